"""Read and decode options travel whole: no function of the loader outside ``options.py`` takes one
of their fields as a parameter of its own (``legacy_format`` once took four signatures in three
files). A new option is then its field in ``options.py`` and the line that reads it."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import lerobot_shards.loader
from lerobot_shards.loader.options import DecodeOptions, ReadOptions

ROOT = Path(lerobot_shards.loader.__file__).parent
FIELDS = {f.name for cls in (ReadOptions, DecodeOptions) for f in dataclasses.fields(cls)}
# (module, function, parameter) that are one value, not an option passed on: the cache size of a
# directory, a mixture's layout's dtype.
ALLOWED = {
    ("read/shard_cache.py", "default_cache_bytes", "cache_dir"),
    ("mix/layout.py", "build_layout", "image_dtype"),
}


def _repeated() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "options.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
                    if arg.arg in FIELDS:
                        found.append((rel, node.name, arg.arg))
    return found


def test_no_read_or_decode_option_is_a_parameter_outside_options() -> None:
    repeated = sorted(set(_repeated()) - ALLOWED)
    assert not repeated, "read/decode options taken one by one (pass ReadOptions/DecodeOptions whole): " + "; ".join(
        f"{m}: {f}({a})" for m, f, a in repeated
    )
    assert ALLOWED <= set(_repeated()), "an allowed exception is gone: drop it from ALLOWED"
