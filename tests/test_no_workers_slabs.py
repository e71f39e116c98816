"""The no-workers slab ring under hostile use: every batch equals the plain DataLoader's.

Batches or parts of them kept (views, slices, ``.numpy()``, ``unbind``), ``DeviceFeeder``, two
iterators alive at once, an abandoned iterator, loader options, a resumed epoch, subclasses that
reorder samples, a dataset also iterated elsewhere, a mixture.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from lerobot_shards.loader import DeviceFeeder, EpisodePoolDataset
from lerobot_shards.loader.transport.slabs import slab_loader

FPS = 30
FRONT, TOP = "observation.images.front", "observation.images.top"
CAMS = (FRONT, TOP)
WINDOW = {FRONT: [-1 / FPS, 0.0], "action": [i / FPS for i in range(3)]}
B = 4


@pytest.fixture(scope="module")
def synth(synth_factory: Callable[..., Path]) -> Path:
    return synth_factory(num_episodes=4, length_range=(12, 20), seed=5)


def _ds(root: Path, **kw: Any) -> EpisodePoolDataset:
    kw.setdefault("image_dtype", torch.uint8)
    return EpisodePoolDataset(str(root), delta_timestamps=WINDOW, episode_pool_size=2, seed=5, **kw)


def _copy(b: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()}


def _plain(ds: EpisodePoolDataset, **kw: Any) -> list[dict[str, Any]]:
    return [_copy(b) for b in DataLoader(ds, batch_size=B, **kw)]


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert list(a) == list(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def _all_same(want: list[dict], got: list[dict]) -> None:
    assert len(want) == len(got)
    for a, b in zip(want, got):
        _same(a, b)


@pytest.mark.slow  # 3.5 s each: every batch of the epoch kept and checked
@pytest.mark.parametrize("how", ["views", "numpy", "unbind", "slices"])
def test_kept_parts_of_batches_keep_their_values(synth, how) -> None:
    want = _plain(_ds(synth))
    loader = slab_loader(_ds(synth), batch_size=B, num_workers=0, slabs=2)
    kept = []
    for b in loader:
        if how == "views":
            kept.append({k: b[k] for k in (FRONT, TOP, "action", "index")})
        elif how == "numpy":
            kept.append({k: b[k].numpy() for k in (FRONT, TOP, "action", "index")})
        elif how == "unbind":
            kept.append({k: list(b[k]) for k in (FRONT, TOP, "action", "index")})
        else:
            kept.append({k: b[k][1:] for k in (FRONT, TOP, "action", "index")})
        del b
        gc.collect()
    for a, k in zip(want, kept):
        for key, v in k.items():
            v = torch.stack(v) if isinstance(v, list) else torch.as_tensor(v)
            ref = a[key][1:] if how == "slices" else a[key]
            assert torch.equal(ref, v), key


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_device_feeder_on_cpu_keeping_every_batch(synth, dtype) -> None:
    plain_ds, ds = _ds(synth, image_dtype=dtype), _ds(synth, image_dtype=dtype)
    want = list(DeviceFeeder(DataLoader(plain_ds, batch_size=B), device="cpu"))
    loader = slab_loader(ds, batch_size=B, num_workers=0)
    got = list(DeviceFeeder(loader, device="cpu"))
    _all_same([_copy(w) for w in want], got)
    assert loader.collate_fn.stats()["workers"]["staged_values"] > 0


def _both(
    scenario: Callable[[Callable[..., Any], EpisodePoolDataset], list], make: Callable[[], Any], **lkw: Any
) -> None:
    """Run ``scenario`` with a plain no-workers DataLoader and with a no-workers slab_loader: same results."""
    dl_kw = {k: v for k, v in lkw.items() if k not in ("layout", "slabs")}
    want = scenario(lambda ds, **kw: DataLoader(ds, batch_size=kw.pop("batch_size", B), **{**dl_kw, **kw}), make())
    got = scenario(
        lambda ds, **kw: slab_loader(ds, batch_size=kw.pop("batch_size", B), num_workers=0, **{**lkw, **kw}), make()
    )
    assert len(want) == len(got) and len(want) > 0
    for a, b in zip(want, got):
        if isinstance(a, dict):
            _same(a, b)
        else:
            assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))


def _interleaved(loader_of, ds) -> list:
    loader = loader_of(ds)
    it1 = iter(loader)
    out = [_copy(next(it1)) for _ in range(3)]
    it2 = iter(loader)
    kept = []
    live = [it1, it2]
    while live:
        for it in list(live):
            try:
                b = next(it)
            except StopIteration:
                live.remove(it)
                continue
            kept.append(b)
            out.append(_copy(b))
            if len(kept) > 2:
                kept.pop(0)
    out += [_copy(k) for k in kept]
    return out


def test_two_iterators_alive_at_once_interleaved(synth) -> None:
    _both(_interleaved, lambda: _ds(synth))


def _abandon_alive(loader_of, ds) -> list:
    loader = loader_of(ds)
    it1 = iter(loader)
    out = [_copy(next(it1)) for _ in range(3)]
    held = next(it1)
    out += [_copy(b) for b in loader]
    out.append(held)
    out += [_copy(b) for b in it1]
    out += list(loader)  # kept uncopied
    return out


def test_abandoned_but_alive_iterator_resumed_after_another(synth) -> None:
    _both(_abandon_alive, lambda: _ds(synth))


def _two_epochs(loader_of, ds) -> list:
    loader = loader_of(ds)
    return [_copy(b) for b in loader] + list(loader)


@pytest.mark.parametrize(
    ("kw", "lkw"),
    [
        ({}, {"drop_last": True}),
        ({"image_dtype": torch.float32, "resize": (32, 48)}, {}),
        ({"resize": (32, 48)}, {"layout": "contiguous"}),
        ({}, {"pin_memory": True}),
        ({"image_dtype": torch.float32}, {"slabs": 1}),
    ],
)
def test_options(synth, kw, lkw) -> None:
    _both(_two_epochs, lambda: _ds(synth, **kw), **lkw)


def test_resumed_epoch(synth) -> None:
    def make() -> EpisodePoolDataset:
        ds = _ds(synth)
        ds.load_state_dict({"epoch": 0, "batches_consumed": 3, "batch_size": B, "num_workers": 0})
        return ds

    _both(_two_epochs, make)


class _Swapped(EpisodePoolDataset):
    """Yields its samples in pairs swapped."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        it = super().__iter__()
        for a in it:
            b = next(it, None)
            if b is not None:
                yield b
            yield a


class _Delayed(EpisodePoolDataset):
    """Holds every 3rd sample back by 5 (across batch boundaries)."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        held: list = []
        for i, s in enumerate(super().__iter__()):
            if i % 3 == 0:
                held.append((i + 5, s))
            else:
                yield s
            while held and held[0][0] <= i:
                yield held.pop(0)[1]
        for _, s in held:
            yield s


@pytest.mark.parametrize("cls", [_Swapped, _Delayed])
def test_subclass_reordering(synth, cls) -> None:
    def make() -> EpisodePoolDataset:
        return cls(str(synth), delta_timestamps=WINDOW, episode_pool_size=2, seed=5, image_dtype=torch.uint8)

    _both(_two_epochs, make)


def _registered(loader_of, ds) -> list:
    loader = loader_of(ds)
    it = iter(loader)
    out = [next(it) for _ in range(2)]
    out += list(loader_of(ds, batch_size=3))
    out += list(ds)  # direct iteration, samples kept
    out += list(DataLoader(ds, batch_size=3))
    out += list(it)
    out += list(loader)
    return [_copy(b) for b in out]


def test_registered_dataset_then_other_loaders_and_direct_iteration(synth) -> None:
    _both(_registered, lambda: _ds(synth))


def test_mixture_through_a_no_workers_slab_loader(synth) -> None:
    from lerobot_shards.loader import Mixture, MixtureDataset, MixtureSource

    def mix() -> MixtureDataset:
        sources = [MixtureSource(str(synth), name="a", weight=1), MixtureSource(str(synth), name="b", weight=1)]
        return MixtureDataset(
            Mixture(sources), delta_timestamps=WINDOW, episode_pool_size=2, seed=5, image_dtype=torch.uint8
        )

    _both(_two_epochs, mix)
