"""Conversion throughput on local disk, against a plain copy of the same source bytes in the same run.

    .venv/bin/python benchmarks/convert/bench_convert.py [--source DIR] [--workers 1 2] [--repeats 2]

Without ``--source`` it builds a LeRobot v3.0 dataset with realistic bitrates: synth_dataset's
metadata and rows, with each camera mp4 replaced by 640x480 H.264 (g=2, ~15 KB/frame, made by
the ffmpeg CLI from testsrc2) episodes joined by stream copy, so every episode starts on a
keyframe as in LeRobot datasets. Each conversion runs in a child process; its wall time
covers convert_dataset only (not interpreter start-up), and its peak RSS (largest process and
whole process tree, polled every 20 ms) is reported. Results go to ``results/`` as JSON, CSV
and a markdown table.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

RESULTS = Path(__file__).resolve().parent / "results"
FFMPEG_CLIP = (
    "ffmpeg -v error -y -f lavfi -i testsrc2=size={w}x{h}:rate={fps} -frames:v {n} -c:v libx264 -preset ultrafast "
    "-crf 23 -g 2 -bf 0 -x264-params scenecut=0:keyint=2:min-keyint=2 -pix_fmt yuv420p "
    "-video_track_timescale {timescale} -an {out}"
)


def build_source(root: Path, *, episodes: int, frames: int, per_file: int, height: int, width: int) -> Path:
    """synth_dataset layout and rows, with realistic-bitrate video swapped in (see module docstring)."""
    from lerobot_shards.synth import synth_dataset
    from lerobot_shards.video import TICKS_PER_FRAME, concat_clips, probe_clip

    fps = 30
    synth_dataset(
        root,
        num_episodes=episodes,
        length_range=(frames, frames),
        height=8,
        width=40,
        episodes_per_video_file=per_file,
        episodes_per_data_file=episodes,
    )
    clip = root.parent / "clip.mp4"
    subprocess.run(
        FFMPEG_CLIP.format(w=width, h=height, fps=fps, n=frames, timescale=fps * TICKS_PER_FRAME, out=clip).split(),
        check=True,
    )
    data = clip.read_bytes()
    for path in sorted((root / "videos").rglob("*.mp4")):
        concat_clips([data] * (probe_clip(path).num_frames // frames), path)  # same episodes, real bitrate
    info = json.loads((root / "meta/info.json").read_text())
    for spec in info["features"].values():
        if spec["dtype"] == "video":
            spec["shape"] = [height, width, 3]
            spec["info"].update({"video.height": height, "video.width": width, "video.codec": "h264"})
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    return root


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def plain_copy(src: Path, dst: Path) -> float:
    start = time.perf_counter()
    shutil.copytree(src, dst)
    os.sync()
    return time.perf_counter() - start


def run_child(source: Path, dest: Path, workers: int, reencode: str | None, shard_size: str) -> dict[str, float]:
    """Convert in a child process; poll its process tree for peak RSS."""
    cmd = [sys.executable, __file__, "--child", str(source), str(dest), str(workers), reencode or "", shard_size]
    proc = psutil.Popen(cmd, stdout=subprocess.PIPE, text=True)
    peak_one = peak_tree = 0
    while proc.poll() is None:
        try:
            procs = [proc, *proc.children(recursive=True)]
            rss = [p.memory_info().rss for p in procs]
        except psutil.Error:
            continue
        peak_one, peak_tree = max(peak_one, *rss), max(peak_tree, sum(rss))
        time.sleep(0.02)
    out = proc.stdout.read()
    if proc.returncode:
        raise RuntimeError(f"conversion failed ({proc.returncode}): {out}")
    return {
        "seconds": json.loads(out)["seconds"],
        "peak_rss_mb": peak_one / 2**20,
        "peak_rss_tree_mb": peak_tree / 2**20,
    }


def child(source: str, dest: str, workers: str, reencode: str, shard_size: str) -> None:
    from lerobot_shards.convert.plan import ConvertOptions, parse_size
    from lerobot_shards.convert.run import convert_dataset

    start = time.perf_counter()
    convert_dataset(
        source,
        dest,
        ConvertOptions(reencode=reencode or None, shard_bytes=parse_size(shard_size)),
        workers=int(workers),
        progress=False,
    )
    os.sync()
    print(json.dumps({"seconds": time.perf_counter() - start}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, help="a LeRobot v3.0 dataset (default: build one)")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--frames", type=int, default=300, help="frames per episode")
    parser.add_argument("--episodes-per-file", type=int, default=16)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shard-size", default="64MB", help="small enough that every worker gets shards")
    parser.add_argument("--reencode", choices=["h264", "hevc", "av1"], help="also time one re-encoding run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return

    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-convert-") as tmp:
        tmp_path = Path(tmp)
        source = args.source or build_source(
            tmp_path / "src",
            episodes=args.episodes,
            frames=args.frames,
            per_file=args.episodes_per_file,
            height=args.height,
            width=args.width,
        )
        src_bytes = tree_bytes(source)
        print(f"source {source}: {src_bytes / 1e6:.1f} MB", flush=True)
        copies = []
        runs = []
        configs = [("copy", w) for w in args.workers] + ([(args.reencode, max(args.workers))] if args.reencode else [])
        for rep in range(args.repeats):
            # interleave copy and conversions so both see the same machine state
            copies.append(plain_copy(source, tmp_path / f"copy-{rep}"))
            shutil.rmtree(tmp_path / f"copy-{rep}")
            for mode, workers in configs:
                dest = tmp_path / f"out-{mode}-{workers}-{rep}"
                r = run_child(source, dest, workers, None if mode == "copy" else mode, args.shard_size)
                runs.append({"mode": mode, "workers": workers, "out_bytes": tree_bytes(dest), **r})
                shutil.rmtree(dest)
                print(f"  convert ({mode}) workers={workers}: {r['seconds']:.2f} s", flush=True)
        copy_s = statistics.median(copies)
        copy_mb_s = src_bytes / 1e6 / copy_s
        rows = []
        for mode, workers in configs:
            mine = [r for r in runs if (r["mode"], r["workers"]) == (mode, workers)]
            seconds = statistics.median(r["seconds"] for r in mine)
            mb_s = src_bytes / 1e6 / seconds
            rows.append(
                {
                    "mode": "stream copy" if mode == "copy" else f"re-encode {mode}",
                    "workers": workers,
                    "seconds": round(seconds, 3),
                    "mb_per_s": round(mb_s, 1),
                    "ratio_to_plain_copy": round(mb_s / copy_mb_s, 3),
                    "out_mb": round(mine[0]["out_bytes"] / 1e6, 1),
                    "peak_rss_mb": round(max(r["peak_rss_mb"] for r in mine), 1),
                    "peak_rss_tree_mb": round(max(r["peak_rss_tree_mb"] for r in mine), 1),
                }
            )
        result = {
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "source": {
                "path": str(args.source or "built: see bench_convert.py"),
                "mb": round(src_bytes / 1e6, 1),
                "episodes": args.episodes if not args.source else None,
                "frames_per_episode": args.frames,
                "size": f"{args.width}x{args.height}",
            },
            "shard_size": args.shard_size,
            "plain_copy": {"seconds": round(copy_s, 3), "mb_per_s": round(copy_mb_s, 1), "repeats": len(copies)},
            "runs": rows,
        }
    (RESULTS / "bench_convert.json").write_text(json.dumps(result, indent=1) + "\n")
    with open(RESULTS / "bench_convert.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        f"Source: {result['source']['mb']} MB ({result['source']['size']}); plain copy "
        f"{result['plain_copy']['mb_per_s']} MB/s (median of {len(copies)}); shards of {args.shard_size}; "
        f"{os.cpu_count()} CPUs.",
        "",
        "| mode | workers | seconds | MB/s | ratio to plain copy | output MB | peak RSS MB (largest process) "
        "| peak RSS MB (process tree) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ] + [
        f"| {r['mode']} | {r['workers']} | {r['seconds']} | {r['mb_per_s']} | {r['ratio_to_plain_copy']} | "
        f"{r['out_mb']} | {r['peak_rss_mb']} | {r['peak_rss_tree_mb']} |"
        for r in rows
    ]
    (RESULTS / "bench_convert.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
