"""``dataset.meta``: what LeRobot's policies, processors and trainer read from a dataset, without LeRobot.

``make_policy(cfg, ds_meta=...)`` reads ``features`` (LeRobot's schema: a camera's stored
``shape``, so shards converted with ``--resize`` give the policy their stored size) and
``stats``; ``make_pre_post_processors(..., dataset_stats=meta.stats)`` normalizes with the
stats; the trainer logs ``camera_keys``, totals and ``fps``. The stats are those LeRobot itself
would hold: it writes ``meta/stats.json`` by aggregating every episode's stats
(``compute_stats.aggregate_stats``), and we aggregate the per-episode stats of the chosen
episodes the same way (weighted means, parallel variance, min/max, count-weighted quantiles),
so a subset trains with its own stats. Pure: numpy only (never LeRobot, pandas or I/O).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..depth import DepthParams, is_depth, stats_factor
from ..language import LANGUAGE_COLUMNS
from ..lerobot_v3 import IMAGE_DTYPE, VIDEO_DTYPE, nested_stats

Stats = dict[str, dict[str, np.ndarray]]


def stats_to_numpy(stats: Mapping[str, Mapping[str, Any]]) -> Stats:
    """JSON stats as LeRobot loads them (``io_utils.cast_stats_to_numpy``): every value an at-least-1-D array."""
    return {key: {name: np.atleast_1d(np.array(value)) for name, value in ft.items()} for key, ft in stats.items()}


def aggregate_feature_stats(stats_list: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One feature's stats over several episodes, by LeRobot's formulas (``aggregate_feature_stats``)."""
    means = np.stack([s["mean"] for s in stats_list])
    variances = np.stack([s["std"] ** 2 for s in stats_list])
    counts = np.stack([s["count"] for s in stats_list])
    total_count = counts.sum(axis=0)
    while counts.ndim < means.ndim:
        counts = np.expand_dims(counts, axis=-1)
    total_mean = (means * counts).sum(axis=0) / total_count
    delta_means = means - total_mean
    total_variance = ((variances + delta_means**2) * counts).sum(axis=0) / total_count
    out = {
        "min": np.min(np.stack([s["min"] for s in stats_list]), axis=0),
        "max": np.max(np.stack([s["max"] for s in stats_list]), axis=0),
        "mean": total_mean,
        "std": np.sqrt(total_variance),
        "count": total_count,
    }
    for q in (k for k in stats_list[0] if k.startswith("q") and k[1:].isdigit()):
        if all(q in s for s in stats_list):
            out[q] = (np.stack([s[q] for s in stats_list]) * counts).sum(axis=0) / total_count
    return out


def aggregate_stats(stats_list: Sequence[Mapping[str, Mapping[str, np.ndarray]]]) -> Stats:
    """Stats over several episodes: every feature any episode has, aggregated (``aggregate_stats``)."""
    keys = sorted({k for s in stats_list for k in s})
    return {k: aggregate_feature_stats([s[k] for s in stats_list if k in s]) for k in keys}


def episode_stats_rows(rows: Iterable[Mapping[str, Any]]) -> dict[int, Stats]:
    """Per-episode stats from ``meta/episodes`` rows (``episode_index`` and ``stats/<feature>/<stat>`` columns)."""
    return {int(row["episode_index"]): stats_to_numpy(nested_stats(dict(row))) for row in rows}


@dataclass(frozen=True)
class DatasetMeta:
    """The metadata of the episodes a loader reads, shaped like ``LeRobotDatasetMetadata``.

    ``total_episodes``/``total_frames``/``total_tasks`` are the whole dataset's (as LeRobot's
    metadata); the dataset's ``num_episodes``/``num_frames`` count the chosen episodes.
    ``stats`` covers the chosen episodes. ``tasks`` is the task strings by ``task_index``
    (LeRobot keeps a pandas frame; ``lerobot_shards.integrations.lerobot_train`` adapts it).
    """

    repo_id: str
    root: str
    info: dict[str, Any]
    features: dict[str, dict[str, Any]]
    stats: Stats
    tasks: tuple[str, ...]
    episodes: tuple[int, ...]  # the chosen episodes, ascending
    total_episodes: int
    total_frames: int
    fps: int | float
    robot_type: str | None = None
    stats_source: str = field(default="episodes", compare=False)  # "episodes", "stats.json" or "none"

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft["dtype"] in (VIDEO_DTYPE, IMAGE_DTYPE)]

    @property
    def video_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft["dtype"] == VIDEO_DTYPE]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft["dtype"] == IMAGE_DTYPE]

    @property
    def depth_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if is_depth(ft)]

    @property
    def has_language_columns(self) -> bool:
        return any(c in self.features for c in LANGUAGE_COLUMNS)

    @property
    def total_tasks(self) -> int:
        return len(self.tasks)

    @property
    def names(self) -> dict[str, Any]:
        return {k: ft.get("names") for k, ft in self.features.items()}

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(ft["shape"]) for k, ft in self.features.items()}


def dataset_meta(
    *,
    root: str,
    info: Mapping[str, Any],
    features: Mapping[str, dict[str, Any]],
    cameras: Sequence[str],
    tasks: Sequence[str],
    episodes: Sequence[int],
    all_episodes: int,
    all_frames: int,
    fps: float,
    dataset_stats: Mapping[str, Any],
    episode_stats: Mapping[int, Stats] | None,
    repo_id: str | None = None,
    depth: Mapping[str, tuple[DepthParams, str]] | None = None,
) -> DatasetMeta:
    """The metadata of ``episodes``; camera features other than ``cameras`` are left out (never emitted).

    Stats: aggregated from ``episode_stats`` when every chosen episode has them, else the
    dataset's ``meta/stats.json`` (``dataset_stats``, which covers every episode). A depth camera's
    (``depth``: camera -> its parameters and the unit its frames are returned in) are then rescaled
    from the unit they were recorded in, as LeRobot's ``meta.rescale_depth_stats`` does.
    """
    # shapes as tuples, as LeRobot's ``load_info`` makes them
    keep = {
        k: {**ft, "shape": tuple(ft["shape"])}
        for k, ft in features.items()
        if ft["dtype"] != VIDEO_DTYPE or k in cameras
    }
    chosen = tuple(sorted(int(e) for e in episodes))
    if episode_stats is not None and chosen and all(episode_stats.get(e) for e in chosen):
        stats, source = aggregate_stats([episode_stats[e] for e in chosen]), "episodes"
    elif dataset_stats:
        stats, source = stats_to_numpy(dataset_stats), "stats.json"
    else:
        stats, source = {}, "none"
    stats = {k: v for k, v in stats.items() if k in keep}
    for key, (params, unit) in (depth or {}).items():
        factor = stats_factor(params, unit)
        if factor is not None and key in stats:
            stats[key] = {name: v if name == "count" else v * factor for name, v in stats[key].items()}
    raw_fps = info.get("fps", fps)
    return DatasetMeta(
        repo_id=repo_id or root.rstrip("/").rsplit("/", 1)[-1],
        root=root,
        info=dict(info),
        features=keep,
        stats=stats,
        tasks=tuple(tasks),
        episodes=chosen,
        total_episodes=int(info.get("total_episodes", all_episodes)),
        total_frames=int(info.get("total_frames", all_frames)),
        fps=int(raw_fps) if float(raw_fps).is_integer() else float(raw_fps),
        robot_type=info.get("robot_type"),
        stats_source=source,
    )
