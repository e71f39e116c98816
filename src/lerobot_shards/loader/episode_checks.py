"""An episode's rows are what the metadata says they are, checked once when it enters the pool.

Both sources (converted shards and raw datasets) turn an episode's parquet rows into numpy
columns (``sources.table_to_columns``); before those columns are emitted as samples they are
checked here against the features, tasks and length the metadata declares. A mismatch would
otherwise surface later as a bare ``IndexError`` deep in emission (a ``task_index`` past the
task table), as a collate error between two episodes (a vector of the wrong width), or not at
all (a ``task_index`` of -1 picks the last task; a wrong ``frame_index`` labels a frame as
another). Costs a few vectorised comparisons per episode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..format import feature_shape
from ..lerobot_v3 import IMAGE_DTYPE, VIDEO_DTYPE

# Declared dtypes whose values must not arrive as floats (a cast would truncate them silently).
_EXACT_KINDS = {
    "bool": "b",
    **{f"int{n}": "iub" for n in (8, 16, 32, 64)},
    **{f"uint{n}": "iub" for n in (8, 16, 32, 64)},
}


def check_episode_columns(
    table: pa.Table,
    columns: dict[str, np.ndarray],
    *,
    episode_index: int,
    length: int,
    features: dict[str, dict[str, Any]],
    tasks: Sequence[str],
    where: str,
    error: type[Exception],
    episode_tasks: Sequence[str] = (),
) -> None:
    """Raise ``error`` naming ``where`` and the column unless the episode's rows agree with its metadata.

    ``length`` rows in every column; no nulls; each vector as wide as its feature's ``shape``;
    integer and bool features not stored as floats; ``episode_index`` the episode's,
    ``frame_index`` 0..length-1, every ``task_index`` a row of ``tasks`` and, when the episode
    lists its tasks (``episode_tasks``, a converted episode's header), one of those.
    """
    if table.num_rows != length:
        raise error(f"{where}: {table.num_rows} rows, the metadata says the episode has {length} frames")
    for name, spec in features.items():
        if spec["dtype"] in (VIDEO_DTYPE, IMAGE_DTYPE) or name not in columns:
            continue
        col = table.column(name)
        if col.null_count:
            raise error(f"{where}: column {name!r} has {col.null_count} null value(s)")
        values = columns[name]
        width = values.shape[1] if values.ndim == 2 else 1
        want = math.prod(feature_shape(spec, f"feature {name!r}", error))
        if width != want or (values.ndim == 2 and values.shape[0] != length):
            raise error(
                f"{where}: column {name!r} holds {width} value(s) per frame, its feature's shape "
                f"{spec['shape']} says {want}"
            )
        kinds = _EXACT_KINDS.get(spec["dtype"])
        if kinds is not None and values.dtype.kind not in kinds:
            raise error(f"{where}: column {name!r} holds {values.dtype} values, its feature's dtype is {spec['dtype']}")
    _check_index(columns, "episode_index", np.full(length, episode_index), where, error)
    _check_index(columns, "frame_index", np.arange(length), where, error)
    task_index = columns.get("task_index")
    if task_index is not None and length:
        used = np.unique(task_index)
        if used[0] < 0 or used[-1] >= len(tasks):
            bad = int(used[0] if used[0] < 0 else used[-1])
            raise error(f"{where}: task_index {bad} is not a task (the dataset has {len(tasks)} tasks)")
        named = {tasks[int(i)] for i in used}
        if episode_tasks and not named <= set(episode_tasks):
            raise error(
                f"{where}: its rows' task_index names tasks {sorted(named)}, the episode lists {sorted(episode_tasks)}"
            )


def _check_index(
    columns: dict[str, np.ndarray], name: str, want: np.ndarray, where: str, error: type[Exception]
) -> None:
    got = columns.get(name)
    if got is None:
        return
    got = got.reshape(len(got), -1)[:, 0] if got.ndim > 1 else got
    if got.dtype.kind not in "iu" or not np.array_equal(got, want):
        row = int(np.flatnonzero(got != want)[0]) if got.shape == want.shape else 0
        raise error(f"{where}: column {name!r} holds {got[row].item()!r} at row {row}, expected {want[row]}")
