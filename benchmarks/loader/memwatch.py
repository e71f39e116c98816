"""RSS of a process and of its child processes (DataLoader workers), sampled on a background thread.

Standalone on purpose (psutil only): ``bench_loader.py`` (our venv) and ``lerobot_baseline.py``
(LeRobot's venv) both import it from this folder, so both sides are measured the same way.

Per process the summary gives, in MiB: ``start`` (first sample), ``warm`` (when the first batch
reached the training loop), ``mid`` (middle of the epoch after the first batch), ``end`` (last
sample before the epoch ended), ``peak``, and two growth figures: ``growth`` = end - warm (what a
leak looks like: it must stay near zero), ``growth_2nd_half`` = end - mid, ``floor_growth`` =
min RSS of the last quarter - min RSS of the second quarter (batch buffers come and go above a
floor; a leak lifts the floor) and ``slope_mb_per_min`` (least squares after the first batch).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

try:
    import psutil
except ImportError:  # pragma: no cover - reported, not fatal
    psutil = None

MiB = 1 << 20


class RssMonitor:
    """Samples the RSS of this process and of its children every ``interval`` seconds."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.available = psutil is not None
        self._series: dict[int, list[tuple[float, int]]] = {}
        self._names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ignore: set[int] = set()
        self.t0 = 0.0
        self.t_first_batch: float | None = None
        self.t_end: float | None = None

    def start(self) -> RssMonitor:
        self.t0 = time.perf_counter()
        if not self.available:
            return self
        me = psutil.Process(os.getpid())
        self._ignore = {c.pid for c in me.children(recursive=False)}  # children that were there before
        self._thread = threading.Thread(target=self._run, args=(me,), daemon=True)
        self._thread.start()
        return self

    def first_batch(self) -> None:
        if self.t_first_batch is None:
            self.t_first_batch = time.perf_counter() - self.t0

    def end_of_epoch(self) -> None:
        self.t_end = time.perf_counter() - self.t0
        self._sample_once(psutil.Process(os.getpid())) if self.available else None

    def stop(self) -> dict[str, Any]:
        if self.t_end is None:
            self.end_of_epoch()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self.summary()

    def _sample_once(self, me: Any) -> None:
        now = time.perf_counter() - self.t0
        procs = [me]
        try:
            procs += [c for c in me.children(recursive=False) if c.pid not in self._ignore]
        except psutil.Error:
            pass
        for p in procs:
            try:
                rss = p.memory_info().rss
            except psutil.Error:
                continue
            if rss == 0:  # an exited worker not yet reaped (zombie): no longer a sample
                continue
            self._series.setdefault(p.pid, []).append((now, rss))
            if p.pid not in self._names:
                self._names[p.pid] = "main" if p.pid == me.pid else "worker"

    def _run(self, me: Any) -> None:
        while not self._stop.is_set():
            self._sample_once(me)
            self._stop.wait(self.interval)

    def summary(self) -> dict[str, Any]:
        if not self.available:
            return {"available": False, "reason": "psutil is not installed"}
        main_pid = os.getpid()
        out: dict[str, Any] = {"available": True, "interval_s": self.interval, "main": None, "workers": []}
        workers = []
        for pid, series in self._series.items():
            s = _summarise(series, self.t_first_batch, self.t_end)
            s["pid"] = pid
            if pid == main_pid:
                out["main"] = s
            else:
                workers.append(s)
        workers.sort(key=lambda s: s["first_seen_s"])
        for i, w in enumerate(workers):
            w["worker"] = i  # order of appearance = DataLoader worker id (they are started in order)
        out["workers"] = workers
        return out


def _summarise(series: list[tuple[float, int]], t_warm: float | None, t_end: float | None) -> dict[str, Any]:
    end_limit = t_end if t_end is not None else series[-1][0]
    inside = [x for x in series if x[0] <= end_limit + 1e-9] or series[:1]
    t_warm = t_warm if t_warm is not None else inside[0][0]

    def at(t: float) -> int:
        return min(inside, key=lambda x: abs(x[0] - t))[1]

    warm = at(t_warm)
    after = [(t, r) for t, r in inside if t >= t_warm]
    slope = None
    if len(after) >= 3 and after[-1][0] - after[0][0] > 0.5:  # least squares, MiB per minute
        ts = [t for t, _ in after]
        rs = [r / MiB for _, r in after]
        mt, mr = sum(ts) / len(ts), sum(rs) / len(rs)
        var = sum((t - mt) ** 2 for t in ts)
        slope = round(60 * sum((t - mt) * (r - mr) for t, r in zip(ts, rs)) / var, 1) if var else None
    # the floor (min) of the last quarter vs of the second quarter: transient batch buffers come and
    # go on top of a floor; a leak raises the floor
    span = end_limit - t_warm
    q2 = [r for t, r in after if t_warm + span / 4 <= t <= t_warm + span / 2]
    q4 = [r for t, r in after if t >= t_warm + 3 * span / 4]
    floor_growth = (min(q4) - min(q2)) if q2 and q4 else None
    mid = at(t_warm + (end_limit - t_warm) / 2)
    end = inside[-1][1]
    mb = lambda b: round(b / MiB, 1)  # noqa: E731
    return {
        "samples": len(inside),
        "first_seen_s": round(inside[0][0], 3),
        "start_mb": mb(inside[0][1]),
        "warm_mb": mb(warm),
        "mid_mb": mb(mid),
        "end_mb": mb(end),
        "peak_mb": mb(max(r for _, r in inside)),
        "growth_mb": mb(end - warm),
        "growth_2nd_half_mb": mb(end - mid),
        "floor_growth_mb": mb(floor_growth) if floor_growth is not None else None,
        "slope_mb_per_min": slope,
    }
