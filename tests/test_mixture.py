"""Weighted mixtures: schedule, exact counts, windows per fps, shared keys, stats, resume, a bucket.

Real synthetic datasets at 10, 15 and 30 fps with identity-painted frames, real DataLoader
workers, the local S3-protocol server. The resume and partition tests leave video out.
"""

from __future__ import annotations

import collections
import datetime
import functools
import json
import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from convert_helpers import run_cli
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.loader.meta import aggregate_stats
from lerobot_shards.loader.mix import order as mix_order
from lerobot_shards.loader.mix.dataset import (
    Mixture,
    MixtureDataset,
    MixtureError,
    MixtureResumeError,
    MixtureSource,
    load_mixture,
)
from lerobot_shards.loader.mix.layout import mix_stats
from lerobot_shards.loader.mix.order import interleave
from lerobot_shards.loader.mix.spec import MixtureFileError, source_counts
from lerobot_shards.loader.plan import progress
from lerobot_shards.loader.plan.sampling import keyed_rng
from lerobot_shards.synth import identity_vector, read_identity, synth_dataset
from test_train_example import _finish, _launch, _sha

FRONT = "observation.images.front"
TOP = "observation.images.top"
FPS = (10, 15, 30)
BATCH = 4
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")


@pytest.fixture(scope="module")
def video(synth_factory: Callable[..., Path]) -> dict[int, Path]:
    """One small dataset per fps with the front camera; the 10 fps one has the top camera too."""
    return {
        fps: synth_factory(
            num_episodes=3,
            fps=fps,
            cameras=(FRONT, TOP) if fps == 10 else (FRONT,),
            height=32,
            length_range=(8, 14),
            seed=fps,
        )
        for fps in FPS
    }


@pytest.fixture(scope="module")
def tables(synth_factory: Callable[..., Path]) -> dict[int, Path]:
    """Datasets without video (tables only), several virtual shards each: for order and resume."""
    return {
        fps: synth_factory(num_episodes=6, fps=fps, cameras=(), length_range=(6, 15), seed=100 + fps) for fps in FPS
    }


def _mixture(roots: dict[int, Path], **shares: Any) -> Mixture:
    """Sources named f"{fps}fps"; ``shares`` maps that name to its MixtureSource keywords."""
    return Mixture(
        [MixtureSource(str(roots[fps]), name=f"{fps}fps", **shares.get(f"{fps}fps", {"repeat": 1})) for fps in FPS],
        samples_per_epoch=shares.pop("samples_per_epoch", None),
    )


def _keys(batch: dict[str, Any]) -> list[tuple[str, int, int]]:
    return list(zip(batch["dataset_name"], batch["episode_index"].tolist(), batch["frame_index"].tolist()))


def _all_frames(ds: MixtureDataset) -> collections.Counter:
    return collections.Counter(
        (name, e, f)
        for name, src in zip(ds.names, ds.sources)
        for s in src.shards
        for e, n in zip(s.episodes, s.lengths)
        for f in range(n)
    )


def _batches(ds: MixtureDataset, num_workers: int = 0) -> list[list[tuple[str, int, int]]]:
    return [_keys(b) for b in DataLoader(ds, batch_size=BATCH, num_workers=num_workers)]


# -- the schedule and the counts ------------------------------------------------------------------


def test_weights_give_their_proportions_in_every_prefix(tables: dict[int, Path]) -> None:
    weights = {"10fps": 0.6, "15fps": 0.3, "30fps": 0.1}
    mix = _mixture(tables, samples_per_epoch=20_000, **{k: {"weight": w} for k, w in weights.items()})
    ds = MixtureDataset(mix, seed=3)
    assert ds.counts == {"10fps": 12_000, "15fps": 6_000, "30fps": 2_000}
    schedule = ds.plan(0, 0).schedule
    assert len(schedule) == 20_000
    for n in (20_000, 2_000, 137):  # the whole epoch and its prefixes, within 4 binomial sigmas
        counts = np.bincount(schedule[:n], minlength=3)
        for d, w in enumerate(weights.values()):
            assert abs(counts[d] - n * w) <= 4 * np.sqrt(n * w * (1 - w)), (n, d, counts)
    ds.set_epoch(1)
    assert not np.array_equal(ds.plan(0, 0).schedule, schedule)  # each epoch its own schedule


def test_interleave_is_pure_and_exact() -> None:
    a = interleave([5, 0, 3], keyed_rng(1, 2))
    assert a.tolist() == interleave([5, 0, 3], keyed_rng(1, 2)).tolist()
    assert collections.Counter(a.tolist()) == {0: 5, 2: 3}


def test_samples_follow_the_schedule_and_frames_are_theirs(video: dict[int, Path]) -> None:
    mix = _mixture(
        video, samples_per_epoch=40, **{"10fps": {"weight": 3}, "15fps": {"weight": 2}, "30fps": {"weight": 1}}
    )
    ds = MixtureDataset(mix, seed=1)
    expected = ds.plan(0, 0).schedule.tolist()
    got = []
    for batch in DataLoader(ds, batch_size=BATCH):
        got += batch["dataset_index"].tolist()
        assert [ds.names[i] for i in batch["dataset_index"].tolist()] == list(batch["dataset_name"])
        keys = list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist()))
        assert [read_identity(frame) for frame in batch[FRONT]] == keys
    assert got == expected
    assert collections.Counter(got) == {0: 20, 1: 13, 2: 7}


def test_repeat_and_choose_give_exact_counts(tables: dict[int, Path]) -> None:
    mix = _mixture(tables, **{"10fps": {"repeat": 2}, "15fps": {"repeat": 0.5}, "30fps": {"choose": 7}})
    ds = MixtureDataset(mix, seed=2)
    frames = {name: src.num_frames for name, src in zip(ds.names, ds.sources)}
    want = {"10fps": 2 * frames["10fps"], "15fps": round(0.5 * frames["15fps"]), "30fps": 7}
    assert ds.counts == want and ds.samples_per_epoch == sum(want.values())
    seen = collections.Counter(k for b in _batches(ds, num_workers=2) for k in b)
    per_source = collections.Counter()
    for (name, _, _), n in seen.items():
        per_source[name] += n
    assert per_source == want
    every = _all_frames(ds)
    assert {k: n for k, n in seen.items() if k[0] == "10fps"} == {k: 2 for k in every if k[0] == "10fps"}
    assert all(n == 1 for k, n in seen.items() if k[0] != "10fps")  # within one pass: never twice


def test_source_counts_refuses_an_epoch_shorter_than_its_fixed_counts() -> None:
    mix = Mixture([MixtureSource("a", choose=10), MixtureSource("b", weight=1)], samples_per_epoch=5)
    with pytest.raises(ValueError, match="samples_per_epoch=5 but the repeat/choose sources alone take 10"):
        source_counts(mix, [100, 100])
    assert source_counts(Mixture([MixtureSource("a", weight=1), MixtureSource("b", weight=1)]), [10, 30]) == (20, 20)


def test_huge_weights_and_numpy_numbers_are_plain_proportions() -> None:
    """Weights of 1e308 overflowed their sum (a NaN error naming nothing); numpy counts passed the
    checks and then failed ``json.dumps`` in the digest."""
    huge = Mixture([MixtureSource("a", weight=1e308), MixtureSource("b", weight=1e308)])
    assert source_counts(huge, [10, 30]) == (20, 20)
    mix = Mixture(
        [MixtureSource("a", choose=np.int64(5)), MixtureSource("b", weight=np.float32(1))],
        samples_per_epoch=np.int64(12),
    )
    assert (type(mix.samples_per_epoch), type(mix.sources[0].choose), type(mix.sources[1].weight)) == (int, int, float)
    assert source_counts(mix, [10, 30]) == (5, 7)
    json.dumps([s.identity() for s in mix.sources])


# -- windows per fps ------------------------------------------------------------------------------


def test_every_window_is_exact_at_each_sources_fps(video: dict[int, Path]) -> None:
    deltas = {"observation.state": [-0.2, 0.0, 0.2], FRONT: [-0.2, 0.0]}
    ds = MixtureDataset(_mixture(video), delta_timestamps=deltas, seed=5)
    lengths = {
        (name, e): n
        for name, src in zip(ds.names, ds.sources)
        for s in src.shards
        for e, n in zip(s.episodes, s.lengths)
    }
    seen = collections.Counter()
    for batch in DataLoader(ds, batch_size=BATCH, num_workers=2):
        for i, (name, e, f) in enumerate(_keys(batch)):
            fps = ds.source(name).fps
            seen[name] += 1
            for key, steps in deltas.items():
                wanted = f + np.round(np.asarray(steps) * fps).astype(int)
                frames = np.clip(wanted, 0, lengths[name, e] - 1)
                assert batch[f"{key}_is_pad"][i].tolist() == (frames != wanted).tolist()
                if key == FRONT:
                    assert [read_identity(x) for x in batch[key][i]] == [(e, int(g)) for g in frames]
                else:
                    np.testing.assert_allclose(batch[key][i].numpy(), identity_vector(e, frames), rtol=0, atol=1e-3)
    assert seen == {name: src.num_frames for name, src in zip(ds.names, ds.sources)}


def test_a_delta_off_a_sources_frame_grid_is_refused_naming_it(video: dict[int, Path]) -> None:
    with pytest.raises(MixtureError, match=r"mixture source '15fps' \(15 fps\).*0\.1 s.*fps=15"):
        MixtureDataset(_mixture(video), delta_timestamps={"action": [0.0, 0.1]})


def test_windows_set_after_reading_meta_equal_windows_given_at_construction(video: dict[int, Path]) -> None:
    """LeRobot's trainer reads ``meta`` to choose the windows, then sets them: one open, same samples."""
    mix = Mixture(
        [
            MixtureSource(str(video[10]), name="a", repeat=1, key_map={"observation.effort": "action"}),
            MixtureSource(str(video[15]), name="b", repeat=1),
        ]
    )
    deltas = {"observation.effort": [0.0, 0.2], "action": [0.0, 0.2], FRONT: [-0.2, 0.0]}
    given = MixtureDataset(mix, delta_timestamps=deltas, seed=4)
    later = MixtureDataset(mix, seed=4)
    assert later.meta.features == given.meta.features
    later.set_delta_timestamps(deltas, 1e-4)
    assert later.layout == given.layout
    for a, b in zip(DataLoader(given, batch_size=8), DataLoader(later, batch_size=8), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == b[key] if isinstance(a[key], list) else torch.equal(a[key], b[key]), key
    with pytest.raises(MixtureError, match=r"mixture source 'b' \(15 fps\).*0\.1 s"):
        later.set_delta_timestamps({"action": [0.0, 0.1]}, 1e-4)  # on source a's grid (10 fps), not b's
    assert later.layout == given.layout  # refused whole: no source took the new windows
    assert [ds.delta_offsets.keys() for ds in later.sources] == [ds.delta_offsets.keys() for ds in given.sources]


def test_windows_set_after_persistent_workers_started_are_refused(video: dict[int, Path]) -> None:
    mix = Mixture(
        [MixtureSource(str(video[10]), name="a", repeat=1), MixtureSource(str(video[15]), name="b", repeat=1)]
    )
    ds = MixtureDataset(mix, seed=4)
    loader = DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    assert FRONT in next(iter(loader)) and next(iter(loader))[FRONT].dim() == 4  # one frame per sample
    ds.set_delta_timestamps({FRONT: [-0.2, 0.0]}, 1e-4)
    with pytest.raises(RuntimeError, match="mixture: delta_timestamps were set after this DataLoader's persistent"):
        next(iter(loader))
    assert next(iter(DataLoader(ds, batch_size=4, num_workers=2)))[FRONT].shape[1] == 2  # new workers: new windows


# -- shared keys ----------------------------------------------------------------------------------


def test_key_map_missing_keys_and_padded_vectors(video: dict[int, Path]) -> None:
    mix = Mixture(
        [
            MixtureSource(
                str(video[10]),
                name="a",
                repeat=1,
                key_map={"observation.images.wrist": TOP, "observation.effort": "action"},
            ),
            MixtureSource(str(video[15]), name="b", repeat=1, key_map={"observation.effort": "timestamp"}),
            MixtureSource(str(video[30]), name="c", repeat=1),
        ]
    )
    ds = MixtureDataset(mix, seed=4)
    assert ds.layout.padded == {"observation.effort": 6}
    assert set(ds.layout.flagged) == {"observation.images.wrist", "observation.effort", "action", "timestamp"}
    assert ds.meta.features["observation.effort"]["shape"] == (6,)
    seen = set()
    for batch in DataLoader(ds, batch_size=8, num_workers=2):  # sources mix inside a batch: they stack
        for i, (name, e, f) in enumerate(_keys(batch)):
            seen.add(name)
            effort, mask = batch["observation.effort"][i], batch["observation.effort_mask"][i]
            missing = {k: bool(batch[f"{k}_is_missing"][i]) for k in ds.layout.flagged}
            if name == "a":
                assert read_identity(batch["observation.images.wrist"][i]) == (e, f)
                np.testing.assert_allclose(effort.numpy(), identity_vector(e, f) + 0.5, atol=1e-3)
                assert mask.all() and not batch["action"][i].any()
                assert missing == {
                    "observation.images.wrist": False,
                    "observation.effort": False,
                    "action": True,
                    "timestamp": False,
                }
            elif name == "b":
                assert effort[0] == pytest.approx(f / 15, abs=1e-4) and not effort[1:].any()
                assert mask.tolist() == [True] + [False] * 5 and batch["timestamp"][i] == 0
                assert not batch["observation.images.wrist"][i].any()
                assert missing == {
                    "observation.images.wrist": True,
                    "observation.effort": False,
                    "action": False,
                    "timestamp": True,
                }
            else:
                assert not effort.any() and not mask.any()
                assert missing == {
                    "observation.images.wrist": True,
                    "observation.effort": True,
                    "action": False,
                    "timestamp": False,
                }
            assert read_identity(batch[FRONT][i]) == (e, f)
    assert seen == {"a", "b", "c"}


def test_windows_of_missing_and_padded_keys(video: dict[int, Path]) -> None:
    mix = Mixture(
        [
            MixtureSource(str(video[10]), name="a", repeat=1, key_map={"observation.effort": "action"}),
            MixtureSource(str(video[15]), name="b", repeat=1, key_map={"observation.effort": "timestamp"}),
        ]
    )
    ds = MixtureDataset(mix, delta_timestamps={"observation.effort": [0.0, 0.2], "action": [0.0, 0.2]}, seed=4)
    lengths = {
        (n, e): k for n, src in zip(ds.names, ds.sources) for s in src.shards for e, k in zip(s.episodes, s.lengths)
    }
    for batch in DataLoader(ds, batch_size=8):
        assert batch["observation.effort"].shape[1:] == (2, 6) and batch["action"].shape[1:] == (2, 6)
        for i, (name, e, f) in enumerate(_keys(batch)):
            fps = ds.source(name).fps
            frames = np.minimum([f, f + round(0.2 * fps)], lengths[name, e] - 1)
            pad = [False, f + round(0.2 * fps) > lengths[name, e] - 1]
            assert batch["observation.effort_is_pad"][i].tolist() == pad
            if name == "a":  # effort is its action; it lacks "action": zeros, every step padded
                np.testing.assert_allclose(batch["observation.effort"][i], identity_vector(e, frames) + 0.5, atol=1e-3)
                assert not batch["action"][i].any() and batch["action_is_pad"][i].all()
            else:  # effort is its timestamp, padded with zeros to 6
                np.testing.assert_allclose(batch["observation.effort"][i][:, 0], frames / 15, atol=1e-4)
                assert not batch["observation.effort"][i][:, 1:].any()
                assert batch["observation.effort_mask"][i].tolist() == [True] + [False] * 5
                assert batch["action_is_pad"][i].tolist() == pad


def test_key_map_errors_name_the_source(video: dict[int, Path]) -> None:
    clash = Mixture([MixtureSource(str(video[10]), name="a", repeat=1, key_map={"observation.state": "action"})])
    with pytest.raises(
        MixtureError,
        match="mixture source 'a': key_map renames 'action' to 'observation.state', which the source already has",
    ):
        MixtureDataset(clash)
    unknown = Mixture([MixtureSource(str(video[10]), name="a", repeat=1, key_map={"x": "cam_left_wrist"})])
    with pytest.raises(MixtureError, match=r"mixture source 'a': key_map names \['cam_left_wrist'\], which it lacks"):
        MixtureDataset(unknown)


def test_cameras_are_shared_names_a_source_lacking_one_fills_it(video: dict[int, Path]) -> None:
    wrist = "observation.images.wrist"
    mix = Mixture(
        [
            MixtureSource(str(video[10]), name="a", repeat=1, key_map={wrist: TOP}),
            MixtureSource(str(video[15]), name="b", repeat=1),
        ]
    )
    ds = MixtureDataset(mix, cameras=[wrist], seed=2)
    assert [src.cameras for src in ds.sources] == [(TOP,), ()]  # each source decodes only what was chosen
    assert [k for k, v in ds.features.items() if v["dtype"] == "video"] == [wrist]
    seen = collections.Counter()
    for batch in DataLoader(ds, batch_size=8, num_workers=2):
        assert FRONT not in batch and TOP not in batch
        for i, (name, e, f) in enumerate(_keys(batch)):
            seen[name] += 1
            assert bool(batch[f"{wrist}_is_missing"][i]) == (name == "b")
            if name == "a":
                assert read_identity(batch[wrist][i]) == (e, f)
            else:
                assert not batch[wrist][i].any()
    assert seen == ds.counts
    assert all(not src.cameras for src in MixtureDataset(mix, cameras=[]).sources)
    with pytest.raises(MixtureError, match=r"cameras \['observation.images.top'\]: no mixture source has them"):
        MixtureDataset(mix, cameras=[TOP])  # source a's top camera goes by the shared name only


@pytest.mark.slow
def test_train_example_on_a_mixture_file_resumes_to_the_same_parameters(tmp_path: Path) -> None:
    """examples/train.py given a mixture file (2 gloo ranks x 2 workers, one camera chosen by shared
    name, action windows at 10 and 30 fps): stopped after its first checkpoint and relaunched, it
    ends with the parameters of an uninterrupted run."""
    roots = [
        synth_dataset(tmp_path / f"d{fps}", num_episodes=4, fps=fps, cameras=(FRONT,), length_range=(8, 12), seed=fps)
        for fps in (10, 30)
    ]
    mixture = tmp_path / "mix.json"
    mixture.write_text(json.dumps({"sources": [{"source": str(r), "repeat": 1} for r in roots]}))
    reference = _finish(_launch(mixture, tmp_path / "ref" / "ckpt.pt", "--camera", FRONT))
    stopped = _finish(_launch(mixture, tmp_path / "run" / "ckpt.pt", "--camera", FRONT, "--max-steps", "3"))
    assert "checkpoint step 3 epoch 0 batch 3" in stopped
    resumed = _finish(_launch(mixture, tmp_path / "run" / "ckpt.pt", "--camera", FRONT))
    assert "resumed from" in resumed and "at step 3 (epoch 0, batch 3)" in resumed
    assert _sha(resumed) == _sha(reference)


def test_frames_of_other_sizes_are_refused_or_resized(
    video: dict[int, Path], synth_factory: Callable[..., Path]
) -> None:
    tall = synth_factory(num_episodes=2, fps=30, cameras=(FRONT,), height=48, length_range=(8, 10), seed=3)
    mix = Mixture(
        [MixtureSource(str(video[15]), name="small", repeat=1), MixtureSource(str(tall), name="tall", repeat=1)]
    )
    with pytest.raises(
        MixtureError,
        match=r"frames of 'observation.images.front' are \(32, 160, 3\) in mixture source 'small' but \(48, 160, 3\) in 'tall'.*resize=",
    ):
        MixtureDataset(mix)
    ds = MixtureDataset(mix, resize=(24, 80))
    batch = next(iter(DataLoader(ds, batch_size=32)))
    assert batch[FRONT].shape[1:] == (3, 24, 80) and set(batch["dataset_name"]) == {"small", "tall"}


# -- stats ----------------------------------------------------------------------------------------


def test_stats_combine_by_the_sources_shares(tables: dict[int, Path]) -> None:
    mix = _mixture(
        tables, samples_per_epoch=1000, **{"10fps": {"weight": 3}, "15fps": {"weight": 1}, "30fps": {"weight": 1}}
    )
    ds = MixtureDataset(mix)
    w = np.array([0.6, 0.2, 0.2])
    assert ds.weights == pytest.approx(tuple(w))
    per = [ds.source_meta(name).stats["observation.state"] for name in ds.names]
    for name, src in zip(ds.names, ds.sources):  # a source's own stats are its episodes' (LeRobot's aggregation)
        assert ds.source_meta(name).stats["observation.state"]["mean"] == pytest.approx(
            src.meta.stats["observation.state"]["mean"]
        )
    got = ds.meta.stats["observation.state"]
    mean = sum(wi * s["mean"] for wi, s in zip(w, per))
    var = sum(wi * (s["std"] ** 2 + (s["mean"] - mean) ** 2) for wi, s in zip(w, per))
    np.testing.assert_allclose(got["mean"], mean)
    np.testing.assert_allclose(got["std"], np.sqrt(var))
    np.testing.assert_allclose(got["min"], np.min([s["min"] for s in per], axis=0))
    np.testing.assert_allclose(got["max"], np.max([s["max"] for s in per], axis=0))
    # feature_stats (for DeviceFeeder): the sources' stats.json combined alike; every episode is chosen here.
    np.testing.assert_allclose(ds.feature_stats["observation.state"]["mean"], mean, rtol=1e-6)
    np.testing.assert_allclose(ds.feature_stats["observation.state"]["std"], np.sqrt(var), rtol=1e-5)
    # Equal weights on equal-size sources: the same as LeRobot's aggregation over all their episodes.
    equal = MixtureDataset(Mixture([MixtureSource(str(tables[10]), name=n, weight=1) for n in ("x", "y")]))
    both = aggregate_stats([equal.source_meta("x").stats, equal.source_meta("y").stats])
    np.testing.assert_allclose(equal.meta.stats["action"]["std"], both["action"]["std"], rtol=1e-6)


def test_mix_stats_of_padded_vectors_weigh_each_dimension_by_its_sources() -> None:
    a = {
        "v": {
            "mean": np.array([1.0, 10.0]),
            "std": np.array([1.0, 2.0]),
            "min": np.array([0.0, 8.0]),
            "max": np.array([2.0, 12.0]),
            "count": np.array([10]),
        }
    }
    b = {
        "v": {
            "mean": np.array([3.0]),
            "std": np.array([1.0]),
            "min": np.array([-1.0]),
            "max": np.array([5.0]),
            "count": np.array([30]),
        }
    }
    got = mix_stats([a, b], [0.25, 0.75])["v"]
    np.testing.assert_allclose(got["mean"], [0.25 * 1 + 0.75 * 3, 10.0])  # dim 1: only a has it
    np.testing.assert_allclose(got["std"], [np.sqrt(0.25 * (1 + 1.5**2) + 0.75 * (1 + 0.5**2)), 2.0])
    np.testing.assert_allclose(got["min"], [-1.0, 8.0])
    np.testing.assert_allclose(got["max"], [5.0, 12.0])
    assert got["count"].tolist() == [40]


# -- partition and resume -------------------------------------------------------------------------


def test_two_ranks_are_disjoint_within_every_source(tables: dict[int, Path]) -> None:
    mix = _mixture(tables)  # repeat 1 each: every frame of every source once per epoch
    per_rank = []
    for rank in range(2):
        ds = MixtureDataset(mix, rank=rank, world_size=2, seed=6, equal_samples_per_rank=False, episodes_per_shard=1)
        per_rank.append(collections.Counter(k for b in _batches(ds, num_workers=2) for k in b))
    assert not set(per_rank[0]) & set(per_rank[1])
    assert per_rank[0] + per_rank[1] == _all_frames(ds)
    assert all(set(k[0] for k in c) == {"10fps", "15fps", "30fps"} for c in per_rank)  # every source on every rank


def test_equal_count_mode_gives_ranks_equal_batches(tables: dict[int, Path]) -> None:
    mix = _mixture(tables, samples_per_epoch=101, **{n: {"weight": 1} for n in ("10fps", "15fps", "30fps")})
    counts = [
        sum(len(b) for b in _batches(MixtureDataset(mix, rank=r, world_size=2, episodes_per_shard=1), num_workers=2))
        for r in range(2)
    ]
    assert counts[0] == counts[1] > 0  # equal_samples_per_rank is on for 2 ranks


def _run_rank(rank: int, roots: list[str], init_file: str, out_dir: str) -> None:
    timeout = datetime.timedelta(seconds=60)  # a hang (unequal batch counts) fails instead of stalling
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2, timeout=timeout)
    try:
        mix = Mixture([MixtureSource(r, name=f"s{i}", weight=w) for i, (r, w) in enumerate(zip(roots, (3, 2, 1)))], 90)
        ds = MixtureDataset(mix, seed=2, episodes_per_shard=1)  # rank and world size from torch.distributed
        assert (ds.rank, ds.world_size) == (rank, 2)
        batches = []
        for batch in DataLoader(ds, batch_size=BATCH, num_workers=2):
            dist.all_reduce(torch.ones(1))  # as DDP does each step
            batches.append(_keys(batch))
        gathered: list = [None] * 2
        dist.all_gather_object(gathered, batches)
        if rank == 0:
            Path(out_dir, "result.json").write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_read_disjoint_parts_of_every_source_in_equal_batches(
    tables: dict[int, Path], tmp_path: Path
) -> None:
    roots = [str(tables[fps]) for fps in FPS]
    mp.start_processes(
        _run_rank, args=(roots, str(tmp_path / "init"), str(tmp_path)), nprocs=2, start_method="spawn", join=True
    )
    per_rank = json.loads((tmp_path / "result.json").read_text())
    assert len(per_rank[0]) == len(per_rank[1])  # equal counts per rank (the default for 2 ranks)
    seen = [collections.Counter(tuple(k) for b in batches for k in b) for batches in per_rank]
    assert not set(seen[0]) & set(seen[1])
    both = seen[0] + seen[1]
    per_source = collections.Counter(k[0] for k in both.elements())
    assert per_source == {"s0": 44, "s1": 28, "s2": 12}  # 45/30/15 each split over 4 consumers, floored


def _resume_kwargs() -> dict[str, Any]:
    return dict(seed=9, episode_pool_size=2, episodes_per_shard=2, equal_samples_per_rank=False)


def test_exact_resume_on_a_mixture(tables: dict[int, Path]) -> None:
    mix = _mixture(tables, **{"10fps": {"repeat": 1.5}, "15fps": {"choose": 20}, "30fps": {"repeat": 1}})
    full = _batches(MixtureDataset(mix, **_resume_kwargs()), num_workers=2)
    for cut in (0, 3, 7):  # 7: mid-round of the two workers
        ds = MixtureDataset(mix, **_resume_kwargs())
        next(iter(DataLoader(ds, batch_size=BATCH, num_workers=2)))  # records num_workers
        state = json.loads(json.dumps(ds.state_dict(batches_consumed=cut, batch_size=BATCH)))
        resumed = MixtureDataset(mix, **_resume_kwargs())
        resumed.load_state_dict(state)
        assert _batches(resumed, num_workers=2) == full[cut:]


def test_resumes_under_other_batch_sizes_cover_a_mixtures_epoch_once(tables: dict[int, Path]) -> None:
    """Cut at batch size 3, resumed at 5 and cut again, resumed at 2, with 2 workers: every sample of
    the epoch once (the second resume skipped 5-sample batches for the 3-sample ones and lost samples)."""
    mix = _mixture(tables)
    kw = _resume_kwargs()

    def run(ds: MixtureDataset, size: int, stop: int | None = None) -> list[tuple[str, int, int]]:
        out = []
        for i, b in enumerate(DataLoader(ds, batch_size=size, num_workers=2)):
            if i == stop:
                break
            out += _keys(b)
        return out

    first = MixtureDataset(mix, **kw)
    everything = collections.Counter(run(first, 3))
    seen = run(first, 3, stop=4)
    state = first.state_dict(batches_consumed=4, batch_size=3)
    second = MixtureDataset(mix, **kw)
    second.load_state_dict(state)
    seen += run(second, 5, stop=3)
    state = second.state_dict(batches_consumed=4 + 3, batch_size=5)
    third = MixtureDataset(mix, **kw)
    third.load_state_dict(state)
    seen += run(third, 2)
    assert collections.Counter(seen) == everything


def test_elastic_resume_covers_what_remains_of_each_source(tables: dict[int, Path]) -> None:
    mix = _mixture(tables, **{"10fps": {"repeat": 1}, "15fps": {"choose": 25}, "30fps": {"repeat": 1}})
    cut = 5
    first = MixtureDataset(mix, **_resume_kwargs())
    batches = _batches(first, num_workers=2)
    done = collections.Counter(k for b in batches[:cut] for k in b)
    state = first.state_dict(batches_consumed=cut, batch_size=BATCH)
    rest: collections.Counter = collections.Counter()
    for rank in range(2):  # 1 rank x 2 workers -> 2 ranks x 3 workers
        ds = MixtureDataset(mix, rank=rank, world_size=2, **_resume_kwargs())
        ds.load_state_dict(state)
        resumed = _batches(ds, num_workers=3)
        rest.update(k for b in resumed for k in b)
        # Interrupted again inside the elastic epoch: resumes exactly under the same layout.
        again = MixtureDataset(mix, rank=rank, world_size=2, **_resume_kwargs())
        again.load_state_dict(ds.state_dict(batches_consumed=cut + 4, batch_size=BATCH))  # from the epoch start
        assert _batches(again, num_workers=3) == resumed[4:]
    together = done + rest
    every = _all_frames(first)
    for name in ("10fps", "30fps"):  # repeat 1: every frame exactly once over the two runs
        assert {k: n for k, n in together.items() if k[0] == name} == {k: 1 for k in every if k[0] == name}
    fifteen = {k: n for k, n in together.items() if k[0] == "15fps"}
    assert sum(fifteen.values()) == 25 and set(fifteen.values()) == {1}


def _equal_resume(mix: Mixture, new_world: int, cut: int, **kw: Any) -> list[list[tuple[str, int, int]]]:
    """Every new rank's samples after 2 ranks in equal-count mode were cut at batch ``cut``."""
    state = None
    for rank in range(2):
        ds = MixtureDataset(mix, rank=rank, world_size=2, equal_samples_per_rank=True, **kw)
        for i, _ in enumerate(DataLoader(ds, batch_size=BATCH)):
            if i == cut:
                state = state or ds.state_dict(batches_consumed=cut, batch_size=BATCH)
                break
    out = []
    for rank in range(new_world):
        ds = MixtureDataset(mix, rank=rank, world_size=new_world, equal_samples_per_rank=True, **kw)
        ds.load_state_dict(state)
        out.append([k for b in _batches(ds) for k in b])
    return out


@pytest.mark.parametrize("new_world", [3, 4])
def test_an_equal_count_elastic_resume_reads_a_sources_part_from_its_other_frames(
    tables: dict[int, Path], new_world: int
) -> None:
    """Equal-count mode (the multi-rank default) from 2 ranks to 3 or 4: a new rank holding no frame
    of one group of a source's remaining frames (whole passes, partial ones) reads that part from
    the source's other frames it holds, where it used to fail with an internal error. Every rank
    yields as many samples, all real frames of the source."""
    mix = Mixture([MixtureSource(str(tables[15]), name="15fps", repeat=1)])
    for cut in (1, 2, 3):
        ranks = _equal_resume(mix, new_world, cut, seed=11, episodes_per_shard=2)
        assert len({len(r) for r in ranks}) == 1 and ranks[0], (cut, [len(r) for r in ranks])
        assert {k for r in ranks for k in r} <= set(_all_frames(MixtureDataset(mix)))


def test_an_equal_count_elastic_resume_never_moves_samples_between_sources(tables: dict[int, Path]) -> None:
    """A new rank holding no frame at all of one source cannot read its part elsewhere: moving it
    to another source changed the mixture's counts (30fps read 92 of a 61-sample share). Refused
    in one line naming the source."""
    with pytest.raises(ValueError, match=r"equal-count mode: mixture source '\w+' owes this consumer \d+ samples"):
        _equal_resume(_mixture(tables), 4, 2, seed=11)


def test_elastic_resume_continues_a_share_of_several_passes_pass_by_pass(tables: dict[int, Path]) -> None:
    """repeat 2 and weights above their sources' sizes (about 2.1 passes): interrupted under 1 rank x 2
    workers (whose consumers stand in different passes at the second cut) and resumed under 2 ranks x
    3 workers, every frame comes as often as in the uninterrupted epoch: the rest of each current
    pass once, then the following passes; a last partial pass gives as many frames their third read."""
    mix = _mixture(
        tables, samples_per_epoch=400, **{"10fps": {"repeat": 2}, "15fps": {"weight": 1}, "30fps": {"weight": 1}}
    )
    first = MixtureDataset(mix, **_resume_kwargs())
    assert first.counts == {"10fps": 140, "15fps": 130, "30fps": 130}  # 70, 64 and 61 frames
    batches = _batches(first, num_workers=2)
    uninterrupted = collections.Counter(k for b in batches for k in b)

    def reads(counter: collections.Counter, name: str) -> collections.Counter:
        """How many frames of the source come once, twice, three times."""
        return collections.Counter(n for k, n in counter.items() if k[0] == name)

    assert reads(uninterrupted, "10fps") == {2: 70}
    for cut in (20, 50):
        done = collections.Counter(k for b in batches[:cut] for k in b)
        state = first.state_dict(batches_consumed=cut, batch_size=BATCH)
        rest: collections.Counter = collections.Counter()
        for rank in range(2):
            ds = MixtureDataset(mix, rank=rank, world_size=2, **_resume_kwargs())
            ds.load_state_dict(state)
            resumed = _batches(ds, num_workers=3)
            rest.update(k for b in resumed for k in b)
            if cut == 50:  # interrupted again, in a later pass's part: resumes exactly
                again = MixtureDataset(mix, rank=rank, world_size=2, **_resume_kwargs())
                again.load_state_dict(ds.state_dict(batches_consumed=cut + 20, batch_size=BATCH))
                assert _batches(again, num_workers=3) == resumed[20:]
        together = done + rest
        for name, count in first.counts.items():
            assert sum(n for k, n in together.items() if k[0] == name) == count
            assert set(k for k in together if k[0] == name) == set(k for k in _all_frames(first) if k[0] == name)
            assert reads(together, name) == reads(uninterrupted, name), (cut, name)


def test_interleaved_counts_are_the_schedules_head_counted() -> None:
    """What an elastic resume reads of each interrupted consumer's schedule (its first samples' count
    per source) is the sorted schedule's, found by selection; ties, as ``interleave`` sorts them."""
    rng = np.random.default_rng(3)
    for case in range(200):
        shares = rng.integers(0, 40, rng.integers(1, 5)).tolist()
        for head in {0, 1, sum(shares) // 2, sum(shares) - 1, sum(shares), sum(shares) + 3}:
            want = np.bincount(interleave(shares, keyed_rng(case))[: max(head, 0)], minlength=len(shares))
            assert np.array_equal(mix_order.interleaved_counts(shares, keyed_rng(case), head), want), (shares, head)

    class Ties:  # every key of equal rank equal: (k + 0.5) / n, so two sources of one share tie everywhere
        def random(self, n: int) -> np.ndarray:
            return np.full(n, 0.5)

    for head in range(9):
        want = np.bincount(interleave([4, 4], Ties())[:head], minlength=2)  # type: ignore[arg-type]
        assert np.array_equal(mix_order.interleaved_counts([4, 4], Ties(), head), want)  # type: ignore[arg-type]


def test_elastic_resume_finds_the_sources_cuts_compiled_as_the_samplers_replay_does(
    tables: dict[int, Path], monkeypatch
) -> None:
    """Where each interrupted consumer stood in each source, a share of several passes included, is
    found by the compiled loop (``progress.consumer_progress``), not by running every sampler
    emission by emission: the resumed samples are those of the replay (the reference, numba off)."""
    mix = _mixture(
        tables, samples_per_epoch=400, **{"10fps": {"repeat": 2}, "15fps": {"weight": 1}, "30fps": {"weight": 1}}
    )
    first = MixtureDataset(mix, **_resume_kwargs())
    for i, _ in enumerate(DataLoader(first, batch_size=BATCH, num_workers=2)):
        if i == 50:  # past a pass in 10fps
            break
    state = first.state_dict(batches_consumed=50, batch_size=BATCH)

    def resumed() -> list[list[tuple[str, int, int]]]:
        out = []
        for rank in range(2):
            ds = MixtureDataset(mix, rank=rank, world_size=2, **_resume_kwargs())
            ds.load_state_dict(state)
            out += _batches(ds)
        return out

    compiled = resumed()
    monkeypatch.setattr(progress, "_kernel", lambda: None)
    assert compiled and resumed() == compiled


def test_an_elastic_mixture_resume_finds_the_cuts_once_per_rank_not_per_worker(
    tables: dict[int, Path], monkeypatch
) -> None:
    """From 1 rank x 2 workers to 2 ranks x 3 workers: where the old consumers stood in each source
    is found once per rank, at ``load_state_dict`` before the DataLoader forks (counted across the
    processes), and the samples are those of workers that each find it themselves."""
    mix = _mixture(tables, **{"10fps": {"repeat": 2}, "15fps": {"choose": 25}, "30fps": {"repeat": 1}})
    first = MixtureDataset(mix, **_resume_kwargs())
    for i, _ in enumerate(DataLoader(first, batch_size=BATCH, num_workers=2)):
        if i == 5:
            break
    state = first.state_dict(batches_consumed=5, batch_size=BATCH)
    calls = multiprocessing.Value("i", 0)
    cut = mix_order._elastic_cut.__wrapped__

    def counted(*args: Any) -> Any:
        with calls.get_lock():
            calls.value += 1
        return cut(*args)

    def resumed() -> list[list[tuple[str, int, int]]]:
        out = []
        for rank in range(2):
            ds = MixtureDataset(mix, rank=rank, world_size=2, **_resume_kwargs())
            ds.load_state_dict(state)
            out.append(_batches(ds, num_workers=3))
        return out

    monkeypatch.setattr(mix_order, "_elastic_cut", functools.lru_cache(maxsize=1)(counted))
    once = resumed()
    assert calls.value == 2  # one per rank
    calls.value = 0
    monkeypatch.setattr(mix_order, "_elastic_cut", functools.lru_cache(maxsize=1)(counted))  # nothing found yet
    monkeypatch.setattr(mix_order.MixtureOrder, "prepare", lambda self, resume: None)
    assert resumed() == once and calls.value == 2 * 3  # one per worker


def test_a_resume_with_other_weights_or_a_single_dataset_state_is_refused(tables: dict[int, Path]) -> None:
    ds = MixtureDataset(_mixture(tables, **{"10fps": {"weight": 2}, "15fps": {"weight": 1}, "30fps": {"weight": 1}}))
    state = ds.state_dict(batches_consumed=2, batch_size=BATCH)
    other = MixtureDataset(_mixture(tables, **{"10fps": {"weight": 1}, "15fps": {"weight": 1}, "30fps": {"weight": 1}}))
    with pytest.raises(MixtureResumeError, match="saved by another mixture.*samples per epoch 10fps: ") as caught:
        other.load_state_dict(state)
    assert "\n" not in str(caught.value)
    single = ds.source("10fps").state_dict(batches_consumed=2, batch_size=BATCH)
    with pytest.raises(MixtureResumeError, match="saved by a single dataset"):
        ds.load_state_dict(single)
    reseeded = MixtureDataset(
        _mixture(tables, **{"10fps": {"weight": 2}, "15fps": {"weight": 1}, "30fps": {"weight": 1}}), seed=9
    )
    with pytest.raises(MixtureResumeError, match=r"saved with seed=0 \(this mixture: 9\)"):
        reseeded.load_state_dict(state)  # the setting named, not "another mixture"
    ds.load_state_dict(state)  # its own state loads


# -- a bucket and a local raw source --------------------------------------------------------------


def test_a_converted_source_in_a_bucket_mixed_with_a_raw_local_one(
    video: dict[int, Path], s3_server, tmp_path: Path
) -> None:
    import fsspec

    convert_dataset(video[30], tmp_path / "converted", ConvertOptions(episodes_per_shard=2), progress=False)
    fs = fsspec.filesystem("s3", **s3_server.storage_options)
    fs.makedirs("mixture-test", exist_ok=True)
    fs.put(str(tmp_path / "converted") + "/", "s3://mixture-test/converted", recursive=True)
    mix = Mixture(
        [
            MixtureSource(
                "s3://mixture-test/converted", name="bucket", repeat=1, storage_options=s3_server.storage_options
            ),
            MixtureSource(str(video[15]), name="local", repeat=1, episodes=[0, 2]),
        ]
    )
    ds = MixtureDataset(mix, seed=8)
    seen = collections.Counter()
    for batch in DataLoader(ds, batch_size=BATCH, num_workers=2):
        keys = _keys(batch)
        assert [read_identity(frame) for frame in batch[FRONT]] == [(e, f) for _, e, f in keys]
        seen.update(keys)
    assert seen == _all_frames(ds)
    assert {e for name, e, _ in seen if name == "local"} == {0, 2}


# -- mixture files --------------------------------------------------------------------------------


def test_load_mixture_from_yaml_and_json(video: dict[int, Path], tmp_path: Path) -> None:
    (tmp_path / "data").symlink_to(video[10].parent)
    (tmp_path / "mix.yaml").write_text(
        f"samples_per_epoch: 30\nsources:\n"
        f"  - source: data/{video[10].name}\n    name: ten\n    weight: 2\n    key_map: {{observation.images.wrist: {TOP}}}\n"
        f"  - source: {video[15]}\n    weight: 1\n    episodes: [0, 1]\n"
    )
    mix = load_mixture(tmp_path / "mix.yaml")
    assert mix.sources[0].source == str(tmp_path / "data" / video[10].name)  # relative to the file
    assert mix.names == ("ten", video[15].name) and mix.sources[1].episodes == (0, 1)
    ds = MixtureDataset(tmp_path / "mix.yaml")
    assert ds.counts == {"ten": 20, video[15].name: 10}
    (tmp_path / "mix.json").write_text(json.dumps({"sources": [{"source": str(video[15]), "choose": 3}]}))
    assert MixtureDataset(tmp_path / "mix.json").samples_per_epoch == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sources:\n  - source: a\n    wieght: 1\n", r"mix\.yaml: unknown key sources\[0\]\.wieght \(known: "),
        (
            "sources:\n  - source: a\nsamples: 3\n",
            r"mix\.yaml: unknown key samples \(known: samples_per_epoch, sources\)",
        ),
        (
            "sources:\n  - source: a\n    weight: 1\n    repeat: 2\n",
            r"mix\.yaml: sources\[0\]: mixture source 'a': give exactly one of weight, repeat, choose",
        ),
        ("sources:\n  - name: a\n    weight: 1\n", r"mix\.yaml: sources\[0\] lacks 'source'"),
        (
            "sources:\n  - source: a\n    choose: -1\n",
            r"mix\.yaml: sources\[0\]: mixture source 'a': choose must be a non-negative int",
        ),
        ("sources: [\n", r"mix\.yaml: not valid YAML"),
        ("- a\n", r"mix\.yaml: a mixture file holds a mapping with 'sources'"),
    ],
)
def test_bad_mixture_files_give_one_line_naming_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "mix.yaml").write_text(text)
    with pytest.raises(MixtureFileError, match=message) as caught:
        load_mixture(tmp_path / "mix.yaml")
    assert "\n" not in str(caught.value)


def test_inspect_shows_a_mixture_files_sources_and_shares(tables: dict[int, Path], tmp_path: Path) -> None:
    (tmp_path / "mix.yaml").write_text(
        f"samples_per_epoch: 100\nsources:\n"
        f"  - {{source: {tables[10]}, name: ten, weight: 3, key_map: {{observation.effort: timestamp}}}}\n"
        f"  - {{source: {tables[15]}, name: fifteen, choose: 10}}\n"
    )
    shown = run_cli("inspect", tmp_path / "mix.yaml")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"Mixture {tmp_path / 'mix.yaml'}: sources 2, samples per epoch 100")
    assert lines[2].split()[:3] + lines[2].split()[-2:] == ["ten", str(tables[10]), "weight", "90", "90.0%"]
    assert lines[3].split()[:3] + lines[3].split()[-2:] == ["fifteen", str(tables[15]), "choose", "10", "10.0%"]
    assert "observation.effort: missing in fifteen (zeros, observation.effort_is_missing)" in lines
    (tmp_path / "bad.yaml").write_text("sources: [{source: x, wieght: 1}]\n")
    bad = run_cli("inspect", tmp_path / "bad.yaml")
    assert bad.returncode == 1 and "bad.yaml: unknown key sources[0].wieght" in bad.stderr


def _cut_after(ds: Any, n: int) -> None:
    """Make ``ds``'s streams end after ``n`` samples each (as a source whose plan and bytes disagree)."""
    real = ds.stream

    def short(*args: Any, **kwargs: Any) -> Any:
        stream = real(*args, **kwargs)
        try:
            for i, item in enumerate(stream):
                if i == n:
                    return
                yield item
        finally:
            stream.close()

    ds.stream = short


def test_a_source_that_ends_before_its_schedule_is_an_error_not_a_shorter_epoch(tables: dict[int, Path]) -> None:
    ds = MixtureDataset(_mixture(tables), seed=3)
    full = sum(1 for _ in ds)
    _cut_after(ds.sources[1], 2)
    with pytest.raises(RuntimeError, match=r"mixture source '15fps' \(.*\): its samples ended after 2 of the \d+"):
        list(ds)
    # on_error="skip": a source may drop samples (bad bytes); the epoch is then shorter, as the option says
    skipping = MixtureDataset(_mixture(tables), seed=3, on_error="skip")
    _cut_after(skipping.sources[1], 2)
    assert 0 < sum(1 for _ in skipping) < full
