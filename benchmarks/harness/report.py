"""From a results directory (one JSON per case) to a markdown table, summary.csv, charts and the targets.

The targets are the object-storage issue's, reported and never asserted. For each it says met or
missed and, from the case's own counters, which resource bound it: the network (the shaper
delivered near its bandwidth, or workers waited on reads), decode (workers spent most of their
time in the decoder), float conversion (the uint8 twin is much faster) or collation/transfer
(near the DataLoader ceiling, which does no I/O and no decode).

LeRobot's loaders run only with DataLoader workers, so a workers=0 group of ours (decoding in
threads of the main process) is held against LeRobot's best worker count, and the target says so.

Cases with an ``epoch`` (the decoded-frame cache's cold and warm epochs, each measured whole) are
held to the frame cache's targets (issue 31): the cold epoch at least 3x LeRobot, the warm one at
least 8x (15x on a training-size conversion), the first batch of a cold cache under 2 s; a miss
names the largest share of its CPU time per sample (decode, cache reads, collation, the rest).
Their value gives the ratio of CPU ms per sample too, which load on a shared machine barely
moves. An epoch is measured from ``iter()`` on, pool fill and slabs included, so its memory
growth is no leak test (the frame cache's own benchmark measures a consumer's USS).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .host import percent

COLUMNS = (
    "loader",
    "source",
    "epoch",
    "mode",
    "decode",
    "workers",
    "dtype",
    "status",
    "samples_per_s",
    "round_samples_per_s",
    "round_host_steal_pct",
    "frames_per_s",
    "cpu_ms_per_sample",
    "decode_ms",
    "cache_read_ms",
    "collate_ms",
    "rest_ms",
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
    if r["case"].get("transport", "queue") != "queue":
        kind += f" {r['case']['transport']}"
    return f"{kind} [{r['case']['label']}]" if r["case"].get("label") else kind


def row(r: dict[str, Any]) -> dict[str, Any]:
    case, wait, rounds = r["case"], r.get("wait_s") or {}, r.get("rounds") or []
    workers = (r.get("memory") or {}).get("workers") or []
    split = r.get("cpu_split_ms") or {}
    ms = lambda v: round(v * 1000, 1) if v is not None else None  # noqa: E731
    worst = lambda key: max((w[key] for w in workers), default=None)  # noqa: E731
    return {
        "loader": _loader(r),
        "source": case["source"],
        "epoch": case.get("epoch", ""),
        "mode": case["mode"],
        "decode": case["decode"],
        "workers": case["workers"],
        "dtype": r.get("image_dtype_used") or case["image_dtype"],
        "status": r["status"],
        "samples_per_s": r.get("samples_per_s"),
        "round_samples_per_s": " / ".join(str(x["samples_per_s"]) for x in rounds) if len(rounds) > 1 else None,
        # the share of the machine's CPU time its host took, per round (harness.host): a slow round with
        # much steal was slowed by the host's other guests, not by its code
        "round_host_steal_pct": " / ".join(percent(x.get("host_steal")) for x in rounds)
        or percent(r.get("host_steal")),
        "frames_per_s": r.get("frames_per_s"),
        "cpu_ms_per_sample": r.get("cpu_ms_per_sample"),
        "decode_ms": split.get("decode_ms"),
        "cache_read_ms": split.get("cache_read_ms"),
        "collate_ms": split.get("collate_ms"),
        "rest_ms": split.get("rest_ms"),
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
    """(mode, decode, workers, dtype, label, transport, epoch) of a case."""
    c = r["case"]
    dtype = r.get("image_dtype_used") or c["image_dtype"]
    return (
        c["mode"],
        c["decode"],
        c["workers"],
        dtype,
        c.get("label", ""),
        c.get("transport", "queue"),
        c.get("epoch", ""),
    )


def _find(results: list[dict[str, Any]], group: tuple, kind: str, source: str | None = None) -> dict[str, Any] | None:
    """The ok case of ``kind`` in ``group``; the pure-decode limit has no transport, so any matches."""
    same = (lambda g: g[:5] == group[:5]) if kind == "pure-decode" else (lambda g: g == group)
    for r in results:
        if r["status"] == "ok" and r.get("samples_per_s") and r["case"]["kind"] == kind and same(_group(r)):
            if source is None or r["case"]["source"] == source:
                return r
    return None


def _lerobot_map(results: list[dict[str, Any]], group: tuple) -> dict[str, Any] | None:
    """The newest LeRobot map-style baseline of ``group``; for workers=0, where LeRobot has no
    case, its best worker count (same mode, decode, dtype and label)."""
    mode, decode, workers, dtype, label, *_ = group

    def matches(r: dict[str, Any]) -> bool:
        m, d, w, t, lab, *_ = _group(r)
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
    split = r.get("cpu_split_ms") or {}
    if c.get("epoch") and split:  # the frame cache's epochs: the largest share of a sample's CPU time
        shares = {
            "decode (the cache's sequential fills and any decode at emit)": split.get("decode_ms") or 0,
            "cache reads (verified copies out of the page cache)": split.get("cache_read_ms") or 0,
            "collation": split.get("collate_ms") or 0,
            "transport, sampling and the loop (the rest)": split.get("rest_ms") or 0,
        }
        name = max(shares, key=lambda k: shares[k])
        bound = f"{name}: {shares[name]:.1f} of {r.get('cpu_ms_per_sample')} CPU ms/sample on {_cpus(r)} cores"
        if split.get("fill_write_ms"):  # the fills' writes into new page-cache pages, and what they cost here
            bound += f", of which {split['fill_write_ms']:.1f} writing the frames into new page-cache pages"
            probe = ((r.get("config") or {}).get("machine") or {}).get("page_cache_ms_per_mb")
            if probe:
                bound += f" (this machine: {probe['new']:g} CPU ms/MB new, {probe['rewrite']:g} rewritten)"
        return bound
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
        twin = _find(results, (*group[:3], "uint8", *group[4:]), c["kind"], c["source"])
        if twin and twin["samples_per_s"] > 1.3 * r["samples_per_s"]:
            return "float conversion"
    ceiling = _find(results, group, "ceiling")
    if ceiling and r["samples_per_s"] >= 0.7 * ceiling["samples_per_s"]:
        return "collation/transfer (near the DataLoader ceiling)"
    return "CPU shared by decode, collation and other load"


def _cpus(r: dict[str, Any]) -> Any:
    return ((r.get("config") or {}).get("machine") or {}).get("cpus", "?")


FRAME_CACHE_TARGETS = {  # (epoch, source): ratio to LeRobot's best map-style worker count
    ("cold", "converted-local"): 3.0,
    ("cold", "converted-resized"): 3.0,
    ("warm", "converted-local"): 8.0,
    ("warm", "converted-resized"): 15.0,
}


def frame_cache_targets(results: list[dict[str, Any]], g: tuple) -> list[dict[str, Any]]:
    """Issue 31's targets of an epoch group: each source's epoch against LeRobot, a cold cache's first batch."""
    out = []
    epoch = g[6]
    newest = _lerobot_map(results, (*g[:2], 0, *g[3:]))  # LeRobot at its best worker count, whatever ours run
    versus = (newest["case"]["kind"] + f" (best: w{newest['case']['workers']})") if newest else "LeRobot map"
    for source in ("converted-local", "converted-resized"):
        mine = _find(results, g, "ours", source)
        if mine is None or (epoch, source) not in FRAME_CACHE_TARGETS:  # the disk epoch: reported, no target
            continue
        factor = FRAME_CACHE_TARGETS[(epoch, source)]
        ratio = mine["samples_per_s"] / newest["samples_per_s"] if newest else None
        met = None if ratio is None else ratio >= factor
        what = f"{epoch} epoch, {source} >= {factor:g}x {versus}"
        value = f"{ratio:.2f}x" if ratio else None
        theirs, cost = (newest or {}).get("cpu_ms_per_sample"), mine.get("cpu_ms_per_sample")
        if value and theirs and cost:  # what load on a shared machine barely moves: CPU per sample
            value += f" (CPU ms/sample {theirs / cost:.2f}x)"
        out.append(_target(g, what, value, met, mine, results))
        if epoch == "cold":
            first = mine.get("first_batch_s")
            ok = None if first is None else first < 2
            out.append(_target(g, f"first batch, cold cache, {source} < 2 s", f"{first} s", ok, mine, results))
    return out


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issues' targets, per group of cases that share mode, decode, workers, dtype, label, transport and epoch."""
    out = []
    groups = sorted({_group(r) for r in results if r["case"]["kind"] == "ours" and r["status"] == "ok"}, key=str)
    for g in groups:
        if g[6]:
            out += frame_cache_targets(results, g)
            continue
        local, bucket = _find(results, g, "ours", "converted-local"), _find(results, g, "ours", "converted-bucket")
        raw_bucket = _find(results, g, "ours", "raw-bucket")
        newest = _lerobot_map(results, g)
        versus = newest["case"]["kind"] if newest else "LeRobot map"
        ours = "converted-local"
        if not g[2]:  # LeRobot has no workers=0 case: its best worker count
            ours = f"converted-local (w0, {local.get('decode_threads') if local else '?'} threads)"
            versus += f" (best: w{newest['case']['workers'] if newest else '?'})"
        decode = _find(results, g, "pure-decode")
        limit = 0.9 if g[2] else 0.85  # with workers: issue 21's
        checks = [
            ("converted-bucket >= 0.8x converted-local", bucket, local, 0.8, bucket),
            ("converted-bucket >= 1.2x raw-bucket", bucket, raw_bucket, 1.2, bucket),
            (f"{ours} >= 2x {versus}", local, newest, 2.0, local),
            (f"converted-local >= {limit}x pure-decode limit", local, decode, limit, local),
        ]
        for what, a, b, factor, subject in checks:
            ratio = a["samples_per_s"] / b["samples_per_s"] if a and b else None
            met = None if ratio is None else ratio >= factor
            out.append(_target(g, what, f"{ratio:.2f}x" if ratio else None, met, subject, results))
        if g[2]:  # workers: what a sample costs against decoding it alone
            cost, floor = (local or {}).get("cpu_ms_per_sample"), (decode or {}).get("cpu_ms_per_sample")
            ratio = cost / floor if cost and floor else None
            met = None if ratio is None else ratio <= 1.1
            what = "converted-local CPU ms/sample <= 1.1x pure-decode's"
            out.append(_target(g, what, f"{ratio:.2f}x" if ratio else None, met, local, results))
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
    mode, decode, workers, dtype, label, transport, epoch = group
    return {
        "epoch": epoch,
        "mode": mode,
        "decode": decode,
        "workers": workers,
        "dtype": dtype,
        "label": label,
        "transport": transport,
        "target": what,
        "value": value,
        "result": "n/a (case missing)" if met is None else "met" if met else "missed",
        "bound_by": bound_by(subject, results) if subject is not None and met is False else "",
    }


# ---------------------------------------------------------------- charts

SOURCE_ORDER = (
    "raw-local",
    "converted-local",
    "converted-resized",
    "raw-bucket",
    "converted-bucket",
    "converted-bucket-warm",
)
STYLES = {  # bar colour (and hatch) per kind of configuration; the legend explains them
    "ours w0": ("#1f77b4", ""),
    "ours workers": ("#9ecae1", ""),
    "ours workers slab": ("#2ca02c", ""),
    "ours cold epoch": ("#ff7f0e", ""),
    "ours warm epoch": ("#d62728", ""),
    "ours disk epoch": ("#8c564b", ""),
    "LeRobot": ("#8c8c8c", ""),
    "decode limit": ("#ffffff", "xx"),
    "DataLoader ceiling": ("#ffffff", "//"),
}
LIMITS = {"pure-decode": "decode limit", "ceiling": "DataLoader ceiling"}


def _style(r: dict[str, Any]) -> str:
    if r["loader"].startswith("ours") and r.get("epoch"):
        return f"ours {r['epoch']} epoch"
    if r["loader"].startswith("ours"):
        return "ours w0" if not r["workers"] else "ours workers slab" if " slab" in r["loader"] else "ours workers"
    return LIMITS.get(r["loader"].split(" ")[0], "LeRobot")


def throughput_groups(rows: list[dict[str, Any]], mode: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """The throughput chart of one mode, as data: [(group title, [bar])], each bar one configuration
    with its ``label``, ``value`` (samples/s), ``ratio`` to the newest LeRobot map-style baseline at
    its best worker count (same decode and dtype; None without one) and ``style``. Ours are grouped
    by source, then LeRobot, then the limits (pure decode, DataLoader ceiling), each apart."""
    ok = [r for r in rows if r["status"] == "ok" and r["samples_per_s"] and r["mode"] == mode]
    several = lambda key: len({r[key] for r in ok}) > 1  # noqa: E731
    maps = [r for r in ok if r["loader"].endswith(":map")]
    newest = max((r["loader"] for r in maps), default=None)

    def reference(r: dict[str, Any]) -> float | None:
        same = [
            m["samples_per_s"]
            for m in maps
            if m["loader"] == newest and (m["dtype"], m["decode"]) == (r["dtype"], r["decode"])
        ]
        return max(same, default=None)

    def bar(r: dict[str, Any], name: str) -> dict[str, Any]:
        parts = [f"w{r['workers']}", name] if r["loader"].startswith("ours") else [name, f"w{r['workers']}"]
        parts += [r["dtype"]] if several("dtype") else []
        parts += [r["decode"]] if r["decode"] != "cpu" else []
        ref = reference(r)
        return {
            "label": " ".join(p for p in parts if p),
            "value": r["samples_per_s"],
            "ratio": r["samples_per_s"] / ref if ref else None,
            "style": _style(r),
        }

    key = lambda r: (r["workers"], r["loader"], r["dtype"], r["decode"])  # noqa: E731
    groups: list[tuple[str, list[dict[str, Any]]]] = []
    ours = [r for r in ok if r["loader"].startswith("ours")]
    for source in sorted({r["source"] for r in ours}, key=lambda s: (SOURCE_ORDER + (s,)).index(s)):
        for epoch in ("", "cold", "warm", "disk"):  # windowed cases, then the frame cache's epochs apart
            mine = sorted((r for r in ours if r["source"] == source and r.get("epoch", "") == epoch), key=key)
            title = f"ours, {source}" + (f", {epoch} epoch" if epoch else "")
            if mine:
                groups.append((title, [bar(r, r["loader"][len("ours") :].strip()) for r in mine]))
    lerobot = sorted((r for r in ok if _style(r) == "LeRobot"), key=lambda r: (r["loader"], r["workers"], r["dtype"]))
    if lerobot:
        groups.append(
            ("LeRobot (raw-local)", [bar(r, r["loader"].replace("lerobot-", "").replace(":", " ")) for r in lerobot])
        )
    limits = sorted(
        (r for r in ok if _style(r) in LIMITS.values()),
        key=lambda r: (r["loader"].split(" ")[0] != "pure-decode", *key(r)),
    )
    if limits:
        names = {"pure-decode": "decode", "ceiling": "ceiling"}
        groups.append(("limits", [bar(r, " ".join(names.get(w, w) for w in r["loader"].split(" "))) for r in limits]))
    return groups


def _throughput_chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    modes = [m for m in ("frame", "act", "long") if any(r["mode"] == m for r in rows)]
    layouts = [throughput_groups(rows, m) for m in modes]
    bars = max(sum(len(b) for _, b in groups) + 2 * len(groups) for groups in layouts)
    fig, axes = plt.subplots(len(modes), 1, figsize=(max(8, 0.55 * bars + 2), 5.4 * len(modes)), squeeze=False)
    for ax, mode, groups in zip(axes[:, 0], modes, layouts):
        x, ticks, labels = 0.0, [], []
        # the DataLoader ceiling (no I/O, no decode) may dwarf every loader: it is cut at the top
        real = [b["value"] for _, bs in groups for b in bs if not b["label"].startswith("ceiling")]
        top = max(real or [b["value"] for _, bs in groups for b in bs])
        for i, (title, group) in enumerate(groups):
            if i and not title.startswith("ours") and groups[i - 1][0].startswith("ours"):
                ax.axvline(x - 0.6, color="black", linewidth=0.8, linestyle=":")  # ours | baselines and limits
            start = x
            for b in group:
                colour, hatch = STYLES[b["style"]]
                height = min(b["value"], top * 1.2)
                ax.bar(x, height, 0.8, color=colour, hatch=hatch, edgecolor="black", linewidth=0.6)
                text = f"{b['value']:.0f}" + (f"\n{b['ratio']:.2f}x" if b["ratio"] is not None else "")
                text += " (cut)" if height < b["value"] else ""
                ax.text(x, height + top * 0.01, text, ha="center", va="bottom", fontsize=7)
                ticks.append(x)
                labels.append(b["label"])
                x += 1
            ax.text(
                (start + x - 1) / 2, 0.97, title, transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=8
            )
            x += 1.2
        ax.set_xticks(ticks, labels, rotation=45, ha="right", fontsize=7)
        ax.set_ylim(0, top * 1.35)
        ax.set_ylabel("samples/s (after warm-up; an epoch: all of it)")
        ratios = any(b["ratio"] is not None for _, bs in groups for b in bs)
        under = "under each value its ratio to the newest LeRobot" if ratios else "no LeRobot results: no ratios"
        ax.set_title(f"{mode}: samples/s per configuration; {under}", fontsize=9)
    used = {b["style"] for groups in layouts for _, bs in groups for b in bs}
    legend = [Patch(facecolor=c, hatch=h, edgecolor="black", label=n) for n, (c, h) in STYLES.items() if n in used]
    axes[0, 0].legend(handles=legend, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def charts(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """throughput.png (``throughput_groups`` of every mode) and wait.png (p50/p95/p99)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok" and r["samples_per_s"]]
    if not ok:
        return []
    written = [out / "throughput.png"]
    _throughput_chart(ok, written[-1])

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
        key=lambda r: (
            r["mode"],
            not r["loader"].startswith("ours"),
            r["epoch"] != "",
            r["source"],
            ("", "cold", "warm", "disk").index(r["epoch"]),
            r["loader"],
            r["workers"],
            r["dtype"],
        ),
    )
    write_csv(rows, results / "summary.csv")
    pngs = charts(rows, results)
    config = found[0]["config"] if found else {}
    lines = [f"# Loader benchmark: {results.name}", ""]
    if config:
        net, ds = config["network"], config["dataset"]
        cap = f" (at most {config['max_seconds']:g} s of measurement)" if config.get("max_seconds") else ""
        lines += [
            f"Dataset `{config.get('raw') or config['size']}`: {ds['episodes']} episodes, {ds['frames']} frames x {ds['cameras']} cameras, "
            f"raw {config['raw_bytes'] / 1e6:.0f} MB, converted {config['converted_bytes'] / 1e6:.0f} MB "
            f"({config['convert_options']})"
            + (
                f"; converted-resized {config['resized_bytes'] / 1e6:.0f} MB ({config['resized_convert_options']})"
                if config.get("resized_bytes")
                else ""
            )
            + f". Bucket: {net['latency_ms']:g} ms per request, "
            f"{net['bandwidth_mb_s']:g} MB/s shared. {config['warmup_batches']} warm-up (ours: at least until every "
            f"episode pool is full) + {config['batches']} measured batches per case{cap}; {config['machine']['cpus']} CPUs; git {config['git']}.",
            "",
            (
                f"samples/s: the median of {config['rounds']} interleaved rounds (each in `round_samples_per_s`; "
                "`round_host_steal_pct`: the share of the machine's CPU time its host took in each round, "
                "`harness.host`). "
                if config.get("rounds", 1) > 1
                else ""
            )
            + "cpu_ms_per_sample: CPU time of the process tree (main + workers) per measured sample, which load "
            "on a shared machine barely moves. LeRobot runs only with workers: a workers=0 row of ours decodes "
            "in threads of the main process and is held against LeRobot's best worker count in the targets.",
            "",
        ]
        probe = config["machine"].get("page_cache_ms_per_mb")
        if probe:
            lines += [
                f"Writing into new page-cache pages cost {probe['new']:g} CPU ms/MB on this machine, rewriting the "
                f"same pages {probe['rewrite']:g} (`harness.measure.page_cache_write_cost`, before the cases): a "
                "cold epoch's fills write every decoded frame into new pages, so a VM whose host backs guest "
                "memory lazily (free page reporting) pays that ratio on them; bare metal pays about the rewrite.",
                "",
            ]
    lines += [markdown_table(rows), "", "## Targets", ""]
    lines += [
        markdown_table(
            targets(found),
            (
                "mode",
                "decode",
                "workers",
                "dtype",
                "label",
                "transport",
                "epoch",
                "target",
                "value",
                "result",
                "bound_by",
            ),
        )
    ]
    lines += ["", *(f"![{p.stem}]({p.name})" for p in pngs), ""]
    text = "\n".join(lines)
    (results / "summary.md").write_text(text)
    return text
