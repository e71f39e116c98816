"""Peak RSS per consumer with and without a memory budget (``memory_budget_bytes``).

Synthetic 2-camera 480p AV1 episodes of 3,000 frames at real-footage weight (~21 KB per frame
and camera, about 125 MB per episode), converted one episode per shard; the dataset is built once
and cached under ``data/``. Each case runs in a fresh process: the loader with 0 or 2 DataLoader
workers, no budget (the pool and read-ahead of 16 episodes as before) or the given one, for
``--samples`` samples per consumer (more than one episode's frames, so a budgeted pool turns over
at least once). Per consumer: the peak RSS (``ru_maxrss``, the kernel's high-water mark: the main
process at 0 workers, the largest worker at 2, from ``RUSAGE_CHILDREN`` once they exited), its
RSS before iterating (after the dataset was built, or at the worker's start), the episode bytes it
held at most (``resident_bytes_peak``) and the budget's own estimate. Cases alternate within
each round. Not a test: figures only.

    python benchmarks/memory_budget.py [--episodes 12] [--budget-mib 1024] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

CAMERAS = ("observation.images.front", "observation.images.top")
LENGTH = 3000
DATA = Path(__file__).resolve().parents[1] / "data"


def build(episodes: int) -> Path:
    """The cached dataset (raw, then converted one episode per shard)."""
    from lerobot_shards.convert.plan import ConvertOptions
    from lerobot_shards.convert.run import convert_dataset
    from lerobot_shards.synth import synth_dataset

    raw = DATA / f"memory-480p-{episodes}x{LENGTH}"
    shards = raw.with_name(raw.name + "-shards")
    if not (raw / "meta/info.json").exists():
        synth_dataset(
            raw,
            num_episodes=episodes,
            cameras=CAMERAS,
            height=480,
            width=640,
            codec="av1",
            texture="realistic",
            length_range=(LENGTH, LENGTH),
            frame_bits=12,
        )
    if not (shards / "manifest.json").exists():
        convert_dataset(raw, shards, ConvertOptions(episodes_per_shard=1))
    return shards


def case(root: Path, workers: int, budget: int | None, samples: int) -> dict[str, float]:
    """One consumer layout in this process (run through ``--case``)."""
    import multiprocessing

    import psutil
    from torch.utils.data import DataLoader

    from lerobot_shards.loader import EpisodePoolDataset

    ds = EpisodePoolDataset(str(root), seed=0, memory_budget_bytes=budget)
    starts = multiprocessing.Array("d", max(1, workers), lock=False)

    def started(worker: int) -> None:
        starts[worker] = psutil.Process().memory_info().rss

    loader = DataLoader(
        ds,
        batch_size=8,
        num_workers=workers,
        worker_init_fn=started if workers else None,
        multiprocessing_context="fork" if workers else None,
    )
    before = psutil.Process().memory_info().rss
    wall, cpu = time.perf_counter(), time.process_time()
    n = 0
    for batch in loader:
        n += len(batch["index"])
        if n >= samples * max(1, workers):
            break
    del loader  # its workers exit: their peak joins RUSAGE_CHILDREN
    elapsed = time.perf_counter() - wall
    who = resource.RUSAGE_CHILDREN if workers else resource.RUSAGE_SELF
    total = ds.stats()["total"]
    return {
        "samples": n,
        "pool": ds.memory.pool,
        "prefetch": ds.memory.prefetch,
        "budget_mib": round(ds.memory.budget / 2**20, 1),
        "estimate_mib": round(ds.memory.estimate / 2**20, 1),
        "held_peak_mib": round(total["resident_bytes_peak"] / 2**20, 1),
        "rss_before_mib": round((max(starts) if workers else before) / 2**20, 1),
        "rss_peak_mib": round(resource.getrusage(who).ru_maxrss / 2**10, 1),
        "samples_per_s": round(n / elapsed, 1),
        "cpu_ms_per_sample": round(1000 * (time.process_time() - cpu) / n, 2) if not workers else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=12)
    parser.add_argument("--budget-mib", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=4000, help="samples per consumer")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results/memory"))
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--case", nargs=4, metavar=("ROOT", "WORKERS", "BUDGET", "SAMPLES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        root, workers, budget, samples = args.case
        row = case(Path(root), int(workers), None if budget == "none" else int(budget), int(samples))
        print(json.dumps(row))
        return
    root = build(args.episodes)
    if args.build_only:
        return
    budget = args.budget_mib << 20
    cases = [(w, b) for w in (0, 2) for b in (None, budget)]
    rows: dict[str, list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for workers, b in cases:
            name = f"w{workers}, {'no budget' if b is None else f'budget {args.budget_mib} MiB'}"
            load = os.getloadavg()[0]
            done = subprocess.run(
                [sys.executable, __file__, "--case", str(root), str(workers), str(b or "none"), str(args.samples)],
                capture_output=True,
                text=True,
                check=True,
            )
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["load_avg_1m"] = round(load, 2)
            rows.setdefault(name, []).append(row)
            print(name, row, flush=True)
    result = {
        "dataset": f"{args.episodes} episodes x {LENGTH} frames, 2 cameras 480x640 AV1 (synth, realistic texture), "
        "one episode per shard",
        "episode_mib": round(max(p.stat().st_size for p in (root / "shards").glob("*.tar")) / 2**20, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared (load average per case)",
        "cases": {name: runs[-1] for name, runs in rows.items()},
        "rounds": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory_budget.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "| case | pool / read-ahead | budget MiB | estimate MiB | episode bytes held MiB | RSS before MiB | "
        "peak RSS MiB | above start MiB | samples/s | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["cases"].items():
        lines.append(
            f"| {name} | {r['pool']} / {r['prefetch']} | {r['budget_mib']} | {r['estimate_mib']} | "
            f"{r['held_peak_mib']} | {r['rss_before_mib']} | {r['rss_peak_mib']} | "
            f"{round(r['rss_peak_mib'] - r['rss_before_mib'], 1)} | {r['samples_per_s']} | "
            f"{r['load_avg_1m']} |"
        )
    (out / "summary.md").write_text(
        f"# Peak RSS per consumer\n\n{result['dataset']} ({result['episode_mib']} MiB per episode); "
        f"{args.samples} samples per consumer; {result['machine']}.\n\n" + "\n".join(lines) + "\n"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
