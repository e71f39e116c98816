"""How long a test waits for something that must happen: a hang guard, never a speed check.

A test that gives a subprocess, a thread or a condition 10-120 s fails on a loaded machine (five
developers share two cores here; a Python start that imports torch took over 60 s at load 50)
while the code under test is right. So every such wait uses this one bound, which only turns a
hang into a failure before pytest-timeout's 600 s would (pyproject.toml) and says what it waited
for. Timing guarantees of the product (a storage call's deadline) are tested where they are
documented, against those deadlines, not here.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

HANG_GUARD_S = 540.0


def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition`` (polled every 5 ms), not for a guessed time: fails naming ``what``
    only when it does not hold within the hang guard."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not reached within {HANG_GUARD_S:.0f} s"
        time.sleep(0.005)


def waiting_in(thread_id: int | None, function: str) -> bool:
    """Whether thread ``thread_id`` is inside ``function`` right now (blocked there, when a test
    waits for this): a test asserting what a blocked thread did not do waits for this, not a sleep."""
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False
