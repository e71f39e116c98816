"""A network shaper of our own: a TCP proxy that adds per-request latency and a shared bandwidth cap.

Put in front of the local S3-protocol server it turns "a bucket on 127.0.0.1" (no latency, memory
bandwidth) into something like a bucket in another region: every response's first byte waits
``latency_s`` after the request that asked for it (so small ranged reads pay a round trip each,
as they do against S3), and all connections together share one token bucket of ``bandwidth``
bytes/s in each direction (so parallel connections cannot multiply the bandwidth).

    python benchmarks/harness/shaper.py --upstream 127.0.0.1:9000 --port 9100 --profile cross-region

Runs in a thread of the benchmark's parent process (``ShapedProxy.start``), so the parent counts
the bytes every case fetched (``bytes_down``) whatever reads them: our loader, LeRobot, s3fs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass

CHUNK = 64 * 1024


@dataclass(frozen=True)
class Profile:
    """Per-request latency (seconds) and shared bandwidth (bytes/s, 0 = unlimited)."""

    latency_s: float
    bandwidth: float

    def describe(self) -> str:
        bw = f"{self.bandwidth / 1e6:g} MB/s" if self.bandwidth else "unlimited"
        return f"{self.latency_s * 1000:g} ms, {bw}"


PROFILES = {
    "cross-region": Profile(0.030, 100e6),  # the default: 30 ms per request, 100 MB/s
    "same-region": Profile(0.005, 1e9),
    "none": Profile(0.0, 0.0),
}


class TokenBucket:
    """``rate`` bytes/s shared by every caller of one event loop; bursts up to ``burst`` bytes."""

    def __init__(self, rate: float, burst: float | None = None) -> None:
        self.rate = rate
        self.burst = burst or max(CHUNK, rate / 50)  # 20 ms worth: smooth, yet no tiny sleeps
        self._tokens = self.burst
        self._last = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self, n: int) -> None:
        if not self.rate:
            return
        async with self._lock:  # first come, first served: connections share the rate fairly
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= n
            if self._tokens < 0:  # in debt: wait until it is paid back
                await asyncio.sleep(-self._tokens / self.rate)


def _request_line(data: bytes) -> str:
    """A request's first line, with its Range header if it has one (what was asked, for the log)."""
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    ranged = [h.split(":", 1)[1].strip() for h in head[1:] if h.lower().startswith("range:")]
    return " ".join(head[:1] + ranged)


class ShapedProxy:
    """Forwards 127.0.0.1:``port`` to ``upstream`` with ``profile`` applied; counts bytes both ways."""

    def __init__(self, upstream: tuple[str, int], profile: Profile, port: int = 0) -> None:
        self.upstream, self.profile, self.port = upstream, profile, port
        self.bytes_down = 0  # upstream -> client (what storage delivered)
        self.bytes_up = 0
        self.requests = 0  # request bursts seen (a new request after a response began)
        self.log: list[tuple[float, str]] = []  # (monotonic time, request line) of each request burst
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- running in a thread -------------------------------------------------------------------

    def start(self) -> ShapedProxy:
        self._thread = threading.Thread(target=lambda: asyncio.run(self.serve()), name="shaper", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("shaper did not start within 10 s")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> ShapedProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._down = TokenBucket(self.profile.bandwidth)
        self._up = TokenBucket(self.profile.bandwidth)
        server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    # -- one connection ------------------------------------------------------------------------

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        asked_at: list[float] = []  # times of requests whose response has not started yet

        async def client_to_upstream() -> None:
            while data := await client_r.read(CHUNK):
                if not asked_at:
                    asked_at.append(time.monotonic())
                    self.requests += 1
                    self.log.append((asked_at[0], _request_line(data)))
                await self._up.take(len(data))
                self.bytes_up += len(data)
                up_w.write(data)
                await up_w.drain()

        async def upstream_to_client() -> None:
            while data := await up_r.read(CHUNK):
                if asked_at:  # the first byte of a response: one round trip after the request
                    delay = asked_at.pop() + self.profile.latency_s - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                await self._down.take(len(data))
                self.bytes_down += len(data)
                client_w.write(data)
                await client_w.drain()

        tasks = [asyncio.ensure_future(client_to_upstream()), asyncio.ensure_future(upstream_to_client())]
        try:  # HTTP clients never half-close: either side ending ends the connection
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel() if not task.done() else task.exception()  # a reset peer is not an error here
            for w in (client_w, up_w):
                with contextlib.suppress(Exception):
                    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    ap.add_argument("--port", type=int, default=0, help="local port (0: any free one, printed)")
    ap.add_argument("--profile", choices=sorted(PROFILES), default="cross-region")
    ap.add_argument("--latency-ms", type=float, help="override the profile's per-request latency")
    ap.add_argument("--bandwidth-mbps", type=float, help="override the profile's bandwidth, MB/s (0: unlimited)")
    args = ap.parse_args()
    profile = PROFILES[args.profile]
    profile = Profile(
        profile.latency_s if args.latency_ms is None else args.latency_ms / 1000,
        profile.bandwidth if args.bandwidth_mbps is None else args.bandwidth_mbps * 1e6,
    )
    host, port = args.upstream.rsplit(":", 1)
    proxy = ShapedProxy((host, int(port)), profile, args.port).start()
    print(f"shaping {proxy.url} -> {args.upstream}: {profile.describe()} (Ctrl-C stops)", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
