"""The loader benchmark: how many samples/s a training loop gets, from local disk and from a shaped bucket.

    .venv/bin/python benchmarks/bench.py                      # the quick matrix (make bench)
    .venv/bin/python benchmarks/bench.py --rounds 3           # each case 3 times, interleaved: medians
    .venv/bin/python benchmarks/bench.py --size full --modes frame,act,long --workers 0,2,4 \\
        --batches 200 --max-seconds 120 --timeout 600 --out benchmarks/results/full
    .venv/bin/python benchmarks/bench.py --modes act --sources converted-local \\
        --opt num_ffmpeg_threads=2 --label ffmpeg2            # one more case: any loader option
    .venv/bin/python benchmarks/bench.py --sources '' --frame-cache converted-local,converted-resized \\
        --workers 0,2 --transports slab --baseline-datasets map --no-limits   # cold and warm epochs

Builds (once) a synthetic LeRobot v3.0 dataset with the weight of real footage and its conversion,
serves both from the real S3-protocol server behind our shaper (30 ms per request, 100 MB/s
shared by default), and runs every case of the matrix (sources x modes x decodes x workers x
image dtypes, then the LeRobot baselines, the pure-decode limit and the DataLoader ceiling) in
its own process with a timeout. With ``--rounds N`` the whole matrix runs N times, round after
round, so slow spells of a shared machine hit every case alike, and each case reports its median
round. One JSON per case lands in ``--out``; ``summarize.py`` then writes the table,
``summary.csv`` and the charts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from harness import data, measure  # noqa: E402
from harness.cases import DECODES, FRAME_CACHE_SOURCES, MODES, SOURCES, TRANSPORTS, Case, expand  # noqa: E402
from harness.measure import page_cache_write_cost  # noqa: E402
from harness.runner import LEROBOT, baseline_command, median_round, our_command, run_case  # noqa: E402
from harness.shaper import PROFILES, Profile  # noqa: E402

LEROBOT_LATEST_SH = Path("/work/shared/tools/lerobot-latest.sh")
LEROBOT_ENV_SH = REPO / "tests/lerobot/env.sh"  # the tests' LeRobot 0.6.1 root (Python 3.13), when built


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _options(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; a VALUE that parses as JSON is taken as such (numbers, true, lists)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"option {pair!r} is not KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def default_baselines() -> list[str]:
    """LeRobot interpreters found on this machine (see README): NAME=COMMAND."""
    found = []
    rootfs = os.environ.get("LEROBOT_LATEST_ROOTFS")
    env_root = subprocess.run(["bash", str(LEROBOT_ENV_SH), "root"], capture_output=True, text=True).stdout.strip()
    if env_root and (Path(env_root) / "opt/lerobot/bin/python").is_file():
        found.append(f"lerobot-0.6.1=bash {LEROBOT_ENV_SH} run {{dirs}} --")
    elif rootfs and LEROBOT_LATEST_SH.is_file():
        found.append(f"lerobot-0.6.1=bash {LEROBOT_LATEST_SH} run {rootfs} {{dirs}} --")
    venv = Path(os.environ.get("LEROBOT_VENV", REPO / ".venv-lerobot"))
    if (venv / "bin/python").is_file():
        found.append(f"lerobot-0.4.4={venv}/bin/python")
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(data.SIZES), default="quick", help="dataset size")
    ap.add_argument(
        "--raw",
        type=Path,
        help="a LeRobot v3.0 dataset (real footage) instead of the synthetic one of --size, whose "
        "conversion defaults it keeps",
    )
    ap.add_argument("--data-dir", type=Path, default=REPO / "data/bench", help="where datasets are built and kept")
    ap.add_argument("--out", type=Path, default=HERE / "results/latest", help="results directory")
    ap.add_argument("--sources", default=",".join(SOURCES), help=f"subset of {','.join(SOURCES)} ('' for none)")
    ap.add_argument("--modes", default="act", help=f"subset of {','.join(MODES)}")
    ap.add_argument("--decodes", default="cpu,cuda", help=f"subset of {','.join(DECODES)} (cuda: skipped without GPU)")
    ap.add_argument(
        "--workers",
        default="0,2",
        help="DataLoader worker counts, e.g. 0,2,4 (0: ours decodes in threads of the main process; no LeRobot case)",
    )
    ap.add_argument("--cuda-workers", type=int, default=1, help="workers for cuda cases (each holds a CUDA context)")
    ap.add_argument(
        "--cuda-reencode",
        default="h264",
        help="codec of the conversion cuda cases read ('' reads the AV1 one; Hopper NVDEC cannot decode AV1)",
    )
    ap.add_argument("--image-dtypes", default="uint8", help="uint8,float32")
    ap.add_argument(
        "--transports",
        default=",".join(TRANSPORTS),
        help="with workers, how batches reach the main process: queue (the DataLoader's default collate), "
        "slab (loader.transport.SlabCollate)",
    )
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--pool-size", type=int, default=8)
    ap.add_argument("--prefetch-factor", type=int, default=4)
    ap.add_argument("--resize", help="HxW: resize frames in the loader (passed as resize=(H, W))")
    ap.add_argument("--warmup-batches", type=int, default=3)
    ap.add_argument("--batches", type=int, default=30, help="measured batches per case (after warm-up), at most")
    ap.add_argument("--max-seconds", type=float, default=20, help="stop measuring a case after this long (0: never)")
    ap.add_argument("--rounds", type=int, default=1, help="run the matrix this many times, interleaved; medians")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per case (and round) before it is killed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", choices=sorted(PROFILES), default="cross-region", help="bucket network shape")
    ap.add_argument("--latency-ms", type=float, help="override the profile's per-request latency")
    ap.add_argument("--bandwidth-mbps", type=float, help="override the profile's bandwidth (MB/s, 0: none)")
    ap.add_argument("--opt", action="append", default=[], help="KEY=VALUE for EpisodePoolDataset (repeatable)")
    ap.add_argument("--convert-opt", action="append", default=[], help="KEY=VALUE for convert_dataset (repeatable)")
    ap.add_argument("--label", default="", help="names this variant in case names and the table")
    ap.add_argument(
        "--baseline",
        action="append",
        default=None,
        help="NAME=COMMAND: a LeRobot interpreter (a python, or a wrapper with {dirs}); default: those found",
    )
    ap.add_argument("--baseline-datasets", default="map,streaming", help="LeRobot datasets to run: map,streaming")
    ap.add_argument("--baseline-workers", help="worker counts of LeRobot's baselines, e.g. 1,2,3 (default: --workers)")
    ap.add_argument(
        "--frame-cache",
        default="",
        help=f"subset of {','.join(FRAME_CACHE_SOURCES)}: ours' cold and warm epochs through the decoded-frame "
        "cache, each measured whole (converted-resized: the conversion with --resize at --resized-conversion)",
    )
    ap.add_argument("--resized-conversion", default="224x224", help="HxW of the converted-resized source")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--no-limits", action="store_true", help="skip the pure-decode limit and the DataLoader ceiling")
    ap.add_argument("--no-summary", action="store_true")
    ap.add_argument("--prepare-only", action="store_true", help="build the datasets and exit (SLURM's first job)")
    return ap.parse_args(argv)


def _profile(args: argparse.Namespace) -> Profile:
    p = PROFILES[args.profile]
    return Profile(
        p.latency_s if args.latency_ms is None else args.latency_ms / 1000,
        p.bandwidth if args.bandwidth_mbps is None else args.bandwidth_mbps * 1e6,
    )


def _last_line(text: str) -> str:
    """The exception message of a (DataLoader-wrapped) traceback, or the note."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def skip(case: Case, config: dict[str, Any], out: Path, note: str) -> dict[str, Any]:
    """A case not run, recorded so the table says why."""
    result = {"status": "skipped", "note": note, "name": case.name, "case": case.to_dict(), "config": config}
    (out / f"{case.name}.json").write_text(json.dumps(result, indent=1))
    return result


def _git() -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sources, modes, decodes = _list(args.sources), _list(args.modes), _list(args.decodes)
    transports, frame_cache = _list(args.transports), _list(args.frame_cache)
    for values, allowed, what in (
        (sources, SOURCES, "source"),
        (frame_cache, FRAME_CACHE_SOURCES, "frame-cache source"),
        (modes, MODES, "mode"),
        (decodes, DECODES, "decode"),
        (transports, TRANSPORTS, "transport"),
    ):
        bad = sorted(set(values) - set(allowed))
        if bad:
            raise SystemExit(f"unknown {what} {bad}; choose from {', '.join(allowed)}")
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds} must be >= 1")
    baselines = {} if args.no_baselines else dict(b.split("=", 1) for b in (args.baseline or default_baselines()))
    resize = [int(x) for x in args.resize.lower().split("x")] if args.resize else None
    cases = expand(
        sources=sources,
        modes=modes,
        decodes=decodes,
        workers=[int(w) for w in _list(args.workers)],
        image_dtypes=_list(args.image_dtypes),
        baselines=list(baselines),
        baseline_datasets=_list(args.baseline_datasets),
        limits=not args.no_limits,
        transports=tuple(transports),
        frame_cache_sources=tuple(frame_cache),
        baseline_workers=[int(w) for w in _list(args.baseline_workers)] if args.baseline_workers else None,
        batch_size=args.batch_size,
        pool_size=args.pool_size,
        prefetch_factor=args.prefetch_factor,
        resize=resize,
        label=args.label,
        loader_opts=_options(args.opt),
    )
    for case in cases:
        if case.decode == "cuda":
            case.workers = min(case.workers, args.cuda_workers)
    no_cuda = "cuda" in decodes and not _cuda_available()

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    data_dir = args.data_dir.resolve()
    raw = (
        data.external_dataset(data_dir, args.raw) if args.raw else data.raw_dataset(data_dir, args.size, seed=args.seed)
    )
    convert_opts = data.convert_options(args.size, _options(args.convert_opt))
    converted = data.converted_dataset(raw, convert_opts)
    resized_size = [int(x) for x in args.resized_conversion.lower().split("x")]
    resized_opts = {**convert_opts, "resize": {"*": resized_size}}
    resized = data.converted_dataset(raw, resized_opts) if "converted-resized" in frame_cache else None
    if args.prepare_only:
        print(f"[bench] datasets ready: {raw} and {converted}" + (f" and {resized}" if resized else ""))
        return 0
    info = json.loads((raw / "meta/info.json").read_text())
    cameras = [k for k, v in info["features"].items() if v["dtype"] == "video"]
    paths: dict[str, str] = {"raw-local": str(raw), "converted-local": str(converted)}
    if resized is not None:
        paths["converted-resized"] = str(resized)
    gpu = "cuda" in decodes and not no_cuda and args.cuda_reencode
    if gpu:  # NVDEC of Hopper GPUs (H100/H200) cannot decode AV1: cuda cases read an H.264 conversion
        paths["converted-local@cuda"] = str(
            data.converted_dataset(raw, {**convert_opts, "reencode": args.cuda_reencode})
        )
    profile = _profile(args)
    config = {
        "size": args.size,
        **({"raw": str(args.raw.resolve())} if args.raw else {}),
        "dataset": {"episodes": info["total_episodes"], "frames": info["total_frames"], "cameras": len(cameras)},
        "raw_bytes": data.tree_bytes(raw),
        "converted_bytes": data.tree_bytes(converted),
        "convert_options": convert_opts,
        **({"resized_convert_options": resized_opts, "resized_bytes": data.tree_bytes(resized)} if resized else {}),
        "network": {
            "profile": args.profile,
            "latency_ms": profile.latency_s * 1000,
            "bandwidth_mb_s": profile.bandwidth / 1e6,
        },
        "warmup_batches": args.warmup_batches,
        "batches": args.batches,
        "max_seconds": args.max_seconds,
        "rounds": args.rounds,
        "seed": args.seed,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "git": _git(),
        "baselines": baselines or "none found (make lerobot-venv; LEROBOT_LATEST_ROOTFS, see README)",
    }
    if frame_cache:  # what the cold epoch's fills pay per byte of new page cache on this machine
        config["machine"]["page_cache_ms_per_mb"] = page_cache_write_cost(out)
    bucket = None
    if any("bucket" in c.source for c in cases):
        from harness.storage import Bucket

        bucket = Bucket(profile, out / "logs")
        print(f"[bench] bucket behind the shaper at {bucket.proxy.url} ({profile.describe()}); uploading", flush=True)
        paths["raw-bucket"] = bucket.upload(raw, "raw")
        paths["converted-bucket"] = paths["converted-bucket-warm"] = bucket.upload(converted, "converted")
        if gpu:
            url = bucket.upload(Path(paths["converted-local@cuda"]), "converted-cuda")
            paths["converted-bucket@cuda"] = paths["converted-bucket-warm@cuda"] = url
    runnable = []
    for case in cases:
        if case.decode == "cuda" and no_cuda:
            _report(case, skip(case, config, out, "no CUDA device on this machine"), "not run:")
        else:
            runnable.append(case)
    rounds: dict[str, list[dict[str, Any]]] = {case.name: [] for case in runnable}
    try:
        for k in range(1, args.rounds + 1):
            where = out if args.rounds == 1 else out / "rounds" / f"r{k}"  # the median lands in out
            for i, case in enumerate(runnable, 1):
                result = _run(case, args, config, paths, cameras, info["fps"], baselines, bucket, where, data_dir)
                rounds[case.name].append(result)
                _report(case, result, f"round {k}/{args.rounds}, {i}/{len(runnable)}")
    finally:
        if bucket is not None:
            bucket.close()
    failed = 0
    for case in runnable:
        result = median_round(rounds[case.name])
        (out / f"{case.name}.json").write_text(json.dumps(result, indent=1, default=str))
        failed += result["status"] not in ("ok", "skipped")
        if args.rounds > 1:
            each = ", ".join(str(r["samples_per_s"]) for r in result["rounds"])
            print(
                f"[bench] {case.name}: median of {args.rounds} rounds {result.get('samples_per_s')} samples/s ({each})"
            )
    if not args.no_summary:
        from summarize import summarize

        print(summarize(out))
    return 1 if failed == len(cases) else 0


def _report(case: Case, result: dict[str, Any], where: str) -> None:
    """One progress line: the case's samples/s, CPU ms per sample and first batch, or why it has none."""
    rate = result.get("samples_per_s")
    first = result.get("first_batch_s")
    detail = (
        f"{rate} samples/s, {result.get('cpu_ms_per_sample')} CPU ms/sample"
        + (f", first batch {first} s" if first is not None else "")
        if rate
        else _last_line(result.get("note") or result.get("error") or "")
    )
    print(f"[bench {time.strftime('%H:%M:%S')}] {where} {case.name}: {result['status']}: {detail}", flush=True)


def _run(
    case: Case,
    args: argparse.Namespace,
    config: dict[str, Any],
    paths: dict[str, str],
    cameras: list[str],
    fps: float,
    baselines: dict[str, str],
    bucket: Any,
    out: Path,
    data_dir: Path,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": case.name,
        "case": case.to_dict(),
        "config": config,
        "paths": paths,
        "cameras": cameras,
        "fps": fps,
        "seed": args.seed,
        "warmup_batches": args.warmup_batches,
        "batches": args.batches,
        "max_seconds": args.max_seconds,
        "storage_options": bucket.storage_options if bucket else None,
        "cache_dir": str(out / "cache" / case.name),
        "hf_home": str(data_dir / "hf-home"),
        "raw_plan": data.raw_plan(config["convert_options"]),
    }
    frames = None
    if case.epoch:  # the cold epoch fills this cache, the warm one after it reads it: shared by the pair
        frames = out / "cache" / "frames" / dataclasses.replace(case, epoch="").name
        spec["frame_cache_dir"] = str(frames)
        if case.epoch == "cold":
            shutil.rmtree(frames, ignore_errors=True)
    if ":" in case.kind:
        command = [*baseline_command(baselines[case.kind.split(":")[0]], [REPO, data_dir, out]), str(LEROBOT)]
    else:
        command = our_command()
    proxy = bucket.proxy if bucket else None
    try:
        if case.source == "converted-bucket-warm":  # fill the cache with what the measured run will read
            primed = run_case({**spec, "name": case.name + "__prime"}, command, out / "priming", args.timeout, proxy)
            spec["config"] = {**config, "prime": {k: primed.get(k) for k in ("status", "samples", "storage_bytes")}}
        if case.epoch in ("warm", "disk") and frames is not None and not frames.is_dir():  # no cold epoch before
            cold = {**spec, "name": case.name + "__prime", "case": {**spec["case"], "epoch": "cold"}}
            primed = run_case(cold, command, out / "priming", args.timeout, proxy)
            spec["config"] = {**config, "prime": {k: primed.get(k) for k in ("status", "samples")}}
        if case.epoch == "disk" and frames is not None:  # every read from the disk
            spec["config"] = {**spec["config"], "dropped_from_page_cache": measure.drop_page_cache(frames)}
        return run_case(spec, command, out, args.timeout, proxy)
    finally:
        shutil.rmtree(out / "cache" / case.name, ignore_errors=True)
        if case.epoch == "disk" and frames is not None:  # the last of the three
            shutil.rmtree(frames, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
