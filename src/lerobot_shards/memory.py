"""How much memory a process's node gives it: its cgroup's limit where one is set, else the
machine's. Sizes the loader's default memory budget per consumer."""

from __future__ import annotations

import os

# cgroup limits at or above this are "no limit" (cgroup v1 writes 2**63 rounded down to a page)
NO_LIMIT = 1 << 62


def node_memory_bytes() -> int:
    """The memory this process may use: the smallest limit of its cgroup (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``) where one is set, else the machine's physical memory (``MemTotal``)."""
    physical = _physical()
    limits = [limit for limit in (_cgroup_v2(), _cgroup_v1()) if limit is not None and limit < NO_LIMIT]
    return min([physical, *limits])


def _physical() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 8 << 30  # unknown: a small node's


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path for ``controller`` ("" for the v2 hierarchy), from /proc/self/cgroup."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, names, path = line.rstrip("\n").split(":", 2)
                if names.split(",") == [controller] or controller in names.split(","):
                    return path
    except (OSError, ValueError):
        pass
    return None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return None if text == "max" else int(text) if text.isdigit() else None


def _cgroup_v2() -> int | None:
    path = _own_cgroup("")
    if path is None:
        return None
    return _read_int(os.path.join("/sys/fs/cgroup", path.lstrip("/"), "memory.max")) or _read_int(
        "/sys/fs/cgroup/memory.max"
    )


def _cgroup_v1() -> int | None:
    path = _own_cgroup("memory")
    root = "/sys/fs/cgroup/memory"
    found = [_read_int(os.path.join(root, path.lstrip("/"), "memory.limit_in_bytes"))] if path else []
    found.append(_read_int(os.path.join(root, "memory.limit_in_bytes")))  # a container sees its own at the root
    limits = [x for x in found if x is not None]
    return min(limits) if limits else None
