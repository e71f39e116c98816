"""``lerobot-shards train``'s process settings (integrations/train_process.py): OpenMP's passive wait
before torch loads, glibc's fixed allocator thresholds, and the environment's own values kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os, sys
from lerobot_shards.integrations.train_process import tune
done = tune()
print(json.dumps({"done": done, "omp": os.environ.get("OMP_WAIT_POLICY"), "torch": "torch" in sys.modules}))
"""


def _probe(env: dict[str, str], before: str = "") -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", before + PROBE], env=env, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.splitlines()[-1])


def _env(**extra: str) -> dict[str, str]:
    keys = {"OMP_WAIT_POLICY", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"}
    return {**{k: v for k, v in os.environ.items() if k not in keys}, **extra}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tune_sets_a_passive_wait_and_the_allocator_thresholds() -> None:
    got = _probe(_env())
    assert got["omp"] == "PASSIVE" and not got["torch"]
    assert got["done"] == ["OMP_WAIT_POLICY=PASSIVE", "malloc mmap_threshold=32 MiB, trim_threshold=256 MiB"]


def test_tune_keeps_what_the_environment_sets() -> None:
    got = _probe(_env(OMP_WAIT_POLICY="ACTIVE", MALLOC_MMAP_THRESHOLD_="131072"))
    assert got == {"done": [], "omp": "ACTIVE", "torch": False}


def test_tune_leaves_openmp_alone_once_torch_is_loaded() -> None:
    """libgomp read its variables when torch loaded: setting one after would claim what did not happen."""
    got = _probe(_env(MALLOC_MMAP_THRESHOLD_="131072"), before="import torch\n")
    assert got == {"done": [], "omp": None, "torch": True}
