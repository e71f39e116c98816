"""The node-sticky partition (``partition="node"``): each node reads the same part of the dataset
every epoch, dealt anew to its ranks and workers, every frame once per epoch, with exact and
elastic resume. Ranks are simulated (``rank=``, ``world_size=``, ``local_world_size=``) as in
test_elastic; DataLoader workers are real."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from lerobot_shards.cpus import local_world_size
from lerobot_shards.loader import EpisodePoolDataset, MixtureDataset
from lerobot_shards.loader.mix.spec import Mixture, MixtureSource
from lerobot_shards.loader.plan.partition import Consumer, PlanOptions, ShardSpec, node_parts, plan_consumer
from lerobot_shards.synth import read_identity, synth_dataset

CAM = "observation.images.front"
BATCH = 3
WORLD, LOCAL, WORKERS = 4, 2, 2  # two nodes of two ranks, two DataLoader workers each

Key = tuple[int, int]


def _shards(n: int = 12) -> list[ShardSpec]:
    return [ShardSpec(i, (3 * i, 3 * i + 1, 3 * i + 2), (20 + i, 17 + 2 * i, 30 - i)) for i in range(n)]


def _plans(shards, epoch: int, options: PlanOptions, world: int = WORLD, workers: int = WORKERS):
    return [
        plan_consumer(shards, seed=7, epoch=epoch, consumer=Consumer(r, world, w, workers), options=options)
        for r in range(world)
        for w in range(workers)
    ]


@pytest.mark.parametrize("equal", [False, True])
def test_each_node_reads_the_same_part_every_epoch_shuffled_within(equal: bool) -> None:
    shards = _shards()
    options = PlanOptions(equal_samples_per_rank=equal, nodes=WORLD // LOCAL)
    per_node = LOCAL * WORKERS
    parts, layouts = [], []
    for epoch in range(4):
        plans = _plans(shards, epoch, options)
        episodes = [e for p in plans for _, e in p.episodes]
        assert sorted(episodes) == sorted(e for s in shards for e in s.episodes)  # every episode once
        if equal:
            assert len({p.num_samples for p in plans}) == 1
        else:
            assert sum(p.num_samples for p in plans) == sum(s.frames for s in shards)
        parts.append([frozenset(e for p in plans[n : n + per_node] for _, e in p.episodes) for n in (0, per_node)])
        layouts.append([p.episodes for p in plans])
    assert all(p == parts[0] for p in parts)  # the node's part never changes
    assert parts[0][0] and parts[0][1] and not parts[0][0] & parts[0][1]
    assert len({tuple(x) for x in layouts}) == 4  # which rank and worker reads which episode changes
    assert _plans(shards, 2, options) == _plans(shards, 2, options)  # a pure function


def test_one_node_is_the_global_partition() -> None:
    shards = _shards()
    assert _plans(shards, 3, PlanOptions(nodes=1)) == _plans(shards, 3, PlanOptions())


def test_node_parts_hold_no_epoch_and_balance_frames() -> None:
    shards = _shards(10)
    parts = node_parts(shards, 3, seed=7)
    loads = [sum(s.frames for s in part) for part in parts]
    assert sorted(e for part in parts for s in part for e in s.episodes) == list(range(30))
    assert max(loads) - min(loads) <= max(n for s in shards for n in s.lengths)
    assert node_parts(shards, 3, seed=8) != parts


def test_a_world_size_the_nodes_do_not_divide_is_named() -> None:
    with pytest.raises(ValueError, match="world_size divisible by the node count: 3 ranks on 2 nodes"):
        plan_consumer(_shards(), seed=0, epoch=0, consumer=Consumer(0, 3, 0, 1), options=PlanOptions(nodes=2))


# -- on a real dataset, with real DataLoader workers ---------------------------------------------


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """12 episodes in 6 virtual shards, one camera with identity painted."""
    return synth_dataset(
        tmp_path_factory.mktemp("node") / "ds",
        num_episodes=12,
        cameras=(CAM,),
        height=64,
        width=64,
        length_range=(6, 14),
        episodes_per_video_file=4,
        episodes_per_data_file=4,
        seed=3,
    )


def _dataset(root: Path, rank: int, world: int = WORLD, local: int | None = LOCAL, **kwargs) -> EpisodePoolDataset:
    kwargs.setdefault("cameras", [])
    kwargs.setdefault("equal_samples_per_rank", False)
    return EpisodePoolDataset(
        str(root),
        episodes_per_shard=2,
        episode_pool_size=2,
        seed=4,
        rank=rank,
        world_size=world,
        local_world_size=local,
        partition="node",
        **kwargs,
    )


def _batches(ds: EpisodePoolDataset, workers: int, pixels: bool = False) -> list[list[Key]]:
    out = []
    for batch in DataLoader(ds, batch_size=BATCH, num_workers=workers):
        keys = list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist()))
        if pixels:
            assert [read_identity(image) for image in batch[CAM]] == keys
        out.append(keys)
    return out


def _all_frames(root: Path) -> collections.Counter:
    ds = EpisodePoolDataset(str(root), episodes_per_shard=2, cameras=[])
    return collections.Counter((e, f) for s in ds.shards for e, n in zip(s.episodes, s.lengths) for f in range(n))


def test_real_workers_cover_each_epoch_once_nodes_keep_their_episodes(raw: Path) -> None:
    node_episodes, rank_batches = [], []
    for epoch in range(2):
        seen: collections.Counter = collections.Counter()
        nodes: list[set[int]] = [set(), set()]
        ranks = []
        for rank in range(WORLD):
            ds = _dataset(raw, rank, cameras=[CAM] if rank == 0 else [])
            ds.set_epoch(epoch)
            batches = _batches(ds, WORKERS, pixels=rank == 0)
            keys = [k for b in batches for k in b]
            seen.update(keys)
            nodes[rank // LOCAL].update(e for e, _ in keys)
            ranks.append(batches)
        assert seen == _all_frames(raw)  # every frame of the epoch exactly once over all ranks and workers
        node_episodes.append(nodes)
        rank_batches.append(ranks)
    assert node_episodes[0] == node_episodes[1]
    assert not node_episodes[0][0] & node_episodes[0][1]
    for rank in range(WORLD):  # the node's part again, in another order on each rank
        assert rank_batches[0][rank] != rank_batches[1][rank]


def _interrupted(root: Path, cut: int) -> tuple[collections.Counter, dict, list[list[list[Key]]]]:
    seen: collections.Counter = collections.Counter()
    full = []
    for rank in range(WORLD):
        ds = _dataset(root, rank)
        batches = _batches(ds, WORKERS)
        assert cut < len(batches)
        seen.update(k for b in batches[:cut] for k in b)
        full.append(batches)
        state = ds.state_dict(batches_consumed=cut, batch_size=BATCH)
    return seen, state, full


def test_resume_replays_the_rest_of_the_epoch_exactly(raw: Path) -> None:
    _, state, full = _interrupted(raw, 2)
    assert state["nodes"] == WORLD // LOCAL
    for rank in range(WORLD):
        ds = _dataset(raw, rank)
        ds.load_state_dict(state)
        assert _batches(ds, WORKERS) == full[rank][2:]


@pytest.mark.parametrize("world, local, workers", [(2, 1, 1), (6, 3, 1), (2, 1, 3)])
def test_elastic_resume_on_as_many_nodes_covers_the_epoch_once(raw: Path, world: int, local: int, workers: int) -> None:
    before, state, _ = _interrupted(raw, 2)
    after: collections.Counter = collections.Counter()
    for rank in range(world):
        ds = _dataset(raw, rank, world, local, cameras=[CAM])
        ds.load_state_dict(state)
        keys = [k for b in _batches(ds, workers, pixels=True) for k in b]
        part = node_parts(ds.shards, 2, seed=4)[rank // local]  # the rest of a node's part stays on the node
        assert {e for e, _ in keys} <= {e for s in part for e in s.episodes}
        after.update(keys)
    assert before + after == _all_frames(raw)


def test_a_resume_on_another_node_count_is_refused_in_one_line(raw: Path) -> None:
    _, state, _ = _interrupted(raw, 1)
    ds = _dataset(raw, 0, WORLD, 1)  # four nodes of one rank
    with pytest.raises(ValueError, match=r"saved with nodes=2 but this dataset has nodes=4.*resume on as many nodes"):
        ds.load_state_dict(state)


def test_a_global_state_without_nodes_still_resumes(raw: Path) -> None:
    ds = EpisodePoolDataset(str(raw), episodes_per_shard=2, cameras=[], seed=4)
    state = ds.state_dict(batches_consumed=0, batch_size=BATCH)
    assert state["nodes"] == 1
    del state["nodes"]  # as saved before node-sticky partitions: its digest leaves nodes=1 out
    EpisodePoolDataset(str(raw), episodes_per_shard=2, cameras=[], seed=4).load_state_dict(state)


def test_local_world_size_that_does_not_divide_the_world_is_named(raw: Path) -> None:
    with pytest.raises(ValueError, match=r"local_world_size ranks, but 3 \(given\) does not divide world_size=4"):
        _dataset(raw, 0, 4, 3)


SLURM = ("SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "LOCAL_WORLD_SIZE")


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, None),
        ({"LOCAL_WORLD_SIZE": "4", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "2"}, (4, "LOCAL_WORLD_SIZE")),
        ({"SLURM_NTASKS_PER_NODE": "2"}, None),  # a batch script, not a task srun started
        ({"SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2"}, (2, "SLURM_NTASKS_PER_NODE")),
        (
            {
                "SLURM_LOCALID": "0",
                "SLURM_NODEID": "3",
                "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
                "SLURM_NTASKS_PER_NODE": "2",
            },
            (1, "SLURM_STEP_TASKS_PER_NODE"),
        ),
        (  # counted, not expanded into a list of 10**11 entries (minutes, then a MemoryError)
            {"SLURM_LOCALID": "0", "SLURM_NODEID": "5", "SLURM_STEP_TASKS_PER_NODE": "4(x99999999999),2"},
            (4, "SLURM_STEP_TASKS_PER_NODE"),
        ),
        (
            {"SLURM_LOCALID": "0", "SLURM_NODEID": "2", "SLURM_STEP_TASKS_PER_NODE": "3,2(x1)"},
            (2, "SLURM_STEP_TASKS_PER_NODE"),
        ),
        (
            {"SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "3,2(x1)"},
            (3, "SLURM_STEP_TASKS_PER_NODE"),
        ),
    ],
)
def test_the_ranks_per_node_come_from_torchrun_or_an_srun_task(
    env: dict[str, str], want: tuple[int, str] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in SLURM:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert local_world_size() == want


def test_srun_tasks_group_ranks_into_nodes_and_a_bad_count_is_named(raw: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SLURM:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
    assert _dataset(raw, 0, 4, None).epoch_order.nodes == 2
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "3")
    with pytest.raises(ValueError, match=r"but 3 \(SLURM_NTASKS_PER_NODE\) does not divide world_size=4"):
        _dataset(raw, 0, 4, None)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "two")
    with pytest.raises(ValueError, match=r"environment variable SLURM_NTASKS_PER_NODE='two' is not a count of ranks"):
        _dataset(raw, 0, 4, None)


def test_a_mixture_refuses_the_node_partition_in_one_line(raw: Path) -> None:
    mix = Mixture([MixtureSource(str(raw), name="a", repeat=1)])
    with pytest.raises(ValueError, match=r"MixtureDataset: partition='node' is not supported for mixtures yet"):
        MixtureDataset(mix, partition="node")
