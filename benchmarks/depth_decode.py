"""Depth-map samples: LeRobot 0.6.1's ``LeRobotDataset`` against ``EpisodePoolDataset`` (raw and converted).

Runs inside the LeRobot environment (tests/lerobot/env.sh), from the repository root::

    PYTHONPATH=$PWD/src bash tests/lerobot/env.sh run $PWD -- benchmarks/depth_decode.py [--frames N]

The data: a dataset recorded through LeRobot's own writer (one 480x640 depth camera, 12-bit
gray12le HEVC as LeRobot encodes depth: lossless x265, g=2, with B-frames), 4 episodes, and its
conversion (LeRobot's B-frames cannot be cut by stream copy: its clips are re-encoded losslessly
without them). Each sample is the depth camera's frame and a 3-frame window (``delta_timestamps``
-0.1, 0, 0.1 s), as float32 mm. In each round the three cases run one after the other (LeRobot's
dataset in a random order of indices, ours in its own shuffled order, no DataLoader workers, one
decode thread), and report wall ms and CPU ms (this process) per sample; the load average is
recorded with each round, since the machine is shared. Writes ``benchmarks/results/depth/depth_decode.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data/depth-decode"
OUT = REPO / "benchmarks/results/depth/depth_decode.json"
DEPTH = "observation.images.depth"
DELTAS = {DEPTH: [-0.1, 0.0, 0.1]}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def build(frames: int) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from lerobot_shards.convert.run import convert_dataset

    if (DATA / "shards/manifest.json").exists():
        return
    features = {
        DEPTH: {"dtype": "video", "shape": (480, 640, 1), "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (2,), "names": ["a", "b"]},
    }
    features[DEPTH]["info"] = {"is_depth_map": True}
    ds = LeRobotDataset.create("local/depth-bench", fps=30, features=features, root=DATA / "raw", use_videos=True)
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:480, 0:640].astype(np.float32)
    for ep in range(4):
        for i in range(frames):
            depth = 0.3 + 0.004 * x + 0.003 * y + 0.05 * i + rng.normal(0, 0.01, (480, 640)).astype(np.float32)
            ds.add_frame({DEPTH: depth[..., None], "observation.state": np.array([ep, i], np.float32), "task": "t"})
        ds.save_episode()
    ds.finalize()
    convert_dataset(DATA / "raw", DATA / "shards", progress=False)


def lerobot_case(n: int, seed: int) -> tuple[float, float]:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/depth-bench", root=DATA / "raw", delta_timestamps=DELTAS, return_uint8=True)
    order = random.Random(seed).sample(range(len(ds)), min(n, len(ds)))
    start, cpu = time.perf_counter(), _cpu()
    for i in order:
        ds[i][DEPTH].sum()
    return (time.perf_counter() - start) / len(order), (_cpu() - cpu) / len(order)


def ours_case(source: str, n: int, seed: int) -> tuple[float, float]:
    from lerobot_shards.loader import EpisodePoolDataset

    ds = EpisodePoolDataset(str(DATA / source), delta_timestamps=DELTAS, seed=seed, decode_threads=0)
    start, cpu, count = time.perf_counter(), _cpu(), 0
    for sample in ds:
        sample[DEPTH].sum()
        count += 1
        if count == n:
            break
    return (time.perf_counter() - start) / count, (_cpu() - cpu) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=60, help="frames per episode")
    parser.add_argument("--samples", type=int, default=120, help="samples per case and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    build(args.frames)
    rounds = []
    for r in range(args.rounds):
        row = {"round": r, "load_average": os.getloadavg()}
        row["lerobot"] = lerobot_case(args.samples, r)
        row["ours_raw"] = ours_case("raw", args.samples, r)
        row["ours_shards"] = ours_case("shards", args.samples, r)
        rounds.append(row)
        print(json.dumps(row))
    summary = {}
    for case in ("lerobot", "ours_raw", "ours_shards"):
        wall = float(np.median([row[case][0] for row in rounds])) * 1e3
        cpu = float(np.median([row[case][1] for row in rounds])) * 1e3
        summary[case] = {"wall_ms_per_sample": round(wall, 2), "cpu_ms_per_sample": round(cpu, 2)}
    for case in ("ours_raw", "ours_shards"):
        summary[case]["wall_ratio_to_lerobot"] = round(
            summary["lerobot"]["wall_ms_per_sample"] / summary[case]["wall_ms_per_sample"], 2
        )
    result = {"settings": vars(args), "rounds": rounds, "median": summary}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
