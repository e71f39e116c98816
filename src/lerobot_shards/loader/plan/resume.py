"""Mid-epoch resume: from batches the trainer consumed back to samples each worker must skip.

With an IterableDataset, torch's DataLoader batches inside each worker and hands batches out
round-robin in worker order, skipping workers whose stream has ended: round r yields worker w's
r-th batch for every w that has one. Workers never see the global count, so the resume state is
just ``{epoch, batches_consumed, batch_size}`` and each worker replays its own share from it.
``batches_consumed`` must count batches the training loop received, not batches prefetched.

A fresh DataLoader always starts its round-robin at worker 0, so skipping alone is not enough
after a cut inside a round: DataLoader worker j must replay stream (j + resume_rotation) % W
(the stream being the original worker's consumer) and skip that stream's consumed samples.
Rotated, the rest of the epoch comes out in exactly the uninterrupted order.

A resumed run may use another batch size. Its position is then a sequence of segments, the
epoch's batches by batch size in the order they were consumed (``Segments``): each segment's
batches were dealt round-robin by a DataLoader that started at the stream the previous segment's
left off, so the skips are found by replaying the segments one after another.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

Segments = tuple[tuple[int, int], ...]  # (batches, batch_size) of consecutive parts of an epoch, in order


class ResumePoint(NamedTuple):
    """Where one DataLoader worker picks up a resumed epoch."""

    stream: int  # the original worker (consumer) whose samples this DataLoader worker yields
    skip: int  # samples of that stream already consumed: fast-forward them


def num_batches(num_samples: int, batch_size: int, drop_last: bool = False) -> int:
    """Batches from one stream of ``num_samples``; a partial last one unless ``drop_last``."""
    if num_samples < 0:
        raise ValueError(f"num_samples must be non-negative, got {num_samples}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    full, rest = divmod(num_samples, batch_size)
    return full if drop_last or rest == 0 else full + 1


def batches_taken_per_worker(batches_consumed: int, worker_batches: Sequence[int]) -> list[int]:
    """Batches each worker had delivered once the epoch's first ``batches_consumed`` were out."""
    return _round_robin_cut(batches_consumed, worker_batches)[0]


def resume_rotation(batches_consumed: int, worker_batches: Sequence[int]) -> int:
    """Offset o such that resumed DataLoader worker j must replay stream (j + o) % num_workers.

    0 at a round boundary; otherwise one past the last stream served in the interrupted round,
    so the resumed round-robin starts with the stream whose batch is due next.
    """
    return _round_robin_cut(batches_consumed, worker_batches)[1]


def _round_robin_cut(batches_consumed: int, worker_batches: Sequence[int]) -> tuple[list[int], int]:
    """(batches taken per worker, rotation) after ``batches_consumed`` batches.

    Closed form of the round-robin: after ``r`` full rounds, worker w delivered min(c_w, r);
    the rest of the count falls, in worker order, on workers still alive in round ``r``.
    """
    total = sum(worker_batches)
    if not 0 <= batches_consumed <= total:
        raise ValueError(
            f"batches_consumed={batches_consumed} is outside this epoch, which has {total} "
            f"batches ({len(worker_batches)} workers: {list(worker_batches)}); was the batch "
            f"size, world size or worker count changed since the state was saved?"
        )

    def delivered(rounds: int) -> int:
        return sum(min(c, rounds) for c in worker_batches)

    lo, hi = 0, max(worker_batches, default=0)  # largest r with delivered(r) <= batches_consumed
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if delivered(mid) <= batches_consumed:
            lo = mid
        else:
            hi = mid - 1
    taken = [min(c, lo) for c in worker_batches]
    extra, rotation = batches_consumed - delivered(lo), 0
    for w, c in enumerate(worker_batches):
        if extra == 0:
            break
        if c > lo:
            taken[w] += 1
            extra -= 1
            rotation = w + 1
    return taken, rotation


def merge_segments(segments: Sequence[tuple[int, int]]) -> Segments:
    """``segments`` without empty ones, neighbours of one batch size merged (the same position)."""
    out: list[tuple[int, int]] = []
    for batches, batch_size in segments:
        if batches == 0:
            continue
        if out and out[-1][1] == batch_size:
            out[-1] = (out[-1][0] + batches, batch_size)
        else:
            out.append((batches, batch_size))
    return tuple(out)


def consumed_per_stream(
    segments: Sequence[tuple[int, int]], worker_samples: Sequence[int], drop_last: bool = False
) -> tuple[list[int], int]:
    """(samples of every stream consumed, rotation) once ``segments`` were consumed.

    A segment is run by a DataLoader whose worker j replays stream (j + rotation) % W, the
    rotation the segments before it left; a single segment is the plain round-robin cut.
    """
    streams = len(worker_samples)
    consumed, rotation = [0] * streams, 0
    for batches, batch_size in segments:
        order = [(j + rotation) % streams for j in range(streams)]
        left = [worker_samples[s] - consumed[s] for s in order]
        taken, turn = _round_robin_cut(batches, [num_batches(n, batch_size, drop_last) for n in left])
        for j, s in enumerate(order):
            consumed[s] += min(taken[j] * batch_size, left[j])
        rotation = (rotation + turn) % streams
    return consumed, rotation


def samples_to_skip(
    segments: Sequence[tuple[int, int]],
    worker_samples: Sequence[int],
    worker: int,
    drop_last: bool = False,
) -> int:
    """Samples of stream ``worker`` already consumed once ``segments`` were: fast-forward them on resume.

    ``worker_samples`` lists every stream's samples this epoch on this rank (one entry for
    DataLoader num_workers=0). ``resume_point`` pairs it with the stream each worker replays.
    """
    if not 0 <= worker < len(worker_samples):
        raise ValueError(f"worker must be in [0, {len(worker_samples)}), got {worker}")
    return consumed_per_stream(segments, worker_samples, drop_last)[0][worker]


def resume_point(
    segments: Sequence[tuple[int, int]],
    worker_samples: Sequence[int],
    worker: int,
    drop_last: bool = False,
) -> ResumePoint:
    """What DataLoader worker ``worker`` replays in a resumed epoch: its stream and skip.

    The stream, not the DataLoader worker id, must pick the consumer's shards and rng.
    """
    if not 0 <= worker < len(worker_samples):
        raise ValueError(f"worker must be in [0, {len(worker_samples)}), got {worker}")
    consumed, rotation = consumed_per_stream(segments, worker_samples, drop_last)
    stream = (worker + rotation) % len(worker_samples)
    return ResumePoint(stream, consumed[stream])
