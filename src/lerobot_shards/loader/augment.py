"""Image augmentation (``DecodeOptions.image_transforms``) seeded per sample, so it replays on resume.

LeRobot applies its ``ImageTransforms`` to each camera's value of a sample (a window or one frame)
in ``__getitem__``, drawing the random parameters from torch's global generator: a resumed run,
or one with other DataLoader workers, transforms its samples differently. Here each sample's
transforms draw from a generator of their own seeded from ``(seed, epoch, episode, frame)``: the
same sample is transformed the same way in an uninterrupted run, a resumed one, under any worker
or rank layout, and after an elastic resume. (A frame repeated within an epoch, equal-count
mode's padding, repeats its transform too.) A generator seeded with ``s`` draws what torch's
global one draws after ``torch.manual_seed(s)``, so the frames are LeRobot's under that seed.

Why a generator of their own, not the global one seeded and restored (``fork_rng``): torch's
global generator is shared by every thread of the process. Seeding it per sample would let a
sample's transforms run only in the thread that also trains, between steps; a training step
running beside them (dropout, noise, crops) would draw from the sample's seed and have its own
draws undone by the restore. Under ``SampleGenerator`` (a torch function mode, which holds for the
thread that enters it alone) every draw that names no generator is given the sample's, so the
transforms may run on the decode threads while the policy steps, and the training's draws are the
ones an unaugmented run makes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch.overrides import TorchFunctionMode

from ..exceptions import LeRobotShardsError

TRANSFORM_STREAM = 0x4155_474D  # "AUGM": apart from the order's random streams

# torch's draws that take a ``generator=``: under ``SampleGenerator`` one naming none gets the sample's.
_DRAWS = frozenset(
    {
        torch.rand,
        torch.randn,
        torch.randint,
        torch.randperm,
        torch.rand_like,
        torch.randn_like,
        torch.randint_like,
        torch.multinomial,
        torch.normal,
        torch.bernoulli,
        torch.poisson,
        torch.Tensor.uniform_,
        torch.Tensor.normal_,
        torch.Tensor.random_,
        torch.Tensor.bernoulli_,
        torch.Tensor.bernoulli,
        torch.Tensor.exponential_,
        torch.Tensor.geometric_,
        torch.Tensor.cauchy_,
        torch.Tensor.log_normal_,
        torch.Tensor.multinomial,
    }
)
# Draws that take no generator (they would draw from the shared one): refused under ``SampleGenerator``.
_UNSEEDABLE = frozenset(
    {
        torch.dropout,
        torch.alpha_dropout,
        torch.feature_dropout,
        torch.feature_alpha_dropout,
        torch.native_dropout,
        torch.rrelu,
        F.dropout,
        F.dropout1d,
        F.dropout2d,
        F.dropout3d,
        F.alpha_dropout,
        F.feature_alpha_dropout,
        F.rrelu,
        F.gumbel_softmax,
    }
)


class UnseededDraw(LeRobotShardsError, RuntimeError):
    """An image transform draws randomness in a way that cannot be given the sample's generator."""


def sample_seed(seed: int, epoch: int, episode: int, frame: int) -> int:
    """The torch seed of one sample's transforms: a function of its identity, never its position."""
    words = [TRANSFORM_STREAM, seed & 0xFFFF_FFFF, seed >> 32, epoch, episode, frame]
    low, high = np.random.SeedSequence(words).generate_state(2, dtype=np.uint32)
    return int(low) | int(high) << 32


class SampleGenerator(TorchFunctionMode):
    """Within it, in the thread that entered it, torch's draws that name no generator draw from
    ``generator`` (a CPU generator: the frames are augmented where they were decoded, the CPU);
    a draw that takes none, or one on another device, is refused (``UnseededDraw``), never made
    from the generator the training shares."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.generator = generator

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func in _DRAWS and kwargs.get("generator") is None:
            if _device(args, kwargs) != "cpu":
                raise UnseededDraw(
                    f"image_transforms: {_name(func)} draws on {_device(args, kwargs)}; a sample's transforms "
                    "draw from a CPU generator of its own (augment the frames on the CPU)"
                )
            kwargs["generator"] = self.generator
        elif func in _UNSEEDABLE:
            raise UnseededDraw(
                f"image_transforms: {_name(func)} takes no generator, so it cannot draw from the sample's own "
                "(a sample's transforms must replay on resume and leave the training's generator alone)"
            )
        return func(*args, **kwargs)


def _device(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The device a draw makes its values on: ``device=``, else its first tensor argument's, else the CPU."""
    device = kwargs.get("device")
    if device is None:
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), "cpu")
    return torch.device(device).type


def _name(func: Callable[..., Any]) -> str:
    return f"{getattr(func, '__module__', None) or 'torch'}.{getattr(func, '__qualname__', func)}"


class SampleTransforms:
    """``transforms`` applied to each of ``keys`` in a sample, seeded by ``sample_seed``; in any thread."""

    def __init__(
        self, transforms: Callable[[torch.Tensor], torch.Tensor], keys: Sequence[str], seed: int, epoch: int
    ) -> None:
        self.transforms, self.keys, self.seed, self.epoch = transforms, tuple(keys), seed, epoch

    def __call__(self, item: dict[str, Any]) -> dict[str, Any]:
        episode, frame = int(item["episode_index"]), int(item["frame_index"])
        generator = torch.Generator().manual_seed(sample_seed(self.seed, self.epoch, episode, frame))
        with SampleGenerator(generator):
            for key in self.keys:  # a new tensor, never in place: decoded frames may be shared (a cache)
                # contiguous whichever way the frames came (a planar cache entry, or the decoder's
                # channels-last frames): a transform's arithmetic may follow memory order (a mean)
                value = item[key]
                item[key] = self.transforms(value.contiguous() if isinstance(value, torch.Tensor) else value)
        return item
