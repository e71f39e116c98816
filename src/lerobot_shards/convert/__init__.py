"""The converter: LeRobot v3.0 -> episode-aligned tar shards with sidecars and a manifest.

``plan`` (options, shard plan, task shares; pure), ``shard_writer`` (one deterministic tar)
over ``tar_sink`` (tar bytes, hashed as written), ``destination`` (atomic writes to disk or
fsspec), ``shard_status`` (is a shard complete?), ``run`` (resume, workers, tasks, manifest),
``verify``, ``inspect`` and ``upload`` (a finished conversion to object storage). The public
names below load on first use, so ``inspect`` does not pay for the video stack's imports.
"""

from importlib import import_module
from typing import Any

from ..exceptions import ConvertError as ConvertError

_PUBLIC = {
    "ConvertOptions": "plan",
    "RunOptions": "plan",
    "VerifyReport": "verify",
    "convert_dataset": "run",
    "UploadError": "upload",
    "inspect_path": "inspect",
    "upload_dataset": "upload",
    "verify_dataset": "verify",
}
__all__ = sorted([*_PUBLIC, "ConvertError"])


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_PUBLIC[name]}", __name__), name)
