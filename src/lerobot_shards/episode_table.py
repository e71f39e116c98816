"""An episode's table is what the metadata says it is: checked before its rows are used.

Both loader sources (converted shards and raw datasets) and ``verify`` read an episode's rows as
one parquet table; before any of them is emitted as a sample it is checked here against the
features, tasks and length that the metadata declares. A mismatch would otherwise surface later
as a bare ``IndexError`` deep in emission (a ``task_index`` past the task table), as a collate
error between two episodes (a vector of the wrong width), or not at all (a ``task_index`` of -1
picks the last task; a wrong ``frame_index`` labels a frame as another; tasks renamed in the
metadata give every frame another task's text). Costs a few vectorised passes per episode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .format import feature_shape
from .language import is_language_feature, language_column
from .lerobot_v3 import IMAGE_DTYPE, VIDEO_DTYPE, numpy_of

# Declared dtypes whose values must not arrive as floats (a cast would truncate them silently).
_INTEGRAL = frozenset({"bool", *(f"{s}int{n}" for s in ("", "u") for n in (8, 16, 32, 64))})


def check_episode_table(
    table: pa.Table,
    *,
    episode_index: int,
    length: int,
    features: dict[str, dict[str, Any]],
    tasks: Sequence[str],
    where: str,
    error: type[Exception],
    episode_tasks: Sequence[str] = (),
    fps: float | None = None,
) -> None:
    """Raise ``error`` naming ``where`` and the column unless the episode's rows agree with its metadata.

    ``length`` rows; language columns as LeRobot's schema has them, within bounds (``language``); no
    nulls in a feature's column; each row of a feature as many values as its
    ``shape`` holds; integer and bool features not stored as floats; ``episode_index`` the
    episode's, ``frame_index`` 0..length-1, every ``task_index`` a row of ``tasks`` and, when the
    episode lists its tasks (``episode_tasks``: a converted episode's own header), one of those;
    with ``fps``, every ``timestamp`` ``frame_index / fps`` (``check_timestamps``).
    A feature without a column is left to the caller (each says which file lacks it).
    """
    if table.num_rows != length:
        raise error(f"{where}: {table.num_rows} rows, the metadata says the episode has {length} frames")
    for name, spec in features.items():
        if spec["dtype"] in (VIDEO_DTYPE, IMAGE_DTYPE) or name not in table.column_names:
            continue
        if is_language_feature(name, spec):  # lists of annotation rows: LeRobot's schema, bounded
            language_column(table.column(name), name, where, error)
            continue
        _check_feature(table.column(name).combine_chunks(), name, spec, where, error)
    _check_index(table, "episode_index", np.full(length, episode_index), where, error)
    _check_index(table, "frame_index", np.arange(length), where, error)
    if fps is not None:
        check_timestamps(table, fps, where, error)
    if "task_index" in table.column_names and length:
        used = np.unique(numpy_of(table.column("task_index")))
        if used[0] < 0 or used[-1] >= len(tasks):
            bad = int(used[0] if used[0] < 0 else used[-1])
            raise error(f"{where}: task_index {bad} is not a task (the dataset has {len(tasks)} tasks)")
        named = {tasks[int(i)] for i in used}
        if episode_tasks and not named <= set(episode_tasks):
            raise error(
                f"{where}: its rows' task_index names tasks {sorted(named)}, the episode lists {sorted(episode_tasks)}"
            )


TOLERANCE_S = 1e-4  # LeRobot's tolerance_s: how far a decoded frame may lie from the row's timestamp


def check_timestamps(table: pa.Table, fps: float, where: str, error: type[Exception]) -> None:
    """Raise ``error`` naming ``where`` and the row unless every row's ``timestamp`` is its ``frame_index / fps``.

    LeRobot decodes a frame at its row's timestamp while we (and the frame tables) go by the row's
    position: a swapped, doubled or shifted timestamp would pair one frame's pixels with another
    frame's time. Allowed: LeRobot's ``tolerance_s``, plus the rounding of the stored float type
    (float32 timestamps of a long episode are coarser than 1e-4 s).
    """
    if "timestamp" not in table.column_names or not table.num_rows:
        return
    col = table.column("timestamp").combine_chunks()
    if col.null_count or not (pa.types.is_floating(col.type) or pa.types.is_integer(col.type)):
        raise error(f"{where}: column 'timestamp' is not a column of numbers ({col.type}, {col.null_count} nulls)")
    stored = numpy_of(col)
    frames = numpy_of(table.column("frame_index")) if "frame_index" in table.column_names else np.arange(len(stored))
    want = frames.astype(np.float64) / fps
    slack = TOLERANCE_S + (
        np.spacing(np.abs(want).astype(stored.dtype)).astype(np.float64) if stored.dtype.kind == "f" else 0
    )
    off = np.abs(stored.astype(np.float64) - want) > slack
    if off.any():  # NaN compares False: caught by the second test
        row = int(np.flatnonzero(off)[0])
    elif not np.isfinite(stored.astype(np.float64)).all():
        row = int(np.flatnonzero(~np.isfinite(stored.astype(np.float64)))[0])
    else:
        return
    raise error(
        f"{where}: row {row}: timestamp {float(stored[row])!r} s is not frame_index {int(frames[row])} / fps {fps:g} "
        f"= {want[row]:.6f} s (LeRobot decodes at the row's timestamp; tolerance {TOLERANCE_S:g} s)"
    )


def _check_feature(col: pa.Array, name: str, spec: dict[str, Any], where: str, error: type[Exception]) -> None:
    want = math.prod(feature_shape(spec, f"feature {name!r}", error))
    width, leaf = 1, col
    while pa.types.is_list(leaf.type) or pa.types.is_large_list(leaf.type) or pa.types.is_fixed_size_list(leaf.type):
        if leaf.null_count:
            break
        sizes = numpy_of(pc.list_value_length(leaf))
        if len(sizes) and sizes.min() != sizes.max():
            raise error(f"{where}: column {name!r} holds rows of {sizes.min()} to {sizes.max()} values")
        width *= int(sizes[0]) if len(sizes) else want
        leaf = leaf.flatten()
    if leaf.null_count:
        raise error(f"{where}: column {name!r} has {leaf.null_count} null value(s)")
    if width != want:
        raise error(
            f"{where}: column {name!r} holds {width} value(s) per frame, its feature's shape {spec['shape']} says {want}"
        )
    if spec["dtype"] in _INTEGRAL and pa.types.is_floating(leaf.type):
        raise error(f"{where}: column {name!r} holds {leaf.type} values, its feature's dtype is {spec['dtype']}")


def _check_index(table: pa.Table, name: str, want: np.ndarray, where: str, error: type[Exception]) -> None:
    if name not in table.column_names:
        return
    col = table.column(name).combine_chunks()
    if col.null_count or not (pa.types.is_integer(col.type)):
        raise error(f"{where}: column {name!r} is not a column of integers ({col.type}, {col.null_count} nulls)")
    got = numpy_of(col)
    if not np.array_equal(got, want):
        row = int(np.flatnonzero(got != want)[0])
        raise error(f"{where}: column {name!r} holds {int(got[row])} at row {row}, expected {int(want[row])}")
