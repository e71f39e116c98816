"""The slab transport (loader/transport/slabs.py) with real DataLoader workers over an identity-painted dataset.

What it must guarantee: the batches equal the plain DataLoader's bit for bit (every key, dtype and
value, for every dtype, size and worker layout, across epochs and a resume), a batch the loop keeps
is never overwritten by later ones, and slabs are reused (no growth over epochs).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, default_convert

from lerobot_shards.loader import DeviceFeeder, EpisodePoolDataset
from lerobot_shards.loader.transport.slabs import SlabCollate, slab_loader, with_slabs
from lerobot_shards.synth import read_identity
from waits import HANG_GUARD_S

CAMS = ("observation.images.front", "observation.images.top")
WINDOW = {CAMS[0]: [-1 / 30, 0.0], "action": [i / 30 for i in range(5)]}
BATCH = 4


@pytest.fixture(scope="module")
def synth(synth_factory: Callable[..., Path]) -> Path:
    """6 episodes of 20-30 frames, 2 cameras: ~150 samples, an epoch of ~38 batches of 4."""
    return synth_factory(num_episodes=6, length_range=(20, 30))


def _dataset(root: Path, **kwargs: Any) -> EpisodePoolDataset:
    return EpisodePoolDataset(str(root), delta_timestamps=WINDOW, episode_pool_size=2, seed=5, **kwargs)


def _copy(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else list(v) for k, v in batch.items()}


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert list(a) == list(b)
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert isinstance(b[key], torch.Tensor), key
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def _compare(plain: list[dict[str, Any]], batches: Iterator[dict[str, Any]]) -> int:
    """Check each slab batch against the plain one as it arrives (holding none); the count."""
    n = 0
    for n, batch in enumerate(batches, start=1):
        assert n <= len(plain), "more batches than the plain DataLoader"
        _assert_same(plain[n - 1], batch)
        del batch
    return n


@pytest.mark.parametrize(
    ("dtype", "resize", "persistent"),
    [
        (torch.uint8, None, True),
        (torch.float32, (32, 48), False),
        (torch.uint8, (32, 48), False),
        (torch.float32, None, True),
    ],
)
def test_slab_batches_equal_the_plain_dataloaders_over_epochs(synth, dtype, resize, persistent) -> None:
    plain_ds = _dataset(synth, image_dtype=dtype, resize=resize)
    ds = _dataset(synth, image_dtype=dtype, resize=resize)
    plain_loader = DataLoader(plain_ds, batch_size=BATCH, num_workers=2)
    loader = slab_loader(ds, batch_size=BATCH, num_workers=2, persistent_workers=persistent)
    for epoch in (0, 1):
        plain_ds.set_epoch(epoch)
        ds.set_epoch(epoch)
        plain = list(plain_loader)
        assert len(plain[-1]["index"]) < BATCH  # the last partial batch goes through a slab too
        assert _compare(plain, iter(loader)) == len(plain)
    if dtype == torch.uint8 and resize is None:
        batch = plain[0]
        for i, (ep, frame) in enumerate(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist())):
            assert read_identity(batch[CAMS[1]][i]) == (ep, frame)
    stats = loader.collate_fn.stats()["workers"]
    # Every batch is accounted for and the slabs carried them; on a loaded machine a worker may find
    # its ring busy (batches still held by the reorder buffer) and collate one the ordinary way.
    assert stats["slab_batches"] + stats["fallback_batches"] == stats["batches"] == 2 * len(plain)
    assert stats["slab_batches"] >= len(plain)


def test_a_resumed_epoch_through_slabs_equals_the_plain_resume(synth) -> None:
    plain = list(DataLoader(_dataset(synth, image_dtype=torch.uint8), batch_size=BATCH, num_workers=2))
    cut = 7
    state = {"epoch": 0, "batches_consumed": cut, "batch_size": BATCH, "num_workers": 2}
    ds = _dataset(synth, image_dtype=torch.uint8)
    ds.load_state_dict(state)
    loader = slab_loader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True)
    assert _compare(plain[cut:], iter(loader)) == len(plain) - cut
    # the next epoch with the same persistent workers starts from its beginning
    ds.set_epoch(1)
    plain_ds = _dataset(synth, image_dtype=torch.uint8)
    plain_ds.set_epoch(1)
    again = list(DataLoader(plain_ds, batch_size=BATCH, num_workers=2))
    assert _compare(again, iter(loader)) == len(again)


def test_spawned_workers_and_the_device_feeder(synth) -> None:
    """CUDA decoding needs spawned workers; DeviceFeeder converts what the slabs carry (here on the CPU)."""
    plain = list(DataLoader(_dataset(synth, image_dtype=torch.uint8), batch_size=BATCH, num_workers=1))
    spawned = slab_loader(  # one worker: a spawned one imports torch afresh
        _dataset(synth, image_dtype=torch.uint8), batch_size=BATCH, num_workers=1, multiprocessing_context="spawn"
    )
    assert _compare(plain, iter(spawned)) == len(plain)
    assert spawned.collate_fn.stats()["workers"]["slab_batches"] == len(plain)
    floats = list(DataLoader(_dataset(synth, image_dtype=torch.float32), batch_size=BATCH, num_workers=2))
    feeder = DeviceFeeder(slab_loader(_dataset(synth, image_dtype=torch.uint8), batch_size=BATCH, num_workers=2), "cpu")
    assert _compare(floats, iter(feeder)) == len(floats)


def test_a_held_batch_keeps_its_values_while_later_batches_arrive(synth) -> None:
    ds = _dataset(synth, image_dtype=torch.uint8)
    loader = slab_loader(ds, batch_size=BATCH, num_workers=2, slabs=2)  # a small ring: slabs come round fast
    mapped = loader.collate_fn.stats()["main"]["mapped"]  # process-wide: what earlier loaders mapped
    it = iter(loader)
    held = next(it)
    reference = _copy(held)
    view = held[CAMS[0]][1:3]  # a view of the slab outlives the batch dict
    view_reference = view.clone()
    for _ in range(10):
        batch = next(it)
        del batch
        _assert_same(reference, held)
    del held
    for _ in range(10):
        batch = next(it)
        del batch
        assert torch.equal(view, view_reference)
    del it
    stats = loader.collate_fn.stats()
    # slabs were reused (at most 2 per worker ever mapped) and none held by the loop was handed out
    assert stats["main"]["mapped"] - mapped <= 4 and stats["workers"]["slabs_allocated"] <= 4
    assert stats["workers"]["slab_batches"] >= 8


def test_a_forked_child_dropping_its_copy_of_a_batch_frees_nothing(synth) -> None:
    loader = slab_loader(_dataset(synth, image_dtype=torch.uint8), batch_size=BATCH, num_workers=1, slabs=1)
    it = iter(loader)
    held = next(it)
    reference = _copy(held)
    pid = os.fork()
    if pid == 0:  # the child's copy of the batch dies here; the parent's must stay untouched
        del held
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    for _ in range(5):
        batch = next(it)
        del batch
    _assert_same(reference, held)
    assert loader.collate_fn.stats()["workers"]["fallback_batches"] >= 5  # the held slab stayed busy


def test_batches_held_beyond_the_ring_fall_back_to_ordinary_collation(synth) -> None:
    ds = _dataset(synth, image_dtype=torch.uint8)
    plain = list(DataLoader(_dataset(synth, image_dtype=torch.uint8), batch_size=BATCH, num_workers=2))
    loader = slab_loader(ds, batch_size=BATCH, num_workers=2, slabs=1)
    kept = list(loader)  # the loop keeps every batch: never blocks, never overwrites
    assert len(kept) == len(plain)
    for a, b in zip(plain, kept):
        _assert_same(a, b)
        assert _channels_last(b[CAMS[0]])  # a batch that fell back is laid out as a slab's
    stats = loader.collate_fn.stats()["workers"]
    assert stats["fallback_batches"] > 0 and stats["slab_batches"] >= 2
    assert stats["slab_batches"] + stats["fallback_batches"] == len(plain)


def test_worker_memory_and_slabs_stay_flat_over_three_epochs(synth) -> None:
    ds = _dataset(synth, image_dtype=torch.uint8)
    loader = slab_loader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True)
    rss: list[list[int]] = []
    allocated: list[float] = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        it = iter(loader)
        for batch in it:
            del batch
        workers = psutil.Process().children()
        assert len(workers) >= 2
        rss.append([w.memory_info().rss for w in workers])
        allocated.append(loader.collate_fn.stats()["workers"]["slabs_allocated"])
    assert allocated[0] >= 2 and allocated[2] <= 2 * 4  # made as needed, never more than the ring per worker
    growth = max(b - a for a, b in zip(rss[0], rss[2]))
    assert growth < 64 << 20, f"a worker grew {growth >> 20} MiB from epoch 1 to epoch 3"


def test_slabs_of_exited_workers_are_forgotten(synth) -> None:
    """Without persistent workers every epoch has new workers; the old workers' slabs are dropped."""
    ds = _dataset(synth, image_dtype=torch.uint8)
    loader = slab_loader(ds, batch_size=BATCH, num_workers=2)
    for epoch in range(3):
        ds.set_epoch(epoch)
        for batch in loader:
            del batch
    main = loader.collate_fn.stats()["main"]
    assert main["mapped"] >= 3 * 2 and main["slabs_held"] <= 2 * 4


def test_main_process_and_bad_arguments() -> None:
    collate = SlabCollate()
    batch = collate([{"a": torch.tensor([1, 2]), "t": "x"}, {"a": torch.tensor([3, 4]), "t": "y"}])
    assert torch.equal(batch["a"], torch.tensor([[1, 2], [3, 4]])) and batch["t"] == ["x", "y"]
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="slabs must be an int >= 1"):
            SlabCollate(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got one sample: use it with a batch_size"):
        collate({"a": torch.tensor([1, 2])})  # batch_size=None hands it single samples
    built = SlabCollate(collate=default_convert)({"a": torch.tensor([[1], [2]])})  # a batch its dataset built
    assert torch.equal(built["a"], torch.tensor([[1], [2]]))


def _channels_last(t: torch.Tensor) -> bool:
    """``[..., C, H, W]`` over ``[..., H, W, C]`` memory."""
    return t.movedim(-3, -1).is_contiguous() and not t.is_contiguous()


def test_frames_keep_their_decoded_memory_order_and_contiguous_is_a_choice(synth) -> None:
    """torchcodec decodes channels-last; the slab stacks frames in that order (a plain copy, not a
    transposing one) with or without workers; the values are the plain DataLoader's either way."""
    plain = {
        w: list(DataLoader(_dataset(synth, image_dtype=torch.uint8), batch_size=BATCH, num_workers=w)) for w in (0, 2)
    }
    assert all(b[cam].is_contiguous() for b in plain[2] for cam in CAMS)  # default_collate in a worker
    layouts = {
        "workers": slab_loader(_dataset(synth, image_dtype=torch.uint8), batch_size=BATCH, num_workers=2),
        "main process": slab_loader(_dataset(synth, image_dtype=torch.uint8), batch_size=BATCH, num_workers=0),
        "contiguous": DataLoader(
            _dataset(synth, image_dtype=torch.uint8),
            batch_size=BATCH,
            num_workers=2,
            collate_fn=SlabCollate(6, layout="contiguous"),
        ),
        "contiguous, main process": DataLoader(
            _dataset(synth, image_dtype=torch.uint8), batch_size=BATCH, collate_fn=SlabCollate(layout="contiguous")
        ),
    }
    for name, loader in layouts.items():
        n, expected = 0, plain[loader.num_workers]
        for n, batch in enumerate(loader, start=1):
            _assert_same(expected[n - 1], batch)
            for cam in CAMS:  # a window [B, 2, C, H, W] and a single frame [B, C, H, W]
                keeps = not name.startswith("contiguous")
                assert _channels_last(batch[cam]) == keeps and batch[cam].is_contiguous() != keeps, (name, cam)
            assert batch["action"].is_contiguous() and batch["index"].is_contiguous()
            del batch
        assert n == len(expected), name
    for dtype in (torch.uint8, torch.float32):  # converted by the feeder, or a float32 loader's
        floats = DeviceFeeder(slab_loader(_dataset(synth, image_dtype=dtype), batch_size=BATCH, num_workers=2), "cpu")
        first = next(iter(floats))
        assert all(first[cam].dtype == torch.float32 and first[cam].is_contiguous() for cam in CAMS), dtype


def test_only_dense_samples_keep_their_layout() -> None:
    collate = SlabCollate()  # the main process: the same planning as a worker's slab
    transposed = [torch.arange(12).view(3, 4).t() + i for i in range(2)]  # dense, dims swapped
    expanded = [torch.arange(3).expand(4, 3) for _ in range(2)]  # stride 0: stacked contiguous
    strided = [torch.arange(20).view(4, 5)[:, ::2] for _ in range(2)]  # gaps: stacked contiguous
    grads = [torch.ones(2, requires_grad=True) for _ in range(2)]  # default_collate's: autograd records the stack
    samples = [{"t": a, "e": b, "s": c, "g": d} for a, b, c, d in zip(transposed, expanded, strided, grads)]
    batch = collate(samples)
    assert batch["t"].stride() == (12, 1, 4) and batch["e"].is_contiguous() and batch["s"].is_contiguous()
    for key, values in (("t", transposed), ("e", expanded), ("s", strided), ("g", grads)):
        assert torch.equal(batch[key], torch.stack(values)), key
    assert batch["g"].requires_grad
    with pytest.raises(ValueError, match="layout must be"):
        SlabCollate(layout="nhwc")  # type: ignore[arg-type]


def test_with_slabs_rebuilds_a_loader_built_elsewhere_keeping_its_settings(synth) -> None:
    """As ``lerobot-shards train`` does with the DataLoader LeRobot's trainer built: same settings, slabs."""
    plain = list(DataLoader(_dataset(synth, image_dtype=torch.uint8), batch_size=BATCH, num_workers=2))
    built = DataLoader(
        _dataset(synth, image_dtype=torch.uint8),
        batch_size=BATCH,
        num_workers=2,
        prefetch_factor=3,
        persistent_workers=True,
        drop_last=False,
        generator=torch.Generator().manual_seed(3),
        pin_memory=False,
        timeout=HANG_GUARD_S,
        worker_init_fn=_no_op,
        multiprocessing_context="fork",
    )
    loader = with_slabs(built)
    assert isinstance(loader.collate_fn, SlabCollate) and loader.collate_fn.slabs == 3 + 2
    assert (
        loader.collate_fn.layout == "sample"
        and with_slabs(built, layout="contiguous").collate_fn.layout == "contiguous"
    )
    assert loader.collate_fn.pin_memory is False
    kept = ("dataset", "batch_size", "num_workers", "prefetch_factor", "persistent_workers", "generator", "drop_last")
    kept += ("pin_memory", "pin_memory_device", "timeout", "worker_init_fn", "multiprocessing_context", "in_order")
    for name in kept:
        assert getattr(loader, name) == getattr(built, name), name
    batches = iter(loader)
    assert _compare(plain, batches) == len(plain)
    del batches  # persistent workers: shut down here
    assert loader.collate_fn.stats()["workers"]["slab_batches"] >= len(plain) // 2
    # a collate of the caller's own: the loader is left as it is
    custom = DataLoader(_dataset(synth), batch_size=BATCH, num_workers=2, collate_fn=list)
    assert with_slabs(custom) is custom
    # without workers (the layout ``lerobot-shards train`` picks on up to 4 cores): the main
    # process's ring, the frames staged into it, the same batches
    in_process = with_slabs(DataLoader(_dataset(synth, image_dtype=torch.uint8), batch_size=BATCH))
    assert isinstance(in_process.collate_fn, SlabCollate) and in_process.num_workers == 0
    assert _compare(list(DataLoader(_dataset(synth, image_dtype=torch.uint8), batch_size=BATCH)), iter(in_process))
    assert in_process.collate_fn.stats()["workers"]["staged_values"] > 0
    # a loader that pins (LeRobot's trainer on CUDA) gets page-locked slabs: its pin step copies nothing
    pinning = DataLoader(_dataset(synth), batch_size=BATCH, num_workers=2, pin_memory=True)
    assert with_slabs(pinning).collate_fn.pin_memory is True
    with pytest.raises(TypeError, match="IterableDataset"):
        with_slabs(DataLoader(list(range(8)), batch_size=2, num_workers=2))


def _no_op(worker_id: int) -> None:
    pass


# -- staging: frames decoded straight into the slot of the slab their batch travels in -------------


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_frames_are_written_into_their_batch_slot_and_equal_the_plain_loaders(synth, dtype) -> None:
    """After a worker's first batch (its layout is the plan), each camera's frames go straight into
    their slot of the next batch's slab as they are decoded: collation finds them there. The
    windowed camera and the single-frame one, both dtypes, two epochs of persistent workers."""
    plain_ds, ds = _dataset(synth, image_dtype=dtype), _dataset(synth, image_dtype=dtype)
    plain_loader = DataLoader(plain_ds, batch_size=BATCH, num_workers=2)
    loader = slab_loader(ds, batch_size=BATCH, num_workers=2, slabs=8, persistent_workers=True)  # never short
    values = 0
    for epoch in (0, 1):
        plain_ds.set_epoch(epoch)
        ds.set_epoch(epoch)
        plain = list(plain_loader)
        values += len(CAMS) * sum(len(b["index"]) for b in plain)
        assert _compare(plain, iter(loader)) == len(plain)
    stats = loader.collate_fn.stats()["workers"]
    assert stats["fallback_batches"] == 0 and stats["slabs_retired"] == 0
    # all but each worker's first batches and the samples made before those were collated
    assert values // 2 <= stats["staged_values"] <= values
    assert stats["stage_cpu_s"] > 0


class _Wrapped(torch.utils.data.IterableDataset):
    """Another dataset's samples, one left out: what a wrapper may do to the grouping."""

    def __init__(self, inner: EpisodePoolDataset, drop: int) -> None:
        super().__init__()
        self.inner, self.drop = inner, drop

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i, sample in enumerate(self.inner):
            if i != self.drop:
                yield sample


def test_a_wrapped_dataset_stages_nothing(synth) -> None:
    """Between the dataset and the DataLoader a wrapper may regroup, keep or change samples: only a
    dataset the DataLoader batches itself stages its frames."""
    plain = list(DataLoader(_Wrapped(_dataset(synth, image_dtype=torch.uint8), 13), batch_size=BATCH, num_workers=1))
    loader = slab_loader(_Wrapped(_dataset(synth, image_dtype=torch.uint8), 13), batch_size=BATCH, num_workers=1)
    assert _compare(plain, iter(loader)) == len(plain)
    stats = loader.collate_fn.stats()["workers"]
    assert stats["staged_values"] == 0 and stats["slab_batches"] == len(plain)


class _DropsOne(EpisodePoolDataset):
    """A subclass that leaves one sample out: staged (it is the DataLoader's dataset), and its
    batches come out otherwise than staging predicted."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i, sample in enumerate(super().__iter__()):
            if i != 13:
                yield sample


def test_samples_regrouped_after_staging_are_copied_and_staging_stops(synth) -> None:
    def make() -> _DropsOne:
        return _DropsOne(str(synth), delta_timestamps=WINDOW, episode_pool_size=2, seed=5, image_dtype=torch.uint8)

    plain = list(DataLoader(make(), batch_size=BATCH, num_workers=1))
    loader = slab_loader(make(), batch_size=BATCH, num_workers=1, slabs=8)  # a free slab for every reservation
    assert _compare(plain, iter(loader)) == len(plain)
    stats = loader.collate_fn.stats()["workers"]
    assert stats["slabs_retired"] >= 1  # the slab whose slots were given to samples of other batches
    assert 0 < stats["staged_values"] < len(CAMS) * 13  # before the regrouping only
    assert stats["fallback_batches"] == 0


@pytest.mark.parametrize("drop_last", [False, True])
def test_an_abandoned_epoch_leaves_no_staged_frames_behind(synth, drop_last) -> None:
    """Persistent workers: an epoch left after 3 batches (its next batch's slab reserved, frames
    perhaps still being decoded into it) or ended by ``drop_last``; the next epoch is exact."""
    ds = _dataset(synth, image_dtype=torch.uint8)
    loader = slab_loader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True, drop_last=drop_last)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        it = iter(loader)
        for _ in range(3):
            del _
            next(it)
        del it
        plain_ds = _dataset(synth, image_dtype=torch.uint8)
        plain_ds.set_epoch(epoch)
        plain = list(DataLoader(plain_ds, batch_size=BATCH, num_workers=2, drop_last=drop_last))
        ds.set_epoch(epoch)  # the abandoned epoch again (a pass without set_epoch is the next one)
        assert _compare(plain, iter(loader)) == len(plain)
    assert loader.collate_fn.stats()["workers"]["staged_values"] > 0


class _Cached(EpisodePoolDataset):
    """Keeps the first epoch's samples and yields them again in later ones (an in-memory cache)."""

    kept: list[dict[str, Any]] | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.kept is None:
            self.kept = []
            for sample in super().__iter__():
                self.kept.append(sample)
                yield sample
        else:
            yield from self.kept


def test_samples_kept_beyond_their_batch_keep_their_frames(synth) -> None:
    """A staged sample's frames live in its batch's slab: a dataset that keeps samples (a cache)
    keeps that slab from being written again, so the kept frames never change."""

    def make() -> _Cached:
        return _Cached(str(synth), delta_timestamps=WINDOW, episode_pool_size=2, seed=5, image_dtype=torch.uint8)

    plain = list(DataLoader(make(), batch_size=BATCH, num_workers=1))  # a new worker per epoch: a fresh cache
    loader = slab_loader(make(), batch_size=BATCH, num_workers=1, slabs=8, persistent_workers=True)
    for _ in range(3):  # epoch 1 fills the worker's cache, epochs 2 and 3 read it
        assert _compare(plain, iter(loader)) == len(plain)
    stats = loader.collate_fn.stats()["workers"]
    assert stats["staged_values"] > 0 and stats["slabs_retired"] > 0


# -- no workers: the main process's own ring ---------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_without_workers_frames_are_staged_into_reused_batches_equal_to_the_plain_loaders(synth, dtype) -> None:
    """``slab_loader`` without workers batches the dataset itself: its decode threads write frames
    straight into the main process's reused slabs, and the batches equal the plain DataLoader's."""
    plain_ds, ds = _dataset(synth, image_dtype=dtype), _dataset(synth, image_dtype=dtype)
    loader = slab_loader(ds, batch_size=BATCH, num_workers=0)
    values = 0
    for epoch in (0, 1):
        plain_ds.set_epoch(epoch)
        ds.set_epoch(epoch)
        plain = list(DataLoader(plain_ds, batch_size=BATCH, num_workers=0))
        values += len(CAMS) * sum(len(b["index"]) for b in plain)
        assert _compare(plain, iter(loader)) == len(plain)
    stats = loader.collate_fn.stats()["workers"]
    assert stats["slab_batches"] == stats["batches"] == 2 * len(plain) and stats["fallback_batches"] == 0
    assert stats["slabs_allocated"] <= 4  # reused: the loop holds one batch, one is filled, one staged
    assert values // 2 <= stats["staged_values"] <= values


def test_without_workers_a_held_batch_keeps_its_values(synth) -> None:
    """Batches the loop keeps are never rewritten: their slabs stay busy, and once the ring is all
    busy further batches are collated into fresh memory."""
    plain = list(DataLoader(_dataset(synth, image_dtype=torch.uint8), batch_size=BATCH))
    loader = slab_loader(_dataset(synth, image_dtype=torch.uint8), batch_size=BATCH, num_workers=0, slabs=2)
    held = list(loader)  # every batch kept
    assert len(held) == len(plain)
    for a, b in zip(plain, held):
        _assert_same(a, b)
    stats = loader.collate_fn.stats()["workers"]
    assert stats["slabs_allocated"] == 2 and stats["fallback_batches"] == len(plain) - 2


def test_without_workers_an_abandoned_epoch_and_a_wrapper(synth) -> None:
    """An epoch left after 3 batches (its next batch's slab reserved) leaves nothing staged behind;
    a wrapped dataset is not batched directly and stages nothing."""
    ds = _dataset(synth, image_dtype=torch.uint8)
    loader = slab_loader(ds, batch_size=BATCH, num_workers=0)
    it = iter(loader)
    for _ in range(3):
        next(it)
    del it
    plain = list(DataLoader(_dataset(synth, image_dtype=torch.uint8), batch_size=BATCH))
    ds.set_epoch(0)
    assert _compare(plain, iter(loader)) == len(plain)
    assert loader.collate_fn.stats()["workers"]["staged_values"] > 0
    wrapped = slab_loader(_Wrapped(_dataset(synth, image_dtype=torch.uint8), 13), batch_size=BATCH, num_workers=0)
    plain = list(DataLoader(_Wrapped(_dataset(synth, image_dtype=torch.uint8), 13), batch_size=BATCH))
    assert _compare(plain, iter(wrapped)) == len(plain)
    assert wrapped.collate_fn.stats()["workers"]["staged_values"] == 0


def test_without_workers_samples_kept_beyond_their_batch_keep_their_frames(synth) -> None:
    def make() -> _Cached:
        return _Cached(str(synth), delta_timestamps=WINDOW, episode_pool_size=2, seed=5, image_dtype=torch.uint8)

    plain = list(DataLoader(make(), batch_size=BATCH))
    loader = slab_loader(make(), batch_size=BATCH, num_workers=0)
    for _ in range(3):  # epoch 1 fills the cache, epochs 2 and 3 read it
        assert _compare(plain, iter(loader)) == len(plain)
    stats = loader.collate_fn.stats()["workers"]
    assert stats["staged_values"] > 0 and stats["slabs_retired"] > 0
