"""A consumer's memory budget: how many episodes its pool and its read-ahead may hold.

A consumer (the main process, or one DataLoader worker) holds its pool's episodes (their encoded
clips and decoded tables), the episodes its reader read ahead, the one being read, evicted
episodes whose queued samples are still decoding, the parsed sidecars of the shards it reads, a
decoder per resident clip, and the decoded frames of the samples decoded ahead. ``fit_pool``
bounds their sum by the budget and says how many episodes fit: the read-ahead shrinks first (it
does not change the order), then the pool, never below one episode (a sample's window lies in one
episode).

Pure: every figure comes from metadata (the episodes' lengths and encoded bytes as the manifest
or the raw tables record them, the cameras' frame sizes), never from what was measured, so every
consumer, a resumed run and an elastic replay derive the same pool, hence the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...exceptions import LeRobotShardsError

# Episodes held beyond the pool and the read-ahead queue: the one the reader has read and waits
# to queue (while it is read its bytes are there twice: the range read and the clips cut from
# it), and one evicted episode whose queued samples are still decoding.
EXTRA_EPISODES = 3
# A parsed sidecar's frame tables, per frame and camera (measured ~235 B), for the shards open
# at once: the one being read and the next one read ahead.
SIDECAR_FRAME_BYTES = 256
OPEN_SHARDS = 2
# A decoder's own frames (FFmpeg's reference frames, its output frame and torchcodec's RGB copy),
# in RGB frames of its camera's decoded size.
DECODER_FRAMES = 8
# Bytes of one value of a tabular feature once decoded into numpy (int64, float64 at most).
VALUE_BYTES = 8


@dataclass(frozen=True)
class MemoryNeeds:
    """What one consumer's memory is made of, from metadata (see the module's docstring)."""

    episode_bytes: Sequence[int]  # per chosen episode: encoded bytes held + decoded tables + sidecar rows
    frame_bytes: Sequence[int]  # per decoded camera: one RGB uint8 frame at its decoded size
    sample_bytes: int  # one sample's decoded frames as returned (windows, dtype)
    lookahead_samples: int  # samples decoded ahead (decode_ahead: 2 x decode threads, at least 1)
    decoder_cap: int | None  # decoders kept (decoder_cache_size), None: pool x cameras, at most 64
    fixed_bytes: int = 0  # what the source itself holds (sidecars, a raw source's data file, read-ahead chunks)

    def decoders(self, pool: int) -> int:
        """Decoders held with a pool of ``pool`` episodes."""
        cap = self.decoder_cap if self.decoder_cap is not None else min(64, pool * max(1, len(self.frame_bytes)))
        return min(cap, pool * max(1, len(self.frame_bytes)))

    def cost(self, pool: int, prefetch: int) -> int:
        """Bytes held with ``pool`` resident episodes and ``prefetch`` read ahead: the largest
        episodes that many times over, their decoders, the decode look-ahead, the fixed part."""
        largest = sorted(self.episode_bytes, reverse=True)[: pool + prefetch + EXTRA_EPISODES]
        decoder = DECODER_FRAMES * max(self.frame_bytes, default=0)
        # each sample's frames twice: decoded, and converted into the sample's dtype
        return (
            self.fixed_bytes
            + sum(largest)
            + self.decoders(pool) * decoder
            + 2 * self.lookahead_samples * self.sample_bytes
        )


@dataclass(frozen=True)
class MemoryPlan:
    """The pool and read-ahead a budget allows, and what they are estimated to hold."""

    budget: int
    pool: int
    prefetch: int
    estimate: int  # bytes, by ``MemoryNeeds.cost``
    asked_pool: int
    asked_prefetch: int
    needs: MemoryNeeds  # what the estimate was made of

    @property
    def shrunk(self) -> bool:
        return (self.pool, self.prefetch) != (self.asked_pool, self.asked_prefetch)


class EpisodeTooLarge(LeRobotShardsError, ValueError):
    """Not even one episode (with the next one read ahead) fits the budget."""


def fit_pool(needs: MemoryNeeds, budget: int, pool: int, prefetch: int) -> MemoryPlan:
    """The largest read-ahead, then the largest pool, whose ``cost`` fits ``budget``: the
    read-ahead shrinks first, down to one episode, then the pool, down to one. ``EpisodeTooLarge``
    when a pool of one does not fit."""
    q = _largest(lambda q: needs.cost(pool, q) <= budget, min(prefetch, 1), prefetch)
    if q is not None:
        return MemoryPlan(budget, pool, q, needs.cost(pool, q), pool, prefetch, needs)
    p = _largest(lambda p: needs.cost(p, 1) <= budget, 1, pool)
    if p is None:
        raise EpisodeTooLarge(f"needs {needs.cost(1, 1)} bytes with a pool of one episode and one read ahead")
    return MemoryPlan(budget, p, 1, needs.cost(p, 1), pool, prefetch, needs)


def _largest(fits: Callable[[int], bool], low: int, high: int) -> int | None:
    """The largest n in [low, high] with ``fits(n)`` (``fits`` grows no truer as n grows)."""
    if high < low or not fits(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def episode_held_bytes(encoded: int, length: int, row_values: int, cameras: int) -> int:
    """One resident episode's bytes: its encoded clips, its table decoded into numpy, its sidecar rows."""
    return encoded + length * (row_values * VALUE_BYTES + cameras * SIDECAR_FRAME_BYTES)


def sidecar_bytes(shard_frames: Sequence[int], cameras: int) -> int:
    """The parsed sidecars of the open shards (the largest ones)."""
    return sum(sorted(shard_frames, reverse=True)[:OPEN_SHARDS]) * cameras * SIDECAR_FRAME_BYTES
