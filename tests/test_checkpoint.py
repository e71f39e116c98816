"""The resume state: every setting that fixes the order is recorded and checked; a bad state is
refused whole, in one line naming the key, before anything is planned or changed."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.plan.order import MAX_WORKERS, ORDER_DIGEST, OrderKey, parse_state
from lerobot_shards.synth import synth_dataset

BATCH = 3


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """6 episodes, tables only (the order is a matter of tables)."""
    return synth_dataset(tmp_path_factory.mktemp("ckpt") / "ds", num_episodes=6, cameras=(), length_range=(8, 16))


def _dataset(root: Path, **kwargs: Any) -> EpisodePoolDataset:
    kwargs.setdefault("episodes_per_shard", 1)
    kwargs.setdefault("episode_pool_size", 2)
    kwargs.setdefault("seed", 3)
    return EpisodePoolDataset(str(root), **kwargs)


def _keys(ds: EpisodePoolDataset, num_workers: int = 0) -> list[list[tuple[int, int]]]:
    return [
        list(zip(b["episode_index"].tolist(), b["frame_index"].tolist()))
        for b in DataLoader(ds, batch_size=BATCH, num_workers=num_workers)
    ]


@pytest.fixture(scope="module")
def saved(raw: Path) -> dict[str, Any]:
    """A state saved after 2 batches of epoch 1, with one worker's layout recorded."""
    ds = _dataset(raw)
    ds.set_epoch(1)
    _keys(ds)
    return ds.state_dict(batches_consumed=2, batch_size=BATCH)


def test_a_state_records_every_order_setting_and_their_digest(saved: dict[str, Any]) -> None:
    key = OrderKey(**{k: saved[k] for k in OrderKey.__dataclass_fields__})
    assert saved[ORDER_DIGEST] == key.digest()
    assert (saved["shuffle"], saved["equal_samples_per_rank"], saved["drop_last"]) == (True, False, False)
    assert (saved["epoch"], saved["batches_consumed"], saved["num_workers"], saved["world_size"]) == (1, 2, 0, 1)


@pytest.mark.parametrize(
    ("changed", "key"),
    [
        (dict(seed=4), "seed"),
        (dict(shuffle=False), "shuffle"),
        (dict(episode_pool_size=3), "episode_pool_size"),
        (dict(equal_samples_per_rank=True), "equal_samples_per_rank"),
        (dict(drop_last=True), "drop_last"),
        (dict(episodes=[0, 1, 2, 3, 5]), "episodes_digest"),
        (dict(episodes_per_shard=2), "shard_plan_digest"),
    ],
)
def test_a_resume_with_an_order_setting_changed_is_refused_naming_it(
    raw: Path, saved: dict[str, Any], changed: dict[str, Any], key: str
) -> None:
    other = _dataset(raw, **changed)
    with pytest.raises(ValueError, match=rf"saved with {key}=\S+ but this dataset has {key}=.*order would differ"):
        other.load_state_dict(saved)
    assert other.epoch == 0 and other._control.resume is None  # nothing changed


def test_the_equal_count_default_follows_the_world_size_so_it_is_named(raw: Path) -> None:
    """Equal counts default on for 2 ranks and off for 1: an elastic resume 2 -> 1 must say so."""
    ds = _dataset(raw, rank=0, world_size=2)
    _keys(ds, 0)
    state = ds.state_dict(batches_consumed=1, batch_size=BATCH)
    with pytest.raises(ValueError, match=r"equal_samples_per_rank=True .* pass equal_samples_per_rank= explicitly"):
        _dataset(raw).load_state_dict(state)
    _dataset(raw, equal_samples_per_rank=True).load_state_dict(state)  # explicit: the same order


def test_the_same_episodes_named_otherwise_are_the_same_order(raw: Path, saved: dict[str, Any]) -> None:
    full = _dataset(raw)
    full.set_epoch(1)
    same = _dataset(raw, episodes=[5, 4, 3, 2, 1, 0])
    same.load_state_dict(saved)
    assert _keys(same) == _keys(full)[2:]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (dict(batches_consumed=4.9), r"batches_consumed must be an int in \[0, \d+\], got 4.9"),
        (dict(batches_consumed=True), r"batches_consumed must be an int .* got True"),
        (dict(batches_consumed="2"), r"batches_consumed must be an int .* got '2'"),
        (dict(batches_consumed=-1), r"batches_consumed must be an int in \[0"),
        (dict(batch_size=0), r"batch_size must be an int in \[1"),
        (dict(epoch=-1), r"epoch must be an int in \[0"),
        (dict(num_workers=10**7), rf"num_workers must be an int in \[0, {MAX_WORKERS}\], got 10000000"),
        (dict(world_size=0), r"world_size must be an int in \[1"),
        (dict(shuffle=1), r"shuffle must be True or False, got 1"),
        (dict(episodes_digest="all"), r"episodes_digest must be a 16-character hex digest, got 'all'"),
        (dict(seed=4), r"saved with seed=4 but this dataset has seed=3"),
        (dict(order_digest="0" * 16), r"order_digest 0{16} does not match its own order settings"),
        (dict(nonsense=1), r"unknown keys \['nonsense'\]"),
        (dict(elastic_world_size=2), r"has \['elastic_world_size'\] but not .*all or none"),
        (
            dict(elastic_world_size=0, elastic_num_workers=0, elastic_batches_consumed=0, elastic_batch_size=0),
            r"elastic_world_size must be an int in \[1",
        ),
        (
            dict(elastic_world_size=2, elastic_num_workers=0, elastic_batches_consumed=3, elastic_batch_size=3),
            r"elastic_batches_consumed=3 is past batches_consumed=2",
        ),
        (
            dict(world_size=1 << 16, num_workers=MAX_WORKERS),
            r"world_size=65536 x num_workers=1024 is more than \d+ consumers",
        ),
        (dict(earlier_batches="1x2"), r"earlier_batches must be a list of 1 to \d+ \[batches, batch_size\]"),
        (dict(earlier_batches=[[1, 2, 3]]), r"earlier_batches must hold \[batches, batch_size\] pairs"),
        (dict(earlier_batches=[[0, 2]]), r"batches must be an int in \[1"),
        (dict(earlier_batches=[[1, 2], [1, 2]]), r"earlier_batches has two neighbours of batch_size 2"),
        (dict(earlier_batches=[[1, BATCH]]), r"earlier_batches ends with the batch size that follows it"),
        (dict(earlier_batches=[[3, 2]]), r"earlier_batches holds more batches than batches_consumed counts"),
        (dict(elastic_earlier_batches=[[1, 2]]), r"has elastic_earlier_batches but no elastic_\* keys"),
    ],
)
def test_a_tampered_state_is_refused_in_one_line_naming_the_key(
    raw: Path, saved: dict[str, Any], edit: dict[str, Any], message: str
) -> None:
    ds = _dataset(raw)
    with pytest.raises(ValueError, match=message) as raised:
        ds.load_state_dict({**saved, **edit})
    assert "\n" not in str(raised.value)
    assert ds.epoch == 0 and ds._control.resume is None  # refused whole: nothing changed


def test_an_edited_order_setting_is_caught_by_the_digest(raw: Path, saved: dict[str, Any]) -> None:
    """Edit a state's seed to match another dataset's: its digest still names the original order."""
    with pytest.raises(ValueError, match=r"order_digest \w+ does not match its own order settings .* edited"):
        _dataset(raw, seed=4).load_state_dict({**saved, "seed": 4})


def test_state_dict_refuses_counts_that_are_not_ints(raw: Path) -> None:
    ds = _dataset(raw)
    with pytest.raises(ValueError, match=r"batches_consumed must be an int in \[0, \d+\], got 4.9"):
        ds.state_dict(batches_consumed=4.9, batch_size=BATCH)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"batch_size must be an int in \[1, \d+\], got True"):
        ds.state_dict(batches_consumed=1, batch_size=True)


def test_a_full_state_and_the_minimal_one_resume_to_the_same_batches(raw: Path, saved: dict[str, Any]) -> None:
    full = _dataset(raw)
    full.set_epoch(1)
    expected = _keys(full)[2:]
    resumed = _dataset(raw)
    resumed.load_state_dict(saved)
    assert _keys(resumed) == expected
    minimal = _dataset(raw)
    minimal.load_state_dict({"epoch": 1, "batches_consumed": 2, "batch_size": BATCH})
    assert _keys(minimal) == expected
    older = {k: v for k, v in saved.items() if k in ("epoch", "batches_consumed", "batch_size", "seed", "world_size")}
    legacy = _dataset(raw)  # a state of an older version: the keys it has are checked
    legacy.load_state_dict({**older, "episode_pool_size": 2, "sampler_order": 2, "num_workers": 0})
    assert _keys(legacy) == expected


def test_elastic_resume_stays_allowed(raw: Path) -> None:
    """Another worker count (and world size) is no order setting: the rest of the epoch, once."""
    ds = _dataset(raw, equal_samples_per_rank=False)
    full = _keys(ds, 2)
    state = ds.state_dict(batches_consumed=3, batch_size=BATCH)
    assert state["num_workers"] == 2
    rest = []
    for rank in range(2):
        resumed = _dataset(raw, equal_samples_per_rank=False, rank=rank, world_size=2)
        resumed.load_state_dict(state)
        rest += _keys(resumed, 1)
    seen = collections.Counter(k for b in full[:3] + rest for k in b)
    assert seen == collections.Counter(k for b in full for k in b)


def _run(
    ds: EpisodePoolDataset, batch_size: int, num_workers: int, stop: int | None = None
) -> list[list[tuple[int, int]]]:
    """The batches of one DataLoader of ``batch_size`` over ``ds``, the first ``stop`` of them."""
    out = []
    for b in DataLoader(ds, batch_size=batch_size, num_workers=num_workers):
        if stop is not None and len(out) == stop:
            break
        out.append(list(zip(b["episode_index"].tolist(), b["frame_index"].tolist())))
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resumes_under_other_batch_sizes_cover_the_epoch_once(raw: Path, num_workers: int) -> None:
    """Cut at batch size 3, resumed at 5 and cut again, resumed at 2: every sample once. The second
    state records the batches of size 3 (``earlier_batches``); a resume at 5 goes on as the first did."""
    ds = _dataset(raw)
    everything = collections.Counter(k for b in _run(ds, 3, num_workers) for k in b)
    first = _run(ds, 3, num_workers, stop=4)
    state = ds.state_dict(batches_consumed=4, batch_size=3)
    ds = _dataset(raw)
    ds.load_state_dict(state)
    second = _run(ds, 5, num_workers)
    state = ds.state_dict(batches_consumed=4 + 2, batch_size=5)
    assert state["earlier_batches"] == [[4, 3]]
    ds = _dataset(raw)
    ds.load_state_dict(state)
    assert _run(ds, 5, num_workers) == second[2:]
    ds = _dataset(raw)
    ds.load_state_dict(state)
    third = _run(ds, 2, num_workers)
    assert collections.Counter(k for b in first + second[:2] + third for k in b) == everything
    again = ds.state_dict(batches_consumed=4 + 2 + 1, batch_size=2)  # a third size
    assert again["earlier_batches"] == [[4, 3], [2, 5]]
    with pytest.raises(ValueError, match=r"batches_consumed=5 \(batch_size=2\) is before the position"):
        ds.state_dict(batches_consumed=5, batch_size=2)


def test_an_elastic_epoch_resumed_again_under_other_batch_sizes_covers_it_once(raw: Path) -> None:
    """1 rank x 2 workers cut at batch size 3, resumed at 5 and cut; 2 ranks x 1 worker (elastic)
    at 4, cut; the same layout again at 2 to the end: every sample once."""
    kw: dict[str, Any] = dict(equal_samples_per_rank=False)
    ds = _dataset(raw, **kw)
    everything = collections.Counter(k for b in _run(ds, 3, 2) for k in b)
    seen = [k for b in _run(ds, 3, 2, stop=3) for k in b]
    state = ds.state_dict(batches_consumed=3, batch_size=3)
    ds = _dataset(raw, **kw)
    ds.load_state_dict(state)
    seen += [k for b in _run(ds, 5, 2, stop=1) for k in b]
    state = ds.state_dict(batches_consumed=4, batch_size=5)
    states = []
    for rank in range(2):
        ds = _dataset(raw, rank=rank, world_size=2, **kw)
        ds.load_state_dict(state)
        seen += [k for b in _run(ds, 4, 1, stop=2) for k in b]
        states.append(ds.state_dict(batches_consumed=4 + 2, batch_size=4))
    assert states[0] == states[1] and "earlier_batches" not in states[0]
    assert (states[0]["elastic_batch_size"], states[0]["elastic_earlier_batches"]) == (5, [[3, 3]])
    for rank in range(2):
        ds = _dataset(raw, rank=rank, world_size=2, **kw)
        ds.load_state_dict(states[0])
        seen += [k for b in _run(ds, 2, 1) for k in b]
    assert collections.Counter(seen) == everything


def test_parse_state_is_pure_and_reads_the_layout(saved: dict[str, Any]) -> None:
    got = parse_state(saved)
    assert (got.resume.epoch, got.resume.batches_consumed, got.resume.num_workers) == (1, 2, 0)
    assert got.order_digest == saved[ORDER_DIGEST] and got.order["seed"] == 3
    with pytest.raises(ValueError, match="resume state must be a dict, got list"):
        parse_state([1, 2])  # type: ignore[arg-type]


def test_set_epoch_refuses_what_is_not_an_epoch(raw: Path) -> None:
    ds = _dataset(raw)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=r"epoch must be an int in \[0, \d+\], got"):
            ds.set_epoch(bad)  # type: ignore[arg-type]
    assert ds.epoch == 0
