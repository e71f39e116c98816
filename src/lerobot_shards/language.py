"""LeRobot 0.6.1's language annotation columns, read as its ``LeRobotDataset`` returns them.

An annotated dataset (``lerobot-annotate``, ``lerobot.datasets.language``) declares
``language_persistent`` and ``language_events`` with ``dtype: language`` and holds, on every row of
its parquet, a list of structs: the episode's persistent rows (role, content, style, timestamp,
camera, tool_calls; the same list on every frame) and the events that fire at that frame (the
same fields but the timestamp). ``LeRobotDataset.__getitem__`` returns the frame's own row (never
windowed, no filtering by timestamp) as Python lists of dicts, after the ``datasets`` library has
cast the stored column to LeRobot's feature: a missing field reads ``None``, a ``timestamp`` is
rounded to float32, and each ``tool_calls`` entry is a ``Json`` value (a struct LeRobot's writer
inferred goes through pandas' ujson, whose floats keep 10 decimals). ``LanguageColumn.row`` gives
those values; the rows stay in Arrow until a sample asks for its frame (the persistent list is
repeated on every frame: as Python objects an episode's copies would cost far more memory).

The columns are untrusted: ``language_column`` checks the stored type once per episode and bounds
what a row may hold (rows per frame, bytes of one string, bytes of the episode's column), each
failure one line naming the episode and the column.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

LANGUAGE_DTYPE = "language"
LANGUAGE_PERSISTENT = "language_persistent"
LANGUAGE_EVENTS = "language_events"
LANGUAGE_COLUMNS = (LANGUAGE_PERSISTENT, LANGUAGE_EVENTS)
# lerobot.datasets.language's PERSISTENT_ROW_FIELDS and EVENT_ROW_FIELDS, in its feature's order
ROW_FIELDS = {
    LANGUAGE_PERSISTENT: ("role", "content", "style", "timestamp", "camera", "tool_calls"),
    LANGUAGE_EVENTS: ("role", "content", "style", "camera", "tool_calls"),
}
_TEXT_FIELDS = ("role", "content", "style", "camera")
# Bounds on untrusted rows: an annotated frame holds tens of rows of sentences in practice.
MAX_ROWS_PER_FRAME = 4096
MAX_TEXT_BYTES = 1 << 20  # one string: a content, role, style, camera, or a tool call's JSON
MAX_COLUMN_BYTES = 256 << 20  # an episode's column in Arrow (the persistent rows repeat on every frame)
JSON_DECIMALS = 10  # pandas' ujson_dumps(double_precision=10), which datasets' Json feature encodes with


def is_language_feature(name: str, spec: dict[str, Any]) -> bool:
    """A language column as LeRobot 0.6.1 declares it (its name decides, as LeRobot's feature mapping does)."""
    return spec.get("dtype") == LANGUAGE_DTYPE and name in LANGUAGE_COLUMNS


def language_keys(features: dict[str, dict[str, Any]]) -> list[str]:
    """The dataset's language columns, in its features' order."""
    return [k for k, spec in features.items() if is_language_feature(k, spec)]


def describe(features: dict[str, dict[str, Any]]) -> list[str]:
    """``inspect``'s line about a dataset's language columns (none when it has none)."""
    keys = language_keys(features)
    return [f"  language annotations: {', '.join(keys)} (LeRobot 0.6.1's rows, per frame)"] if keys else []


class LanguageColumn:
    """One episode's language column: its rows in Arrow, each frame's converted when a sample asks for it."""

    def __init__(self, name: str, rows: pa.ListArray | pa.LargeListArray, json_calls: bool) -> None:
        self.name = name
        self.rows = rows
        self.fields = ROW_FIELDS[name]
        self.json_calls = json_calls  # tool_calls entries stored as JSON text (else as Arrow values)

    def __len__(self) -> int:
        return len(self.rows)

    def row(self, frame: int) -> list[dict[str, Any] | None] | None:
        """The frame's rows as ``LeRobotDataset[i][name]`` gives them: fresh Python objects every call."""
        stored = self.rows[int(frame)].as_py()
        if stored is None:
            return None
        return [self._entry(r) for r in stored]

    def _entry(self, stored: dict[str, Any] | None) -> dict[str, Any] | None:
        if stored is None:
            return None
        out = {f: stored.get(f) for f in self.fields}
        if out.get("timestamp") is not None:
            out["timestamp"] = float(np.float32(out["timestamp"]))
        calls = out["tool_calls"]
        if calls is not None:
            out["tool_calls"] = [_json_value(c, self.json_calls) for c in calls]
        return out


def _json_value(value: Any, stored_as_json: bool) -> Any:
    """A ``tool_calls`` entry as datasets' ``Json`` feature decodes it."""
    if value is None:
        return None
    if stored_as_json:  # the text as datasets decodes it: pandas' ujson_loads, whose floats may differ
        parsed = json.loads(value)  # from Python's in the last bit (it reads them imprecisely)
        return _ujson_loads(value) if _has_float(parsed) else parsed
    return _ujson_round(value)


def _ujson_loads(text: str) -> Any:
    try:
        from pandas.io.json import ujson_loads
    except ImportError:
        return json.loads(text)
    return ujson_loads(text)


def _ujson_round(value: Any) -> Any:
    """``value`` after datasets' ``Json`` round trip, pandas' ujson (``ujson_dumps`` prints floats with
    10 decimals, ``ujson_loads`` reads them back imprecisely). Only values holding a float change;
    pandas, which is LeRobot's and not ours, is imported for those only; without it, the nearest
    float to the 10-decimal text (which may differ from LeRobot's in the last bit)."""
    if not _has_float(value):
        return value
    try:
        from pandas.io.json import ujson_dumps, ujson_loads
    except ImportError:
        return _rounded(value)
    return ujson_loads(ujson_dumps(value))


def _has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    return isinstance(value, list) and any(_has_float(v) for v in value)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.{JSON_DECIMALS}f}") if np.isfinite(value) and abs(value) < 1e15 else value
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def language_column(col: pa.Array | pa.ChunkedArray, name: str, where: str, error: type[Exception]) -> LanguageColumn:
    """Episode rows of language column ``name`` checked against LeRobot's row schema and the bounds.

    Raises ``error`` naming ``where`` (file and episode) and the column: a column that is not a list
    of structs, a struct field LeRobot's feature lacks (its cast refuses it) or of another kind,
    more than ``MAX_ROWS_PER_FRAME`` rows on a frame, a string over ``MAX_TEXT_BYTES``, a column
    over ``MAX_COLUMN_BYTES``.
    """
    at = f"{where}: column {name!r}"
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        raise error(f"{at} is {arr.type}, not a list of annotation rows (LeRobot's language column)")
    if arr.nbytes > MAX_COLUMN_BYTES:
        raise error(f"{at} holds {arr.nbytes} bytes, more than the {MAX_COLUMN_BYTES} an episode's column may hold")
    if len(arr):
        counts = np.nan_to_num(pc.list_value_length(arr).to_numpy(zero_copy_only=False), nan=0)
        if counts.max(initial=0) > MAX_ROWS_PER_FRAME:
            frame = int(np.argmax(counts))
            raise error(f"{at}: frame {frame} has {int(counts[frame])} rows, more than {MAX_ROWS_PER_FRAME} per frame")
    entries = arr.flatten()
    if pa.types.is_null(entries.type):
        return LanguageColumn(name, arr, json_calls=False)
    if not pa.types.is_struct(entries.type):
        raise error(f"{at} holds {entries.type} rows, not structs of {', '.join(ROW_FIELDS[name])}")
    fields = ROW_FIELDS[name]
    extra = [entries.type.field(i).name for i in range(entries.type.num_fields)]
    extra = [f for f in extra if f not in fields]
    if extra:
        raise error(f"{at}: rows hold field(s) {extra} that LeRobot's language rows lack ({', '.join(fields)})")
    json_calls = False
    for f in fields:
        if entries.type.get_field_index(f) < 0:
            continue
        values = entries.field(f)
        t = values.type
        if f in _TEXT_FIELDS:
            if not (pa.types.is_null(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
                raise error(f"{at}: field {f!r} is {t}, not text")
            _check_text(values, f"{at}: field {f!r}", error)
        elif f == "timestamp":
            if not (pa.types.is_null(t) or pa.types.is_floating(t) or pa.types.is_integer(t)):
                raise error(f"{at}: field 'timestamp' is {t}, not seconds")
        else:  # tool_calls: a list of JSON values (text, or what LeRobot's writer let Arrow infer)
            if pa.types.is_null(t):
                continue
            if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
                raise error(f"{at}: field 'tool_calls' is {t}, not a list")
            calls = values.flatten()
            if isinstance(calls, pa.ExtensionArray):  # pa.json_(): JSON text underneath
                calls = calls.storage
            if pa.types.is_string(calls.type) or pa.types.is_large_string(calls.type):
                json_calls = True
                _check_text(calls, f"{at}: field 'tool_calls'", error)
                _check_json(calls, f"{at}: field 'tool_calls'", error)
    return LanguageColumn(name, arr, json_calls)


def _check_text(values: pa.Array, at: str, error: type[Exception]) -> None:
    if pa.types.is_null(values.type) or not len(values):
        return
    sizes = pc.binary_length(values).to_numpy(zero_copy_only=False)
    sizes = np.nan_to_num(sizes.astype(np.float64), nan=0)
    if sizes.max(initial=0) > MAX_TEXT_BYTES:
        raise error(f"{at} holds a string of {int(sizes.max())} bytes, more than {MAX_TEXT_BYTES}")


def _check_json(values: pa.Array, at: str, error: type[Exception]) -> None:
    """Every distinct JSON text decodes as a sample will decode it (LeRobot's Json feature decodes
    each when its frame is read): a text nested 200,000 deep was a bare RecursionError here, and an
    integer past 64 bits beside a float passed Python's parser, then failed pandas' mid-epoch
    ("Value is too big!", naming nothing)."""
    for text in pc.unique(values.drop_null()).to_pylist():
        try:
            _json_value(text, True)
        except (ValueError, RecursionError) as e:
            raise error(f"{at} holds {text[:40]!r}..., which is not JSON a sample decodes ({str(e)[:80]})") from None
