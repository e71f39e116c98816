"""The ``lerobot-shards train`` process's OpenMP wait policy and allocator thresholds: settings that
change no computed bit, only how much CPU the same computation costs.

With image transforms on (``benchmarks/train_throughput.py``, Diffusion, 2 cores) a perf profile of
the trainer showed about a third of its CPU outside the work itself:

- OpenMP spin-waiting (libgomp, ~18% of samples): the training step's intra-op team busy-waits
  between its parallel regions (libgomp's default spin), on cores the decode and transform
  threads need. ``OMP_WAIT_POLICY=PASSIVE`` makes an idle team member sleep at once. It decides
  how a thread waits, never how a region's work is split or reduced: the same bits.
- Page faults on fresh memory (clear_page and the fault path, ~15%): glibc serves each
  allocation over its dynamic mmap threshold (128 KiB at first) with a new mapping, and the
  transforms' float temporaries of a 480p window (7 MB each) are allocated and freed per call,
  so every call faults in and zeroes its pages again. A fixed 32 MiB threshold (glibc's largest)
  and a 256 MiB trim threshold keep those blocks in the heap for the next call. On one
  2x3x480x640 uint8 window at one thread: brightness 5.5 -> 2.0 CPU ms, contrast 8.6 -> 4.4,
  saturation 9.8 -> 5.3. The allocator decides where a tensor lives, never its values.
- Blocks over that largest threshold: the trainer's own float copies of each batch (LeRobot's
  loop divides the uint8 frames by 255, then normalizes them: four tensors of 59 MB per camera
  at 8 x 2 x 480p) were still new mappings every step. No mappings of glibc's own
  (``M_MMAP_MAX`` 0) serve them from the heap too, where the next step finds them: Diffusion
  with transforms on, 0.208 -> 0.167 CPU s per sample (3 interleaved pairs, each pair 18-24 %
  less; a second set, against these thresholds given as environment variables: 0.195 -> 0.149).
  Mapped frame cache files and shared-memory slabs are not glibc's blocks and are unchanged.
  What it costs: the trim threshold bounds only the free space at the heap's top; a freed block
  below a live one stays resident (reused, never returned), so the trainer's RSS is its high-water
  mark of large transient blocks (a checkpoint's serialized buffer, an eval batch), not its
  current use. A DataLoader worker forked while such freed blocks are resident keeps a private
  copy of every page of them the trainer writes again (copy-on-write), up to their size per
  worker for the worker's life. Blocks over 64 MiB in threads other than the main one are still
  glibc's mappings (a non-main arena's heap is at most 64 MiB; glibc falls back to a mapping
  regardless of ``M_MMAP_MAX``).

``tune()`` runs first in ``lerobot-shards train`` (``cli.train``), before torch is imported (the
run's log says what it set, once LeRobot is found):
libgomp reads ``OMP_WAIT_POLICY`` when it loads. What the environment sets is kept: an
``OMP_WAIT_POLICY`` of its own, or glibc's ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` /
``MALLOC_MMAP_MAX_``, or the same as ``GLIBC_TUNABLES`` (``glibc.malloc.mmap_threshold`` /
``trim_threshold`` / ``mmap_max``).
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 256 << 20
applied: list[str] = []  # what ``tune`` set in this process, for the train command's log


def tune() -> list[str]:
    """Apply both settings where they can still take effect; returns what it set (also kept in ``applied``)."""
    done = []
    if "torch" not in sys.modules and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        done.append("OMP_WAIT_POLICY=PASSIVE")
    if keep_large_blocks():
        done.append(
            f"malloc mmap_threshold={MMAP_THRESHOLD >> 20} MiB, trim_threshold={TRIM_THRESHOLD >> 20} MiB, mmap_max=0"
        )
    applied[:] = done
    return done


def environment() -> dict[str, str]:
    """``tune``'s settings as environment variables (glibc reads ``MALLOC_*_`` at start-up), for
    another process: ``benchmarks/train_throughput.py`` runs LeRobot's own trainer under them too,
    so that the loader's share of the difference is measured apart from these settings'."""
    return {
        "OMP_WAIT_POLICY": "PASSIVE",
        "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
        "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
        "MALLOC_MMAP_MAX_": "0",
    }


def keep_large_blocks() -> bool:
    """glibc's fixed thresholds and no mappings of its own (``mallopt``), unless the environment gave
    its own; False where there is no glibc (another libc or OS) or it refused."""
    own = {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_MAX_"}
    if not sys.platform.startswith("linux") or os.environ.keys() & own or _tunables_set():
        return False
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):
            return False
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(
        mallopt(param, value)
        for param, value in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_MMAP_MAX, 0))
    )


def _tunables_set() -> bool:
    """Whether ``GLIBC_TUNABLES`` sets any of the three (glibc reads them at start-up; a ``mallopt``
    after would override what the user asked for)."""
    names = {"glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold", "glibc.malloc.mmap_max"}
    return any(item.split("=", 1)[0].strip() in names for item in os.environ.get("GLIBC_TUNABLES", "").split(":"))
