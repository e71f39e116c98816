"""Training throughput with LeRobot 0.6.1's own trainer: ``lerobot-train`` on LeRobot's dataset against
``lerobot-shards train`` on the same data converted to shards; same policy, batch size, seed, CPU.

Runs inside the LeRobot environment (tests/lerobot/env.sh), from the repository root::

    PYTHONPATH=$PWD/src bash tests/lerobot/env.sh run $PWD -- benchmarks/train_throughput.py

The data: a synthetic LeRobot v3.0 dataset with the weight of real footage (``synth --texture
realistic``: two 640x480 AV1 cameras at LeRobot's g=2, crf=30, about 21 KB a frame), 4 episodes of
30-40 frames, built once under ``data/train-throughput/`` with its stream-copied conversion. It is
small so that every run of 24 steps spans more than one epoch (1.6 for Diffusion, 1.3 for ACT): ``lerobot-shards train`` turns its decoded-frame cache on by itself, so its first epoch
decodes and fills the cache and the later ones read it, as in a real training run. Each run gets a
``$TMPDIR`` of its own, so each starts with an empty cache; the first epoch is reported apart.

The policies, small so that a step is bound by the data, not the model (the loader is what is
measured; on a GPU the model's share shrinks further):
- Diffusion: two past frames of each camera per sample, its encoder (a ResNet18 with group norm)
  sees an 84x84 random crop of each, the U-Net is narrow (``down_dims=[32,64]``).
- ACT: one frame of each camera per sample and a 10-step action chunk, a 1-layer 32-wide
  transformer. ACT's image encoder is a ResNet18 over each whole frame (no crop option, and its
  config accepts ResNets only): at 640x480 its forward and backward cost 1.6-1.8 CPU s per frame
  here, 3.5 s per sample, which would measure the ResNet, not the data. So its ``input_features``
  leave the cameras out and give it an environment state instead (``observation.state`` copied as
  ``observation.environment_state``, ``add_environment_state``: ACT needs an image or one): both
  trainers still read, decode and (with transforms on) augment both cameras of every sample, as in
  any ACT run (LeRobot's dataset and ours return every camera a dataset holds).
Image transforms on is ``--dataset.image_transforms.enable=true``: LeRobot's default set (three of
brightness, contrast, saturation, hue, sharpness and affine per camera value), applied per sample
in LeRobot's DataLoader workers and in ours (seeded per sample, bit-identical to LeRobot's).

Two LeRobot baselines: ``lerobot-train`` as users run it, and "LeRobot tuned", the same under the
process settings ``lerobot-shards train`` sets for itself (``train_process.environment()``: OpenMP's
passive wait, glibc's allocator keeping large blocks). Those settings change no bit and are not
the loader: LeRobot's own loop allocates four 59 MB float copies of a Diffusion batch per camera
every step, which glibc maps and faults in afresh each time, and its OpenMP team spins on the cores
its DataLoader workers need (measured 2026-12-07: Diffusion 4.4 -> 8.6 samples/s under them). Ours
over the tuned baseline is the loader's own share; ours over the plain one is what a user who
switches gets.

Loader layouts: ``lerobot-train`` with ``--num_workers`` (default 2, its best on 2 cores);
``lerobot-shards train`` without ``--num_workers``, so in the layout it picks by itself (printed in
its log and recorded).

Measured from the first log window's line to the last one's (``--log-freq`` steps each; the first
window, with start-up and the first decoders, is left out), as each line arrives: wall-clock
samples/s, and the CPU seconds the whole process tree (trainer and DataLoader workers) spent per
sample, read from /proc at each line: on a shared machine, load moves it least. The epoch that
holds the first window's end is "the first epoch" (its windows are reported apart: cold cache for
ours); "later epochs" are the windows after it. The load average is recorded around each run, and
the share of the machine's CPU time its host took meanwhile (``harness.host``: on this shared VM the
same ours-alone ACT run measured 34.1 samples/s with 15.5 % stolen and 46.3-47.8 with 0.2-0.4 %).
Runs alternate: for each repeat, each policy and transforms setting, LeRobot's run then ours, so a
change in the machine's load falls on both. Figures are medians over the repeats.
Results: ``benchmarks/results/train_throughput.json`` and ``train_throughput.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from harness.host import cpu_ticks, percent, stolen_share
from lerobot_shards.integrations import train_process

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data/train-throughput"
RESULTS = REPO / "benchmarks/results/train_throughput.json"
SYNTH = dict(
    num_episodes=4,
    cameras=("observation.images.front", "observation.images.top"),
    height=480,
    width=640,
    length_range=(30, 40),
    codec="av1",
    gop=2,
    crf=30,
    texture="realistic",
    episodes_per_video_file=4,  # one mp4 per camera, as LeRobot writes a dataset this small
    episodes_per_data_file=4,
    seed=0,
)
ENV = "observation.environment_state"  # ACT's model input in place of its cameras (see above)
POLICIES: dict[str, dict[str, str]] = {
    "diffusion": {
        "type": "diffusion",
        "n_obs_steps": "2",
        "horizon": "16",
        "n_action_steps": "8",
        "down_dims": "[32,64]",
        "diffusion_step_embed_dim": "32",
        "spatial_softmax_num_keypoints": "8",
        "crop_shape": "[84,84]",
        "use_group_norm": "true",
        "pretrained_backbone_weights": "null",
    },
    "act": {
        "type": "act",
        "dim_model": "32",
        "n_heads": "2",
        "dim_feedforward": "64",
        "n_encoder_layers": "1",
        "n_decoder_layers": "1",
        "n_vae_encoder_layers": "1",
        "latent_dim": "8",
        "chunk_size": "10",
        "n_action_steps": "10",
        "pretrained_backbone_weights": "null",
        "input_features": json.dumps(
            {"observation.state": {"type": "STATE", "shape": [6]}, ENV: {"type": "ENV", "shape": [6]}}
        ),
    },
}
DROP_N_LAST = {"diffusion": 7, "act": 0}  # LeRobot's EpisodeAwareSampler never samples these
# lerobot-train as users run it, and under the process settings `lerobot-shards train` sets itself
LEROBOT_TRAINERS = ("lerobot", "lerobot-tuned")
WINDOW = re.compile(r"step:(\d+)\s.*?updt_s:([\d.]+)\s+data_s:([\d.]+)")


def datasets() -> tuple[Path, Path, list[int]]:
    """The raw dataset, its conversion and its episode lengths (built on first use, and again when
    SYNTH changed or a build was killed half-way)."""
    from lerobot_shards.convert.run import convert_dataset
    from lerobot_shards.synth import synth_dataset

    raw, shards, stamp = DATA / "raw", DATA / "shards", DATA / "synth.json"
    wanted = json.dumps({**SYNTH, "added": ENV}, sort_keys=True)
    if not (raw / "meta/info.json").is_file() or not stamp.is_file() or stamp.read_text() != wanted:
        shutil.rmtree(DATA, ignore_errors=True)
        print(f"building {raw} (once)", flush=True)
        synth_dataset(raw, workers=os.cpu_count() or 1, **SYNTH)  # type: ignore[arg-type]
        add_environment_state(raw)
    if not (shards / "manifest.json").is_file():
        print(f"converting into {shards} (once)", flush=True)
        convert_dataset(raw, shards, progress=False)
    stamp.write_text(wanted)
    import pyarrow.parquet as pq

    episodes = pq.read_table(next((raw / "meta/episodes").rglob("*.parquet")), columns=["length"])
    return raw, shards, [int(n) for n in episodes.column("length").to_pylist()]


def add_environment_state(raw: Path) -> None:
    """``observation.state`` copied as ``observation.environment_state`` (values, schema, stats), so
    ACT can train without its cameras: it needs an image or an environment state."""
    import pyarrow.parquet as pq

    for name in ("info.json", "stats.json"):
        meta = json.loads((raw / "meta" / name).read_text())
        table = meta["features"] if name == "info.json" else meta
        table[ENV] = table["observation.state"]
        (raw / "meta" / name).write_text(json.dumps(meta, indent=4))
    for path in (raw / "data").rglob("*.parquet"):
        data = pq.read_table(path)
        hf = json.loads(data.schema.metadata[b"huggingface"])
        hf["info"]["features"][ENV] = hf["info"]["features"]["observation.state"]
        data = data.append_column(ENV, data["observation.state"])
        pq.write_table(data.replace_schema_metadata({b"huggingface": json.dumps(hf).encode()}), path)
    for path in (raw / "meta/episodes").rglob("*.parquet"):
        episodes = pq.read_table(path)
        for column in [c for c in episodes.column_names if c.startswith("stats/observation.state/")]:
            episodes = episodes.append_column(column.replace("observation.state", ENV), episodes[column])
        pq.write_table(episodes, path)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and every descendant, live or reaped (a reaped
    child's time is in its parent's children_* fields)."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:  # exited and reaped: no figure for a line read after that
        return math.nan
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def command(trainer: str, policy: str, transforms: bool, root: Path, out: Path, args: argparse.Namespace) -> list[str]:
    lerobot = trainer in LEROBOT_TRAINERS
    cmd = [sys.executable, "-m", "lerobot.scripts.lerobot_train" if lerobot else "lerobot_shards.cli"]
    if not lerobot:
        cmd.append("train")
    cmd += [
        "--dataset.repo_id=local/train-throughput",
        f"--dataset.root={root}",
        f"--dataset.image_transforms.enable={str(transforms).lower()}",
        *(f"--policy.{k}={v}" for k, v in POLICIES[policy].items()),
        "--policy.device=cpu",
        "--policy.push_to_hub=false",
        f"--batch_size={args.batch_size}",
        f"--steps={args.steps}",
        f"--save_freq={args.steps * 10}",  # only the final checkpoint, after the last window
        f"--log_freq={args.log_freq}",
        "--seed=1",
        "--wandb.enable=false",
        f"--output_dir={out}",
    ]
    if lerobot:
        cmd.append(f"--num_workers={args.num_workers}")
    return cmd


def _end_session_after(proc: subprocess.Popen[str]) -> None:
    proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def segment(marks: list[tuple[int, float, float]], batch: int) -> dict[str, float] | None:
    """samples/s and CPU s per sample between the first and the last of ``marks`` (step, wall, CPU)."""
    if len(marks) < 2:
        return None
    (s0, t0, c0), (s1, t1, c1) = marks[0], marks[-1]
    samples = (s1 - s0) * batch
    return {"steps": s1 - s0, "samples_per_s": samples / (t1 - t0), "cpu_s_per_sample": (c1 - c0) / samples}


def run_one(
    trainer: str, policy: str, transforms: bool, root: Path, epoch_steps: int, args: argparse.Namespace, tag: str
) -> dict[str, Any]:
    """One training run, measured between its first and last log windows, and the first epoch apart."""
    out = DATA / "runs" / tag
    shutil.rmtree(out.parent / f"{tag}.tmp", ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    tmp = out.parent / f"{tag}.tmp"  # a $TMPDIR of its own: the frame cache starts empty
    tmp.mkdir(parents=True)
    environ = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "HF_LEROBOT_HOME": str(DATA / "home"),
        "TMPDIR": str(tmp),
        # LeRobot's trainer under the process settings ours sets itself (OpenMP's wait, glibc's
        # allocator): what is left between it and ours is the loader's
        **(train_process.environment() if trainer == "lerobot-tuned" else {}),
    }
    load_before, ticks = os.getloadavg(), cpu_ticks()
    started = time.monotonic()
    marks: list[tuple[int, float, float]] = []  # step, wall, tree CPU
    lerobot_avg: list[tuple[float, float]] = []  # LeRobot's own updt_s, data_s per window
    log = []
    cmd = command(trainer, policy, transforms, root, out, args)
    popen = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ, start_new_session=True)
    with subprocess.Popen(cmd, **popen) as proc:  # type: ignore[call-overload]
        # Once the trainer exits, whatever it left behind (DataLoader workers orphaned by a crash hold
        # the log pipe open and spin) goes with it: its own session, ended by id.
        threading.Thread(target=_end_session_after, args=(proc,), daemon=True).start()
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            window = WINDOW.search(line)
            if window and not math.isnan(cpu := tree_cpu_s(proc.pid)):
                marks.append((int(window[1]), time.monotonic(), cpu))
                lerobot_avg.append((float(window[2]), float(window[3])))
            if time.monotonic() - started > args.timeout:
                proc.kill()
        rc = proc.wait()
    wall = time.monotonic() - started
    stolen = stolen_share(ticks, cpu_ticks())
    text = "".join(log)
    (out.parent / f"{tag}.log").write_text(text)
    shutil.rmtree(tmp, ignore_errors=True)
    if rc != 0:
        raise SystemExit(f"{tag} exited {rc}; log tail:\n{text[-3000:]}")
    steady = segment(marks, args.batch_size)
    if steady is None:
        raise SystemExit(f"{tag}: fewer than two log windows in its log:\n{text[-3000:]}")
    first_end = max(epoch_steps, marks[0][0])  # the epoch holding the first window's end
    first = [m for m in marks if m[0] <= first_end]
    later = [m for m in marks if m[0] >= first_end]
    layout = re.search(r"num_workers=\d+(?: \(given\))?, decode[ _]threads[ =]\w+(?:, decode_ahead=\d+)?", text)
    cache = re.search(r"frame cache[^\n]*", text)
    return {
        "trainer": trainer,
        "policy": policy,
        "transforms": transforms,
        "measured_steps": f"{marks[0][0] + 1}-{marks[-1][0]}",
        **steady,
        "first_epoch": segment(first, args.batch_size),
        "later_epochs": segment(later, args.batch_size),
        "lerobot_data_s": statistics.fmean(d for _, d in lerobot_avg[1:]),  # its own per-window averages
        "lerobot_updt_s": statistics.fmean(u for u, _ in lerobot_avg[1:]),
        "wall_s": wall,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "host_steal": stolen,  # the share of the machine's CPU time its host took (harness.host)
        **({"layout": layout.group(0)} if layout else {}),
        **({"frame_cache": cache.group(0)} if cache and trainer not in LEROBOT_TRAINERS else {}),
    }


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per policy and transforms setting: each trainer's medians over its runs, every run's figure
    (the spread is part of the result on a shared machine), and ours over LeRobot's."""
    rows = []
    for policy, transforms in dict.fromkeys((r["policy"], r["transforms"]) for r in runs):
        row: dict[str, Any] = {"policy": policy, "transforms": transforms}
        speeds: dict[str, list[float]] = {}  # each trainer's runs in order: the i-th of each is repeat i
        for trainer in (*LEROBOT_TRAINERS, "lerobot-shards"):
            mine = [r for r in runs if (r["policy"], r["transforms"], r["trainer"]) == (policy, transforms, trainer)]
            if not mine:
                continue
            speeds[trainer] = [r["samples_per_s"] for r in mine]
            later = [r["later_epochs"]["samples_per_s"] for r in mine if r["later_epochs"]]
            row[trainer] = {
                "samples_per_s": statistics.median(r["samples_per_s"] for r in mine),
                "samples_per_s_runs": [round(r["samples_per_s"], 2) for r in mine],
                "cpu_s_per_sample": statistics.median(r["cpu_s_per_sample"] for r in mine),
                "cpu_s_per_sample_runs": [round(r["cpu_s_per_sample"], 3) for r in mine],
                "first_epoch_samples_per_s": statistics.median(
                    r["first_epoch"]["samples_per_s"] for r in mine if r["first_epoch"]
                )
                if any(r["first_epoch"] for r in mine)
                else None,
                "later_epochs_samples_per_s": statistics.median(later) if later else None,
                "loadavg_1min": [round(r["loadavg_before"][0], 1) for r in mine],
                "host_steal_pct": [percent(r.get("host_steal"), "-") for r in mine],
            }
        if "lerobot" in row and "lerobot-shards" in row:
            ours, theirs = row["lerobot-shards"], row["lerobot"]
            row["ratio_samples_per_s"] = ours["samples_per_s"] / theirs["samples_per_s"]
            row["ratio_cpu_s_per_sample"] = theirs["cpu_s_per_sample"] / ours["cpu_s_per_sample"]
            # run by run (a ratio of medians pairs runs of different repeats): ours over the run before it
            row["ratio_runs"] = [o / t for o, t in zip(speeds["lerobot-shards"], speeds["lerobot"], strict=False)]
        if "lerobot-tuned" in row and "lerobot-shards" in row:  # the loader's own share
            ours, tuned = row["lerobot-shards"], row["lerobot-tuned"]
            row["ratio_to_tuned_samples_per_s"] = ours["samples_per_s"] / tuned["samples_per_s"]
            row["ratio_to_tuned_cpu_s_per_sample"] = tuned["cpu_s_per_sample"] / ours["cpu_s_per_sample"]
            row["ratio_to_tuned_runs"] = [
                o / t for o, t in zip(speeds["lerobot-shards"], speeds["lerobot-tuned"], strict=False)
            ]
        rows.append(row)
    return rows


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(rows: list[dict[str, Any]], record: dict[str, Any]) -> str:
    """The summary as markdown: one line per policy and transforms setting."""
    done = min(
        (len(row[t]["samples_per_s_runs"]) for row in rows for t in (*LEROBOT_TRAINERS, "lerobot-shards") if t in row),
        default=0,
    )
    lines = [
        "# LeRobot 0.6.1's trainer: `lerobot-shards train` over `lerobot-train`",
        "",
        f"{record['date']}; {record['machine']['cpus']} CPUs; load average (1 min) {record['load_range']} "
        f"during the runs; {done} of {record['config']['repeats']} runs of each case, interleaved; medians. "
        "`benchmarks/train_throughput.py` (its docstring says how it measures); every run in train_throughput.json. "
        "Host steal: the share of the machine's CPU time its host took during each run (this is a shared VM; "
        "`harness.host`). LeRobot tuned: `lerobot-train` under the process settings "
        "`lerobot-shards train` sets itself (`train_process.environment()`: OpenMP's passive wait, glibc's "
        "allocator thresholds), so ours over it is the loader's own share.",
        "",
        "| policy | transforms | LeRobot samples/s | LeRobot tuned | ours samples/s | ratio | ratio to tuned "
        "| ratio run by run (to tuned) | LeRobot / tuned / ours CPU s/sample | CPU ratio (to tuned) "
        "| ours, first epoch / later epochs samples/s | host steal % per run, LeRobot / tuned / ours |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        theirs, ours, tuned = row.get("lerobot"), row.get("lerobot-shards"), row.get("lerobot-tuned")
        if not theirs or not ours:
            continue
        first, later = ours["first_epoch_samples_per_s"], ours["later_epochs_samples_per_s"]
        to_tuned = f"{row['ratio_to_tuned_samples_per_s']:.2f}x" if tuned else "-"
        cpu_tuned = f" ({row['ratio_to_tuned_cpu_s_per_sample']:.2f}x)" if tuned else ""
        tuned_cpu = f"{tuned['cpu_s_per_sample']:.3f}" if tuned else "-"
        by_run = ", ".join(f"{x:.2f}" for x in row.get("ratio_runs", []))
        if tuned:
            by_run += f" ({', '.join(f'{x:.2f}' for x in row.get('ratio_to_tuned_runs', []))})"
        steal = " / ".join(", ".join(t["host_steal_pct"]) if t else "-" for t in (theirs, tuned, ours))
        lines.append(
            f"| {row['policy']} | {'on' if row['transforms'] else 'off'} | {theirs['samples_per_s']:.1f} "
            f"| {_figure(tuned['samples_per_s'] if tuned else None)} | {ours['samples_per_s']:.1f} "
            f"| **{row['ratio_samples_per_s']:.2f}x** | {to_tuned} | {by_run} "
            f"| {theirs['cpu_s_per_sample']:.3f} / {tuned_cpu} "
            f"/ {ours['cpu_s_per_sample']:.3f} | {row['ratio_cpu_s_per_sample']:.2f}x{cpu_tuned} "
            f"| {_figure(first)} / {_figure(later)} | {steal} |"
        )
    return "\n".join(lines) + "\n"


def write(runs: list[dict[str, Any]], args: argparse.Namespace, lengths: list[int]) -> None:
    """The record of ``runs`` so far: JSON with every run, and the markdown summary beside it."""
    rows = summarize(runs)
    import importlib.metadata

    loads = [x for r in runs for x in (r["loadavg_before"][0], r["loadavg_after"][0])]
    record = {
        "what": "LeRobot 0.6.1's trainer, samples/s and CPU s per sample: lerobot-train on LeRobot's dataset "
        "vs lerobot-shards train on shards in its own layout (frame cache on by itself, cold at each run's start)",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "load_range": f"{min(loads):.1f}-{max(loads):.1f}",
        "versions": {p: importlib.metadata.version(p) for p in ("lerobot", "torch", "torchcodec", "torchvision")},
        "dataset": {**{k: list(v) if isinstance(v, tuple) else v for k, v in SYNTH.items()}, "lengths": lengths},
        "config": {
            "policies": {p: POLICIES[p] for p in args.policies.split(",")},
            "device": "cpu",
            "batch_size": args.batch_size,
            "lerobot_num_workers": args.num_workers,
            "steps": args.steps,
            "log_freq": args.log_freq,
            "repeats": args.repeats,
            "excluded": f"the first {args.log_freq} steps (start-up); figures are medians over the runs",
            "epochs": "first_epoch: the windows up to the end of the epoch holding the first window's end; "
            "later_epochs: the windows after it (ours: frame cache warm)",
        },
        "summary": rows,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(table(rows, record))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", default="diffusion,act")
    parser.add_argument("--transforms", default="on,off", help="on, off or on,off")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--log-freq", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-workers", type=int, default=2, help="lerobot-train's (ours picks its own)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each case, interleaved")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import lerobot  # noqa: F401  (fails here, not in the first run, outside the LeRobot environment)

    raw, shards, lengths = datasets()
    policies = args.policies.split(",")
    settings = [{"on": True, "off": False}[t] for t in args.transforms.split(",")]
    runs = []
    for r in range(args.repeats):
        for policy in policies:
            samples = sum(max(n - DROP_N_LAST[policy], 0) for n in lengths)
            epoch_steps = math.ceil(samples / args.batch_size)
            for transforms in settings:
                for trainer, root in (("lerobot", raw), ("lerobot-tuned", raw), ("lerobot-shards", shards)):
                    tag = f"{policy}-{'tf' if transforms else 'plain'}-{trainer}-{r}"
                    result = run_one(trainer, policy, transforms, root, epoch_steps, args, tag)
                    result["epoch_steps"] = epoch_steps
                    print(
                        f"{tag:36s} {result['samples_per_s']:6.2f} samples/s, {result['cpu_s_per_sample']:.3f} CPU s/sample, "
                        f"host steal {percent(result['host_steal'], '-')} %, load {result['loadavg_before'][0]:.1f} -> {result['loadavg_after'][0]:.1f}",
                        flush=True,
                    )
                    runs.append(result)
                    write(runs, args, lengths)  # after every run: an interrupted benchmark keeps its runs
    print(table(summarize(runs), json.loads(args.out.read_text())))


if __name__ == "__main__":
    main()
