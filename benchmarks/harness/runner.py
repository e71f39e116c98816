"""Run one case in its own process with a timeout; a crash, an OOM kill or a hang is a result too.

The parent adds what only it can see: bytes the shaper delivered during the case (bucket
sources), the case's exact configuration, and how the process ended. A case run in several
rounds is reported by its median round (``median_round``).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .host import cpu_ticks, stolen_share

HERE = Path(__file__).resolve().parent
OURS = HERE / "run_ours.py"
LEROBOT = HERE / "run_lerobot.py"


def baseline_command(template: str, dirs: list[Path]) -> list[str]:
    """The interpreter command of a baseline: a python, or a wrapper whose ``{dirs}`` token becomes
    the directories it must see (e.g. ``lerobot-latest.sh run ROOT {dirs} --``)."""
    out: list[str] = []
    for token in shlex.split(template):
        out += [str(d) for d in dirs] if token == "{dirs}" else [token]
    return out


def run_case(
    spec: dict[str, Any], command: list[str], results: Path, timeout_s: float, proxy: Any = None
) -> dict[str, Any]:
    """Run ``command CASE.json RESULT.json`` for ``spec``; return (and write) the result."""
    name = spec["name"]
    case_file, out_file, log_file = (results / "cases" / f"{name}{ext}" for ext in (".json", ".result.json", ".log"))
    case_file.parent.mkdir(parents=True, exist_ok=True)
    case_file.write_text(json.dumps(spec, indent=1))
    out_file.unlink(missing_ok=True)
    down0 = proxy.bytes_down if proxy else 0
    ticks = cpu_ticks()
    start = time.perf_counter()
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(
            [*command, str(case_file), str(out_file)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
        except BaseException:  # the benchmark itself is stopped: take the case (and its workers) along
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    elapsed = time.perf_counter() - start
    stolen = stolen_share(ticks, cpu_ticks())
    if out_file.is_file():
        result = json.loads(out_file.read_text())
    elif rc == "timeout":
        result = {"status": "timeout", "error": f"no result within {timeout_s:.0f} s (killed)"}
    else:
        killed = isinstance(rc, int) and rc < 0 and -rc == signal.SIGKILL
        why = "killed by SIGKILL (out of memory?)" if killed else f"exited with {rc}"
        result = {"status": "crashed", "error": f"{why}; log: {log_file}"}
    result["log_tail"] = log_file.read_text(errors="replace")[-1500:] if result["status"] != "ok" else None
    result.update(name=name, case=spec["case"], config=spec["config"], process_s=round(elapsed, 1), host_steal=stolen)
    if proxy is not None and "bucket" in spec["case"]["source"]:
        result["storage_bytes"] = proxy.bytes_down - down0  # what the bucket delivered, metadata included
    elif result.get("loader_stats"):
        result["storage_bytes"] = result["loader_stats"].get("bytes_read")  # what our loader read
    elif isinstance(result.get("memory"), dict):
        result["storage_bytes"] = result["memory"].get("read_bytes")  # read() calls of the process tree
    samples = result.get("samples")
    result["storage_bytes_per_sample"] = (
        round(result["storage_bytes"] / samples) if samples and result.get("storage_bytes") else None
    )
    (results / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def our_command() -> list[str]:
    return [sys.executable, str(OURS)]


def median_round(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The result that reports a case run once per round: its median round by samples/s.

    One real round, not averaged figures, so its waits, memory and CPU time belong together. With
    an even count the faster of the middle two: load on a shared machine only ever slows a case
    down. Rounds that failed are left out unless all did (then the last, which says why). Every
    round's status, samples/s and CPU ms per sample stay in ``rounds``; ``median_round`` numbers
    the chosen one from 1 (None when all failed).
    """
    if not results:
        raise ValueError("median_round: no rounds")
    ok = sorted(
        (i for i, r in enumerate(results) if r["status"] == "ok" and r.get("samples_per_s")),
        key=lambda i: results[i]["samples_per_s"],
    )
    chosen = ok[len(ok) // 2] if ok else len(results) - 1
    rounds = [{k: r.get(k) for k in ("status", "samples_per_s", "cpu_ms_per_sample", "host_steal")} for r in results]
    return {**results[chosen], "rounds": rounds, "median_round": chosen + 1 if ok else None}
