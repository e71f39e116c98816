"""``image_transforms``: every sample's camera values augmented under torch's generator seeded by the
sample's identity, so an uninterrupted run, a resumed one and another worker layout see the same
augmented frames, and the caller's generator is left alone. (LeRobot's own ``ImageTransforms``
through this option: tests/lerobot/test_image_transforms.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.synth import read_identity, synth_dataset

CAM = "observation.images.front"


def brighten(frames: torch.Tensor) -> torch.Tensor:
    """A random brightness offset from torch's generator (picklable: DataLoader workers run it)."""
    return (frames.int() + int(torch.randint(1, 100, ()))).clamp(0, 255).to(frames.dtype)


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    return synth_dataset(
        tmp_path_factory.mktemp("augment") / "ds", num_episodes=4, cameras=(CAM,), length_range=(10, 16), seed=2
    )


def _dataset(root: Path, **kwargs) -> EpisodePoolDataset:
    kwargs.setdefault("episodes_per_shard", 1)
    return EpisodePoolDataset(
        str(root), image_dtype=torch.uint8, seed=3, delta_timestamps={CAM: [-1 / 30, 0.0]}, **kwargs
    )


def _samples(loader: DataLoader) -> list[tuple[int, int, torch.Tensor]]:
    return [
        (int(e), int(f), frames) for b in loader for e, f, frames in zip(b["episode_index"], b["frame_index"], b[CAM])
    ]


def test_the_same_sample_is_augmented_the_same_way_under_any_layout_and_resume(raw: Path) -> None:
    plain = {(e, f): x for e, f, x in _samples(DataLoader(_dataset(raw), batch_size=4))}
    full = _samples(DataLoader(_dataset(raw, image_transforms=brighten), batch_size=4))
    offsets = set()
    for e, f, x in full:
        base = plain[(e, f)]
        assert [read_identity(frame) for frame in base][-1] == (e, f)  # the frame asked for, then augmented
        shift = x.int() - base.int()
        unclipped = base < 155
        offsets.add(int(shift[unclipped].flatten()[0]))
        assert (shift[unclipped] == shift[unclipped].flatten()[0]).all()  # one draw for the whole window
    assert len(offsets) > 10  # samples drew their own
    workers = _samples(DataLoader(_dataset(raw, image_transforms=brighten), batch_size=4, num_workers=2))
    by_frame = {(e, f): x for e, f, x in full}
    assert {(e, f) for e, f, _ in workers} == set(by_frame)
    assert all(torch.equal(x, by_frame[(e, f)]) for e, f, x in workers)
    ds = _dataset(raw, image_transforms=brighten)
    resumed = _dataset(raw, image_transforms=brighten)
    resumed.load_state_dict(ds.state_dict(batches_consumed=3, batch_size=4))
    rest = _samples(DataLoader(resumed, batch_size=4))
    assert [(e, f) for e, f, _ in rest] == [(e, f) for e, f, _ in full[12:]]
    assert all(torch.equal(a[2], b[2]) for a, b in zip(rest, full[12:]))


def test_epochs_differ_and_the_callers_generator_is_left_alone(raw: Path) -> None:
    ds = _dataset(raw, image_transforms=brighten)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    first = {(int(s["episode_index"]), int(s["frame_index"])): s[CAM] for s in ds}  # in this thread
    assert torch.equal(torch.get_rng_state(), before)
    ds.set_epoch(1)
    second = {(e, f): x for e, f, x in _samples(DataLoader(ds, batch_size=4))}
    assert sum(not torch.equal(first[k], second[k]) for k in first) > len(first) // 2
