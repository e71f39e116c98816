"""Counters the loader's workers share with the main process: ``EpisodePoolDataset.stats()``.

DataLoader workers are separate processes, so the counters live in one shared-memory array of
``MAX_WORKERS`` rows, created with the dataset and inherited by the workers. Each worker writes
only its own row; no locks are needed.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from .decoding.frame_fill import COUNTERS as FRAME_COUNTERS
from .read.shard_cache import COUNTERS

MAX_WORKERS = 64  # stats rows per process tree
STAT_FIELDS = (
    "frames_emitted",
    "pool_occupancy",
    "admissions",
    "evictions",
    "bytes_read",
    "decoder_hits",
    "decoder_misses",
    "decoder_evictions",
    "decode_seconds",
    "decode_cpu_seconds",  # CPU time of the decoding threads (decode_seconds is their wall time)
    "frames_decoded",
    "fast_forward_samples",
    "fast_forward_seconds",
    "wait_seconds",
    "decode_threads",  # threads decoding in each consumer (summed: all consumers')
    "episodes_skipped",  # on_error="skip": episodes whose bytes were bad, and their samples dropped
    "samples_skipped",
    "samples_substituted",  # equal-count mode: skipped samples replaced by a frame of a good resident episode
    "resident_bytes_peak",  # the most episode bytes a consumer held at once (read ahead, resident, decoding)
    *COUNTERS,  # storage bytes and cache outcomes (loader.read.shard_cache)
    *FRAME_COUNTERS,  # the decoded-frame cache (loader.decoding.frame_fill)
)


class SharedStats:
    """The shared counter array: one ``StatSlot`` per worker, summed by ``summary``."""

    def __init__(self) -> None:
        self._array = multiprocessing.Array("d", MAX_WORKERS * len(STAT_FIELDS), lock=False)

    def slot(self, worker: int) -> StatSlot:
        """Worker ``worker``'s row; raises past ``MAX_WORKERS``."""
        if not 0 <= worker < MAX_WORKERS:
            raise ValueError(f"at most {MAX_WORKERS} DataLoader workers per rank are supported")
        return StatSlot(self._array, worker)

    def summary(self) -> dict[str, Any]:
        """Per-worker rows that saw any activity, and their totals."""
        per_worker = []
        n = len(STAT_FIELDS)
        for w in range(MAX_WORKERS):
            values = dict(zip(STAT_FIELDS, self._array[w * n : (w + 1) * n]))
            if any(values.values()):
                per_worker.append({"worker": w, **values})
        total = {f: _combine(f, [w[f] for w in per_worker]) for f in STAT_FIELDS}
        return {"workers": per_worker, "total": total}


class StatSlot:
    """One worker's row of the shared counters (each worker writes only its own row)."""

    def __init__(self, array: Any, worker: int) -> None:
        self._array = array
        base = worker * len(STAT_FIELDS)
        self._index = {f: base + i for i, f in enumerate(STAT_FIELDS)}

    def reset(self) -> None:
        """Zero the row at the start of an iteration."""
        for i in self._index.values():
            self._array[i] = 0.0

    def add(self, field: str, value: float) -> None:
        """Add ``value`` to a counter."""
        self._array[self._index[field]] += value

    def set(self, field: str, value: float) -> None:
        """Overwrite a gauge (pool occupancy, decoder cache totals)."""
        self._array[self._index[field]] = value


def _combine(field: str, values: list[float]) -> float:
    """Totals add up, except peaks (the largest worker's)."""
    return max(values, default=0.0) if field.endswith("_peak") else sum(values)
