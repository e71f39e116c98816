"""The zero-copy shard writer: the same tar bytes as tarfile, whichever way the bytes travel."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from lerobot_shards import video
from lerobot_shards.convert import tar_sink
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.shard_writer import ConvertError, _cut_ranges, build_shard
from lerobot_shards.convert.tar_sink import FileRanges, TarSink
from lerobot_shards.lerobot_v3 import LeRobotV3Source
from lerobot_shards.mp4cut import Mp4File
from lerobot_shards.shard_plan import PlannedShard
from lerobot_shards.synth import paint_identity
from lerobot_shards.video import ClipError, concat_clips, cut_clip, encode_video

H, W, FPS = 64, 160, 30
LENGTHS = (7, 10, 6)  # gop=2: frame 8 is not a keyframe


def _tarfile_reference(members: list[tuple[str, bytes]]) -> bytes:
    """What the writer made before: tarfile.addfile with fixed header fields."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def source_file(tmp_path: Path) -> Path:
    path = tmp_path / "source.bin"
    path.write_bytes(os.urandom(3 * 1024 * 1024 + 123))
    return path


def _ranges(path: Path, prefix: bytes, ranges: tuple[tuple[int, int], ...]) -> FileRanges:
    st = os.stat(path)
    return FileRanges(str(path), prefix, ranges, (st.st_ino, st.st_size, st.st_mtime_ns))


def _members(source_file: Path) -> list[tuple[str, bytes | FileRanges]]:
    return [
        ("000000.json", b'{"a":1}'),
        ("000000.parquet", b""),
        ("x" * 150 + ".mp4", bytes(range(256)) * 2),  # pax header; exactly one block
        ("caf\u00e9/\u00fcml\u00e4ut.bin", b"z" * 513),  # non-ASCII: pax header
        ("big.bin", os.urandom(1024 * 1024 + 7)),  # past the gathering threshold: written directly
        ("clip-a.mp4", _ranges(source_file, b"PREFIX" * 50, ((0, 1000), (5000, 2 * 1024 * 1024 + 1)))),
        ("clip-b.mp4", _ranges(source_file, b"", ((3 * 1024 * 1024, 123),))),
        ("clip-c.mp4", _ranges(source_file, b"p", ((17, 1),))),
    ]


def _plain(members: list[tuple[str, bytes | FileRanges]]) -> list[tuple[str, bytes]]:
    return [(name, p.read() if isinstance(p, FileRanges) else p) for name, p in members]


def _write(members: list[tuple[str, bytes | FileRanges]], out) -> tuple[dict, str, int]:  # type: ignore[no-untyped-def]
    sink = TarSink(out)
    try:
        placed = {name: sink.add(name, payload) for name, payload in members}
        digest = sink.finish()
    finally:
        sink.close()
    return placed, digest, sink.offset


def _check(members: list[tuple[str, bytes | FileRanges]], got: bytes, placed: dict, digest: str, size: int) -> None:
    want = _tarfile_reference(_plain(members))
    assert got == want
    assert size == len(want) and digest == hashlib.sha256(want).hexdigest()
    with tarfile.open(fileobj=io.BytesIO(got)) as tar:
        for info in tar.getmembers():
            assert (placed[info.name].offset, placed[info.name].size) == (info.offset_data, info.size)


def test_file_output_matches_tarfile(source_file: Path, tmp_path: Path) -> None:
    members = _members(source_file)
    out = tmp_path / "shard.tar"
    with open(out, "wb") as f:
        placed, digest, size = _write(members, f)
    _check(members, out.read_bytes(), placed, digest, size)


def test_in_memory_output_matches_tarfile(source_file: Path) -> None:
    members = _members(source_file)
    buf = io.BytesIO()
    placed, digest, size = _write(members, buf)
    _check(members, buf.getvalue(), placed, digest, size)


def test_tar_after_existing_bytes(source_file: Path, tmp_path: Path) -> None:
    """Buffered bytes already in the file stay first; offsets count from where the tar starts."""
    members = _members(source_file)
    out = tmp_path / "shard.tar"
    with open(out, "wb") as f:
        f.write(b"junk")
        placed, digest, size = _write(members, f)
    data = out.read_bytes()
    assert data[:4] == b"junk"
    _check(members, data[4:], placed, digest, size)


@pytest.mark.parametrize("refuse", [("copy_file_range",), ("copy_file_range", "sendfile")])
def test_kernel_copy_fallbacks(
    source_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refuse: tuple[str, ...]
) -> None:
    calls: list[str] = []

    def refused(name: str):  # type: ignore[no-untyped-def]
        def fail(*args: object) -> int:
            calls.append(name)
            raise OSError(errno.EXDEV if name == "copy_file_range" else errno.EINVAL, "refused by the test")

        return fail

    for name in refuse:
        monkeypatch.setattr(os, name, refused(name))
    members = _members(source_file)
    out = tmp_path / "shard.tar"
    with open(out, "wb") as f:
        placed, digest, size = _write(members, f)
    _check(members, out.read_bytes(), placed, digest, size)
    assert calls == list(refuse)  # each refused method is tried once, then left alone


def test_small_hash_backlog(source_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tar_sink, "HASH_BACKLOG", 1000)
    monkeypatch.setattr(tar_sink, "SMALL_WRITE", 100)
    members = _members(source_file)
    out = tmp_path / "shard.tar"
    with open(out, "wb") as f:
        placed, digest, size = _write(members, f)
    _check(members, out.read_bytes(), placed, digest, size)


def test_changed_source_is_refused(source_file: Path, tmp_path: Path) -> None:
    member = _ranges(source_file, b"", ((0, 10),))
    with open(source_file, "ab") as f:
        f.write(b"more")
    with open(tmp_path / "shard.tar", "wb") as f, pytest.raises(ConvertError, match="changed"):
        _write([("clip.mp4", member)], f)


# -- the cut as file ranges -------------------------------------------------------------------


@pytest.fixture(scope="module")
def joined(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ranges") / "file-000.mp4"
    clips = []
    for e, n in enumerate(LENGTHS):
        buf = io.BytesIO()
        encode_video((paint_identity(e, i, H, W) for i in range(n)), buf, fps=FPS, codec="h264", gop=2)
        clips.append(buf.getvalue())
    concat_clips(clips, path)
    return path


@pytest.mark.parametrize("first, count", [(0, 7), (7, 10), (17, 6), (9, 4), (0, 23)])
@pytest.mark.parametrize("cold", [False, True])
def test_cut_ranges_equal_cut_clip(
    joined: Path, first: int, count: int, cold: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if cold:  # the stream facts are probed from the clip's bytes, not taken from the cache
        monkeypatch.setattr(video, "_FACTS_CACHE", {})
    ranges, info = _cut_ranges(str(joined), first, count)
    data, want_info = cut_clip(str(joined), first, count)
    assert ranges.read() == data and ranges.size == len(data)
    assert info == want_info
    with Mp4File(joined) as mp4:
        layout = mp4.layout(first, count)
        assert layout.size == len(data) and layout.prefix == ranges.prefix and layout.ranges == ranges.ranges


@pytest.mark.parametrize("first, count", [(8, 3), (17, 10), (0, 0)])
def test_cut_ranges_refuse_like_cut_clip(joined: Path, first: int, count: int) -> None:
    with pytest.raises(ClipError) as want:
        cut_clip(str(joined), first, count)
    with pytest.raises(ClipError) as got:
        _cut_ranges(str(joined), first, count)
    assert str(got.value) == str(want.value)


# -- whole shards -----------------------------------------------------------------------------


def test_build_shard_file_and_memory_agree(small_synth: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copied: list[int] = []
    real = os.copy_file_range

    def counting(*args: int) -> int:
        n = real(*args)
        copied.append(n)
        return n

    monkeypatch.setattr(os, "copy_file_range", counting)
    source = LeRobotV3Source(str(small_synth))
    shard = PlannedShard(index=0, episodes=tuple(e.episode_index for e in source.episodes), frames=0, est_bytes=0)
    options = ConvertOptions()
    buf = io.BytesIO()
    in_memory = build_shard(source, shard, options, buf)
    with open(tmp_path / "shard.tar", "wb") as f:
        on_file = build_shard(source, shard, options, f)
    data = (tmp_path / "shard.tar").read_bytes()
    assert data == buf.getvalue() and on_file == in_memory
    assert in_memory.size == len(data) and in_memory.sha256 == hashlib.sha256(data).hexdigest()
    assert copied, "clips were not copied file to file"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        offsets = {m.name: (m.offset_data, m.size) for m in tar.getmembers()}
    for entry in in_memory.episodes:
        for name, member in entry.members.items():
            assert offsets[name] == (member.offset, member.size)
