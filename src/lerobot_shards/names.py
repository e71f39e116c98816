"""Untrusted names: every name read from a dataset is confined to its directory before use.

Manifests, sidecars, tar members and ``info.json`` path templates all come from files an
attacker may control (a shared bucket, a downloaded dataset). A name such as ``/etc/x`` or
``../../x`` would make a join escape the dataset or the loader's cache, so names are checked
when they are parsed (``check_name``, ``check_relpath``) and again where a path is joined
(``confined_join``).
"""

from __future__ import annotations

import os

from .exceptions import LeRobotShardsError

SEPARATORS = ("/", "\\")


class UnsafeNameError(LeRobotShardsError, ValueError):
    """A name read from a dataset file would leave its directory (or is not a name at all)."""


def _problem_with_name(value: object) -> str | None:
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not a string"
    if not value:
        return "is empty"
    if "\x00" in value:
        return "contains a NUL character"
    if any(sep in value for sep in SEPARATORS):
        return "contains a path separator"
    if value in (".", ".."):
        return "is a directory reference"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # JSON's "\\ud800", or bytes a reader could not decode: not a name as text
        return "is not valid Unicode text (a lone surrogate, or bytes that are not UTF-8)"
    return None


def check_name(value: object, what: str) -> str:
    """``value`` when it is a plain file name (no separator, NUL, ``.``/``..``, not empty); else raise.

    ``what`` names the file and field in the error, e.g. ``"manifest.json: shards[2].name"``.
    """
    problem = _problem_with_name(value)
    if problem:
        raise UnsafeNameError(f"{what} = {value!r} {problem}; expected a plain file name")
    return value  # type: ignore[return-value]


def check_relpath(value: object, what: str) -> str:
    """``value`` when it is a relative POSIX path that stays inside its root; else raise.

    Every ``/``-separated part must be a plain name: no leading ``/``, no ``..``, no ``.``, no
    empty part (``a//b``), no backslash, no NUL.
    """
    if not isinstance(value, str) or not value:
        raise UnsafeNameError(f"{what} = {value!r} is not a relative path")
    if value.startswith("/"):
        raise UnsafeNameError(f"{what} = {value!r} is an absolute path; expected a path relative to the dataset")
    for part in value.split("/"):
        problem = _problem_with_name(part)
        if problem:
            raise UnsafeNameError(f"{what} = {value!r}: part {part!r} {problem}; expected a path inside the dataset")
    return value


def confined_join(base: str, name: str, what: str) -> str:
    """``base/name`` for a plain ``name``; raises unless the result lies directly under ``base``."""
    check_name(name, what)
    path = os.path.join(base, name)
    if os.path.dirname(os.path.abspath(path)) != os.path.abspath(base):
        raise UnsafeNameError(f"{what} = {name!r} leaves {base}")
    return path
