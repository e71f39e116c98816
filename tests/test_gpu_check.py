"""benchmarks/gpu_check.sh stays runnable: shell syntax, and a quick run that does the CPU parts without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from waits import HANG_GUARD_S

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"


def test_script_syntax() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path; the GPU path is for the GPU machine")
def test_quick_run_without_cuda(tmp_path: Path) -> None:
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable, GPU_CHECK_BUDGET="280")
    done = subprocess.run(
        ["bash", str(SCRIPT), "--quick"], env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no CUDA: running the CPU parts only" in done.stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["no_cuda"] is True
    sections = report["sections"]
    for name in ("env", "data", "slab", "decode/cpu-0w", "decode/cpu-2w", "feeder"):
        assert sections[name]["status"] == "ok", (name, sections[name])
    assert sections["feeder"]["result"]["equal_to_float32_loader"] is True
    slab = sections["slab"]["result"]  # without CUDA: slabs unpinned, the same comparisons
    assert slab["equal_to_plain_loader"] is True and slab["feeder_over_pinned_slabs_equal"] is True
    assert slab["slabs_pinned"]["transport"]["workers"]["slab_batches"] > 0
    assert sections["decode/cpu-0w"]["result"]["loader_random_frames_per_s"] > 0
    assert (tmp_path / "gpu_check.log").read_text().count("== gpu_check") == 2
