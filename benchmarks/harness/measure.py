"""How every case is measured: one timing loop and one RSS/IO/CPU monitor, the same for us and for LeRobot.

Standalone on purpose (standard library only, no lerobot_shards or psutil; Linux /proc): the LeRobot runners import it
from their own interpreters (a separate venv, or a Debian 13 root where this folder is mounted at
the same path), so both sides are timed by the same code.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

MiB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (Linux /proc; no psutil, which LeRobot's environments may lack)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                kids = [int(x) for x in task.read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far, all its threads (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime: fields 14 and 15 of stat(5)


def _proc_sample(pid: int) -> tuple[int, int, float] | None:
    """(resident bytes, bytes passed to read() calls so far, CPU seconds so far) of one process, None once gone."""
    try:
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        return rss, int(io["rchar"]), _cpu_seconds(pid)
    except (OSError, ValueError, KeyError, IndexError):
        return None


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and its live descendants."""
    total = 0.0
    for pid in [os.getpid(), *_children(os.getpid())]:
        try:
            total += _cpu_seconds(pid)
        except (OSError, ValueError, IndexError):  # exited meanwhile
            pass
    return total


class Monitor:
    """Samples RSS, bytes read (``rchar``) and CPU time of this process and its descendants every ``interval`` s.

    Descendants are the DataLoader workers; those alive before ``start`` are ignored. ``warm()``
    marks the end of the warm-up so memory growth and CPU time are measured from there. CPU time
    is what load on a shared machine barely moves: other jobs take cores away from a case, which
    lowers its samples/s, but not CPU seconds it did not get.
    """

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self._series: dict[int, list[tuple[float, int, int, float]]] = {}  # pid -> (t, rss, rchar, cpu_s)
        self._lock = threading.Lock()  # warm() samples from the caller's thread too
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ignore: set[int] = set()
        self._cpu_warm: dict[int, float] = {}
        self.t0 = time.perf_counter()
        self.t_warm: float | None = None

    def start(self) -> Monitor:
        self._ignore = set(_children(os.getpid()))
        self.t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def warm(self) -> None:
        """Mark the end of the warm-up: sample every process now, the baseline of their CPU time."""
        self._sample()
        self.t_warm = time.perf_counter() - self.t0
        with self._lock:
            self._cpu_warm = {pid: series[-1][3] for pid, series in self._series.items()}

    def _sample(self) -> None:
        with self._lock:
            now = time.perf_counter() - self.t0
            for pid in [os.getpid()] + [c for c in _children(os.getpid()) if c not in self._ignore]:
                got = _proc_sample(pid)
                if got and got[0]:  # zombies report 0
                    self._series.setdefault(pid, []).append((now, *got))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def stop(self) -> dict[str, Any]:
        """Per-process memory (MiB), total bytes read since ``start`` and CPU seconds since ``warm``
        (a process born after it counts whole; None without a ``warm``); call before workers exit."""
        self._sample()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        main, workers, read, cpu = None, [], 0, 0.0
        for pid, series in self._series.items():
            read += series[-1][2] - series[0][2]
            cpu += series[-1][3] - self._cpu_warm.get(pid, 0.0)
            row = _memory_row(series, self.t_warm)
            if pid == os.getpid():
                main = row
            else:
                workers.append(row)
        workers.sort(key=lambda r: r.pop("first_seen_s"))
        cpu_s = round(cpu, 3) if self.t_warm is not None else None
        return {"main": main, "workers": workers, "read_bytes": read, "cpu_s": cpu_s}


def _memory_row(series: list[tuple[float, int, int, float]], t_warm: float | None) -> dict[str, Any]:
    t_warm = series[0][0] if t_warm is None else t_warm
    after = [rss for t, rss, _, _ in series if t >= t_warm] or [series[-1][1]]
    half = after[len(after) // 2 :]
    return {
        "first_seen_s": series[0][0],
        "warm_mb": round(after[0] / MiB, 1),
        "peak_mb": round(max(rss for _, rss, _, _ in series) / MiB, 1),
        "end_mb": round(series[-1][1] / MiB, 1),
        # a leak lifts the floor that batch buffers come and go above: min of the 2nd half - min of the 1st
        "floor_growth_mb": round((min(half) - min(after[: max(1, len(after) // 2)])) / MiB, 1),
    }


def percentiles(values: list[float], qs: Iterable[int] = (50, 95, 99)) -> dict[str, float | None]:
    ordered = sorted(values)
    out: dict[str, float | None] = {}
    for q in qs:
        out[f"p{q}"] = ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else None
    return out


def drive(
    loader: Iterable[Any],
    *,
    warmup_batches: int,
    batches: int,
    frames_per_sample: int,
    batch_len: Callable[[Any], int],
    max_seconds: float | None = None,
) -> dict[str, Any]:
    """Iterate ``loader`` as a training loop that does nothing else and time what it waits for.

    Rates are over the post-warm-up wall clock (from the end of batch ``warmup_batches`` to the
    last batch), so worker start-up and pool fill show only in ``first_batch_s``. Measurement
    stops after ``batches`` batches or once it has lasted ``max_seconds``, whichever comes first,
    so a slow case stays bounded. Each wait is the time one ``next()`` blocked; their percentiles
    are over the measured batches only. ``cpu_ms_per_sample`` is the CPU time of the whole process
    tree (this process and its workers) over the measured span per measured sample: unlike
    samples/s, other load on the machine hardly moves it. Memory and bytes read cover the
    process tree from ``iter()`` on.
    """
    monitor = Monitor().start()
    t0 = time.perf_counter()
    t_warm: float | None = None
    if not warmup_batches:  # measured from iter() on
        t_warm = t0
        monitor.warm()
    it = iter(loader)
    waits: list[float] = []
    first = None
    samples = warm_samples = 0
    ended = capped = False
    while len(waits) < warmup_batches + batches:
        t = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            ended = True
            break
        now = time.perf_counter()
        waits.append(now - t)
        samples += batch_len(batch)
        del batch
        if first is None:
            first = now - t0
        if warmup_batches and len(waits) == warmup_batches:
            t_warm, warm_samples = now, samples
            monitor.warm()
        if max_seconds and t_warm is not None and len(waits) > warmup_batches and now - t_warm >= max_seconds:
            capped = True
            break
    end = time.perf_counter()
    measured = waits[warmup_batches:]
    span = end - t_warm if t_warm is not None and measured else None
    measured_samples = samples - warm_samples
    sps = measured_samples / span if span else None
    out = {
        "batches": len(waits),
        "measured_batches": len(measured),
        "samples": samples,
        "measured_samples": measured_samples,
        "wall_s": round(end - t0, 3),
        "measured_s": round(span, 3) if span else None,
        "first_batch_s": round(first, 3) if first is not None else None,
        "samples_per_s": round(sps, 2) if sps else None,
        "frames_per_s": round(sps * frames_per_sample, 1) if sps else None,
        "wait_s": {k: (round(v, 4) if v is not None else None) for k, v in percentiles(measured).items()},
        "epoch_ended": ended,
        "time_capped": capped,
    }
    memory = monitor.stop()  # while the workers are still alive
    cpu: float | None = memory["cpu_s"] if span and measured_samples else None
    out["memory"] = memory
    out["cpu_ms_per_sample"] = round(cpu * 1000 / measured_samples, 2) if cpu is not None else None
    del it  # shuts the workers down
    return out


def run_main(body: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Entry point of a case process: read the case JSON (argv[1]), run ``body``, write argv[2].

    A Python exception becomes ``status: error`` with its traceback; a crash or an OOM kill
    leaves no file and the parent records it from the exit code.
    """
    case = json.loads(Path(sys.argv[1]).read_text())
    try:
        result = {"status": "ok", **body(case)}
    except Exception as e:  # reported in the results, the matrix goes on
        result = {"status": "error", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    tmp = Path(sys.argv[2] + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    os.replace(tmp, sys.argv[2])


def drop_page_cache(directory: Path) -> dict[str, float]:
    """Write every file under ``directory`` to the disk and drop its pages from the page cache
    (``fsync``, then ``POSIX_FADV_DONTNEED``: no root needed), so that the next reads of them come
    from the disk (the frame cache's ``disk`` epoch). Returns the MB and files dropped."""
    total = 0
    files = [p for p in directory.rglob("*") if p.is_file()]
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return {"mb": round(total / 1e6, 1), "files": len(files)}


def page_cache_write_cost(directory: Path, mb: int = 512) -> dict[str, float]:
    """CPU ms per MB of writing ``mb`` MB into new page-cache pages (a new file in ``directory``),
    then of writing the same pages again: what the frame cache's fills pay per decoded byte. On
    bare metal the two are close; a VM whose host backs guest memory lazily (free page reporting
    hands freed guest pages back to the host) pays a host fault on each new page, several times
    the rewrite, and the cold epoch's fills write every decoded frame into new pages."""
    block = os.urandom(1 << 20)
    path = directory / f".page-cache-probe.{os.getpid()}"
    out = {}
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for name in ("new", "rewrite"):
            start = time.process_time()
            for i in range(mb):
                os.pwrite(fd, block, i << 20)
            out[name] = round(1000 * (time.process_time() - start) / mb, 3)
    finally:
        os.close(fd)
        path.unlink()
    return out
