"""Subprocesses of the LeRobot suite: every one has a deadline and dies with its whole process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")
CLI = [sys.executable, "-m", "lerobot_shards.cli"]
# ACT at its smallest (a 32-wide one-layer transformer, no pretrained weights), as the suite trains it
TINY_ACT = [
    "--policy.type=act",
    "--policy.dim_model=32",
    "--policy.n_heads=2",
    "--policy.dim_feedforward=64",
    "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1",
    "--policy.latent_dim=8",
    "--policy.chunk_size=10",
    "--policy.n_action_steps=10",
    "--policy.pretrained_backbone_weights=null",
]


def env(**extra: str) -> dict[str, str]:
    """This environment with our package importable (it is not installed in the LeRobot env)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    path = os.pathsep.join(p for p in (SRC, base.get("PYTHONPATH")) if p)
    return {**base, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", **extra}


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@contextlib.contextmanager
def started(cmd: Sequence[str], log: Path, environ: dict[str, str]) -> Iterator[subprocess.Popen]:
    """``cmd`` running in its own process group, output to ``log``; killed (the group) on leaving."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=environ, start_new_session=True)
    try:
        yield proc
    finally:
        _kill(proc)


def run(cmd: Sequence[str], log: Path, environ: dict[str, str], timeout: float) -> str:
    """Run ``cmd`` to completion within ``timeout`` s; fail with the log's tail otherwise. Returns the log."""
    with started(cmd, log, environ) as proc:
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            pytest.fail(f"{' '.join(cmd[:4])}... ran past {timeout:.0f} s; log tail:\n{log.read_text()[-3000:]}")
    text = log.read_text()
    if rc != 0:
        pytest.fail(f"{' '.join(cmd[:4])}... exited {rc}; log tail:\n{text[-4000:]}")
    return text


def wait_for(what: str, ready: Callable[[], bool], proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Poll ``ready`` (an event on disk) until true; fail if ``proc`` exits first or the deadline passes."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"exited {proc.returncode} before {what}; log tail:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:.0f} s; log tail:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
