"""LeRobot baseline: LeRobot's own map-style LeRobotDataset + a plain shuffled DataLoader.

Run by the python of a SEPARATE venv holding lerobot 0.4.4 (see setup_lerobot_venv.sh), never by
ours: lerobot is not a dependency of lerobot-shards. ``bench_loader.py`` starts it as a subprocess
and reads the JSON object it prints as its last stdout line.

Offline: LeRobotDataset(repo_id, root=...) loads a local folder without the hub as long as
meta/, data/ and videos/ are complete (it only calls the hub when a file is missing); we set
HF_HUB_OFFLINE=1 anyway so a missing file fails fast instead of hanging.

For each worker count: time to build the DataLoader iterator and get the first batch, samples/s
over the epoch (or ``--max-samples``), RSS per worker (memwatch). Then, in the main process and
only after all DataLoader workers are gone (LeRobot keeps a process-global decoder cache that
must not be forked), it saves ``dataset[0]`` with ``torch.save`` for the compatibility check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memwatch import RssMonitor  # noqa: E402
from sample_shape import describe  # noqa: E402


def _clear_decoder_cache() -> None:
    """LeRobot caches decoders (and open files) process-wide; forked workers would share them."""
    try:
        from lerobot.datasets import video_utils

        cache = getattr(video_utils, "_default_decoder_cache", None)
        if cache is not None:
            cache.clear()
    except Exception:  # noqa: BLE001 - older/newer LeRobot without the cache
        pass


def run_one(ds, workers: int, batch_size: int, seed: int, max_samples: int | None) -> dict:
    import torch
    from torch.utils.data import DataLoader

    gen = torch.Generator()
    gen.manual_seed(seed)
    loader = DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers, generator=gen)
    mon = RssMonitor().start()
    t0 = time.perf_counter()
    it = iter(loader)
    n = batches = 0
    first = None
    for batch in it:
        if first is None:
            first = time.perf_counter() - t0
            mon.first_batch()
        n += len(batch["index"])
        batches += 1
        if max_samples and n >= max_samples:
            break
    wall = time.perf_counter() - t0
    mon.end_of_epoch()
    del it  # shuts the workers down
    memory = mon.stop()
    _clear_decoder_cache()  # with workers=0 the main process built decoders: never fork them
    steady = (n - batch_size) / (wall - first) if first is not None and wall > first and n > batch_size else None
    return {
        "workers": workers,
        "samples": n,
        "batches": batches,
        "wall_s": round(wall, 3),
        "first_batch_s": round(first, 3) if first is not None else None,
        "samples_per_s": round(n / wall, 2) if wall > 0 else None,
        "steady_samples_per_s": round(steady, 2) if steady else None,
        "memory": memory,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="local LeRobot v3.0 dataset folder")
    ap.add_argument("--delta-timestamps", default="null", help="JSON {key: [seconds, ...]} or null")
    ap.add_argument("--workers", default="0", help="comma-separated DataLoader worker counts")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-samples", type=int, default=0, help="stop each run after this many samples (0: epoch)")
    ap.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads in this process")
    ap.add_argument("--repeat", type=int, default=1, help="runs per worker count; the fastest is reported")
    ap.add_argument("--sample0-out", default=None, help="torch.save dataset[0] here (compatibility check)")
    args = ap.parse_args()

    result: dict = {"ok": False}
    try:
        import lerobot
        import torch
        import torchcodec
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        result["versions"] = {
            "python": sys.version.split()[0],
            "lerobot": getattr(lerobot, "__version__", None),
            "torch": torch.__version__,
            "torchcodec": torchcodec.__version__,
        }
        if result["versions"]["lerobot"] is None:
            from importlib.metadata import version

            result["versions"]["lerobot"] = version("lerobot")
        if args.torch_threads:
            torch.set_num_threads(args.torch_threads)
        result["torch_threads"] = torch.get_num_threads()
        delta = json.loads(args.delta_timestamps)
        t = time.perf_counter()
        ds = LeRobotDataset(repo_id="local/bench", root=args.root, delta_timestamps=delta)
        result["init_s"] = round(time.perf_counter() - t, 3)
        result["video_backend"] = ds.video_backend
        result["num_frames"] = len(ds)
        run_one(ds, 0, args.batch_size, args.seed, 2 * args.batch_size)  # warm-up, not measured
        result["runs"] = []
        for w in (int(x) for x in args.workers.split(",") if x.strip()):
            runs = [run_one(ds, w, args.batch_size, args.seed, args.max_samples or None) for _ in range(args.repeat)]
            best = dict(max(runs, key=lambda r: r["samples_per_s"] or 0))
            if len(runs) > 1:
                best["samples_per_s_all"] = [r["samples_per_s"] for r in runs]
            result["runs"].append(best)
        if args.sample0_out:
            sample = ds[0]  # main process, after every worker is gone
            torch.save(sample, args.sample0_out)
            result["sample0"] = describe(sample)
        result["ok"] = True
    except Exception as e:  # reported to the benchmark, which prints it and goes on
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()[-4000:]
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
