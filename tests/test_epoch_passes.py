"""A second pass without ``set_epoch`` moves to the next epoch's order (as MosaicML Streaming does), with
real DataLoaders (persistent workers too); a run resumed mid-pass and an uninterrupted one still agree."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from lerobot_shards.loader import EpisodePoolDataset, Mixture, MixtureDataset, MixtureSource

CAM = "observation.images.front"
BATCH = 3


@pytest.fixture(scope="module")
def raw(synth_factory) -> Path:
    return synth_factory(num_episodes=6, length_range=(6, 9), cameras=(CAM,), height=32, width=48)


def _dataset(raw: Path, mixture: bool = False) -> EpisodePoolDataset | MixtureDataset:
    if mixture:
        sources = [MixtureSource(str(raw), name="a", weight=1), MixtureSource(str(raw), name="b", weight=1)]
        return MixtureDataset(Mixture(sources), episode_pool_size=2, seed=5)
    return EpisodePoolDataset(str(raw), episode_pool_size=2, seed=5)


def _loader(ds, workers: int, persistent: bool) -> DataLoader:
    return DataLoader(
        ds,
        batch_size=BATCH,
        num_workers=workers,
        persistent_workers=persistent,
        multiprocessing_context="fork" if workers else None,
    )


def _keys(batch: dict) -> list[tuple[int, int]]:
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist()))


def _epoch(raw: Path, epoch: int, workers: int, mixture: bool = False) -> list[tuple[int, int]]:
    ds = _dataset(raw, mixture)
    ds.set_epoch(epoch)
    return [k for b in _loader(ds, workers, False) for k in _keys(b)]


@pytest.mark.parametrize(
    ("workers", "persistent", "mixture"), [(0, False, False), (2, False, False), (2, True, False), (2, True, True)]
)
def test_a_pass_without_set_epoch_is_the_next_epoch(raw: Path, workers: int, persistent: bool, mixture: bool) -> None:
    ds = _dataset(raw, mixture)
    loader = _loader(ds, workers, persistent)
    passes = [[k for b in loader for k in _keys(b)] for _ in range(3)]
    want = [_epoch(raw, e, workers, mixture) for e in range(3)]
    assert passes == want and want[0] != want[1] != want[2]
    assert ds.epoch == 2
    ds.set_epoch(0)  # set again: the next pass is epoch 0's
    assert [k for b in loader for k in _keys(b)] == want[0]


@pytest.mark.parametrize(("workers", "persistent", "mixture"), [(0, False, False), (2, True, False), (2, True, True)])
def test_a_run_resumed_mid_pass_agrees_with_an_uninterrupted_one(
    raw: Path, workers: int, persistent: bool, mixture: bool
) -> None:
    """Three passes without ``set_epoch``; the resumed run stops 2 batches into the second, saves,
    and a new dataset loads the state and goes on: the rest of epoch 1, then all of epoch 2 (the
    resumed epoch is not replayed from its resume point)."""
    whole = _loader(_dataset(raw, mixture), workers, persistent)
    uninterrupted = [k for _ in range(3) for b in whole for k in _keys(b)]

    first = _dataset(raw, mixture)
    loader = _loader(first, workers, persistent)
    seen = [k for b in loader for k in _keys(b)]
    it = iter(loader)
    seen += [k for _ in range(2) for k in _keys(next(it))]
    state = first.state_dict(batches_consumed=2, batch_size=BATCH)
    assert state["epoch"] == 1
    del it
    resumed = _dataset(raw, mixture)
    resumed.load_state_dict(state)
    loader = _loader(resumed, workers, persistent)
    for _ in range(2):
        seen += [k for b in loader for k in _keys(b)]
    assert seen == uninterrupted
