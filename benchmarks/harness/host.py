"""What the machine's host took from a measurement: the CPU time stolen from this virtual machine.

On a shared VM the host runs other guests on the same physical cores; the time this guest was
runnable but not running is counted as ``steal`` in /proc/stat (Linux, every virtualised kernel
that reports it; 0 on bare metal). Measured here, the same configuration (ours alone,
ACT through ``lerobot-shards train``) ran 34.1 samples/s with 15.5 % of the CPU time stolen and
46.3-47.8 with 0.2-0.4 %, so each figure carries its share: a run with much steal is slow for a
reason no code change explains.
"""

from __future__ import annotations

from pathlib import Path

STAT = Path("/proc/stat")


def cpu_ticks() -> list[int] | None:
    """The machine's CPU tick counters now (user, nice, system, idle, iowait, irq, softirq, steal,
    ...), or None where /proc/stat is missing."""
    try:
        return [int(x) for x in STAT.read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None


def percent(share: float | None, missing: str = "–") -> str:
    """A share as a percentage for a table, ``missing`` where there is none."""
    return missing if share is None else f"{share * 100:.1f}"


def stolen_share(before: list[int] | None, after: list[int] | None) -> float | None:
    """The share of the machine's CPU time stolen by the host between two ``cpu_ticks`` readings."""
    if before is None or after is None or len(before) < 8 or len(after) < 8:
        return None
    # guest and guest_nice (fields 9-10) are already counted in user and nice
    total = sum(after[:8]) - sum(before[:8])
    return round((after[7] - before[7]) / total, 4) if total > 0 else None
