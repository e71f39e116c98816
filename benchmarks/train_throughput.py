"""Training throughput with LeRobot 0.6.1's own trainer: ``lerobot-train`` on LeRobot's dataset against
``lerobot-shards train`` on the same data converted to shards; same policy, batch size, workers, CPU.

Runs inside the LeRobot environment (tests/lerobot/env.sh), from the repository root::

    PYTHONPATH=$PWD/src bash tests/lerobot/env.sh run $PWD -- benchmarks/train_throughput.py

The data: a synthetic LeRobot v3.0 dataset with the weight of real footage (``synth --texture
realistic``, two 640x480 AV1 cameras at LeRobot's g=2, crf=30, about 21 KB a frame), built once under
``data/train-throughput/`` with its stream-copied conversion. The policy: a small Diffusion policy
whose encoder sees an 84x84 crop, so the step is bound by reading and decoding two past frames of
two cameras per sample rather than by the model, which is where a loader shows.

Measured from the first log window's line to the last one's (``--log-freq`` steps each; the first
window, with worker start-up and the first decoders, is left out), as each line arrives: wall-clock
steps/s and samples/s, and the CPU seconds the whole process tree (trainer and DataLoader workers)
spent per sample, which a shared machine's load disturbs less. LeRobot's own per-window averages
(``updt_s``, ``data_s``) are kept too. Runs alternate between the two trainers (``--repeats``) and
the load average is recorded around each: the machine is shared.
Results: ``benchmarks/results/train_throughput.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data/train-throughput"
RESULTS = REPO / "benchmarks/results/train_throughput.json"
SYNTH = dict(
    num_episodes=8,
    cameras=("observation.images.front", "observation.images.top"),
    height=480,
    width=640,
    length_range=(150, 250),
    codec="av1",
    gop=2,
    crf=30,
    texture="realistic",
    episodes_per_video_file=8,  # one mp4 per camera, as LeRobot writes a dataset this small
    episodes_per_data_file=8,
    seed=0,
)
# A small Diffusion policy (tests/lerobot/test_train.py trains a like one on 48x64 frames); its encoder
# sees an 84x84 random crop of each 480x640 frame, so the model's cost stays below the loader's.
POLICY = {
    "type": "diffusion",
    "n_obs_steps": 2,
    "horizon": 16,
    "n_action_steps": 8,
    "down_dims": "[32,64]",
    "diffusion_step_embed_dim": 32,
    "spatial_softmax_num_keypoints": 8,
    "crop_shape": "[84,84]",
    "use_group_norm": "true",
    "pretrained_backbone_weights": "null",
}
WINDOW = re.compile(r"step:(\d+)\s.*?updt_s:([\d.]+)\s+data_s:([\d.]+)")


def datasets() -> tuple[Path, Path]:
    """The raw dataset and its conversion (built on first use; a build killed half-way is redone)."""
    from lerobot_shards.convert.run import convert_dataset
    from lerobot_shards.synth import synth_dataset

    raw, shards = DATA / "raw", DATA / "shards"
    if not (raw / "meta/info.json").is_file():
        import shutil

        shutil.rmtree(DATA, ignore_errors=True)
        print(f"building {raw} (once)", flush=True)
        synth_dataset(raw, workers=os.cpu_count() or 1, **SYNTH)  # type: ignore[arg-type]
    if not (shards / "manifest.json").is_file():
        print(f"converting into {shards} (once)", flush=True)
        convert_dataset(raw, shards, progress=False)
    return raw, shards


def tree_cpu_s(proc: Any) -> float:
    """CPU seconds (user + system) of a process and every descendant, live or reaped."""
    import psutil

    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def run_one(trainer: str, root: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One training run, measured between its first and last log windows: wall clock per step (read as
    each window's log line arrives), CPU seconds of the whole process tree, and LeRobot's own averages."""
    import psutil

    cmd = [sys.executable, "-m", "lerobot.scripts.lerobot_train" if trainer == "lerobot" else "lerobot_shards.cli"]
    if trainer != "lerobot":
        cmd.append("train")
    cmd += [
        "--dataset.repo_id=local/train-throughput",
        f"--dataset.root={root}",
        *(f"--policy.{k}={v}" for k, v in POLICY.items()),
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
    if args.num_workers is not None and trainer != "lerobot-shards-auto":
        cmd.append(f"--num_workers={args.num_workers}")
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "HF_LEROBOT_HOME": str(DATA / "home")}
    load_before = os.getloadavg()
    started = time.monotonic()
    marks: list[tuple[int, float, float, float, float]] = []  # step, wall, tree CPU, LeRobot's updt_s, data_s
    log = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ) as proc:
        tree = psutil.Process(proc.pid)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            window = WINDOW.search(line)
            if window:
                step, updt, data = int(window[1]), float(window[2]), float(window[3])
                marks.append((step, time.monotonic(), tree_cpu_s(tree), updt, data))
            if time.monotonic() - started > args.timeout:
                proc.kill()
        rc = proc.wait()
    wall = time.monotonic() - started
    text = "".join(log)
    (out.parent / f"{out.name}.log").write_text(text)
    if rc != 0:
        raise SystemExit(f"{trainer} exited {rc}; log tail:\n{text[-3000:]}")
    if len(marks) < 2:
        raise SystemExit(f"{trainer}: fewer than two log windows in its log:\n{text[-3000:]}")
    (s0, t0, c0, _, _), (s1, t1, c1, _, _) = marks[0], marks[-1]  # the first window holds the start-up
    steps = s1 - s0
    steady = marks[1:]
    layout = re.search(r"num_workers=\d+(?: \(given\))?, decode[ _]threads[ =]\w+", text)
    return {
        "trainer": trainer,
        "dataset_root": str(root),
        "measured_steps": f"{s0 + 1}-{s1}",
        "steps_per_s": steps / (t1 - t0),
        "samples_per_s": steps * args.batch_size / (t1 - t0),
        "cpu_s_per_sample": (c1 - c0) / (steps * args.batch_size),
        "lerobot_step_s": statistics.fmean(u + d for _, _, _, u, d in steady),  # LeRobot's updt_s + data_s
        "lerobot_data_s": statistics.fmean(d for _, _, _, _, d in steady),
        "windows": [{"step": s, "updt_s": u, "data_s": d} for s, _, _, u, d in marks],
        "wall_s": wall,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        **({"layout": layout.group(0)} if layout else {}),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per trainer: medians over its runs, its best run, and every run's samples/s (a shared machine
    swings runs with DataLoader workers by several times: the spread is part of the figure)."""
    summary = {}
    for trainer in dict.fromkeys(r["trainer"] for r in runs):
        mine = [r for r in runs if r["trainer"] == trainer]
        summary[trainer] = {
            "samples_per_s": statistics.median(r["samples_per_s"] for r in mine),
            "samples_per_s_best": max(r["samples_per_s"] for r in mine),
            "samples_per_s_runs": [round(r["samples_per_s"], 2) for r in mine],
            "steps_per_s": statistics.median(r["steps_per_s"] for r in mine),
            "cpu_s_per_sample": statistics.median(r["cpu_s_per_sample"] for r in mine),
            "lerobot_data_s": statistics.median(r["lerobot_data_s"] for r in mine),
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--log-freq", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-workers", type=int, default=2, help="both trainers; -1: each its default")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each trainer, alternating")
    parser.add_argument(
        "--with-auto-layout",
        action="store_true",
        help="also lerobot-shards train without --num_workers (its own choice)",
    )
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.num_workers < 0:
        args.num_workers = None
    import lerobot  # noqa: F401  (fails here, not in the first run, outside the LeRobot environment)

    raw, shards = datasets()
    cases = [("lerobot", raw), ("lerobot-shards", shards)] + [("lerobot-shards-auto", shards)] * args.with_auto_layout
    runs = []
    for r in range(args.repeats):
        for trainer, root in cases:
            out = DATA / "runs" / f"{trainer}-{r}"
            subprocess.run(["rm", "-rf", str(out)], check=True)
            result = run_one(trainer, root, out, args)
            print(
                f"{trainer:15s} run {r}: {result['steps_per_s']:.2f} steps/s, {result['samples_per_s']:.1f} samples/s, "
                f"{result['cpu_s_per_sample']:.3f} CPU-s/sample (LeRobot's data_s {result['lerobot_data_s']:.3f}), "
                f"load {result['loadavg_before'][0]:.1f} -> {result['loadavg_after'][0]:.1f}",
                flush=True,
            )
            runs.append(result)
    summary = summarize(runs)
    import importlib.metadata

    record = {
        "what": "LeRobot 0.6.1's trainer, samples/s: lerobot-train on LeRobot's dataset vs lerobot-shards train on shards",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "versions": {p: importlib.metadata.version(p) for p in ("lerobot", "torch", "torchcodec")},
        "dataset": {k: list(v) if isinstance(v, tuple) else v for k, v in SYNTH.items()},
        "config": {
            "policy": POLICY,
            "device": "cpu",
            "batch_size": args.batch_size,
            "num_workers": args.num_workers,
            "steps": args.steps,
            "log_freq": args.log_freq,
            "excluded": f"the first {args.log_freq} steps (start-up); figures are medians over the runs",
        },
        "summary": summary,
        "ratio_median": summary["lerobot-shards"]["samples_per_s"] / summary["lerobot"]["samples_per_s"],
        "ratio_best": summary["lerobot-shards"]["samples_per_s_best"] / summary["lerobot"]["samples_per_s_best"],
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(
        f"wrote {args.out}: ours / LeRobot = {record['ratio_median']:.2f}x (medians), {record['ratio_best']:.2f}x (best runs)"
    )


if __name__ == "__main__":
    main()
