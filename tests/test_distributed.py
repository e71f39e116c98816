"""Real multi-rank runs: gloo process group on CPU, ranks taken from torch.distributed."""

from __future__ import annotations

import collections
import datetime
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.synth import synth_dataset

WORLD = 2
BATCH = 4


def _run_rank(rank: int, root: str, init_file: str, out_dir: str, resume_at: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        kwargs = dict(cameras=[], episodes_per_shard=1, episode_pool_size=2, seed=7, equal_samples_per_rank=True)
        ds = EpisodePoolDataset(root, **kwargs)
        assert (ds.rank, ds.world_size) == (rank, WORLD)
        batches = []
        for batch in DataLoader(ds, batch_size=BATCH, num_workers=2):
            # A collective per step, as DDP does: unequal batch counts across ranks would hang here.
            dist.all_reduce(torch.ones(1))
            batches.append(list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist())))
        state = ds.state_dict(batches_consumed=resume_at, batch_size=BATCH)  # one state for all ranks
        resumed = EpisodePoolDataset(root, **kwargs)
        resumed.load_state_dict(state)
        rest = [
            list(zip(b["episode_index"].tolist(), b["frame_index"].tolist()))
            for b in DataLoader(resumed, batch_size=BATCH, num_workers=2)
        ]
        gathered: list = [None] * WORLD
        dist.all_gather_object(gathered, {"batches": batches, "rest": rest})
        if rank == 0:
            Path(out_dir, "result.json").write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_gloo_cover_exactly_once_equal_batches_and_resume(tmp_path: Path) -> None:
    root = synth_dataset(tmp_path / "ds", num_episodes=6, cameras=(), length_range=(10, 25), seed=1)
    resume_at = 3
    mp.start_processes(
        _run_rank,
        args=(str(root), str(tmp_path / "init"), str(tmp_path), resume_at),
        nprocs=WORLD,
        start_method="spawn",
        join=True,
    )
    results = json.loads((tmp_path / "result.json").read_text())
    counts = [len(r["batches"]) for r in results]
    assert counts[0] == counts[1] > resume_at
    for r in results:
        assert r["rest"] == r["batches"][resume_at:]
    per_rank = [collections.Counter(tuple(k) for b in r["batches"] for k in b) for r in results]
    assert not set(per_rank[0]) & set(per_rank[1])  # disjoint shards: no frame on two ranks
    total = json.loads((root / "meta/info.json").read_text())["total_frames"]
    consumers = WORLD * 2
    # Equal-count mode: every consumer yields total // consumers (a few frames dropped or repeated).
    assert sum(sum(c.values()) for c in per_rank) == consumers * (total // consumers)


def _run_rank_defaults(rank: int, root: str, init_file: str, out_dir: str) -> None:
    # A gloo timeout turns a hang (one rank waiting in all_reduce for a rank that has finished)
    # into an error, so the test fails instead of hanging.
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD, timeout=timeout)
    try:
        ds = EpisodePoolDataset(root, cameras=[], episodes_per_shard=1)  # default settings
        steps = 0
        for _ in DataLoader(ds, batch_size=BATCH, num_workers=2):
            dist.all_reduce(torch.ones(1))
            steps += 1
        dist.barrier()
        Path(out_dir, f"steps-{rank}.json").write_text(json.dumps(steps))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_default_settings_with_uneven_shards_do_not_hang_ddp(tmp_path: Path) -> None:
    # Episodes of 5 to 60 frames, one per shard: frame totals per consumer differ widely.
    root = synth_dataset(tmp_path / "ds", num_episodes=5, cameras=(), length_range=(5, 60), seed=4)
    mp.start_processes(
        _run_rank_defaults,
        args=(str(root), str(tmp_path / "init"), str(tmp_path)),
        nprocs=WORLD,
        start_method="spawn",
        join=True,
    )
    steps = [json.loads((tmp_path / f"steps-{r}.json").read_text()) for r in range(WORLD)]
    assert steps[0] == steps[1] > 0
