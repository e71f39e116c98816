"""Shared timing loop: steady wall samples/s after warmup, and steady CPU ms per sample (this
process and its DataLoader workers, read from /proc over the same steady span): the figure that
survives a shared, overloaded machine."""

import os
import time

TICK = os.sysconf("SC_CLK_TCK")


def _tree(pid):
    out = [pid]
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            kids = open(f"/proc/{pid}/task/{tid}/children").read().split()
        except OSError:
            continue
        for k in kids:
            out += _tree(int(k))
    return out


def _cpu():
    total = 0.0
    for pid in _tree(os.getpid()):
        try:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(f[11]) + int(f[12])) / TICK
    return total


def drive(loader, warmup=3, batches=40):
    it = iter(loader)
    t0 = time.perf_counter()
    for _ in range(warmup):
        next(it)
    first = time.perf_counter() - t0
    n = 0
    c0 = _cpu()
    start = time.perf_counter()
    for _ in range(batches):
        try:
            b = next(it)
        except StopIteration:
            break
        n += len(b["index"])
    el = time.perf_counter() - start
    cpu = _cpu() - c0
    del it
    return {
        "samples_per_s": round(n / el, 2),
        "cpu_ms_per_sample": round(1000 * cpu / n, 1),
        "samples": n,
        "startup_s": round(first, 1),
    }
