"""EpisodePoolDataset contracts: coverage, determinism, resume identity, windows, frame identity."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.synth import read_identity, synth_dataset

CAM = "observation.images.front"
FPS = 30


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """7 episodes (7 virtual shards of one episode), one camera, identity painted."""
    return synth_dataset(
        tmp_path_factory.mktemp("loader") / "ds",
        num_episodes=7,
        cameras=(CAM,),
        length_range=(12, 30),
        episodes_per_video_file=3,
        episodes_per_data_file=4,
        seed=3,
    )


def _dataset(root: Path, **kwargs) -> EpisodePoolDataset:
    kwargs.setdefault("episodes_per_shard", 1)
    kwargs.setdefault("episode_pool_size", 3)
    return EpisodePoolDataset(str(root), **kwargs)


def _keys(batch: dict) -> list[tuple[int, int]]:
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist()))


def _epoch(ds: EpisodePoolDataset, num_workers: int, batch_size: int = 4) -> list[list[tuple[int, int]]]:
    loader = DataLoader(ds, batch_size=batch_size, num_workers=num_workers)
    return [_keys(b) for b in loader]


def _lengths(ds: EpisodePoolDataset) -> dict[int, int]:
    return {e: n for s in ds.shards for e, n in zip(s.episodes, s.lengths)}


def _all_frames(root: Path) -> collections.Counter:
    ds = _dataset(root, cameras=[])
    return collections.Counter((e, f) for e in range(7) for f in range(_lengths(ds)[e]))


@pytest.mark.filterwarnings("ignore:frames per consumer are uneven")
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_exactly_once_across_ranks_and_workers(raw: Path, world_size: int, num_workers: int) -> None:
    seen: collections.Counter = collections.Counter()
    for rank in range(world_size):
        ds = _dataset(raw, cameras=[], rank=rank, world_size=world_size, seed=11, equal_samples_per_rank=False)
        for batch in _epoch(ds, num_workers):
            seen.update(batch)
    assert seen == _all_frames(raw)


def test_same_seed_same_stream_and_epochs_differ(raw: Path) -> None:
    a = _epoch(_dataset(raw, cameras=[], seed=5), 2)
    b = _epoch(_dataset(raw, cameras=[], seed=5), 2)
    assert a == b
    ds = _dataset(raw, cameras=[], seed=5)
    ds.set_epoch(1)
    c = _epoch(ds, 2)
    assert c != a and sorted(sum(c, [])) == sorted(sum(a, []))
    d = _epoch(_dataset(raw, cameras=[], seed=6), 2)
    assert d != a


def test_frames_are_mixed_across_the_pool(raw: Path) -> None:
    stream = sum(_epoch(_dataset(raw, cameras=[], episode_pool_size=3), 0), [])
    first_twenty = [e for e, _ in stream[:20]]
    assert len(set(first_twenty)) >= 2  # frames of several resident episodes interleave
    frames_of_first = [f for e, f in stream if e == stream[0][0]]
    assert frames_of_first != sorted(frames_of_first)  # and come in random order


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_gives_the_remaining_batches(raw: Path, num_workers: int) -> None:
    batch_size = 5
    ds = _dataset(raw, cameras=[], seed=2)
    ds.set_epoch(3)
    full = _epoch(ds, num_workers, batch_size)
    for cut in sorted({0, 1, 3, len(full) // 2, len(full) - 1, len(full)}):
        resumed = _dataset(raw, cameras=[], seed=2)
        resumed.load_state_dict(ds.state_dict(batches_consumed=cut, batch_size=batch_size))
        assert _epoch(resumed, num_workers, batch_size) == full[cut:], f"cut at batch {cut}"


def test_resume_with_video_and_equal_counts(raw: Path) -> None:
    kw = dict(seed=4, equal_samples_per_rank=True, rank=1, world_size=2)
    ds = _dataset(raw, **kw)
    full = list(DataLoader(ds, batch_size=3, num_workers=2))
    cut = len(full) // 2 + 1
    resumed = _dataset(raw, **kw)
    resumed.load_state_dict({"epoch": 0, "batches_consumed": cut, "batch_size": 3})
    rest = list(DataLoader(resumed, batch_size=3, num_workers=2))
    assert len(rest) == len(full) - cut
    for a, b in zip(full[cut:], rest):
        assert _keys(a) == _keys(b)
        assert torch.equal(a[CAM], b[CAM])
    fast = resumed.stats()["total"]
    assert fast["fast_forward_samples"] > 0


def test_equal_samples_per_rank(raw: Path) -> None:
    counts = []
    for rank in range(3):
        ds = _dataset(raw, cameras=[], rank=rank, world_size=3, equal_samples_per_rank=True)
        n = sum(len(b) for b in _epoch(ds, 2))
        assert n == ds.epoch_samples(2)
        counts.append(n)
    assert len(set(counts)) == 1
    total = sum(_all_frames(raw).values())
    assert total - 6 < sum(counts) <= total


def test_windows_and_frames_match_what_was_asked(raw: Path) -> None:
    deltas = [-2 / FPS, -1 / FPS, 0.0, 1 / FPS]
    ds = _dataset(
        raw,
        delta_timestamps={CAM: deltas, "observation.state": deltas, "action": [0.0, 2 / FPS]},
        episode_pool_size=2,
        seed=9,
    )
    lengths = _lengths(ds)
    checked_edges = set()
    for batch in DataLoader(ds, batch_size=8, num_workers=1):
        for i in range(len(batch["index"])):
            ep, frame = int(batch["episode_index"][i]), int(batch["frame_index"][i])
            n = lengths[ep]
            wanted = np.array([frame - 2, frame - 1, frame, frame + 1])
            expected = np.clip(wanted, 0, n - 1)
            assert batch[f"{CAM}_is_pad"][i].tolist() == (wanted != expected).tolist()
            assert batch["observation.state_is_pad"][i].tolist() == (wanted != expected).tolist()
            video = batch[CAM][i]
            assert video.shape[0] == 4 and video.dtype == torch.float32
            assert [read_identity(f) for f in video] == [(ep, int(x)) for x in expected]
            state = batch["observation.state"][i]
            np.testing.assert_allclose(state[:, 0].numpy(), ep * 1000 + expected)
            act_expected = np.clip([frame, frame + 2], 0, n - 1)
            np.testing.assert_allclose(batch["action"][i][:, 0].numpy(), ep * 1000 + act_expected + 0.5)
            if frame in (0, n - 1):
                checked_edges.add((ep, frame))
    assert len(checked_edges) == 2 * 7  # every episode's first and last frame was checked


def test_sample_keys_match_lerobot(raw: Path) -> None:
    ds = _dataset(raw, delta_timestamps={"action": [0.0, 1 / FPS]}, image_dtype=torch.uint8)
    sample = next(iter(ds))
    assert sample[CAM].shape == (3, 64, 160) and sample[CAM].dtype == torch.uint8
    assert read_identity(sample[CAM]) == (int(sample["episode_index"]), int(sample["frame_index"]))
    for key in ("index", "episode_index", "frame_index", "task_index"):
        assert sample[key].shape == () and sample[key].dtype == torch.int64
    assert sample["timestamp"].shape == () and sample["timestamp"].dtype == torch.float32
    assert torch.isclose(sample["timestamp"], sample["frame_index"].float() / FPS)
    assert sample["action"].shape == (2, 6) and sample["action_is_pad"].dtype == torch.bool
    assert sample["observation.state"].shape == (6,)
    assert sample["task"] == f"task {int(sample['episode_index']) % 2}"


def test_stats_aggregate_across_workers(raw: Path) -> None:
    ds = _dataset(raw, seed=1)
    n = sum(len(b["index"]) for b in DataLoader(ds, batch_size=8, num_workers=2))
    stats = ds.stats()
    assert len(stats["workers"]) == 2
    total = stats["total"]
    assert total["frames_emitted"] == n == total["frames_decoded"]
    assert total["admissions"] == total["evictions"] == 7
    assert total["bytes_read"] > 0 and total["decoder_misses"] >= 1


def test_episode_subset_and_clear_errors(raw: Path) -> None:
    ds = _dataset(raw, cameras=[], episodes=[1, 4])
    assert {e for e, _ in sum(_epoch(ds, 0), [])} == {1, 4}
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\] has 0.01 s.*fps=30"):
        _dataset(raw, delta_timestamps={"action": [0.01]})
    with pytest.raises(ValueError, match=r"unknown keys \['nope'\]"):
        _dataset(raw, delta_timestamps={"nope": [0.0]})
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"video_decode_device='cuda' but torch sees no CUDA device"):
            _dataset(raw, video_decode_device="cuda")
    with pytest.raises(ValueError, match=r"video_decode_device must be 'cpu' or 'cuda'"):
        _dataset(raw, video_decode_device="tpu")
    with pytest.raises(ValueError, match=r"unknown cameras \['observation.images.side'\]"):
        _dataset(raw, cameras=["observation.images.side"])
    with pytest.raises(ValueError, match=r"episodes \[99\] are not in the dataset"):
        _dataset(raw, episodes=[1, 99])
    state = _dataset(raw, seed=1).state_dict(batches_consumed=2, batch_size=4)
    with pytest.raises(ValueError, match=r"saved with seed=1 but this dataset has seed=2"):
        _dataset(raw, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"resume state lacks \['batch_size'\]"):
        _dataset(raw).load_state_dict({"epoch": 0, "batches_consumed": 1})


def test_rank_and_world_size_given_win_and_the_missing_one_is_found(raw: Path, monkeypatch) -> None:
    """A rank given alone is not dropped (it once gave rank 0 of 1, every "rank" reading everything),
    nor overridden by RANK; the world size then comes from WORLD_SIZE."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(
        ValueError, match=r"rank must be in \[0, world_size\): rank=1 \(given\), world_size=1 \(found\)"
    ):
        _dataset(raw, cameras=[], rank=1)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    ds = _dataset(raw, cameras=[], rank=1, equal_samples_per_rank=False)
    assert (ds.rank, ds.world_size) == (1, 4)
    other = _dataset(raw, cameras=[], world_size=8, equal_samples_per_rank=False)
    assert (other.rank, other.world_size) == (3, 8)
    for bad in (True, 0.5, "1"):
        with pytest.raises(ValueError, match=r"^rank must be an int, got"):
            _dataset(raw, cameras=[], rank=bad, world_size=2)
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(ValueError, match=r"environment variable WORLD_SIZE='four' is not an integer"):
        _dataset(raw, cameras=[])


@pytest.mark.filterwarnings("ignore:frames per consumer are uneven")
def test_warns_when_a_consumer_gets_no_shard(raw: Path) -> None:
    ds = _dataset(raw, cameras=[], rank=0, world_size=4, equal_samples_per_rank=False)
    with pytest.warns(UserWarning, match=r"1 of 8 consumers .* get no episode: 7 episodes for 8 consumers"):
        ds.plan(rank=0, worker=0, num_workers=2)
    samples = sum(
        len(b)
        for r in range(4)
        for b in _epoch(_dataset(raw, cameras=[], rank=r, world_size=4, equal_samples_per_rank=False), 2)
    )
    assert samples == sum(_all_frames(raw).values())  # the idle consumer just ends; the others cover all


def test_image_features_decode_like_lerobot(tmp_path: Path) -> None:
    key = "observation.images.wrist"
    root = synth_dataset(tmp_path / "img", num_episodes=2, cameras=(), image_keys=(key,), length_range=(6, 9))
    ds = _dataset(root, delta_timestamps={key: [-1 / FPS, 0.0]})
    for sample in ds:
        ep, frame = int(sample["episode_index"]), int(sample["frame_index"])
        image = sample[key]
        assert image.shape == (2, 3, 64, 160) and image.dtype == torch.float32
        assert [read_identity(f) for f in image] == [(ep, max(frame - 1, 0)), (ep, frame)]
        assert sample[f"{key}_is_pad"].tolist() == [frame == 0, False]


def test_one_shard_keeps_every_worker_busy_and_every_frame_once(raw: Path) -> None:
    """Default shard size: the tiny dataset is one shard, split into episode ranges per worker."""
    ds = EpisodePoolDataset(str(raw), cameras=[], episode_pool_size=3, seed=2)
    assert len(ds.shards) == 1
    assert all(ds.plan(rank=0, worker=w, num_workers=2).num_samples > 0 for w in range(2))
    seen = collections.Counter(k for batch in _epoch(ds, 2) for k in batch)
    assert seen == _all_frames(raw)


def test_persistent_workers_follow_set_epoch(raw: Path) -> None:
    """Persistent workers keep their dataset copy: the epoch must still reach them."""
    ds = _dataset(raw, cameras=[], seed=6)
    loader = DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        epochs.append([k for b in loader for k in _keys(b)])
    fresh = _dataset(raw, cameras=[], seed=6)
    fresh.set_epoch(1)
    assert epochs[1] == [k for b in _epoch(fresh, 2) for k in b]  # what a fresh epoch-1 loader yields
    assert epochs[0] != epochs[1]
    for order in epochs:
        assert collections.Counter(order) == _all_frames(raw)


def test_persistent_workers_follow_load_state_dict(raw: Path) -> None:
    full = _epoch(_dataset(raw, cameras=[], seed=8), 2, batch_size=3)
    ds = _dataset(raw, cameras=[], seed=8)
    loader = DataLoader(ds, batch_size=3, num_workers=2, persistent_workers=True)
    assert [_keys(b) for b in loader] == full  # workers started
    ds.load_state_dict({"epoch": 0, "batches_consumed": 5, "batch_size": 3, "num_workers": 2})
    assert [_keys(b) for b in loader] == full[5:]


def test_windows_set_after_persistent_workers_started_are_refused_not_ignored(raw: Path) -> None:
    """A persistent worker's copy holds the windows it started with: it refuses, naming the cause,
    where it used to emit the old windows; new workers (not persistent) take the new ones."""
    ds = _dataset(raw, cameras=[], seed=6)
    loader = DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    assert next(iter(loader))["action"].shape == (4, 6)  # no window: one step of 6 values
    ds.set_delta_timestamps({"action": [0.0, 1 / FPS]}, 1e-4)
    ds.set_epoch(1)
    with pytest.raises(RuntimeError, match="delta_timestamps were set after this DataLoader's persistent workers"):
        next(iter(loader))
    fresh = DataLoader(ds, batch_size=4, num_workers=2)
    assert next(iter(fresh))["action"].shape == (4, 2, 6)
    assert next(iter(DataLoader(ds, batch_size=4)))["action"].shape == (4, 2, 6)


def test_resume_state_records_workers_and_resumes_under_another_count(raw: Path) -> None:
    ds = _dataset(raw, cameras=[], seed=9)
    assert "num_workers" not in ds.state_dict(batches_consumed=0, batch_size=4)  # nothing ran yet
    full = _epoch(ds, 2)
    state = ds.state_dict(batches_consumed=3, batch_size=4)
    assert state["num_workers"] == 2
    resumed = _dataset(raw, cameras=[], seed=9)
    resumed.load_state_dict(state)
    rest = _epoch(resumed, 1)  # elastic: the rest of the epoch on one worker
    assert collections.Counter(k for b in full[:3] + rest for k in b) == _all_frames(raw)
    unrecorded = _dataset(raw, cameras=[], seed=9)
    with pytest.raises(ValueError, match=r"saved with world_size=2 but this dataset has world_size=1"):
        unrecorded.load_state_dict({"epoch": 0, "batches_consumed": 1, "batch_size": 4, "world_size": 2})
    single = _dataset(raw, cameras=[], seed=9)
    _epoch(single, 0)
    state = single.state_dict(batches_consumed=2, batch_size=4)
    assert state["num_workers"] == 0
    again = _dataset(raw, cameras=[], seed=9)
    again.load_state_dict(state)
    single.set_epoch(0)  # its epoch 0 again (a pass without set_epoch is the next epoch)
    assert _epoch(again, 1) == _epoch(single, 0)[2:]  # 0 and 1 workers make the same single stream


def test_fewer_episodes_than_ranks_in_equal_count_mode_fail_when_the_dataset_is_built(raw: Path) -> None:
    episodes = _dataset(raw, cameras=[]).num_episodes
    with pytest.raises(ValueError, match=rf"{episodes} episodes cannot give each of the {episodes + 1} consumers"):
        _dataset(raw, cameras=[], rank=0, world_size=episodes + 1)
    _dataset(raw, cameras=[], rank=0, world_size=episodes + 1, equal_samples_per_rank=False)  # exactly once: fine


def test_default_equal_counts_only_for_several_ranks(raw: Path) -> None:
    assert _dataset(raw, cameras=[]).equal_samples_per_rank is False
    ranks = [_dataset(raw, cameras=[], rank=r, world_size=2) for r in range(2)]
    assert all(ds.equal_samples_per_rank for ds in ranks)
    counts = [len(_epoch(ds, 2)) for ds in ranks]
    assert counts[0] == counts[1]


def test_resume_state_records_the_pool_and_the_sampler_order(raw: Path) -> None:
    """Both shape the emission order: a state saved under another one would replay other samples."""
    state = _dataset(raw, cameras=[], seed=9).state_dict(batches_consumed=2, batch_size=4)
    assert state["episode_pool_size"] == 3 and state["sampler_order"] == 2
    with pytest.raises(ValueError, match=r"saved with episode_pool_size=3 but this dataset has episode_pool_size=2"):
        _dataset(raw, cameras=[], seed=9, episode_pool_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"sampler_order=1 .* another lerobot-shards version"):
        _dataset(raw, cameras=[], seed=9).load_state_dict({**state, "sampler_order": 1})
    _dataset(raw, cameras=[], seed=9).load_state_dict({"epoch": 0, "batches_consumed": 2, "batch_size": 4})  # minimal
