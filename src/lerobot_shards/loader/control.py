"""What the training process tells its DataLoader workers between epochs: epoch and resume state.

Workers hold a pickled copy of the dataset made when they start. Persistent workers
(``persistent_workers=True``) start once, so an attribute set afterwards by ``set_epoch`` or
``load_state_dict`` would never reach them and they would silently replay the old order. The
epoch and the resume state therefore live in a small shared-memory array created with the
dataset, which every worker reads at the start of each ``__iter__``; workers write back the
worker count they run under, so ``state_dict`` can record it. The windows (``delta_timestamps``)
are arrays that do not fit there: the array counts their changes instead, and a worker whose copy
predates the last change refuses to iterate rather than emit the old windows.

A second pass without ``set_epoch`` (iterating the dataset, or a new iterator of its DataLoader,
again) moves to the next epoch, as MosaicML Streaming does: a plain loop that forgets
``set_epoch`` no longer trains every epoch on one order, and a resumed epoch is not replayed from
its resume point. Each worker counts its own passes since the epoch was last set (``set_epoch``,
``load_state_dict``) in a slot of the array: every worker of a DataLoader iterates once per pass,
so they agree without talking, and the main process reads worker 0's count (``epoch``), which a
state saved mid-pass records.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from typing import Any

from .plan.elastic import Origin
from .plan.order import MAX_SEGMENTS, ResumeState
from .plan.resume import Segments

(_EPOCH, _SEEN_WORKERS, _HAS_RESUME, _R_EPOCH, _R_BATCHES, _R_BATCH_SIZE, _R_WORKERS, _R_WORLD, *_R_ORIGIN) = range(12)
_WINDOWS = 12  # generation of the windows (``set_delta_timestamps``)
_UNKNOWN = -1
# A resumed epoch's earlier batch sizes (``ResumeState.earlier``, ``Origin.earlier``): a count,
# then (batches, batch_size) pairs (at most ``MAX_SEGMENTS``), for each of the two.
_R_EARLIER = 13
_R_ORIGIN_EARLIER = _R_EARLIER + 1 + 2 * MAX_SEGMENTS
# The passes since the epoch was set: a generation the setters bump, then per worker (the main
# process is worker 0) the generation it last iterated under and its passes in it.
MAX_WORKERS = 1024
_GENERATION = _R_ORIGIN_EARLIER + 1 + 2 * MAX_SEGMENTS
_PASSES = _GENERATION + 1
_SIZE = _PASSES + 2 * MAX_WORKERS


class SharedControl:
    """The epoch, the pending resume state and the observed worker count, in shared memory."""

    def __init__(self) -> None:
        self._array = multiprocessing.Array("q", _SIZE, lock=False)
        self._array[_SEEN_WORKERS] = _UNKNOWN
        self._array[_GENERATION] = 1  # no worker has iterated under it (their slots hold 0)

    @property
    def epoch(self) -> int:
        """The epoch of the current (or last) pass: the one set, plus the passes since (worker 0's)."""
        return int(self._array[_EPOCH]) + self._passes(0)

    @epoch.setter
    def epoch(self, value: int) -> None:
        """Set the epoch the next pass plans for (``set_epoch``, ``load_state_dict``): passes count anew."""
        self._array[_EPOCH] = int(value)
        self._array[_GENERATION] += 1

    def begin_pass(self, worker: int) -> int:
        """Called by each iterator of worker ``worker`` (0: the main process): the epoch it plans for,
        the one set if this is the worker's first pass since, else one more than its last pass's."""
        if not 0 <= worker < MAX_WORKERS:
            raise ValueError(f"DataLoader worker {worker}: at most {MAX_WORKERS} workers per rank")
        at, generation = _PASSES + 2 * worker, int(self._array[_GENERATION])
        passes = int(self._array[at + 1]) + 1 if int(self._array[at]) == generation else 0
        self._array[at + 1] = passes  # count before generation: the main process reads both
        self._array[at] = generation
        return int(self._array[_EPOCH]) + passes

    def _passes(self, worker: int) -> int:
        at = _PASSES + 2 * worker
        return int(self._array[at + 1]) if int(self._array[at]) == int(self._array[_GENERATION]) else 0

    def new_windows(self) -> int:
        """Count a change of the windows; the generation the dataset setting them keeps."""
        self._array[_WINDOWS] += 1
        return int(self._array[_WINDOWS])

    def stale_windows(self, generation: int, where: str) -> Iterator[Any] | None:
        """For a copy of the dataset made before its windows last changed (a persistent worker's,
        pickled when it started, which would emit the old windows): an iterator that raises at its
        first ``next``, where a DataLoader worker reports the error to the loop (one raised by
        ``__iter__`` itself kills a persistent worker and loses the message). ``None`` if current."""
        if int(self._array[_WINDOWS]) == generation:
            return None
        return _raising(
            RuntimeError(
                f"{where}: delta_timestamps were set after this DataLoader's persistent workers started, and "
                f"they hold the windows they started with; set them before the DataLoader's first iterator, "
                f"or build a new DataLoader"
            )
        )

    @property
    def seen_workers(self) -> int | None:
        """DataLoader ``num_workers`` of the last iteration (0: the main process), if any ran."""
        value = int(self._array[_SEEN_WORKERS])
        return None if value == _UNKNOWN else value

    def saw_workers(self, num_workers: int) -> None:
        """Called by each iterator: the worker count it runs under."""
        self._array[_SEEN_WORKERS] = int(num_workers)

    @property
    def resume(self) -> ResumeState | None:
        """The pending resume state (``None`` when none was loaded)."""
        if not self._array[_HAS_RESUME]:
            return None
        workers, world = int(self._array[_R_WORKERS]), int(self._array[_R_WORLD])
        origin = [int(self._array[i]) for i in _R_ORIGIN]
        return ResumeState(
            epoch=int(self._array[_R_EPOCH]),
            batches_consumed=int(self._array[_R_BATCHES]),
            batch_size=int(self._array[_R_BATCH_SIZE]),
            num_workers=None if workers == _UNKNOWN else workers,
            world_size=None if world == _UNKNOWN else world,
            origin=None if origin[0] == _UNKNOWN else _origin(origin, self._segments(_R_ORIGIN_EARLIER)),
            earlier=self._segments(_R_EARLIER),
        )

    @resume.setter
    def resume(self, state: ResumeState) -> None:
        self._array[_HAS_RESUME] = 0  # never half-written for a reader: flag last
        self._array[_R_EPOCH] = state.epoch
        self._array[_R_BATCHES] = state.batches_consumed
        self._array[_R_BATCH_SIZE] = state.batch_size
        self._array[_R_WORKERS] = _UNKNOWN if state.num_workers is None else state.num_workers
        self._array[_R_WORLD] = _UNKNOWN if state.world_size is None else state.world_size
        origin = state.origin
        values = (
            [_UNKNOWN] * 4
            if origin is None
            else [origin.world_size, origin.num_workers, origin.batches_consumed, origin.batch_size]
        )
        for i, v in zip(_R_ORIGIN, values):
            self._array[i] = v
        self._set_segments(_R_EARLIER, state.earlier)
        self._set_segments(_R_ORIGIN_EARLIER, () if origin is None else origin.earlier)
        self._array[_HAS_RESUME] = 1

    def _segments(self, at: int) -> Segments:
        n = int(self._array[at])
        return tuple((int(self._array[at + 1 + 2 * i]), int(self._array[at + 2 + 2 * i])) for i in range(n))

    def _set_segments(self, at: int, segments: Segments) -> None:
        if len(segments) > MAX_SEGMENTS:  # parse_state and state_dict refuse more
            raise ValueError(f"at most {MAX_SEGMENTS} earlier batch sizes, got {len(segments)}")
        self._array[at] = len(segments)
        for i, (batches, batch_size) in enumerate(segments):
            self._array[at + 1 + 2 * i] = batches
            self._array[at + 2 + 2 * i] = batch_size


def _origin(values: list[int], earlier: Segments) -> Origin:
    world_size, num_workers, batches_consumed, batch_size = values
    return Origin(world_size, num_workers, batches_consumed, batch_size, earlier=earlier)


def _raising(error: Exception) -> Iterator[Any]:
    raise error
    yield  # a generator: raises when first advanced
