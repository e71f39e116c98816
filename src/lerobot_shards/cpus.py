"""How many CPUs a process may use, and a rank's share of its node's: what sizes the converter's
encode pools and the loader's decode threads and workers."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask (a SLURM allocation, ``taskset``), not the
    machine's; the CPU count where there is no mask (macOS, Windows). Sizes encode and decode pools."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def local_world_size() -> tuple[int, str] | None:
    """The ranks on this node as their launcher tells them, and the variable that told: torchrun's
    ``LOCAL_WORLD_SIZE``; else, in a task ``srun`` started (``SLURM_LOCALID`` set: not a batch
    script, whose allocation may hold tasks it never starts), its step's tasks on this node
    (``SLURM_STEP_TASKS_PER_NODE``, as ``2(x3),1``: this node's by ``SLURM_NODEID``), else
    ``SLURM_NTASKS_PER_NODE``; None when none says. A value that is not a count raises, naming it."""
    env = os.environ
    if env.get("LOCAL_WORLD_SIZE", "").strip():
        return _count("LOCAL_WORLD_SIZE", env["LOCAL_WORLD_SIZE"]), "LOCAL_WORLD_SIZE"
    if not env.get("SLURM_LOCALID", "").strip():
        return None
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        text = env.get(name, "").strip()
        if not text:
            continue
        node = _count("SLURM_NODEID", env.get("SLURM_NODEID", "0") or "0", zero=True)
        for part in text.split(","):  # "2(x3),1": 2 tasks on each of 3 nodes, then 1 (the last part
            count, _, times = part.partition("(x")  # also counts for nodes past the list)
            node -= _count(name, times.rstrip(")"), text) if times else 1  # counted, never expanded:
            if node < 0:  # "2(x99999999999)" was a list of 10**11 strings
                break
        return _count(name, count, text), name
    return None


def _count(name: str, text: str, whole: str | None = None, zero: bool = False) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < (0 if zero else 1):
        raise ValueError(f"environment variable {name}={whole or text!r} is not a count of ranks")
    return value


def cores_per_rank() -> int:
    """This rank's share of the node's cores, which sizes its decode threads and workers.

    The cores its launcher (the rank's parent process: torchrun, slurmstepd, a shell) may use are
    shared by the ``local_world_size()`` ranks it started (one when unknown), and a rank never counts
    more than its own mask: torchrun pins nothing, so its ranks split its mask (the whole node, or
    a SLURM allocation, ``taskset`` or container cpuset around it); ``srun --cpu-bind`` or
    ``taskset`` per rank give each rank a mask of its own; NUMA binding gives ranks a node's
    cores, which they split. Counted in the rank's own process (a DataLoader worker cannot tell
    its rank's launcher: a forkserver worker's parent is the fork server). A single rank
    (``LOCAL_WORLD_SIZE`` unset or 1) counts its own mask. Where the launcher's mask cannot be
    read, or is narrower than the rank's (a launcher kept on housekeeping cores, SLURM core
    specialization), a rank's mask narrower than the machine counts as its own, else the machine
    is split among the ranks.
    """
    own = usable_cpus()
    try:
        found = local_world_size()
    except ValueError:  # said where the dataset is built (its node partition); here: one rank
        found = None
    ranks = 1 if found is None else found[0]
    if ranks == 1:
        return own
    launcher = _launcher_cpus(os.getpid())
    if launcher is None or launcher < own:  # unreadable, or a launcher kept off the rank's cores
        return own if own < (os.cpu_count() or own) else max(1, own // ranks)
    return max(1, min(own, launcher // ranks))


def _launcher_cpus(pid: int) -> int | None:
    """How many CPUs the parent of process ``pid`` may use (``None`` where that cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        parent = int(stat[stat.rindex(b")") + 2 :].split()[1])  # after "pid (comm) state": the parent's pid
        return len(os.sched_getaffinity(parent)) if parent > 0 else None
    except (OSError, ValueError, IndexError, AttributeError):
        return None
