"""examples/train.py in real processes (2 ranks x 2 workers, gloo): SIGKILL mid-epoch, relaunch, same parameters."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lerobot_shards.synth import synth_dataset
from waits import HANG_GUARD_S

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train.py"
WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(root: Path, ckpt: Path, *extra: str) -> list[subprocess.Popen]:
    """One process per rank with the launcher's environment (as torchrun or srun sets it)."""
    port = _free_port()
    args = [sys.executable, str(EXAMPLE), str(root), "--ckpt", str(ckpt), "--ckpt-every", "3", "--epochs", "2"]
    args += ["--batch-size", "4", "--workers", "2", "--pool", "2", "--chunk", "3", "--episodes-per-shard", "1"]
    args += ["--log-every", "1000", *extra]
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1")
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONWARNINGS="ignore")
        procs.append(
            subprocess.Popen(
                args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
            )
        )
    return procs


def _finish(procs: list[subprocess.Popen]) -> str:
    try:
        outputs = [p.communicate(timeout=HANG_GUARD_S)[0] for p in procs]
    except subprocess.TimeoutExpired:  # a hung run fails this test, never the suite: kill every rank's group
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        raise
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]
    return outputs[0]


def _sha(output: str) -> str:
    found = re.findall(r"^final-params-sha256 ([0-9a-f]{64})$", output, re.M)
    assert len(found) == 1, output[-3000:]
    return found[0]


@pytest.mark.slow
def test_sigkill_mid_epoch_and_relaunch_ends_with_the_same_parameters(tmp_path: Path) -> None:
    root = synth_dataset(
        tmp_path / "ds", num_episodes=6, cameras=("observation.images.front",), length_range=(10, 14), seed=1
    )
    reference = _launch(root, tmp_path / "ref" / "ckpt.pt")
    # The same run, slowed down so that the kill lands mid-epoch, after its first checkpoint.
    killed = _launch(root, tmp_path / "run" / "ckpt.pt", "--step-time-ms", "250")
    lines = []
    for line in killed[0].stdout:
        lines.append(line)
        if line.startswith("checkpoint step"):
            break
    for p in killed:  # every process the rank started (its DataLoader workers too)
        os.killpg(p.pid, signal.SIGKILL)
    for p in killed:
        p.wait(timeout=HANG_GUARD_S)
    assert lines and lines[-1].startswith("checkpoint step 3 epoch 0 batch 3"), "".join(lines)[-3000:]

    resumed = _finish(_launch(root, tmp_path / "run" / "ckpt.pt"))
    match = re.search(r"^resumed from .* at step (\d+) \(epoch (\d+), batch (\d+)\)$", resumed, re.M)
    assert match, resumed[-3000:]
    step, epoch, batch = map(int, match.groups())
    assert epoch == 0 and 0 < batch == step  # mid-epoch 0: the loader had to fast-forward
    assert "final-params-sha256" not in "".join(lines)
    assert _sha(resumed) == _sha(_finish(reference))


@pytest.mark.parametrize(("flag", "value"), [("--ckpt-every", "0"), ("--log-every", "0"), ("--max-steps", "-1")])
def test_a_count_out_of_range_is_refused_naming_the_flag(flag: str, value: str, tmp_path: Path) -> None:
    """They used to divide by zero mid-run, or stop after one step."""
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path), flag, value], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert proc.returncode == 2 and f"{flag} must be at least" in proc.stderr, proc.stderr
