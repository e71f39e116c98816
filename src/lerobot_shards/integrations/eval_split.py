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


def eval_subset(
    held: Sequence[int], tasks: Mapping[int, Sequence[str]], task_index: Mapping[str, int], max_eval_samples: int
) -> tuple[int, list[tuple[int, list[int]]]]:
    """``--max_eval_samples``: LeRobot's ``Subset`` of the held-out frames, as ``(per_task, [(task_index,
    episodes), ...])``: ``max(1, max_eval_samples // tasks)`` frames of each task present among the
    held-out episodes, the first in index order of the episodes holding it, tasks by ``task_index``."""
    present = sorted({task_index[t] for e in held for t in tasks[e]})
    per_task = max(1, max_eval_samples // max(len(present), 1))
    by_index = {i: t for t, i in task_index.items()}
    return per_task, [(i, [e for e in sorted(held) if by_index[i] in tasks[e]]) for i in present]
