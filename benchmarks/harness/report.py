"""From a results directory (one JSON per case) to a markdown table, summary.csv, charts and the targets.

The targets are the object-storage issue's, reported and never asserted. For each it says met or
missed and, from the case's own counters, which resource bound it: the network (the shaper
delivered near its bandwidth, or workers waited on reads), decode (workers spent most of their
time in the decoder), float conversion (the uint8 twin is much faster) or collation/transfer
(near the DataLoader ceiling, which does no I/O and no decode).

LeRobot's loaders run only with DataLoader workers, so a workers=0 group of ours (decoding in
threads of the main process) is held against LeRobot's best worker count, and the target says so.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

COLUMNS = (
    "loader",
    "source",
    "mode",
    "decode",
    "workers",
    "dtype",
    "status",
    "samples_per_s",
    "round_samples_per_s",
    "frames_per_s",
    "cpu_ms_per_sample",
    "first_batch_s",
    "wait_p50_ms",
    "wait_p95_ms",
    "wait_p99_ms",
    "storage_kb_per_sample",
    "decoder_hit_rate",
    "worker_peak_mb",
    "worker_end_mb",
    "worker_floor_growth_mb",
    "note",
)


def load(results: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(results.glob("*.json"))]


def _loader(r: dict[str, Any]) -> str:
    kind = r["case"]["kind"]
    return f"{kind} [{r['case']['label']}]" if r["case"].get("label") else kind


def row(r: dict[str, Any]) -> dict[str, Any]:
    case, wait, rounds = r["case"], r.get("wait_s") or {}, r.get("rounds") or []
    workers = (r.get("memory") or {}).get("workers") or []
    ms = lambda v: round(v * 1000, 1) if v is not None else None  # noqa: E731
    worst = lambda key: max((w[key] for w in workers), default=None)  # noqa: E731
    return {
        "loader": _loader(r),
        "source": case["source"],
        "mode": case["mode"],
        "decode": case["decode"],
        "workers": case["workers"],
        "dtype": r.get("image_dtype_used") or case["image_dtype"],
        "status": r["status"],
        "samples_per_s": r.get("samples_per_s"),
        "round_samples_per_s": " / ".join(str(x["samples_per_s"]) for x in rounds) if len(rounds) > 1 else None,
        "frames_per_s": r.get("frames_per_s"),
        "cpu_ms_per_sample": r.get("cpu_ms_per_sample"),
        "first_batch_s": r.get("first_batch_s"),
        "wait_p50_ms": ms(wait.get("p50")),
        "wait_p95_ms": ms(wait.get("p95")),
        "wait_p99_ms": ms(wait.get("p99")),
        "storage_kb_per_sample": round(r["storage_bytes_per_sample"] / 1024, 1)
        if r.get("storage_bytes_per_sample")
        else None,
        "decoder_hit_rate": r.get("decoder_hit_rate"),
        "worker_peak_mb": worst("peak_mb"),
        "worker_end_mb": worst("end_mb"),
        "worker_floor_growth_mb": worst("floor_growth_mb"),
        "note": ([line for line in (r.get("note") or r.get("error") or "").splitlines() if line.strip()] or [""])[-1],
    }


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(v).replace("|", "/")[:80]


def markdown_table(rows: list[dict[str, Any]], columns: Iterable[str] = COLUMNS) -> str:
    columns = list(columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)


# ---------------------------------------------------------------- targets


def _group(r: dict[str, Any]) -> tuple:
    c = r["case"]
    return (c["mode"], c["decode"], c["workers"], r.get("image_dtype_used") or c["image_dtype"], c.get("label", ""))


def _find(results: list[dict[str, Any]], group: tuple, kind: str, source: str | None = None) -> dict[str, Any] | None:
    for r in results:
        if r["status"] == "ok" and r.get("samples_per_s") and r["case"]["kind"] == kind and _group(r) == group:
            if source is None or r["case"]["source"] == source:
                return r
    return None


def _lerobot_map(results: list[dict[str, Any]], group: tuple) -> dict[str, Any] | None:
    """The newest LeRobot map-style baseline of ``group``; for workers=0, where LeRobot has no
    case, its best worker count (same mode, decode, dtype and label)."""
    mode, decode, workers, dtype, label = group

    def matches(r: dict[str, Any]) -> bool:
        m, d, w, t, lab = _group(r)
        return (m, d, t, lab) == (mode, decode, dtype, label) and (w == workers or not workers)

    maps = [
        r
        for r in results
        if r["case"]["kind"].endswith(":map") and r["status"] == "ok" and r.get("samples_per_s") and matches(r)
    ]
    newest = max((r["case"]["kind"] for r in maps), default=None)  # lerobot-0.6.1 over lerobot-0.4.4
    return max((r for r in maps if r["case"]["kind"] == newest), key=lambda r: r["samples_per_s"], default=None)


def bound_by(r: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """The resource that most plausibly bound case ``r`` (see the module docstring)."""
    c, stats = r["case"], r.get("loader_stats") or {}
    wall, workers = r.get("wall_s") or 0, max(1, c["workers"])
    bandwidth = (r.get("config") or {}).get("network", {}).get("bandwidth_mb_s") or 0
    if "bucket" in c["source"] and wall:
        if bandwidth and (r.get("storage_bytes") or 0) / wall / 1e6 >= 0.8 * bandwidth:
            return "network bandwidth"
        if stats.get("wait_seconds", 0) / (workers * wall) >= 0.3:
            return "network latency (workers waited for reads)"
    if wall and stats.get("decode_seconds", 0) / (workers * wall) >= 0.5:
        return "decode"
    group = _group(r)
    if group[3] == "float32":
        twin = _find(results, (*group[:3], "uint8", group[4]), c["kind"], c["source"])
        if twin and twin["samples_per_s"] > 1.3 * r["samples_per_s"]:
            return "float conversion"
    ceiling = _find(results, group, "ceiling")
    if ceiling and r["samples_per_s"] >= 0.7 * ceiling["samples_per_s"]:
        return "collation/transfer (near the DataLoader ceiling)"
    return "CPU shared by decode, collation and other load"


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, per group of cases that share mode, decode, workers, dtype and label."""
    out = []
    groups = sorted({_group(r) for r in results if r["case"]["kind"] == "ours" and r["status"] == "ok"}, key=str)
    for g in groups:
        local, bucket = _find(results, g, "ours", "converted-local"), _find(results, g, "ours", "converted-bucket")
        raw_bucket = _find(results, g, "ours", "raw-bucket")
        newest = _lerobot_map(results, g)
        versus = newest["case"]["kind"] if newest else "LeRobot map"
        ours = "converted-local"
        if not g[2]:  # LeRobot has no workers=0 case: its best worker count
            ours = f"converted-local (w0, {local.get('decode_threads') if local else '?'} threads)"
            versus += f" (best: w{newest['case']['workers'] if newest else '?'})"
        decode = _find(results, g, "pure-decode")
        checks = [
            ("converted-bucket >= 0.8x converted-local", bucket, local, 0.8, bucket),
            ("converted-bucket >= 3x raw-bucket", bucket, raw_bucket, 3.0, bucket),
            (f"{ours} >= 1.5x {versus}", local, newest, 1.5, local),
            ("converted-local >= 0.85x pure-decode limit", local, decode, 0.85, local),
        ]
        for what, a, b, factor, subject in checks:
            ratio = a["samples_per_s"] / b["samples_per_s"] if a and b else None
            met = None if ratio is None else ratio >= factor
            out.append(_target(g, what, f"{ratio:.2f}x" if ratio else None, met, subject, results))
        if bucket:
            first = bucket.get("first_batch_s")
            out.append(
                _target(
                    g,
                    "first batch from the bucket < 1 s",
                    f"{first} s",
                    first is not None and first < 1,
                    bucket,
                    results,
                )
            )
        if local:
            memory = local["memory"]
            procs, who = (memory.get("workers"), "worker") if g[2] else ([memory.get("main") or {}], "main-process")
            growth = max((r["floor_growth_mb"] for r in procs or [] if "floor_growth_mb" in r), default=None)
            flat = None if growth is None else growth < 32
            out.append(_target(g, f"{who} RSS flat (floor growth < 32 MB)", f"{growth} MB", flat, None, results))
    return out


def _target(group: tuple, what: str, value: Any, met: bool | None, subject: Any, results: list) -> dict[str, Any]:
    mode, decode, workers, dtype, label = group
    return {
        "mode": mode,
        "decode": decode,
        "workers": workers,
        "dtype": dtype,
        "label": label,
        "target": what,
        "value": value,
        "result": "n/a (case missing)" if met is None else "met" if met else "missed",
        "bound_by": bound_by(subject, results) if subject is not None and met is False else "",
    }


# ---------------------------------------------------------------- charts


def charts(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """throughput.png (samples/s per loader/source, grouped by mode) and wait.png (p50/p95/p99)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok" and r["samples_per_s"]]
    if not ok:
        return []
    modes = sorted({r["mode"] for r in ok}, key=["frame", "act", "long"].index)
    series = sorted({(r["loader"], r["source"], r["decode"], r["workers"], r["dtype"]) for r in ok}, key=str)
    written = []
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(modes) * max(1, len(series)) / 4) + 4, 5))
    width = 0.8 / len(series)
    for i, s in enumerate(series):
        ys = [
            next(
                (
                    r["samples_per_s"]
                    for r in ok
                    if (r["loader"], r["source"], r["decode"], r["workers"], r["dtype"]) == s and r["mode"] == m
                ),
                0,
            )
            for m in modes
        ]
        ax.bar([m + i * width for m in range(len(modes))], ys, width, label=" / ".join(str(x) for x in s))
    ax.set_xticks([m + 0.4 - width / 2 for m in range(len(modes))], modes)
    ax.set_ylabel("samples/s (after warm-up)")
    ax.set_title("Samples per second by loader, source and mode")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: never over a bar
    fig.tight_layout()
    written.append(out / "throughput.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    waits = [r for r in ok if r["wait_p50_ms"] is not None]
    if waits:
        fig, ax = plt.subplots(figsize=(9, max(3, 0.3 * len(waits) + 1)))
        labels = [f"{r['loader']} {r['source']} {r['mode']} w{r['workers']} {r['dtype']}" for r in waits]
        for j, (q, colour) in enumerate(
            (("wait_p50_ms", "tab:green"), ("wait_p95_ms", "tab:orange"), ("wait_p99_ms", "tab:red"))
        ):
            ax.barh(
                [k + j * 0.27 for k in range(len(waits))], [r[q] or 0 for r in waits], 0.27, color=colour, label=q[5:8]
            )
        ax.set_yticks([k + 0.27 for k in range(len(waits))], labels, fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("time the training loop waited for a batch (ms, log)")
        ax.legend()
        fig.tight_layout()
        written.append(out / "wait.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def summarize(results: Path) -> str:
    """Write summary.md, summary.csv and the charts into ``results``; return the markdown."""
    found = load(results)
    rows = sorted(
        (row(r) for r in found),
        key=lambda r: (r["mode"], r["loader"] != "ours", r["loader"], r["source"], r["workers"], r["dtype"]),
    )
    write_csv(rows, results / "summary.csv")
    pngs = charts(rows, results)
    config = found[0]["config"] if found else {}
    lines = [f"# Loader benchmark: {results.name}", ""]
    if config:
        net, ds = config["network"], config["dataset"]
        cap = f" (at most {config['max_seconds']:g} s of measurement)" if config.get("max_seconds") else ""
        lines += [
            f"Dataset `{config['size']}`: {ds['episodes']} episodes, {ds['frames']} frames x {ds['cameras']} cameras, "
            f"raw {config['raw_bytes'] / 1e6:.0f} MB, converted {config['converted_bytes'] / 1e6:.0f} MB "
            f"({config['convert_options']}). Bucket: {net['latency_ms']:g} ms per request, "
            f"{net['bandwidth_mb_s']:g} MB/s shared. {config['warmup_batches']} warm-up (ours: at least until every "
            f"episode pool is full) + {config['batches']} measured batches per case{cap}; {config['machine']['cpus']} CPUs; git {config['git']}.",
            "",
            (
                f"samples/s: the median of {config['rounds']} interleaved rounds (each in `round_samples_per_s`). "
                if config.get("rounds", 1) > 1
                else ""
            )
            + "cpu_ms_per_sample: CPU time of the process tree (main + workers) per measured sample, which load "
            "on a shared machine barely moves. LeRobot runs only with workers: a workers=0 row of ours decodes "
            "in threads of the main process and is held against LeRobot's best worker count in the targets.",
            "",
        ]
    lines += [markdown_table(rows), "", "## Targets", ""]
    lines += [
        markdown_table(
            targets(found), ("mode", "decode", "workers", "dtype", "label", "target", "value", "result", "bound_by")
        )
    ]
    lines += ["", *(f"![{p.stem}]({p.name})" for p in pngs), ""]
    text = "\n".join(lines)
    (results / "summary.md").write_text(text)
    return text
