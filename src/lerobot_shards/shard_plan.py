"""The shard plan: which episodes go into which shard. A pure function of source metadata.

The converter writes shards by this plan, and the loader applies the same plan to a raw
LeRobot dataset as virtual shards, so both sources split into identical shards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_SHARD_BYTES = 512 * 1024 * 1024


def shard_target(
    shard_bytes: int | None = None, episodes_per_shard: int | None = None
) -> tuple[int | None, int | None]:
    """The plan's shard target as (bytes, episodes per shard): exactly one of them is set.

    A shard closes at a byte size or at an episode count, never both; with neither given the
    target is ``DEFAULT_SHARD_BYTES``. Converter, loader and CLI all resolve the target here.
    """
    if shard_bytes is not None and episodes_per_shard is not None:
        raise ValueError("give a shard size or a number of episodes per shard, not both")
    if episodes_per_shard is not None:
        if episodes_per_shard <= 0:
            raise ValueError(f"episodes_per_shard must be positive, got {episodes_per_shard}")
        return None, episodes_per_shard
    if shard_bytes is None:
        return DEFAULT_SHARD_BYTES, None
    if shard_bytes <= 0:
        raise ValueError(f"shard size must be positive, got {shard_bytes}")
    return shard_bytes, None


@dataclass(frozen=True)
class EpisodeSize:
    episode_index: int
    length: int  # frames
    est_bytes: int  # estimated bytes of its members in a shard


@dataclass(frozen=True)
class PlannedShard:
    index: int
    episodes: tuple[int, ...]
    frames: int
    est_bytes: int


def plan_shards(
    episodes: Sequence[EpisodeSize],
    *,
    target_bytes: int | None = None,
    episodes_per_shard: int | None = None,
    shuffle_seed: int | None = None,
) -> list[PlannedShard]:
    """Group whole episodes into shards, in source order (or shuffled by ``shuffle_seed``).

    A shard closes once it reaches ``target_bytes`` (or holds ``episodes_per_shard`` episodes;
    see ``shard_target``). A last shard smaller than half the target is merged into the one
    before it, so there is no tiny tail shard that would leave a consumer nearly idle.
    """
    target_bytes, episodes_per_shard = shard_target(target_bytes, episodes_per_shard)
    order = list(episodes)
    if shuffle_seed is not None:
        import numpy as np  # here only: the CLI reads this module's defaults without paying for numpy

        perm = np.random.default_rng(shuffle_seed).permutation(len(order))
        order = [order[i] for i in perm]

    groups: list[list[EpisodeSize]] = []
    current: list[EpisodeSize] = []
    current_bytes = 0
    for ep in order:
        current.append(ep)
        current_bytes += ep.est_bytes
        full = len(current) >= episodes_per_shard if episodes_per_shard is not None else current_bytes >= target_bytes
        if full:
            groups.append(current)
            current, current_bytes = [], 0
    if current:
        small = (
            len(current) * 2 < episodes_per_shard
            if episodes_per_shard is not None
            else current_bytes * 2 < target_bytes
        )
        if groups and small:
            groups[-1].extend(current)
        else:
            groups.append(current)

    return [
        PlannedShard(
            index=i,
            episodes=tuple(e.episode_index for e in g),
            frames=sum(e.length for e in g),
            est_bytes=sum(e.est_bytes for e in g),
        )
        for i, g in enumerate(groups)
    ]
