"""We write and delete only what we created: the cache never touches a user's files in its
directory nor follows a symlink out of it; ``convert --overwrite`` removes only the converter's
own files and refuses a ``shards/`` that is a symlink out of OUT."""

from __future__ import annotations

import hashlib
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from convert_helpers import run_cli
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.format import MANIFEST_NAME, SHARDS_DIR
from lerobot_shards.loader.read.shard_cache import FileCache, IOCounters, scan
from lerobot_shards.safe_io import UnsafePathError


def _blob(n: int, seed: int) -> bytes:
    return (hashlib.sha256(str(seed).encode()).digest() * (n // 32 + 1))[:n]


def _cache(root: Path, max_bytes: int) -> tuple[FileCache, ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=2)
    return FileCache(str(root), max_bytes, pool, IOCounters(), chunk=1000), pool


def _fill(cache: FileCache, rel: str, data: bytes) -> None:
    f = cache.acquire(lambda start, end: data[start:end], rel, len(data), None, rel)
    assert f is not None
    f.wait()
    f.close()


def test_the_cache_never_counts_or_evicts_a_users_files(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (root / "sub").mkdir(parents=True)
    (root / "my_checkpoint.pt").write_bytes(b"weights" * 2000)  # 14 kB: more than the cap itself
    (root / "sub/notes.txt").write_text("mine")
    cache, pool = _cache(root, 10_000)
    for i in range(5):  # 5 x 4 kB through a 10 kB cap: evictions on every admission after the second
        _fill(cache, f"ds/shard-{i}.tar", _blob(4000, i))
    assert cache.counters.snapshot()["cache_evictions"] == 3
    assert (root / "my_checkpoint.pt").read_bytes() == b"weights" * 2000
    assert (root / "sub/notes.txt").read_text() == "mine"
    assert sorted(os.path.basename(e.path) for e in scan(str(root))) == ["shard-3.tar", "shard-4.tar"]
    pool.shutdown()


def test_the_cache_refuses_a_folder_symlinked_out_of_it(tmp_path: Path) -> None:
    root, outside = tmp_path / "cache", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "keep.bin").write_bytes(b"x" * 100)
    os.symlink(outside, root / "ds")
    cache, pool = _cache(root, 1 << 20)
    with pytest.raises(UnsafePathError, match="is a symlink out of the cache"):
        cache.acquire(lambda start, end: b"y" * (end - start), "ds/shard-0.tar", 163_840, None, "shard-0.tar")
    assert sorted(p.name for p in outside.iterdir()) == ["keep.bin"]  # nothing written there
    pool.shutdown()


def test_a_symlinked_cache_entry_is_neither_read_nor_deleted(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (root / "ds").mkdir(parents=True)
    target = tmp_path / "precious.tar"
    target.write_bytes(b"z" * 4000)
    os.symlink(target, root / "ds/shard-0.tar")
    cache, pool = _cache(root, 1 << 20)
    with pytest.raises(UnsafePathError, match="is a symlink"):
        cache.acquire(lambda start, end: b"y" * (end - start), "ds/shard-0.tar", 4000, None, "shard-0.tar")
    assert target.read_bytes() == b"z" * 4000 and os.path.islink(root / "ds/shard-0.tar")
    pool.shutdown()


@pytest.fixture
def raw(synth_factory) -> Path:
    return synth_factory(num_episodes=2, length_range=(6, 8), cameras=("observation.images.front",))


def test_overwrite_refuses_a_shards_folder_symlinked_out_of_out(raw: Path, tmp_path: Path) -> None:
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    convert_dataset(raw, out, ConvertOptions(episodes_per_shard=1), progress=False)
    shutil.move(out / SHARDS_DIR, elsewhere)
    (elsewhere / "shard-000009.tar").write_bytes(b"someone else's")
    os.symlink(elsewhere, out / SHARDS_DIR)
    before = {p.name: p.read_bytes() for p in elsewhere.iterdir()}
    result = run_cli("convert", raw, out, "--episodes-per-shard", "1", "--overwrite", "--no-progress")
    assert result.returncode == 1 and "through a symlink" in result.stderr, result.stderr
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == before  # nothing deleted or written there


def test_overwrite_removes_only_the_converters_own_files(raw: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    convert_dataset(raw, out, ConvertOptions(episodes_per_shard=1), progress=False)
    mine = {"shard-notes.txt": b"a", "shard-000000.tar.bak": b"b", "README": b"c"}
    for name, data in mine.items():
        (out / SHARDS_DIR / name).write_bytes(data)
    (out / "my_checkpoint.pt").write_bytes(b"w")
    result = run_cli("convert", raw, out, "--episodes-per-shard", "2", "--overwrite", "--no-progress")
    assert result.returncode == 0, result.stderr
    for name, data in mine.items():
        assert (out / SHARDS_DIR / name).read_bytes() == data
    assert (out / "my_checkpoint.pt").read_bytes() == b"w" and (out / MANIFEST_NAME).exists()
    assert not (out / SHARDS_DIR / "shard-000001.tar").exists()  # the old plan's second shard is gone


def test_a_finished_download_is_renamed_under_the_cache_lock(tmp_path: Path, monkeypatch) -> None:
    """The cache bound at every moment: a reservation's scan must never miss a file in mid-rename
    (listed under its temporary name, gone by its stat), or it counts one file too few and reserves
    past the cap. So every rename into the cache happens while the global lock is held."""
    import fcntl

    from lerobot_shards.loader.read import shard_cache as cache_module

    root = tmp_path / "cache"
    cache, pool = _cache(root, 10_000)
    renames: list[bool] = []
    real_replace = os.replace

    def replace(src, dst):
        fd = os.open(root / cache_module.GLOBAL_LOCK, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            renames.append(False)  # nobody held it
        except BlockingIOError:
            renames.append(True)
        finally:
            os.close(fd)
        real_replace(src, dst)

    monkeypatch.setattr(cache_module.os, "replace", replace)
    for i in range(3):
        _fill(cache, f"ds/shard-{i}.tar", _blob(4000, i))
    assert renames == [True] * 6  # each download: its xxh3 record (no sha256 given), then the file itself
    pool.shutdown()
