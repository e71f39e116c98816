"""``lerobot-shards train``'s process settings (integrations/train_process.py): OpenMP's passive wait
before torch loads, glibc's fixed allocator thresholds, and the environment's own values kept."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from lerobot_shards.integrations.train_process import environment

PROBE = """
import json, os, sys
from lerobot_shards.integrations.train_process import tune
done = tune()
print(json.dumps({"done": done, "omp": os.environ.get("OMP_WAIT_POLICY"), "torch": "torch" in sys.modules}))
"""
# glibc's count of its own mappings (mallinfo2's hblks) after a 64 MiB block, over glibc's largest
# mmap threshold: a batch's float frames in the trainer
MAPPED = """
import ctypes, json
from lerobot_shards.integrations.train_process import tune
done = tune()
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
class Info1(ctypes.Structure):  # mallinfo, before glibc 2.33's mallinfo2: the same fields as int
    _fields_ = [(name, ctypes.c_int) for name, _ in Info._fields_]
info = getattr(libc, "mallinfo2", None) or libc.mallinfo
info.restype = Info if info is getattr(libc, "mallinfo2", None) else Info1
libc.free.argtypes = [ctypes.c_void_p]
before = info().hblks  # the interpreter's own, mapped before
first = libc.malloc(64 << 20)
mapped = info().hblks - before
libc.free(first)
again = libc.malloc(64 << 20)
print(json.dumps({"done": done, "mapped": mapped, "reused": again == first}))
libc.free(again)
"""


def _probe(env: dict[str, str], before: str = "") -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", before + PROBE], env=env, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.splitlines()[-1])


def _env(**extra: str) -> dict[str, str]:
    keys = {"OMP_WAIT_POLICY", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_", "GLIBC_TUNABLES"}
    return {**{k: v for k, v in os.environ.items() if k not in keys}, **extra}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tune_sets_a_passive_wait_and_the_allocator_thresholds() -> None:
    got = _probe(_env())
    assert got["omp"] == "PASSIVE" and not got["torch"]
    assert got["done"] == [
        "OMP_WAIT_POLICY=PASSIVE",
        "malloc mmap_threshold=32 MiB, trim_threshold=256 MiB, mmap_max=0",
    ]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt and mallinfo")
def test_blocks_over_the_largest_threshold_come_from_the_heap_and_are_reused() -> None:
    """A 64 MiB block (a batch's float frames are 59 MB per camera): glibc's own mapping, unmapped at
    free and faulted in afresh next time, unless ``tune`` ran; then the heap's, reused."""
    got = _probe(_env(MALLOC_MMAP_MAX_="1"))  # the environment's own: kept
    assert got["done"] == ["OMP_WAIT_POLICY=PASSIVE"]
    out = subprocess.run([sys.executable, "-c", MAPPED], env=_env(), capture_output=True, text=True, check=True)
    tuned = json.loads(out.stdout.splitlines()[-1])
    assert tuned["mapped"] == 0 and tuned["reused"]
    plain = MAPPED.replace("done = tune()", "done = []")
    out = subprocess.run([sys.executable, "-c", plain], env=_env(), capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1])["mapped"] == 1  # glibc's default: a mapping of its own
    # the same settings as environment variables (another process: the benchmark's tuned LeRobot)
    out = subprocess.run(
        [sys.executable, "-c", plain], env=_env(**environment()), capture_output=True, text=True, check=True
    )
    given = json.loads(out.stdout.splitlines()[-1])
    assert given["mapped"] == 0 and given["reused"]


def test_tune_keeps_what_the_environment_sets() -> None:
    got = _probe(_env(OMP_WAIT_POLICY="ACTIVE", MALLOC_MMAP_THRESHOLD_="131072"))
    assert got == {"done": [], "omp": "ACTIVE", "torch": False}
    got = _probe(_env(GLIBC_TUNABLES="glibc.malloc.mmap_max=65536"))  # glibc's newer spelling: kept too
    assert got["done"] == ["OMP_WAIT_POLICY=PASSIVE"]


def test_tune_leaves_openmp_alone_once_torch_is_loaded() -> None:
    """libgomp read its variables when torch loaded: setting one after would claim what did not happen."""
    got = _probe(_env(MALLOC_MMAP_THRESHOLD_="131072"), before="import torch\n")
    assert got == {"done": [], "omp": None, "torch": True}
