"""Image augmentation (``DecodeOptions.image_transforms``) seeded per sample, so it replays on resume.

LeRobot applies its ``ImageTransforms`` to each camera's value of a sample (a window or one frame)
in ``__getitem__``, drawing the random parameters from torch's global generator: a resumed run,
or one with other DataLoader workers, transforms its samples differently. Here each sample's
transforms run under torch's CPU generator seeded from ``(seed, epoch, episode, frame)``, forked
so the caller's generator is left as it was: the same sample is transformed the same way in an
uninterrupted run, a resumed one, under any worker or rank layout, and after an elastic resume.
(A frame repeated within an epoch, equal-count mode's padding, repeats its transform too.)

It runs in the thread that emits the samples, after their frames are decoded: torch's generator
is shared by every thread of a process, so decode threads could not seed it one sample each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

TRANSFORM_STREAM = 0x4155_474D  # "AUGM": apart from the order's random streams


def sample_seed(seed: int, epoch: int, episode: int, frame: int) -> int:
    """The torch seed of one sample's transforms: a function of its identity, never its position."""
    words = [TRANSFORM_STREAM, seed & 0xFFFF_FFFF, seed >> 32, epoch, episode, frame]
    low, high = np.random.SeedSequence(words).generate_state(2, dtype=np.uint32)
    return int(low) | int(high) << 32


class SampleTransforms:
    """``transforms`` applied to each of ``keys`` in a sample, seeded by ``sample_seed``."""

    def __init__(
        self, transforms: Callable[[torch.Tensor], torch.Tensor], keys: Sequence[str], seed: int, epoch: int
    ) -> None:
        self.transforms, self.keys, self.seed, self.epoch = transforms, tuple(keys), seed, epoch

    def __call__(self, item: dict[str, Any]) -> dict[str, Any]:
        episode, frame = int(item["episode_index"]), int(item["frame_index"])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(sample_seed(self.seed, self.epoch, episode, frame))
            for key in self.keys:  # a new tensor, never in place: decoded frames may be shared (a cache)
                item[key] = self.transforms(item[key])
        return item
