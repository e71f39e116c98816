"""The loader's background threads, stopped at interpreter exit while every module is intact.

A loop left early (a script that takes some batches and exits) leaves its loader's daemon
threads running: episode readers, ``DeviceFeeder``'s thread. At exit the interpreter halts a
daemon thread wherever it next takes the GIL; one halted inside a parquet read whose I/O calls
back into Python, or inside a decoder's destructor, aborted the process ("terminate called
without an active exception") or hung it in arrow's exit handlers. One exit hook asks every
tracked thread to stop, then waits for all of them against one deadline, so that exit is delayed
by at most ``EXIT_DEADLINE_S`` however many loaders are open. Tracked are the readers, the
feeders and any other non-main thread consuming a stream (a user's own prefetch thread), whose
stream then ends at once.

The hook runs where ``concurrent.futures`` shuts its executors down (``threading``'s exit hooks,
which run before the interpreter's ``atexit`` ones), and before it: a stream still decoding when the
decode threads are gone would fail ("cannot schedule new futures after interpreter shutdown").
"""

from __future__ import annotations

import atexit
import collections
import threading
import time
from collections.abc import Callable

EXIT_DEADLINE_S = 5.0

_lock = threading.Lock()
_threads: dict[threading.Thread, Callable[[], None]] = {}
_consumers: collections.Counter[threading.Thread] = collections.Counter()
_exiting = threading.Event()


def track(thread: threading.Thread, stop: Callable[[], None]) -> None:
    """Stop ``thread`` with ``stop`` (which must not block) at interpreter exit, unless it has ended."""
    with _lock:
        _threads[thread] = stop


def untrack(thread: threading.Thread, _lock: threading.Lock = _lock, _threads: dict = _threads) -> None:
    """Forget ``thread`` once it has ended (a thread still running stays tracked: exit stops it).

    The defaults bind this module's objects: a generator closed while modules are torn down calls
    this after the module's globals are gone.
    """
    if not thread.is_alive():
        with _lock:
            _threads.pop(thread, None)


def enter(thread: threading.Thread) -> None:
    """``thread`` (not the main one) consumes a stream: exit waits for it too (the stream ends at once)."""
    with _lock:
        _consumers[thread] += 1


def leave(
    thread: threading.Thread, _lock: threading.Lock = _lock, _consumers: collections.Counter = _consumers
) -> None:
    """One of ``thread``'s streams has ended (a thread may consume several: a mixture's sources)."""
    with _lock:
        _consumers[thread] -= 1
        if _consumers[thread] <= 0:
            del _consumers[thread]


def exiting() -> bool:
    """Whether the interpreter is exiting (the hook has run): a stream cut short then ends quietly."""
    return _exiting.is_set()


def _stop_all() -> None:
    _exiting.set()
    with _lock:
        threads = list(_threads.items())
        consumers = list(_consumers)
    for _, stop in threads:
        stop()
    deadline = time.monotonic() + EXIT_DEADLINE_S
    for thread in [t for t, _ in threads] + consumers:
        if thread.ident is not None and thread is not threading.current_thread():  # started, not this one
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


# before concurrent.futures' own hook (registered when it was imported: these run last-registered
# first); ``atexit`` where this private hook is missing
getattr(threading, "_register_atexit", atexit.register)(_stop_all)
