"""The loader's import graph, read with ``ast`` from the source files: its sub-packages exist, no
module imports another in a circle, and every import points down the layers below.

Layers, lowest first (a module may import its own layer and the ones below it):

- ``plan/``: pure functions of metadata, seed, epoch and layout; the standard library, numpy, numba and the
  package's exception types only
- ``transport/``: moving batches between threads, processes and devices; knows nothing of datasets
- the values shared by every layer above: ``options``, ``meta``, ``control``, ``augment``
- ``read/``: sources, the shard cache, remote reads, integrity, the read-ahead thread
- ``decoding/``: decoders of the clips ``read/`` hands over
- the single dataset put together: ``stats``, ``emission``, ``base``, ``dataset``
- ``mix/``: several datasets mixed, each one a dataset of the layer below
- the package's public face (``loader/__init__.py``)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import lerobot_shards.loader

ROOT = Path(lerobot_shards.loader.__file__).parent
PACKAGE = "lerobot_shards.loader"
SUBPACKAGES = ("plan", "read", "decoding", "transport", "mix")
VALUES = ("options", "meta", "control", "augment")
ASSEMBLY = ("stats", "emission", "base", "dataset")
LAYERS = ("plan", "transport", "values", "read", "decoding", "assembly", "mix", "face")
# What plan/ may import besides the standard library (numba: the elastic summary's loop compiled, plan/progress.py).
# lerobot_shards.exceptions: the package's error types (the standard library only), raised by planners too.
PURE_DEPENDENCIES = {"numpy", "numba", "__future__", "lerobot_shards.exceptions"}


def _modules() -> dict[str, Path]:
    """Every module of the loader by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join((PACKAGE, *parts))] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(the loader modules ``name`` imports, the top-level names of everything else it imports; the
    package's own modules outside the loader by their full names)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside: set[str] = set()
    outside: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # ``from . import shutdown`` imports a module; ``from .x import name`` the module x
            targets = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in modules] or [module]
        else:
            continue
        for target in targets:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                inside.add(target)
            else:
                outside.add(target if target.startswith("lerobot_shards.") else target.split(".")[0])
    return inside, outside


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:`` (imports for annotations only, never run)."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules)[0] - {name} for name, path in modules.items()}


def _layer(name: str) -> str:
    parts = name[len(PACKAGE) + 1 :].split(".") if name != PACKAGE else []
    if not parts:
        return "face"
    if parts[0] in SUBPACKAGES:
        return parts[0]
    if parts[0] in VALUES:
        return "values"
    if parts[0] in ASSEMBLY:
        return "assembly"
    raise AssertionError(f"{name}: a top-level loader module in no layer; add it to VALUES or ASSEMBLY here")


def test_the_sub_packages_exist_and_every_module_has_a_layer() -> None:
    modules = _modules()
    for sub in SUBPACKAGES:
        assert f"{PACKAGE}.{sub}" in modules, f"loader/{sub}/ is missing"
    for name in modules:
        _layer(name)


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{a} ({_layer(a)}) imports {b} ({_layer(b)})"
        for a, deps in sorted(graph.items())
        for b in sorted(deps)
        if LAYERS.index(_layer(b)) > LAYERS.index(_layer(a))
    ]


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = _upward(_graph())
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_no_import_cycles() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_plan_is_pure() -> None:
    modules = _modules()
    for name, path in modules.items():
        if _layer(name) != "plan":
            continue
        inside, outside = _imports(name, path, modules)
        assert all(_layer(m) == "plan" for m in inside - {name}), f"{name} imports {sorted(inside)}"
        impure = outside - PURE_DEPENDENCIES - set(sys.stdlib_module_names)
        assert not impure, (
            f"{name} imports {sorted(impure)}: plan/ is the standard library, numpy, numba and the package's exceptions only"
        )
        io = outside & {"os", "io", "socket", "threading", "multiprocessing", "subprocess", "shutil"}
        assert not io, f"{name} imports {sorted(io)}: plan/ does no I/O"


def test_the_check_sees_an_upward_import_and_a_cycle() -> None:
    """The checks themselves can fail: a planner importing the resume state's shared memory (as
    ``plan/order.py`` did before ``ResumeState`` moved there), and a circle of three."""
    assert _upward({f"{PACKAGE}.plan.order": {f"{PACKAGE}.control", f"{PACKAGE}.plan.resume"}}) == [
        f"{PACKAGE}.plan.order (plan) imports {PACKAGE}.control (values)"
    ]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [group + [group[0]] for group in groups]


def test_old_module_paths_import_the_moved_modules() -> None:
    """Paths users' code and README named before the sub-packages still import, as the same modules."""
    import importlib

    from lerobot_shards.loader.transport import SlabCollate, slab_loader, with_slabs

    moved = {
        "cache": "read.shard_cache",
        "checkpoint": "plan.order",
        "decode": "decoding.decoders",
        "mixture": "mix.dataset",
        "mixture_spec": "mix.spec",
        "sources": "read.sources",
        "remote": "read.remote",
        "feeder": "transport.feeder",
    }
    for old, new in moved.items():
        assert importlib.import_module(f"{PACKAGE}.{old}") is importlib.import_module(f"{PACKAGE}.{new}"), old
    assert importlib.import_module(f"{PACKAGE}.mixture").open_dataset is not None
    assert (SlabCollate, slab_loader, with_slabs) == (
        lerobot_shards.loader.SlabCollate,
        lerobot_shards.loader.slab_loader,
        lerobot_shards.loader.with_slabs,
    )
    assert (
        importlib.import_module(f"{PACKAGE}.transport").Layout
        is importlib.import_module(f"{PACKAGE}.transport.slabs").Layout
    )
