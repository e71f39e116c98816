"""Raw streaming from a Hub-shaped server: ours beside LeRobot 0.6.1's datasets on the same server (issue 33).

The datasets are served by ``tests/hub_server.py`` (the Hub's HTTP API, run as its own process with a
request-rate limit answered by 429 + Retry-After) behind ``harness/shaper.py`` (per-request latency,
shared bandwidth), ``HF_ENDPOINT`` pointing at the shaper. Each round runs, interleaved, each case in a
fresh process (cold caches, nothing listed or downloaded yet), with the same ``--workers`` and
``--batch``; ours in the layout README recommends with workers (``slab_loader``: batches in reused
shared memory, not pickled through the DataLoader's queues; uint8 frames, which README recommends:
float on the GPU), LeRobot's in a plain ``DataLoader`` (float32 frames, as it gives them):

- ``ours-local``: ``EpisodePoolDataset`` on the local folder (the 0.8x target's reference);
- ``ours-hub``: ``EpisodePoolDataset`` on the repo id (revision resolved, tree listed, raw streaming);
- ``ours-hub-frame-cache``: the same with an empty decoded-frame cache (``frame_cache_dir``, which
  ``lerobot-shards train`` turns on by default): the epoch is its cold, first pass;
- ``ours-hub-plain``: ``ours-hub`` through a plain ``DataLoader`` (default collate, batches pickled),
  the layout earlier figures used;
- ``lerobot-streaming``: LeRobot's ``StreamingLeRobotDataset(repo_id)`` (its own hf:// streaming);
- ``lerobot``: LeRobot's ``LeRobotDataset(repo_id)`` (downloads the episodes' files, then reads them).

Per case: seconds to the first batch (from building the dataset, its modules imported: the import is
reported apart), samples/s over the rest of the epoch, CPU ms per sample (the process and its
workers), the requests the server got before the first batch and in all, the load average. A case
that fails (LeRobot's streaming dataset on a camera spread over several mp4 files) records its error
as its result. The LeRobot cases need LeRobot 0.6.1, so the whole benchmark runs in its environment::

    PYTHONPATH=$PWD/src bash tests/lerobot/env.sh run $PWD -- benchmarks/hub_stream.py

Without LeRobot (``--cases ours-local,ours-hub``) it runs in the project's venv as well.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
CASES = ("ours-local", "ours-hub", "ours-hub-frame-cache", "ours-hub-plain", "lerobot-streaming", "lerobot")
PEER = "lerobot-streaming"  # the issue's ratio: ours-hub against it


def _child(case: str, source: str, workers: int, batch: int) -> dict[str, Any]:
    """One case in this (fresh) process; the parent reads the JSON it prints."""
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # tests/lerobot/env.sh sets them
        os.environ.pop(name, None)
    started = time.perf_counter()
    from torch.utils.data import DataLoader

    loader_of: Any = DataLoader

    if case.startswith("ours"):
        import torch

        from lerobot_shards.integrations import hub  # noqa: F401  (imported lazily by a repo id: counted as import)
        from lerobot_shards.loader import EpisodePoolDataset, slab_loader

        def make() -> Any:
            # an empty cache in the case's own HF_HOME, which the parent removes after the case
            frame_cache = f"{os.environ['HF_HOME']}/frames" if case.endswith("frame-cache") else None
            # uint8 frames, as README recommends (float on the GPU: DeviceFeeder); LeRobot's are float32
            return EpisodePoolDataset(
                source, seed=0, episode_pool_size=4, frame_cache_dir=frame_cache, image_dtype=torch.uint8
            )

        shuffle = None
        if not case.endswith("plain"):
            loader_of = slab_loader  # README's layout with workers
    else:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
        from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset

        def make() -> Any:
            if case == "lerobot":
                return LeRobotDataset(source)
            return StreamingLeRobotDataset(source, seed=0)

        shuffle = True if case == "lerobot" else None
    imported = time.perf_counter() - started
    out: dict[str, Any] = {"case": case, "import_s": imported, "loadavg": os.getloadavg()[0]}
    t0, cpu0 = time.perf_counter(), time.process_time()
    n = 0
    try:
        loader = loader_of(make(), batch_size=batch, num_workers=workers, shuffle=shuffle)
        it = iter(loader)
        first = next(it)
        out["first_batch_s"] = time.perf_counter() - t0
        out["first_batch_at"] = time.monotonic()  # the parent counts the server's requests up to here
        n = len(first["index"])
        t1 = time.perf_counter()
        for b in it:
            n += len(b["index"])
        rest = time.perf_counter() - t1
        del it, loader  # the workers exit and are waited for: their CPU time is counted below
        out["samples_per_s"] = (n - len(first["index"])) / rest if rest else 0.0
    except Exception as e:
        lines = str(e).strip().splitlines()  # a worker's error: its last line is the original exception
        out["error"] = (lines[-1] if len(lines) > 1 else f"{type(e).__name__}: {''.join(lines)}")[:300]
        out["samples_before_error"] = n
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - cpu0 + children.ru_utime + children.ru_stime
    out |= {"samples": n, "cpu_ms_per_sample": 1000 * cpu / n if n else None, "wall_s": time.perf_counter() - t0}
    return out


def _run_case(case: str, source: str, args: argparse.Namespace, proxy: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hub-bench-home-") as home:
        env = dict(os.environ, HF_HOME=home, HF_LEROBOT_HOME=f"{home}/lerobot", HF_HUB_DISABLE_TELEMETRY="1")
        before = len(proxy.log)
        child = subprocess.run(
            [sys.executable, __file__, "--child", case, "--source", source]
            + ["--workers", str(args.workers), "--batch", str(args.batch)],
            env=env,
            capture_output=True,
            text=True,
            timeout=args.case_timeout,
        )
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    if child.returncode or not lines:
        return {"case": case, "error": f"exit {child.returncode}: {child.stderr.strip().splitlines()[-1:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    log = proxy.log[before:]
    if "first_batch_at" in result:
        at = result.pop("first_batch_at")
        result["requests_before_first_batch"] = sum(1 for t, _ in log if t <= at)
    result["requests"] = len(log)
    return result


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarize(results: list[dict[str, Any]], datasets: list[str]) -> dict[str, Any]:
    """Medians per (dataset, case) and the ratios the issue sets targets for."""
    out: dict[str, Any] = {}
    for size in datasets:
        per: dict[str, Any] = {}
        for case in {r["case"] for r in results if r["dataset"] == size}:
            rows = [r for r in results if r["dataset"] == size and r["case"] == case]
            errors = sorted({r["error"] for r in rows if "error" in r})
            per[case] = {
                "rounds": len(rows),
                **{
                    k: _median(rows, k)
                    for k in (
                        "first_batch_s",
                        "samples_per_s",
                        "cpu_ms_per_sample",
                        "requests_before_first_batch",
                        "requests",
                        "import_s",
                        "loadavg",
                    )
                },
                **({"errors": errors} if errors else {}),
            }
        ratios = {}
        for ours, refs in (
            ("ours-hub", ("ours-local", PEER, "lerobot")),
            ("ours-hub-frame-cache", (PEER,)),
            ("ours-hub-plain", (PEER,)),
        ):
            mine = per.get(ours, {}).get("samples_per_s")
            for ref in refs:
                theirs = per.get(ref, {}).get("samples_per_s")
                if mine and theirs:
                    ratios[f"{ours} / {ref}"] = mine / theirs
        out[size] = {"cases": per, "ratios": ratios}
    return out


def write_summary(path: Path, summary: dict[str, Any], meta: dict[str, Any]) -> None:
    lines = [
        "# Raw streaming from the shaped Hub server: ours beside LeRobot 0.6.1",
        "",
        f"`benchmarks/hub_stream.py`: {meta['profile']}, {meta['requests_per_s_limit']:g} requests/s then 429, "
        f"{meta['workers']} DataLoader workers (ours through `slab_loader` unless named `plain`, uint8 frames as README "
        f"recommends; LeRobot's float32), batch {meta['batch']}, "
        f"{meta['rounds']} interleaved rounds, each "
        f"case a fresh process with empty caches; load average {meta['loadavg_min']:.1f}-{meta['loadavg_max']:.1f} "
        f"during the runs ({meta['machine']}). Medians.",
        "",
    ]
    for size, s in summary.items():
        lines += [
            f"## `{size}` ({meta['datasets'][size]})",
            "",
            "| case | first batch s | samples/s | CPU ms/sample | requests before first batch | requests in all |",
            "|---|---|---|---|---|---|",
        ]
        for case in CASES:
            c = s["cases"].get(case)
            if c is None:
                continue

            def f(key: str, fmt: str, c: dict[str, Any] = c) -> str:
                return "-" if c.get(key) is None else format(c[key], fmt)

            if "errors" in c and c.get("samples_per_s") is None:
                lines.append(f"| {case} | failed: {'; '.join(c['errors'])} | | | | |")
                continue
            lines.append(
                f"| {case} | {f('first_batch_s', '.2f')} | {f('samples_per_s', '.0f')} | "
                f"{f('cpu_ms_per_sample', '.2f')} | {f('requests_before_first_batch', '.0f')} | {f('requests', '.0f')} |"
            )
        lines += [""] + [f"- {k}: **{v:.2f}x**" for k, v in s["ratios"].items()] + [""]
    path.write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="small,tiny", help="benchmark sizes (harness/data.py)")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--latency-ms", type=float, default=30.0)
    ap.add_argument("--mb-per-s", type=float, default=100.0)
    ap.add_argument("--requests-per-s", type=float, default=100.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--case-timeout", type=float, default=900.0)
    ap.add_argument("--data-dir", type=Path, default=REPO / "data/bench")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/hub")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--source", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.source, args.workers, args.batch)), flush=True)
        return

    from harness import data
    from harness.shaper import Profile, ShapedProxy

    sizes = args.datasets.split(",")
    cases = args.cases.split(",")
    raws = {size: data.raw_dataset(args.data_dir.resolve(), size) for size in sizes}
    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests/hub_server.py"), *(f"bench/{s}={raws[s]}" for s in sizes)]
        + ["--requests-per-s", str(args.requests_per_s)],
        stdout=subprocess.PIPE,
        text=True,
    )
    profile = Profile(args.latency_ms / 1000, args.mb_per_s * 1e6)
    results: list[dict[str, Any]] = []
    try:
        assert server.stdout is not None
        upstream = server.stdout.readline().strip().rsplit(":", 1)
        with ShapedProxy((upstream[0].split("//")[1], int(upstream[1])), profile) as proxy:
            os.environ["HF_ENDPOINT"] = proxy.url
            for r in range(args.rounds):
                for size in sizes:
                    for case in cases if r % 2 == 0 else cases[::-1]:  # alternate who goes first
                        source = str(raws[size]) if case == "ours-local" else f"bench/{size}"
                        result = {"round": r, "dataset": size, **_run_case(case, source, args, proxy)}
                        results.append(result)
                        print(json.dumps(result), flush=True)
    finally:
        server.kill()
    summary = summarize(results, sizes)
    loads = [r["loadavg"] for r in results if "loadavg" in r]
    meta = {
        "what": "raw streaming from tests/hub_server.py behind harness/shaper.py: ours vs LeRobot 0.6.1",
        "profile": profile.describe(),
        "requests_per_s_limit": args.requests_per_s,
        "workers": args.workers,
        "batch": args.batch,
        "rounds": args.rounds,
        "datasets": {s: _describe(raws[s]) for s in sizes},
        "loadavg_min": min(loads, default=0.0),
        "loadavg_max": max(loads, default=0.0),
        "machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]}",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hub_stream.json").write_text(json.dumps({**meta, "summary": summary, "runs": results}, indent=1))
    write_summary(args.out / "summary.md", summary, meta)
    print((args.out / "summary.md").read_text())


def _describe(raw: Path) -> str:
    info = json.loads((raw / "meta/info.json").read_text())
    cams = [k for k, v in info["features"].items() if v["dtype"] == "video"]
    files = {len(list((raw / "videos" / cam).rglob("*.mp4"))) for cam in cams}
    shape = info["features"][cams[0]]["shape"]
    return (
        f"{info['total_episodes']} episodes, {info['total_frames']} frames, {len(cams)} cameras "
        f"{shape[1]}x{shape[0]}, {'/'.join(map(str, sorted(files)))} mp4 file(s) per camera"
    )


if __name__ == "__main__":
    main()
