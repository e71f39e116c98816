"""The decoded-frame cache: its frames are the frames decoded at emit, bit for bit, in the same
order; each entry is filled once per node; a killed fill, a damaged entry, a full or read-only disk
and a tight bound never give a wrong frame."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.loader import EpisodePoolDataset, slab_loader
from lerobot_shards.loader.decoding import frame_cache, frame_fill
from lerobot_shards.loader.decoding.frame_cache import ALIGN, ENTRIES_DIR, FrameCache, _parse_header
from lerobot_shards.loader.read.shard_cache import CacheDirError
from lerobot_shards.synth import read_identity
from waits import HANG_GUARD_S

FPS = 30
FRONT, TOP = "observation.images.front", "observation.images.top"
CAMERAS = (FRONT, TOP)
DELTAS = {FRONT: [-1 / FPS, 0.0], "action": [0.0, 1 / FPS]}


@pytest.fixture(scope="module")
def raw(synth_factory: Callable[..., Path]) -> Path:
    """4 episodes, 2 cameras, identity painted."""
    return synth_factory(num_episodes=4, length_range=(12, 20), seed=5)


@pytest.fixture(scope="module")
def shards(raw: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fc") / "converted"
    convert_dataset(raw, out, ConvertOptions(episodes_per_shard=2), progress=False)
    return out


def _dataset(root: Path, cache: Path | None, **kwargs: Any) -> EpisodePoolDataset:
    if (root / "meta/info.json").exists():  # raw: one virtual shard per episode
        kwargs.setdefault("episodes_per_shard", 1)
    kwargs.setdefault("episode_pool_size", 2)
    kwargs.setdefault("delta_timestamps", DELTAS)
    return EpisodePoolDataset(str(root), frame_cache_dir=None if cache is None else str(cache), **kwargs)


def _batches(ds: EpisodePoolDataset, workers: int = 0, slabs: bool = False, batch_size: int = 4) -> list[dict]:
    if slabs:
        loader = slab_loader(ds, batch_size=batch_size, num_workers=workers)
    else:
        loader = DataLoader(ds, batch_size=batch_size, num_workers=workers)
    out = []
    for b in loader:  # slabs are reused: keep copies
        out.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()})
    return out


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) and len(a) > 0
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], torch.Tensor):
                assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), k
            else:
                assert x[k] == y[k], k


def _entries(cache: Path) -> list[str]:
    return sorted(glob.glob(str(cache / ENTRIES_DIR / "*.frames")))


def _total(ds: EpisodePoolDataset) -> dict[str, float]:
    return ds.stats()["total"]


def _pixels(cache: Path) -> set[str]:
    """How the cache's entries keep their frames (their headers' "pixels")."""
    found = set()
    for path in _entries(cache):
        with open(path, "rb") as f:
            found.add(_parse_header(f.read(ALIGN), path)[1].pixels)
    return found


@pytest.mark.parametrize("source", ["raw", "shards"])
@pytest.mark.parametrize(
    ("dtype", "pixels"), [(torch.uint8, "yuv420p"), (torch.float32, "yuv420p"), (torch.uint8, "rgb")]
)
def test_cached_frames_are_the_decoded_frames_and_the_second_epoch_decodes_nothing(
    source: str, dtype: torch.dtype, pixels: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Both ways of keeping frames (the decoder's YUV planes, converted at each read as torchcodec
    converts; RGB) give the frames decoded at emit, bit for bit."""
    root = request.getfixturevalue(source)
    want = _batches(_dataset(root, None, image_dtype=dtype))
    for epoch in range(2):
        ds = _dataset(root, tmp_path, image_dtype=dtype, frame_cache_pixels=pixels)
        got = _batches(ds)
        _same(want, got)
        total = _total(ds)
        if epoch == 0:
            assert total["frame_cache_fills"] == 2 * 4 and total["frames_filled"] > 0
            # the fills' writes are counted apart, as part of the fills' CPU (the benchmark's fill_write_ms)
            assert 0 < total["fill_write_cpu_seconds"] <= total["fill_cpu_seconds"]
        else:  # every frame read back, none decoded
            assert total["frames_decoded"] == 0 and total["frames_filled"] == 0
            assert total["frame_cache_hits"] == 2 * total["frames_emitted"]
    assert len(_entries(tmp_path)) == 2 * 4 and _pixels(tmp_path) == {pixels}
    for batch in got:  # and they are the frames asked for
        for i, (ep, frame) in enumerate(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist())):
            assert read_identity(batch[FRONT][i][1]) == (ep, frame)
            assert read_identity(batch[TOP][i]) == (ep, frame)


@pytest.mark.parametrize("workers", [0, 2])
def test_resized_with_workers_and_slabs(raw: Path, tmp_path: Path, workers: int) -> None:
    opts: dict[str, Any] = {"resize": (32, 48), "image_dtype": torch.uint8}
    want = _batches(_dataset(raw, None, **opts), workers, slabs=True)
    for _ in range(2):
        ds = _dataset(raw, tmp_path, **opts)
        _same(want, _batches(ds, workers, slabs=True))
    assert _total(ds)["frames_decoded"] == 0
    assert want[0][FRONT].shape[-2:] == (32, 48)


def _slab_batches(ds: EpisodePoolDataset, workers: int = 2) -> tuple[list[dict], dict[str, float]]:
    """``_batches`` through slabs, with the workers' transport counters."""
    loader = slab_loader(ds, batch_size=4, num_workers=workers)
    out = [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()} for b in loader]
    return out, loader.collate_fn.stats()["workers"]


@pytest.mark.parametrize(("chunk", "workers"), [(3, 2), (32, 2), (3, 0)])
def test_a_cold_epoch_waits_on_the_fills_and_reads_into_the_slabs(
    raw: Path, tmp_path: Path, chunk: int, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every camera read of a cold epoch comes from its episode's fill (advanced to the frames a
    sample asks for, however far ahead: ``chunk`` 3 makes most reads wait on several steps), none
    decoded at random, and lands in its batch's slab as a warm read does: the same bits. Without
    workers the slabs are the main process's own (``slab_loader`` batches the dataset itself)."""
    monkeypatch.setattr(frame_fill, "FILL_CHUNK", chunk)  # the workers are forked: they see it too
    monkeypatch.setattr(frame_fill, "STARTUP_READS", 0)  # every read waits, however far ahead
    monkeypatch.setattr(frame_fill, "FILL_AHEAD", 0)
    opts: dict[str, Any] = {"image_dtype": torch.uint8}
    want = _batches(_dataset(raw, None, **opts), workers)
    ds = _dataset(raw, tmp_path, **opts)
    got, transport = _slab_batches(ds, workers)
    _same(want, got)
    total = _total(ds)
    assert total["frame_cache_misses"] == 0 and total["frames_decoded"] == 0
    assert total["frame_cache_hits"] == 2 * total["frames_emitted"]
    # every value given a slot was read into it (one not in its slot retires the slabs staged for
    # batches ahead); how many get one depends on the slabs free when its sample is queued
    assert transport["slabs_retired"] == 0 and transport["fallback_batches"] == 0
    assert transport["staged_values"] > 0


def test_a_fill_that_fails_falls_back_to_decoding(raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fill that fails mid-entry (a disk error on its second chunk) is abandoned, its partial
    entry deleted, and the samples waiting on it decoded at emit: the same bits, in batches whose
    layout does not change (no slab retired)."""
    monkeypatch.setattr(frame_fill, "FILL_CHUNK", 4)
    write = frame_cache.Fill.write_stored

    def failing(self: frame_cache.Fill, frame: Any) -> None:
        if self.progress > 0:
            raise OSError(5, "injected disk error")
        write(self, frame)

    opts: dict[str, Any] = {"image_dtype": torch.uint8}
    want = {w: _batches(_dataset(raw, None, **opts), w, slabs=True) for w in (0, 2)}
    monkeypatch.setattr(frame_cache.Fill, "write_stored", failing)
    for workers in (0, 2):
        ds = _dataset(raw, tmp_path / str(workers), **opts)
        got, transport = _slab_batches(ds, workers) if workers else (_batches(ds, 0, slabs=True), None)
        _same(want[workers], got)
        total = _total(ds)
        assert total["frame_cache_misses"] > 0 and total["frames_decoded"] > 0
        assert total["frame_cache_fills"] == 0
        assert glob.glob(str(tmp_path / str(workers) / ENTRIES_DIR / "*")) == []
        assert transport is None or transport["slabs_retired"] == 0


@pytest.mark.slow
def test_real_fixture_through_the_cache(fixture_root: Path, tmp_path: Path) -> None:
    opts: dict[str, Any] = {"episodes": [0], "cameras": [FRONT], "delta_timestamps": None, "image_dtype": torch.uint8}
    want = _batches(EpisodePoolDataset(str(fixture_root), **opts))
    for _ in range(2):
        ds = EpisodePoolDataset(str(fixture_root), frame_cache_dir=str(tmp_path), **opts)
        _same(want, _batches(ds))
    assert _total(ds)["frames_decoded"] == 0


def test_a_mid_epoch_resume_through_the_cache(raw: Path, tmp_path: Path) -> None:
    full = _batches(_dataset(raw, None, seed=4))
    cut = 3
    first = _dataset(raw, tmp_path, seed=4)
    it = iter(DataLoader(first, batch_size=4))
    for _ in range(cut):
        next(it)
    state = first.state_dict(batches_consumed=cut, batch_size=4)
    del it
    resumed = _dataset(raw, tmp_path, seed=4)
    resumed.load_state_dict(state)
    _same(full[cut:], _batches(resumed))


@pytest.mark.slow
def test_two_processes_on_one_directory_fill_each_entry_once(raw: Path, tmp_path: Path) -> None:
    """Two consumers started together on the same episodes: an entry one of them is filling is
    not filled by the other (it decodes its own samples meanwhile), so the fills the two report
    are exactly the entries on disk; both get the frames decoded without the cache."""
    want = _batches(_dataset(raw, None))
    script = textwrap.dedent(f"""
        import json, os, sys, time, torch
        from torch.utils.data import DataLoader
        from lerobot_shards.loader import EpisodePoolDataset
        ds = EpisodePoolDataset({str(raw)!r}, episodes_per_shard=1, episode_pool_size=2,
                                delta_timestamps={json.dumps(DELTAS)}, frame_cache_dir={str(tmp_path / "fc")!r})
        print("ready", flush=True)
        sys.stdin.readline()  # both start iterating at once
        batches = [b for b in DataLoader(ds, batch_size=4)]
        torch.save(batches, sys.argv[1])
        print(json.dumps(ds.stats()["total"]), flush=True)
    """)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / f"out{i}.pt")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    totals = []
    for i, p in enumerate(procs):
        out, _ = p.communicate(timeout=HANG_GUARD_S)
        assert p.returncode == 0
        totals.append(json.loads(out.strip().splitlines()[-1]))
        _same(want, torch.load(tmp_path / f"out{i}.pt"))
    entries = _entries(tmp_path / "fc")
    assert len(entries) > 0
    assert sum(t["frame_cache_fills"] for t in totals) == len(entries)


KILLED_FILL = """
import os, sys, threading
from torch.utils.data import DataLoader
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.decoding import frame_cache
write = frame_cache.Fill.write_stored
def write_then_hang(self, frame):
    write(self, frame)
    print("written", flush=True)  # a frame is on disk, the entry incomplete: kill me now
    threading.Event().wait()
frame_cache.Fill.write_stored = write_then_hang
ds = EpisodePoolDataset(sys.argv[1], episodes_per_shard=1, episode_pool_size=2, frame_cache_dir=sys.argv[2],
                        decode_threads=1)
for _ in DataLoader(ds, batch_size=4):
    pass
"""


def test_a_fill_killed_with_9_is_never_served_and_the_next_run_refills(raw: Path, tmp_path: Path) -> None:
    cache = tmp_path / "fc"
    p = subprocess.Popen([sys.executable, "-c", KILLED_FILL, str(raw), str(cache)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "written"  # a half-written entry
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert _entries(cache) == []
    leftovers = glob.glob(str(cache / ENTRIES_DIR / "*.tmp"))
    assert len(leftovers) == 1
    want = _batches(_dataset(raw, None, delta_timestamps=None))
    ds = _dataset(raw, cache, delta_timestamps=None)
    _same(want, _batches(ds))
    assert _total(ds)["frame_cache_fills"] == 2 * 4
    assert not os.path.exists(leftovers[0])  # swept by the refill of its entry
    assert len(_entries(cache)) == 2 * 4


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_entry_is_detected_and_decoded_again(raw: Path, tmp_path: Path, damage: str) -> None:
    want = _batches(_dataset(raw, None))
    _batches(_dataset(raw, tmp_path))
    entries = _entries(tmp_path)
    for path in entries:
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            if damage == "flip":
                f.seek(size - 100)  # inside the last frame
                byte = f.read(1)
                f.seek(size - 100)
                f.write(bytes([byte[0] ^ 0xFF]))
            else:
                f.truncate(size - 1000)
    ds = _dataset(raw, tmp_path)
    _same(want, _batches(ds))
    total = _total(ds)
    assert total["frame_cache_fills"] > 0
    if damage == "flip":  # found on reading the frame
        assert total["frame_cache_bad"] > 0
    ds = _dataset(raw, tmp_path)
    _same(want, _batches(ds))  # the refilled entries serve


def test_eviction_keeps_the_bound_and_spares_entries_in_use(raw: Path, tmp_path: Path) -> None:
    _batches(_dataset(raw, tmp_path / "big", episode_pool_size=1))
    sizes = [os.path.getsize(p) for p in _entries(tmp_path / "big")]
    bound = sum(sorted(sizes)[-3:])  # room for about three entries of the eight
    want = _batches(_dataset(raw, None, episode_pool_size=1))
    ds = _dataset(raw, tmp_path / "small", episode_pool_size=1, frame_cache_bytes=bound)
    _same(want, _batches(ds))
    total = _total(ds)
    assert total["frame_cache_evictions"] > 0
    assert sum(os.path.getsize(p) for p in _entries(tmp_path / "small")) <= bound
    # an entry held by a consumer is not evicted: a fill that needs its room does not happen
    keys = [_parse_header(Path(p).read_bytes()[:ALIGN], p)[0] for p in _entries(tmp_path / "small")]
    held = [FrameCache(str(tmp_path / "small"), bound).open(k) for k in keys]
    assert all(e is not None for e in held)
    ds = _dataset(raw, tmp_path / "small", episode_pool_size=1, frame_cache_bytes=bound)
    _same(want, _batches(ds))
    assert _total(ds)["frame_cache_evictions"] == 0
    for e in held:
        assert e is not None and os.path.exists(e.path)
        e.close()


def test_a_reservation_with_room_does_not_walk_the_directory(
    raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger (an upper bound of the entries' sum) answers a reservation with room: the
    directory is walked once for the eight entries, when the ledger is made; an entry deleted
    behind the cache's back leaves the ledger high, and a ledger found too high is set right by
    one walk, never exceeding the bound."""
    walks: list[bool] = []
    real_scan = frame_cache.scan

    def counting(root: str, *, probe: bool = True) -> list:
        walks.append(probe)
        return real_scan(root, probe=probe)

    monkeypatch.setattr(frame_cache, "scan", counting)
    want = _batches(_dataset(raw, None))
    _same(want, _batches(_dataset(raw, tmp_path)))
    assert len(_entries(tmp_path)) == 2 * 4 and walks == [False]
    ledger = tmp_path / ".locks" / frame_cache.LEDGER
    total = sum(os.path.getsize(p) for p in _entries(tmp_path))
    assert int(ledger.read_bytes()) == total
    os.unlink(_entries(tmp_path)[0])  # deleted behind the cache's back: the ledger stays high
    ledger.write_bytes(b"garbled")  # a torn write: read as unknown
    ds = _dataset(raw, tmp_path, frame_cache_bytes=total)
    _same(want, _batches(ds))
    assert _total(ds)["frame_cache_fills"] == 1 and len(_entries(tmp_path)) == 2 * 4
    assert int(ledger.read_bytes()) == total and walks == [False, False]


def _swap_height_and_width(path: str) -> None:
    """Edit the entry's header in place: (C, H, W) becomes (C, W, H), the same bytes per frame, so
    every frame still passes its checksum (format 1 returned the frames in the wrong shape)."""
    with open(path, "r+b") as f:
        block = f.read(ALIGN)
        key, layout = _parse_header(block, path)
        c, h, w = layout.shape
        old, new = f'"shape": [{c}, {h}, {w}]'.encode(), f'"shape": [{c}, {w}, {h}]'.encode()
        assert len(old) == len(new) and h != w
        f.seek(0)
        f.write(block.replace(old, new))


def _one_frame_entry(path: str) -> None:
    """Rewrite the entry whole as a valid entry of its key holding only its first frame (what a
    planted or foreign file could be): the loader asked for frames past it (a bare IndexError)."""
    data = Path(path).read_bytes()
    key, layout = _parse_header(data[:ALIGN], path)
    one = frame_cache.Layout(1, layout.shape)
    table = data[layout.table : layout.table + frame_cache.DIGEST_BYTES].ljust(one.data - one.table, b"\0")
    Path(path).write_bytes(frame_cache._header(key, one) + table + data[layout.data : layout.data + layout.frame_bytes])


def _fifo_ledger(cache: Path) -> None:
    """A FIFO where the ledger goes: reading it blocked every reservation forever, under the global lock."""
    ledger = cache / ".locks" / frame_cache.LEDGER
    ledger.unlink()
    os.mkfifo(ledger)
    for path in _entries(cache):
        os.unlink(path)  # the next run reserves again


@pytest.mark.parametrize(
    "edit",
    [
        lambda cache: [_swap_height_and_width(p) for p in _entries(cache)],
        lambda cache: [_one_frame_entry(p) for p in _entries(cache)],
        _fifo_ledger,
    ],
    ids=["header-shape-edited", "entry-of-one-frame", "fifo-ledger"],
)
def test_an_edited_or_planted_cache_gives_the_same_frames(raw: Path, tmp_path: Path, edit: Callable) -> None:
    want = _batches(_dataset(raw, None))
    _batches(_dataset(raw, tmp_path))
    edit(tmp_path)
    ds = _dataset(raw, tmp_path)
    _same(want, _batches(ds))
    assert _total(ds)["frame_cache_fills"] > 0  # the bad entries were refilled, the ledger replaced
    assert (tmp_path / ".locks" / frame_cache.LEDGER).is_file()
    _same(want, _batches(_dataset(raw, tmp_path)))


def test_a_file_where_the_entries_go_is_decoding_without_the_cache_and_no_traceback(
    raw: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each clip's lookup was a NotADirectoryError logged with its traceback by the decode thread."""
    (tmp_path / ENTRIES_DIR).write_text("not a folder")
    want = _batches(_dataset(raw, None))
    with caplog.at_level("WARNING"):
        _same(want, _batches(_dataset(raw, tmp_path)))
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
    assert sum("frame_cache_dir" in r.getMessage() for r in caplog.records) == 1  # said once: no room to fill


def test_two_resize_settings_share_a_directory(raw: Path, tmp_path: Path) -> None:
    small: dict[str, Any] = {"resize": (32, 48), "image_dtype": torch.uint8}
    other: dict[str, Any] = {"resize": (32, 48), "resize_mode": "crop", "image_dtype": torch.uint8}
    for opts in (small, other, {"image_dtype": torch.uint8}):
        want = _batches(_dataset(raw, None, **opts))
        _same(want, _batches(_dataset(raw, tmp_path, **opts)))
    assert len(_entries(tmp_path)) == 3 * 2 * 4
    ds = _dataset(raw, tmp_path, **small)
    _same(_batches(_dataset(raw, None, **small)), _batches(ds))
    assert _total(ds)["frames_decoded"] == 0


def test_bad_settings_are_one_line(raw: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="frame_cache_dir .*file' is not a directory"):
        _dataset(raw, tmp_path / "file")
    with pytest.raises(ValueError, match="frame_cache_bytes must be"):
        _dataset(raw, tmp_path, frame_cache_bytes=0)
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / ".locks").write_text("a file where the cache keeps its index")
    with pytest.raises(CacheDirError, match=rf"frame_cache_dir {blocked}: .*; a file stands where .*frame_cache_dir"):
        _dataset(raw, blocked)
    _dataset(raw, tmp_path / "made" / "here")  # a missing directory is made
    assert (tmp_path / "made" / "here").is_dir()


def _in_tmpfs(mount_opts: str, mountpoint: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``script`` in a private mount namespace with a small tmpfs at ``mountpoint`` (needs root)."""
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a mount namespace here ({probe.stderr.decode().strip()})")
    mountpoint.mkdir(exist_ok=True)
    sh = f'mount -t tmpfs -o {mount_opts} tmpfs "$0" && exec "$@"'
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", sh, str(mountpoint)]
    return subprocess.run(
        [*cmd, sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=HANG_GUARD_S
    )


ON_A_SMALL_DISK = """
import sys, torch
from torch.utils.data import DataLoader
from lerobot_shards.loader import EpisodePoolDataset
def run(cache):
    ds = EpisodePoolDataset(sys.argv[1], episodes_per_shard=1, episode_pool_size=2, frame_cache_dir=cache,
                            frame_cache_bytes=1 << 30)
    return [b["observation.images.front"] for b in DataLoader(ds, batch_size=4)], ds.stats()["total"]
want, _ = run(None)
got, total = run(sys.argv[2])
assert all(torch.equal(a, b) for a, b in zip(want, got)) and len(want) == len(got)
print("fills", int(total["frame_cache_fills"]))
"""


def test_a_full_disk_falls_back_to_decoding_with_one_message(raw: Path, tmp_path: Path) -> None:
    result = _in_tmpfs("size=256k,mode=755", tmp_path / "mnt", ON_A_SMALL_DISK, str(raw), str(tmp_path / "mnt"))
    assert result.returncode == 0, result.stderr
    full = [line for line in result.stderr.splitlines() if "No space left on device" in line]
    assert len(full) == 1 and f"frame_cache_dir {tmp_path / 'mnt'}" in full[0]
    assert "fills" in result.stdout


def test_a_read_only_directory_is_one_line(raw: Path, tmp_path: Path) -> None:
    result = _in_tmpfs("ro,mode=755", tmp_path / "ro", ON_A_SMALL_DISK, str(raw), str(tmp_path / "ro"))
    assert result.returncode != 0
    # the error's one line (the traceback's last: where the interpreter's exit prints more after it,
    # such as a collected generator's note, it is not the last line of stderr)
    said = [line for line in result.stderr.splitlines() if line.startswith("lerobot_shards.")]
    assert len(said) == 1, result.stderr
    assert f"frame_cache_dir {tmp_path / 'ro'}: Read-only file system" in said[0] and "choose a writable" in said[0]


def _free_box(n: int) -> bytes:
    return n.to_bytes(4, "big") + b"free" + bytes(n - 8)


def test_a_raw_mp4_rewritten_in_place_with_its_size_and_mtime_is_not_served_stale(
    synth_factory: Callable[..., Path], tmp_path: Path
) -> None:
    """The cache names a raw mp4 by its path, size and times: file-000.mp4 (episodes 0 and 1)
    rewritten in place with file-001.mp4's frames (episodes 2 and 3, as long; both padded with an
    mp4 ``free`` box to one size) and its modification time set back served episode 0's old frames
    from the cache, where decoding gives the new ones. The change time, which nobody sets, is in
    the key now."""
    root = tmp_path / "raw"
    shutil.copytree(synth_factory(num_episodes=4, length_range=(10, 10), seed=5), root)
    videos = root / "videos" / FRONT / "chunk-000"
    old, new = (videos / "file-000.mp4").read_bytes(), (videos / "file-001.mp4").read_bytes()
    size = max(len(old), len(new)) + 16
    old, new = old + _free_box(size - len(old)), new + _free_box(size - len(new))
    (videos / "file-000.mp4").write_bytes(old)
    cache = tmp_path / "cache"
    _batches(_dataset(root, cache, shuffle=False))  # fills the cache with episode 0's frames
    st = os.stat(videos / "file-000.mp4")
    with open(videos / "file-000.mp4", "r+b") as f:  # same inode, same size
        f.write(new)
    os.utime(videos / "file-000.mp4", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(videos / "file-000.mp4").st_mtime_ns == st.st_mtime_ns
    want = _batches(_dataset(root, None, shuffle=False))
    got = _batches(_dataset(root, cache, shuffle=False))
    _same(want, got)
    assert read_identity(got[0][FRONT][0][1]) == (2, 0)  # episode 0's row now holds episode 2's frames


def _unchanged(frames: torch.Tensor) -> torch.Tensor:
    """An image transform that returns its frames as they are (their memory order shows)."""
    return frames


@pytest.mark.parametrize(("resize", "augmented"), [(None, False), ((32, 48), False), (None, True)])
def test_frames_from_the_cache_lie_in_memory_as_decoded_ones(
    raw: Path, tmp_path: Path, resize: Any, augmented: bool
) -> None:
    """Entries hold each frame's (H, W, C) bytes, torchcodec's order: a sample's frames, cold or warm,
    are (C, H, W) views over channels-last memory, as the decoder's (resized ones too), same bits.
    Frames augmented next (``image_transforms``) are cached planar and come contiguous."""
    opts: dict[str, Any] = {"image_dtype": torch.uint8, "resize": resize}
    if augmented:
        opts["image_transforms"] = _unchanged
    want = list(_dataset(raw, None, **opts))
    for epoch in range(2):  # cold, then warm
        ds = _dataset(raw, tmp_path, **opts)
        got = list(ds)
        assert len(got) == len(want)
        for a, b in zip(want, got):
            for cam in (FRONT, TOP):
                assert torch.equal(a[cam], b[cam])
                frames = b[cam] if b[cam].dim() == 4 else b[cam].unsqueeze(0)
                if augmented:
                    assert frames.is_contiguous(), (cam, b[cam].stride())
                else:
                    assert frames.permute(0, 2, 3, 1).is_contiguous(), (cam, b[cam].stride())
        if epoch == 1:
            assert _total(ds)["frames_decoded"] == 0 and _total(ds)["frames_filled"] == 0
    orders = {json.loads(_parse_header(Path(p).read_bytes()[:ALIGN], p)[0])["order"] for p in _entries(tmp_path)}
    assert orders == {"chw" if augmented else "hwc"}
    if resize is None and not augmented:  # the decoder's own frames are channels-last too: no copy either way
        frames = want[0][TOP].unsqueeze(0)
        assert frames.permute(0, 2, 3, 1).is_contiguous()
