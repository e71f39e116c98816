"""The node cache (loader/read/shard_cache.py): eviction decisions, and real processes sharing one directory."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lerobot_shards.exceptions import LeRobotShardsError
from lerobot_shards.loader.read.remote import RemoteFile, settled
from lerobot_shards.loader.read.shard_cache import (
    CacheDirError,
    CacheEntry,
    FileCache,
    IOCounters,
    default_cache_bytes,
    plan_evictions,
    scan,
)
from waits import HANG_GUARD_S, until, waiting_in

# -- eviction decisions (pure) ----------------------------------------------------------------------


def _e(path: str, size: int, last_used: float, in_use: bool = False) -> CacheEntry:
    return CacheEntry(path, size, last_used, in_use)


def test_evicts_least_recently_used_first_and_only_what_is_needed() -> None:
    entries = [_e("new", 40, 3.0), _e("old", 40, 1.0), _e("mid", 40, 2.0)]
    assert plan_evictions(entries, 0, 120) == []
    assert plan_evictions(entries, 30, 120) == ["old"]
    assert plan_evictions(entries, 70, 120) == ["old", "mid"]
    assert plan_evictions(entries, 120, 120) == ["old", "mid", "new"]


def test_never_evicts_a_file_in_use() -> None:
    entries = [_e("busy-old", 50, 1.0, in_use=True), _e("idle", 50, 2.0)]
    assert plan_evictions(entries, 50, 100) == ["idle"]
    assert plan_evictions(entries, 60, 100) is None  # only the busy file could make room
    assert plan_evictions([], 101, 100) is None  # larger than the cache itself


def test_default_cap_is_half_the_free_space_at_most_one_tib(tmp_path: Path) -> None:
    import shutil

    cap = default_cache_bytes(str(tmp_path / "c"))
    assert 0 < cap <= min(1 << 40, shutil.disk_usage(tmp_path).free // 2 + 1)


# -- one directory, real processes ----------------------------------------------------------------------


def _blob(n: int, seed: int) -> bytes:
    return (hashlib.sha256(str(seed).encode()).digest() * (n // 32 + 1))[:n]


def _fetcher(data: bytes, requests: list[tuple[int, int]] | None = None, gate: threading.Event | None = None):
    def fetch(start: int, end: int) -> bytes:
        if requests is not None:
            requests.append((start, end))
        if gate is not None and start > 0:
            assert gate.wait(HANG_GUARD_S)
        return data[start:end]

    return fetch


def _cache(root: Path, max_bytes: int, chunk: int = 1000) -> tuple[FileCache, IOCounters, ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=2)
    counters = IOCounters()
    return FileCache(str(root), max_bytes, pool, counters, chunk=chunk), counters, pool


def _fetch_once(root: str, barrier, results) -> None:
    cache, counters, pool = _cache(Path(root), 10**6)
    data = _blob(5000, 1)
    barrier.wait()
    f = cache.acquire(_fetcher(data), "ds/a.tar", len(data), hashlib.sha256(data).hexdigest(), "a.tar")
    ok = f is not None and f.read(0, len(data)) == data and f.wait().endswith("a.tar")
    f.close()
    pool.shutdown()
    results.put((ok, counters.snapshot()))


def test_processes_sharing_a_cache_download_a_file_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_fetch_once, args=(str(tmp_path), barrier, results)) for _ in range(3)]
    for p in procs:
        p.start()
    got = [results.get(timeout=HANG_GUARD_S) for _ in procs]
    for p in procs:
        p.join(timeout=HANG_GUARD_S)
    assert all(ok for ok, _ in got)
    assert sum(c["cache_misses"] for _, c in got) == 1
    assert sum(c["cache_hits"] for _, c in got) == 2
    assert sum(c["storage_bytes"] for _, c in got) == 5000


def _hold(root: str, held, release) -> None:
    cache, _, pool = _cache(Path(root), 10_000)
    data = _blob(6000, 2)
    f = cache.acquire(_fetcher(data), "ds/held.tar", len(data), None, "held.tar")
    f.wait()
    held.set()
    release.wait(HANG_GUARD_S)
    f.close()
    pool.shutdown()


def test_a_file_in_use_by_another_process_is_never_evicted(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    held, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold, args=(str(tmp_path), held, release))
    proc.start()
    try:
        assert held.wait(HANG_GUARD_S)
        cache, counters, pool = _cache(tmp_path, 10_000)
        other = _blob(6000, 3)
        assert cache.acquire(_fetcher(other), "ds/other.tar", 6000, None, "other.tar") is None  # would not fit
        assert (tmp_path / "ds/held.tar").stat().st_size == 6000
        release.set()
        proc.join(timeout=HANG_GUARD_S)
        f = cache.acquire(_fetcher(other), "ds/other.tar", 6000, None, "other.tar")
        assert f is not None and f.read(0, 6000) == other
        f.wait()
        f.close()
        assert not (tmp_path / "ds/held.tar").exists()  # unused now: evicted to make room
        assert counters.snapshot()["cache_evictions"] == 1
        assert sum(e.size for e in scan(str(tmp_path))) <= 10_000
        pool.shutdown()
    finally:
        release.set()
        proc.join(timeout=HANG_GUARD_S)


def test_wrong_sized_cached_file_is_fetched_again(tmp_path: Path) -> None:
    cache, counters, pool = _cache(tmp_path, 10**6)
    data = _blob(4000, 4)
    sha = hashlib.sha256(data).hexdigest()
    cache.acquire(_fetcher(data), "ds/s.tar", 4000, sha, "s.tar").close()
    path = tmp_path / "ds/s.tar"
    path.write_bytes(data[:1234])  # truncated behind the cache's back
    _read_whole(cache, data, "ds/s.tar", sha)
    assert path.read_bytes() == data
    assert counters.snapshot()["cache_misses"] == 2
    pool.shutdown()


def _read_whole(cache: FileCache, data: bytes, key: str, sha: str | None) -> None:
    """Take ``key`` into use once more and read it whole: the bytes are the fetched ones."""
    f = cache.acquire(_fetcher(data), key, len(data), sha, key.rsplit("/", 1)[-1])
    assert f.read(0, len(data)) == data
    f.wait()
    f.close()


def test_a_file_without_a_known_digest_damaged_in_place_is_fetched_again(tmp_path: Path) -> None:
    """A raw mp4 has no sha256 to check: the xxh3 of the bytes written is recorded and re-checked."""
    cache, counters, pool = _cache(tmp_path, 10**6)
    data = _blob(4000, 6)
    for _ in range(2):  # downloaded, then a hit: an intact copy is not fetched again
        f = cache.acquire(_fetcher(data), "ds/v.mp4", 4000, None, "v.mp4")
        f.wait()
        f.close()
    assert counters.snapshot()["cache_misses"] == 1 and counters.snapshot()["cache_hits"] == 1
    path = tmp_path / "ds/v.mp4"
    damaged = bytearray(data)
    damaged[2000:2016] = bytes(b ^ 1 for b in damaged[2000:2016])
    path.write_bytes(bytes(damaged))  # same size, other bytes
    _read_whole(cache, data, "ds/v.mp4", None)
    assert path.read_bytes() == data
    assert counters.snapshot()["cache_misses"] == 2
    pool.shutdown()


def test_an_unusable_cache_dir_is_one_error_naming_it(tmp_path: Path) -> None:
    pool = ThreadPoolExecutor(1)
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / ".locks").write_text("a file where the cache keeps its index")
    with pytest.raises(CacheDirError, match=rf"cache_dir {blocked}: .*\.locks\); a file stands where the cache keeps"):
        FileCache(str(blocked), 10**6, pool, IOCounters())
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    if os.geteuid() == 0:  # root writes through permissions: make the folder immutable instead
        if subprocess.run(["chattr", "+i", str(readonly)], capture_output=True).returncode:
            pytest.skip("running as root without chattr +i: cannot make an unwritable folder")
    else:
        readonly.chmod(0o500)
    try:
        with pytest.raises(CacheDirError, match=rf"cache_dir {readonly}: .*; .*choose another cache_dir") as e:
            FileCache(str(readonly), 10**6, pool, IOCounters())
        assert isinstance(e.value, LeRobotShardsError) and "\n" not in str(e.value)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(readonly)], check=True)
        readonly.chmod(0o700)
    pool.shutdown()


def test_a_download_that_fails_its_checksum_is_not_kept(tmp_path: Path) -> None:
    cache, _, pool = _cache(tmp_path, 10**6)
    data = _blob(3000, 5)
    f = cache.acquire(_fetcher(data), "ds/bad.tar", 3000, "0" * 64, "ds/bad.tar")
    with pytest.raises(ValueError, match="ds/bad.tar: downloaded 3000 bytes with sha256 .* the manifest says"):
        f.wait()
    f.close()
    assert [e.path for e in scan(str(tmp_path))] == []
    pool.shutdown()


def test_first_bytes_are_readable_before_the_download_ends(tmp_path: Path) -> None:
    cache, _, pool = _cache(tmp_path, 10**6, chunk=1000)
    data, gate = _blob(5000, 6), threading.Event()
    f = cache.acquire(_fetcher(data, gate=gate), "ds/slow.tar", 5000, None, "slow.tar")
    assert f.read(10, 900) == data[10:900]  # chunk 0 landed; the rest waits on the gate
    assert not f.done.done()
    gate.set()
    assert f.read(900, 5000) == data[900:]
    assert f.wait() == os.path.join(str(tmp_path), "ds", "slow.tar")
    f.close()
    pool.shutdown()


def test_uncached_reads_are_large_ranged_requests_ahead_of_the_reader() -> None:
    data, requests = _blob(10_000, 7), []
    pool = ThreadPoolExecutor(max_workers=2)
    f = RemoteFile(_fetcher(data, requests), len(data), pool, IOCounters(), chunk=1000, ahead=2)
    pieces = [f.read(s, min(s + 300, 10_000)) for s in range(0, 10_000, 300)]
    assert b"".join(pieces) == data
    pool.shutdown()
    assert sorted(requests) == [(i, i + 1000) for i in range(0, 10_000, 1000)]  # each chunk once, 1000 bytes


def test_uncached_read_ahead_waits_until_the_reads_own_chunks_landed() -> None:
    """On a capped link read-ahead in flight would slow the chunk the reader waits for."""
    data, requests, gate = _blob(10_000, 8), [], threading.Event()
    pool = ThreadPoolExecutor(max_workers=4)

    def fetch(start: int, end: int) -> bytes:
        requests.append((start, end))
        if start == 1000:
            assert gate.wait(HANG_GUARD_S)
        return data[start:end]

    f = RemoteFile(fetch, len(data), pool, IOCounters(), chunk=1000, ahead=3)
    f.start()
    assert f.read(0, 500) == data[:500]
    until(lambda: len(requests) >= 4, "read 1's read-ahead requested")
    reader = threading.Thread(target=lambda: f.read(1500, 1600))
    reader.start()
    # chunk 1 is held back: once the reader waits for it, nothing beyond it may have been requested
    until(lambda: waiting_in(reader.ident, "wait") or not reader.is_alive(), "the reader waiting for chunk 1")
    assert sorted(requests) == [(0, 1000), (1000, 2000), (2000, 3000), (3000, 4000)]  # read 1's ahead only
    gate.set()
    reader.join(HANG_GUARD_S)
    pool.shutdown()
    assert (4000, 5000) in requests  # read 2's own chunk landed: its read-ahead followed


def test_settled_wakes_for_chunks_cancelled_while_queued() -> None:
    """A shard read ahead waits for the current shard's chunks (``settled``); closing the source
    cancels the queued ones as the fetch pool shuts down. ``concurrent.futures.wait`` would never
    wake for those: the opener thread would hang, and the process with it at exit."""
    pool = ThreadPoolExecutor(max_workers=1)
    gate = threading.Event()
    running = pool.submit(gate.wait, HANG_GUARD_S)
    queued = pool.submit(bytes, 8)
    pool.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled()
    waiter = threading.Thread(target=settled, args=([running, queued],))
    waiter.start()
    gate.set()
    waiter.join(HANG_GUARD_S)
    assert not waiter.is_alive()
