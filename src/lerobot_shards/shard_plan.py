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
    """What planning needs of one source episode: its frames and its estimated bytes in a shard."""

    episode_index: int
    length: int  # frames
    est_bytes: int  # estimated bytes of its members in a shard


@dataclass(frozen=True)
class PlannedShard:
    """One shard of the plan: its episodes in order, with their frame and estimated byte totals."""

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

    # A shard's fill: its episode count, or its bytes, measured against the one target.
    by_count = episodes_per_shard is not None
    target = episodes_per_shard if by_count else target_bytes
    assert target is not None  # shard_target sets exactly one of them
    groups: list[list[EpisodeSize]] = []
    current: list[EpisodeSize] = []
    fill = 0
    for ep in order:
        current.append(ep)
        fill += 1 if by_count else ep.est_bytes
        if fill >= target:
            groups.append(current)
            current, fill = [], 0
    if current:
        if groups and fill * 2 < target:
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
