"""How many cores each rank counts under real launchers on this machine (``cpus.cores_per_rank``).

Decode threads and the trainer's worker count are sized by a rank's share of the cores: its
launcher's cores split among the ``LOCAL_WORLD_SIZE`` ranks it started, never more than the rank's
own CPU mask. This runs real launchers (a plain process, ``taskset``, ``torchrun`` on the whole
machine and inside a ``taskset`` half of it, as in a partial SLURM allocation) and reports, per
rank, what it counted in its own process and in a DataLoader worker, beside what it should be.
Meaningful from 4 cores up (on 2 every share rounds to 1 or 2).

    python benchmarks/rank_cores.py [OUT.json]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, os
import torch
from torch.utils.data import DataLoader, IterableDataset
from lerobot_shards.loader.decoding.decoders import auto_decode_threads
from lerobot_shards.cpus import cores_per_rank

class Ask(IterableDataset):
    def __init__(self):
        self.cores = cores_per_rank()  # counted in the rank, as EpisodePoolDataset does

    def __iter__(self):
        yield self.cores, auto_decode_threads("cpu", self.cores)

if __name__ == "__main__":
    [(worker_cores, worker_threads)] = [tuple(int(x) for x in b) for b in DataLoader(Ask(), num_workers=2, batch_size=None)][:1]
    print("PROBE " + json.dumps({
        "rank": int(os.environ.get("RANK", 0)),
        "local_world_size": os.environ.get("LOCAL_WORLD_SIZE"),
        "mask": len(os.sched_getaffinity(0)),
        "cores_per_rank": cores_per_rank(),
        "decode_threads_main": auto_decode_threads("cpu"),
        "worker_cores_per_rank": worker_cores,
        "decode_threads_worker_of_2": worker_threads,
    }), flush=True)
"""


def _run(cmd: list[str], probe: Path) -> list[dict]:
    out = subprocess.run([*cmd, str(probe)], capture_output=True, text=True, timeout=300)
    rows = [json.loads(line[6:]) for line in out.stdout.splitlines() if line.startswith("PROBE ")]
    if out.returncode or not rows:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr[-2000:]}")
    return sorted(rows, key=lambda r: r["rank"])


def main() -> None:
    n = len(os.sched_getaffinity(0))
    half = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[: max(1, n // 2)])
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    taskset = shutil.which("taskset")
    scenarios = [("one process", [sys.executable], n)]
    if taskset:
        scenarios.append(("one process, taskset half", [taskset, "-c", half, sys.executable], max(1, n // 2)))
    scenarios.append(("torchrun 2 ranks", torchrun, max(1, n // 2)))
    if taskset:
        scenarios.append(("torchrun 2 ranks inside taskset half", [taskset, "-c", half, *torchrun], max(1, n // 4)))
    out_path = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"rank_cores_probe_{os.getpid()}.py"
    probe.write_text(PROBE)
    results = []
    try:
        for name, cmd, want in scenarios:
            for row in _run(cmd, probe):
                row.update(
                    scenario=name, expected=want, ok=row["cores_per_rank"] == row["worker_cores_per_rank"] == want
                )
                results.append(row)
                print(
                    f"{name:40s} rank {row['rank']}: mask {row['mask']:3d}, counts {row['cores_per_rank']:3d} "
                    f"(worker {row['worker_cores_per_rank']:3d}), expected {want:3d}; decode threads "
                    f"{row['decode_threads_main']} in the rank, {row['decode_threads_worker_of_2']} per worker of 2"
                    f"  {'ok' if row['ok'] else 'WRONG'}",
                    flush=True,
                )
    finally:
        probe.unlink(missing_ok=True)
    summary = {"cpus": n, "rows": results, "all_ok": all(r["ok"] for r in results)}
    if out_path is not None:
        out_path.write_text(json.dumps(summary, indent=1))
    print("all ok" if summary["all_ok"] else "SOME WRONG")


if __name__ == "__main__":
    main()
