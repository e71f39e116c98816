"""Resume cost: fast-forwarding to batch K against producing the first K batches.

    .venv/bin/python benchmarks/loader/bench_resume.py [--dataset DIR] [--workers 2] [--batch-size 16]

Converts the dataset (default: a synthetic one) and, for several cut points K, measures the
time to produce batches 0..K-1 from the start of an epoch and the time from a fresh
``load_state_dict({epoch, batches_consumed: K, batch_size})`` to the first resumed batch
(workers start, replay the sampling order on tables only, read the resident episodes, decode
one batch). It also checks that the resumed batch is the one the uninterrupted run produced.
Writes results/resume.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.synth import synth_dataset

RESULTS = Path(__file__).resolve().parent / "results"


def _keys(batch: dict) -> list[tuple[int, int]]:
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", help="a LeRobot v3.0 dataset (default: synthesize one)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--pool-size", type=int, default=8)
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        source = (
            Path(args.dataset)
            if args.dataset
            else synth_dataset(
                Path(tmp) / "src",
                num_episodes=24,
                height=120,
                width=160,
                length_range=(100, 200),
                episodes_per_video_file=6,
                episodes_per_data_file=6,
            )
        )
        convert_dataset(source, Path(tmp) / "out", ConvertOptions(episodes_per_shard=2), progress=False)

        def dataset() -> EpisodePoolDataset:
            return EpisodePoolDataset(
                str(Path(tmp) / "out"), episode_pool_size=args.pool_size, seed=0, image_dtype=torch.uint8
            )

        ds = dataset()
        times, keys = [], []
        start = time.perf_counter()
        for batch in DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers):
            keys.append(_keys(batch))
            times.append(time.perf_counter() - start)
        total = len(keys)
        rows = []
        for cut in (total // 4, total // 2, 3 * total // 4, total - 1):
            resumed = dataset()
            resumed.load_state_dict(ds.state_dict(batches_consumed=cut, batch_size=args.batch_size))
            t0 = time.perf_counter()
            first = next(iter(DataLoader(resumed, batch_size=args.batch_size, num_workers=args.workers)))
            resume_s = time.perf_counter() - t0
            rows.append(
                {
                    "batches_consumed": cut,
                    "produce_s": times[cut - 1],
                    "resume_to_first_batch_s": resume_s,
                    "first_batch_from_start_s": times[0],
                    "ratio": resume_s / times[cut - 1],
                    "same_batch": _keys(first) == keys[cut],
                }
            )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "resume.json").write_text(
        json.dumps({"args": vars(args), "epoch_batches": total, "rows": rows}, indent=1)
    )
    lines = [
        f"# Resume cost ({args.workers} workers, batch {args.batch_size}, pool {args.pool_size}, "
        f"{total} batches per epoch)",
        "",
        "| resume at batch | producing batches 0..K-1 (s) | resume to first batch (s) | ratio | first batch of a fresh epoch (s) | same batch |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batches_consumed']} | {r['produce_s']:.2f} | {r['resume_to_first_batch_s']:.2f} | "
            f"{r['ratio']:.2f} | {r['first_batch_from_start_s']:.2f} | {r['same_batch']} |"
        )
    (RESULTS / "resume.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
