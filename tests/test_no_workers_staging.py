"""Staging without workers, and augmented frames through the frame cache.

Each no-workers loader stages into its own ring (a second loader, an eval loop inside a training
epoch, never turns the first one's staging off), and a transform sees the same frames, so gives
the same bits, with and without the (planar) frame cache.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from lerobot_shards.loader import EpisodePoolDataset

FPS = 30
FRONT, TOP = "observation.images.front", "observation.images.top"
DELTAS = {FRONT: [-1 / FPS, 0.0], "action": [0.0, 1 / FPS]}


@pytest.fixture(scope="module")
def fc_raw(synth_factory: Callable[..., Path]) -> Path:
    return synth_factory(num_episodes=4, length_range=(12, 20), seed=5)


def _fc_dataset(root: Path, cache: Path | None, **kwargs: Any) -> EpisodePoolDataset:
    kwargs.setdefault("episodes_per_shard", 1)
    kwargs.setdefault("episode_pool_size", 2)
    kwargs.setdefault("delta_timestamps", DELTAS)
    return EpisodePoolDataset(str(root), frame_cache_dir=None if cache is None else str(cache), **kwargs)


def _contrast(frames: torch.Tensor) -> torch.Tensor:
    """A contrast jitter as torchvision's ``adjust_contrast`` computes it: around the image's mean."""
    mean = frames.mean(dim=(-3, -2, -1), keepdim=True)
    return ((frames - mean) * 1.5 + mean).clamp(0, 1)


def _samples(ds: EpisodePoolDataset) -> list[dict[str, Any]]:
    return [
        {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in DataLoader(ds, batch_size=4)
    ]


def test_augmented_frames_from_the_planar_cache_equal_the_uncached_ones(fc_raw: Path, tmp_path: Path) -> None:
    """With ``image_transforms`` the cache's entries are planar, so the transform sees contiguous
    frames where, without the cache, it sees the decoder's channels-last ones: any transform whose
    arithmetic follows memory order (a mean, a sum) then returns other bits with the cache."""
    opts: dict[str, Any] = {"image_dtype": torch.float32, "image_transforms": _contrast, "shuffle": False}
    want = _samples(_fc_dataset(fc_raw, None, **opts))
    for _ in range(2):  # cold (fill), then warm (read)
        got = _samples(_fc_dataset(fc_raw, tmp_path, **opts))
        assert len(got) == len(want)
        for a, b in zip(want, got):
            for cam in (FRONT, TOP):
                assert torch.equal(a[cam], b[cam]), (cam, (a[cam] - b[cam]).abs().max().item())


# -- no-workers slab ring: the process-wide ring the decode threads stage into ----------------------


def test_a_second_no_workers_slab_loader_does_not_turn_the_firsts_staging_off(fc_raw: Path) -> None:
    """A training loader and an evaluation loader, both ``slab_loader(..., num_workers=0)``: the
    main process's staging ring (``_WORKER_RING``) is set only when a ring is made, so once the
    second loader has collated, every later epoch of the first stages its frames into the second's
    ring (and its collation copies them once more): its own staging is off for good."""
    from lerobot_shards.loader.transport.slabs import slab_loader

    def ds(**kw: Any) -> EpisodePoolDataset:
        return _fc_dataset(fc_raw, None, image_dtype=torch.uint8, seed=5, **kw)

    train = slab_loader(ds(), batch_size=4, num_workers=0)
    val = slab_loader(ds(shuffle=False), batch_size=4, num_workers=0)

    def staged() -> float:
        return train.collate_fn.stats()["workers"]["staged_values"]

    per_epoch = []
    for _ in range(2):
        before = staged()
        for _ in train:
            pass
        per_epoch.append(staged() - before)
        for _ in val:
            pass
    assert per_epoch[0] > 0
    assert per_epoch[1] > 0, per_epoch


def test_interleaved_no_workers_loaders_each_stage_into_their_own_ring(fc_raw: Path) -> None:
    """An evaluation loop begun while a training iterator is alive, both resumed turn about: each
    loader's batches still equal the plain loader's, and the training loader keeps staging in the
    epochs after."""
    from lerobot_shards.loader.transport.slabs import slab_loader

    def ds(**kw: Any) -> EpisodePoolDataset:
        return _fc_dataset(fc_raw, None, image_dtype=torch.uint8, seed=5, **kw)

    def copy(b: dict[str, Any]) -> dict[str, Any]:
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()}

    def run(make_loader: Callable[..., Any]) -> list[dict[str, Any]]:
        train, val = make_loader(ds()), make_loader(ds(shuffle=False))
        out = []
        for _ in range(2):
            it = iter(train)
            out += [copy(next(it)) for _ in range(2)]
            out += [copy(b) for b in val]
            out += [copy(b) for b in it]
        return out

    want = run(lambda d: DataLoader(d, batch_size=4))
    loaders: list[Any] = []
    got = run(lambda d: loaders.append(slab_loader(d, batch_size=4, num_workers=0)) or loaders[-1])
    assert len(want) == len(got)
    for a, b in zip(want, got):
        for k in a:
            assert torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k], k
    assert all(loader.collate_fn.stats()["workers"]["staged_values"] > 0 for loader in loaders)
