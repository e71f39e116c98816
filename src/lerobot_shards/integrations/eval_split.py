"""``--dataset.eval_split``: the episodes LeRobot 0.6.1's ``make_train_eval_datasets`` holds out. Pure.

Episodes are grouped by their first task (as ``meta.episodes["tasks"]`` lists them; an episode
with none under ""), groups in order of their first episode, and the last ``ceil(n * eval_split)``
of each group's ``n`` episodes are held out for evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def split_episodes(
    episodes: Sequence[int], tasks: Mapping[int, Sequence[str]], eval_split: float
) -> tuple[list[int], list[int]]:
    """``(train, eval)`` episodes of ``episodes`` (in their order) for ``eval_split`` in (0, 1);
    ``ValueError`` when no training episode is left, as LeRobot's."""
    if not 0 < eval_split < 1:
        raise ValueError(f"--dataset.eval_split must be in (0, 1) to hold episodes out, got {eval_split}")
    by_task: dict[str, list[int]] = {}
    for e in episodes:
        by_task.setdefault(tasks[e][0] if tasks[e] else "", []).append(e)
    train: list[int] = []
    held: list[int] = []
    for group in by_task.values():
        n_eval = math.ceil(len(group) * eval_split)
        train += group[: len(group) - n_eval]
        held += group[len(group) - n_eval :]
    if not train:
        raise ValueError(f"eval_split={eval_split} leaves 0 training episodes from {len(episodes)} total")
    return train, held
