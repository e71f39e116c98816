"""mp4cut, the byte-level stream-copy cut: same packets and ClipInfo as the PyAV cut, or a fallback."""

from __future__ import annotations

import io
import random
import struct
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from torchcodec.decoders import VideoDecoder

from lerobot_shards import video
from lerobot_shards.mp4cut import Mp4CutUnsupported, Mp4File, _box, _full, _runs
from lerobot_shards.synth import FIXTURE_BITS, paint_identity, read_identity
from lerobot_shards.video import ClipError, concat_clips, cut_clip, decode_frames, encode_video

H, W, FPS = 64, 160, 30
LENGTHS = (7, 10, 6)  # with gop=2, episode 1 starts at 7: frame 8 is not a keyframe
STARTS = (0, 7, 17)
FIXTURE_VIDEOS = "videos/{camera}/chunk-000/file-000.mp4"
FIXTURE_EPISODES = ((0, 373), (373, 374), (747, 372), (1119, 373))  # (first frame, length)
PYAV_CUT = video._cut_clip_pyav  # kept here: some tests patch it out of video


def _clip(episode: int, length: int, codec: str) -> bytes:
    buf = io.BytesIO()
    encode_video((paint_identity(episode, i, H, W) for i in range(length)), buf, fps=FPS, codec=codec, gop=2)
    return buf.getvalue()


@pytest.fixture(scope="module", params=["h264", "hevc", "av1"])
def joined(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three episodes encoded one by one and joined by stream copy, as LeRobot builds a camera's mp4."""
    path = tmp_path_factory.mktemp(f"mp4cut-{request.param}") / "file-000.mp4"
    concat_clips([_clip(e, n, request.param) for e, n in enumerate(LENGTHS)], path)
    return path


@pytest.fixture
def pyav_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the byte-level cut unavailable, so cut_clip shows what the PyAV cut does."""

    def refuse(*args: object) -> None:
        raise Mp4CutUnsupported("disabled by the test")

    monkeypatch.setattr(video, "_cut_clip_mp4", refuse)


@pytest.fixture
def mp4_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if cut_clip falls back to PyAV."""

    def fail(*args: object) -> None:
        raise AssertionError("cut_clip fell back to the PyAV cut")

    monkeypatch.setattr(video, "_cut_clip_pyav", fail)


def _packets(data: bytes | Path) -> list[tuple[bytes, int, int, int, bool]]:
    """(bytes, pts, dts, duration, keyframe) of every video packet, by PyAV demux."""
    with av.open(io.BytesIO(data) if isinstance(data, bytes) else str(data)) as c:
        return [(bytes(p), p.pts, p.dts, p.duration, p.is_keyframe) for p in c.demux(c.streams.video[0]) if p.size]


def _box_types(data: bytes, start: int = 0, end: int | None = None, path: str = "") -> list[str]:
    """Paths of every box in the container boxes of ``data`` (moov/trak/... walked)."""
    end = len(data) if end is None else end
    found, pos = [], start
    while pos + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, pos)
        header = 8
        if size == 1:
            size, header = struct.unpack_from(">Q", data, pos + 8)[0], 16
        name = f"{path}/{kind.decode('latin-1')}"
        found.append(name)
        if kind in (b"moov", b"trak", b"mdia", b"minf", b"stbl", b"dinf", b"edts"):
            found += _box_types(data, pos + header, pos + size, name)
        pos += size
    assert pos == end, f"boxes under {path or '/'} do not add up"
    return found


def _check_cut(src: Path | bytes, first: int, count: int) -> tuple[bytes, video.ClipInfo]:
    """The fast cut equals the PyAV cut in packets, timestamps and ClipInfo; returns the fast one."""
    where = "here"
    fast, fast_info = video._cut_clip_mp4(src, first, count, where)
    slow, slow_info = PYAV_CUT(src, first, count, where)
    got, want = _packets(fast), _packets(slow)
    assert [p[0] for p in got] == [p[0] for p in want], "packet bytes differ"
    assert [p[1:] for p in got] == [p[1:] for p in want], "pts/dts/duration/keyframe differ"
    assert got[0][1] == 0 and len(got) == count
    assert fast_info == slow_info
    assert fast_info.frames == video.probe_clip(fast).frames  # the table describes the output clip
    types = _box_types(fast)
    assert [t for t in types if t.count("/") == 1] == ["/ftyp", "/moov", "/mdat"]  # faststart
    assert not any("edts" in t or "elst" in t for t in types)
    return fast, fast_info


@pytest.mark.parametrize("first, count", [(0, 7), (7, 10), (17, 6), (9, 4), (0, 23)])
def test_fast_cut_matches_pyav_and_decodes(joined: Path, first: int, count: int) -> None:
    data, info = _check_cut(joined, first, count)
    assert info.stream_copied and info.source_first_frame == first and info.num_frames == count
    assert [f.pts for f in info.frames] == [i * 512 for i in range(count)]
    clip = decode_frames(data, range(count))
    source = decode_frames(joined, range(first, first + count))
    assert torch.equal(clip, source)
    episode = max(e for e, s in enumerate(STARTS) if s <= first)
    assert read_identity(clip[0]) == (episode, first - STARTS[episode])
    mapped = decode_frames(data, [count - 1, 0], frame_mappings=info.frame_mappings_json())
    assert torch.equal(mapped, source[[count - 1, 0]])


def test_cut_is_deterministic_and_accepts_bytes_and_files(joined: Path, mp4_only: None) -> None:
    data = joined.read_bytes()
    a, info = cut_clip(joined, 7, 10)
    assert cut_clip(joined, 7, 10) == (a, info)
    assert cut_clip(data, 7, 10) == (a, info)
    assert cut_clip(memoryview(data), 7, 10) == (a, info)
    with open(joined, "rb") as f:
        f.seek(5)
        assert cut_clip(f, 7, 10) == (a, info)
        assert f.tell() == 5  # a file-like source is left where it was


@pytest.mark.parametrize("camera", ["observation.images.front", "observation.images.top"])
def test_fixture_episodes_match_pyav(fixture_root: Path, camera: str) -> None:
    path = fixture_root / FIXTURE_VIDEOS.format(camera=camera)
    for first, count in FIXTURE_EPISODES:
        _, info = _check_cut(path, first, count)
        assert (info.codec, info.width, info.height, info.fps, info.time_base) == ("av1", 640, 480, 30.0, (1, 15360))


def test_fixture_episodes_decode_to_source_pixels(fixture_root: Path) -> None:
    path = fixture_root / FIXTURE_VIDEOS.format(camera="observation.images.front")
    source = VideoDecoder(str(path))
    bits = dict(frame_bits=FIXTURE_BITS[0], episode_bits=FIXTURE_BITS[1])
    for episode, (first, count) in enumerate(FIXTURE_EPISODES):
        data, _ = cut_clip(path, first, count)
        clip = VideoDecoder(data)
        assert len(clip) == count
        for lo in range(0, count, 64):  # batches: a whole 640x480 episode is ~350 MB of pixels
            idx = list(range(lo, min(lo + 64, count)))
            got = clip.get_frames_at(idx).data
            assert torch.equal(got, source.get_frames_at([first + i for i in idx]).data), (episode, lo)
            assert read_identity(got[0], **bits) == (episode, lo)


def test_off_keyframe_raises_like_pyav(joined: Path, mp4_only: None) -> None:
    with pytest.raises(ClipError, match=rf"{joined.name} frames \[8, 11\): frame 8 is not a keyframe") as fast:
        cut_clip(joined, 8, 3)
    with pytest.raises(ClipError) as slow:
        PYAV_CUT(joined, 8, 3, f"{joined} frames [8, 11)")
    assert str(fast.value) == str(slow.value)


@pytest.mark.parametrize("first, count, have", [(17, 10, 6), (22, 2, 1), (23, 1, 0), (40, 2, 0)])
def test_too_few_frames_raises_like_pyav(joined: Path, mp4_only: None, first: int, count: int, have: int) -> None:
    where = rf"{joined.name} frames \[{first}, {first + count}\)"
    with pytest.raises(ClipError, match=rf"{where}: source has only {have} of those frames") as fast:
        cut_clip(joined, first, count)
    with pytest.raises(ClipError) as slow:
        PYAV_CUT(joined, first, count, f"{joined} frames [{first}, {first + count})")
    assert str(fast.value) == str(slow.value)


# --- sources the fast cut refuses -------------------------------------------------------------


def _remux(src: Path, **options: str) -> bytes:
    """The same packets in a new mp4 written by PyAV with muxer ``options`` (e.g. movflags)."""
    buf = io.BytesIO()
    with av.open(str(src)) as inp, av.open(buf, "w", format="mp4", options={"use_editlist": "0", **options}) as out:
        stream = inp.streams.video[0]
        out_stream = out.add_stream_from_template(stream, opaque=True)
        out_stream.time_base = stream.time_base
        for p in inp.demux(stream):
            if p.size:
                p.stream = out_stream
                out.mux(p)
    return buf.getvalue()


def test_fragmented_mp4_falls_back(joined: Path) -> None:
    data = _remux(joined, movflags="frag_keyframe+empty_moov")
    assert "/moof" in _box_types(data)
    with pytest.raises(Mp4CutUnsupported, match="mvex"):
        Mp4File(data)
    clip, info = cut_clip(data, 7, 10)
    assert [p[0] for p in _packets(clip)] == [p[0] for p in _packets(joined)[7:17]]
    assert info.num_frames == 10 and info.frames[0].pts == 0


def test_missing_or_empty_file_raises_like_pyav(tmp_path: Path) -> None:
    with pytest.raises(av.FFmpegError):  # what the shard writer catches, as before the byte cut
        cut_clip(tmp_path / "missing.mp4", 0, 2)
    (tmp_path / "empty.mp4").write_bytes(b"")
    with pytest.raises(av.FFmpegError):
        cut_clip(tmp_path / "empty.mp4", 0, 2)


def test_two_tracks_fall_back(joined: Path, tmp_path: Path) -> None:
    path = tmp_path / "two.mp4"
    with av.open(str(joined)) as inp, av.open(str(path), "w", format="mp4", options={"use_editlist": "0"}) as out:
        stream = inp.streams.video[0]
        outs = [out.add_stream_from_template(stream, opaque=True) for _ in range(2)]
        for s in outs:
            s.time_base = stream.time_base
        for p in inp.demux(stream):
            if p.size:
                for s in outs:  # muxing consumes a packet: give each stream its own copy
                    q = av.Packet(bytes(p))
                    q.pts, q.dts, q.duration, q.time_base = p.pts, p.dts, p.duration, p.time_base
                    q.is_keyframe = p.is_keyframe
                    q.stream = s
                    out.mux(q)
    with pytest.raises(Mp4CutUnsupported, match="more than one 'trak'"):
        Mp4File(path)
    _, info = cut_clip(path, 7, 10)
    assert info.num_frames == 10


def test_b_frames_fall_back_and_raise(tmp_path: Path) -> None:
    path = tmp_path / "bframes.mp4"
    with av.open(str(path), "w", format="mp4", options={"use_editlist": "0"}) as out:
        stream = out.add_stream("libx264", rate=FPS, options={"bf": "2", "g": "12", "x264-params": "scenecut=0"})
        stream.height, stream.width, stream.pix_fmt = H, W, "yuv420p"
        for i in range(12):
            frame = av.VideoFrame.from_ndarray(paint_identity(0, i, H, W), format="rgb24")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    with pytest.raises(Mp4CutUnsupported, match="B-frames"):
        Mp4File(path)
    with pytest.raises(ClipError, match="reordered"):
        cut_clip(path, 0, 6)


# --- hand-built layouts: chunks, gaps, co64, mdat before moov, edit lists ----------------------


def _rebuild(src: bytes, chunk_sizes: list[int], *, co64: bool, elst: tuple[int, int] | None = None) -> bytes:
    """The samples of ``src`` in a new mp4: mdat first, chunks of ``chunk_sizes`` samples with junk
    bytes between them, stco or co64, and optionally an edit list (media_time, segment duration)."""
    with Mp4File(src) as mp4:
        track = mp4.track
        samples = mp4.cut(0, track.num_samples)
    body = samples.data[-int(track.sizes.sum()) :]
    assert sum(chunk_sizes) == track.num_samples
    ftyp = _box(b"ftyp", b"isom", struct.pack(">I", 0x200), b"isomiso2mp41")
    mdat, chunk_offsets, sample = bytearray(), [], 0
    pos = len(ftyp) + 8
    for k, n in enumerate(chunk_sizes):
        mdat += bytes([k]) * (k * 37 % 50)  # junk between chunks: samples are not one contiguous run
        chunk_offsets.append(pos + len(mdat))
        start = int(track.sizes[:sample].sum())
        mdat += body[start : start + int(track.sizes[sample : sample + n].sum())]
        sample += n
    stsc = [(k + 1, n, 1) for k, n in enumerate(chunk_sizes) if k == 0 or n != chunk_sizes[k - 1]]
    stts = _runs(track.durations)
    keys = np.flatnonzero(track.sync) + 1
    offsets = np.array(chunk_offsets, dtype=">u8" if co64 else ">u4").tobytes()
    stbl = _box(
        b"stbl",
        track.stsd,
        _full(b"stts", 0, 0, struct.pack(">I", len(stts)), stts.astype(">u4").tobytes()),
        _full(b"stss", 0, 0, struct.pack(">I", len(keys)), keys.astype(">u4").tobytes()),
        _full(b"stsz", 0, 0, struct.pack(">II", 0, track.num_samples), track.sizes.astype(">u4").tobytes()),
        _full(b"stsc", 0, 0, struct.pack(">I", len(stsc)), np.array(stsc, ">u4").tobytes()),
        _full(b"co64" if co64 else b"stco", 0, 0, struct.pack(">I", len(chunk_offsets)), offsets),
    )
    media = int(track.durations.sum())
    mdhd = _full(b"mdhd", 0, 0, struct.pack(">IIIIHH", 0, 0, track.timescale, media, track.language, 0))
    hdlr = _full(b"hdlr", 0, 0, struct.pack(">I4s12x", 0, b"vide"), b"VideoHandler\0")
    minf = _box(
        b"minf",
        _full(b"vmhd", 0, 1, bytes(8)),
        _box(b"dinf", _full(b"dref", 0, 0, struct.pack(">I", 1), _full(b"url ", 0, 1))),
        stbl,
    )
    movie = -(-media * 1000 // track.timescale)
    tkhd = _full(b"tkhd", 0, 3, struct.pack(">IIIII8xhhhH", 0, 0, 1, 0, movie, 0, 0, 0, 0), track.display)
    edts = []
    if elst is not None:
        media_time, segment = elst
        edts.append(_box(b"edts", _full(b"elst", 0, 0, struct.pack(">IIiI", 1, segment, media_time, 0x10000))))
    mvhd = _full(
        b"mvhd",
        0,
        0,
        struct.pack(">IIIIIH10x", 0, 0, 1000, movie, 0x10000, 0x100),
        struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000),
        bytes(24),
        struct.pack(">I", 2),
    )
    moov = _box(b"moov", mvhd, _box(b"trak", tkhd, *edts, _box(b"mdia", mdhd, hdlr, minf)), _box(b"udta"))
    return ftyp + struct.pack(">I4s", 8 + len(mdat), b"mdat") + bytes(mdat) + moov


@pytest.mark.parametrize("co64", [False, True])
def test_chunks_gaps_and_co64(joined: Path, co64: bool) -> None:
    original = joined.read_bytes()
    rebuilt = _rebuild(original, [3, 3, 1, 5, 5, 5, 1], co64=co64)
    with Mp4File(rebuilt) as mp4:
        assert mp4.track.sample_entry == Mp4File(original).track.sample_entry
    for first, count in [(0, 7), (7, 10), (17, 6), (4, 12), (0, 23)]:
        data, _ = _check_cut(rebuilt, first, count)
        assert data == video._cut_clip_mp4(original, first, count, "x")[0]  # output depends on samples only


def _outcome(cut, src: bytes, first: int, count: int) -> tuple:
    """What a cut gives: its packets and ClipInfo, or its ClipError message."""
    try:
        data, info = cut(src, first, count)
    except ClipError as e:
        return ("error", str(e))
    return ("ok", [p[0] for p in _packets(data)], info)


def test_edit_lists(joined: Path) -> None:
    original = joined.read_bytes()
    media_ms = -(-sum(LENGTHS) * 1000 // FPS)
    whole = _rebuild(original, [sum(LENGTHS)], co64=False, elst=(0, media_ms))
    _check_cut(whole, 7, 10)  # an edit list that changes nothing is fine
    for media_time, segment in [(512, media_ms), (0, media_ms // 2), (0, 0)]:  # shift, trim, empty edit
        edited = _rebuild(original, [sum(LENGTHS)], co64=False, elst=(media_time, segment))
        with pytest.raises(Mp4CutUnsupported, match="edit list"):
            Mp4File(edited)
        for first, count in [(7, 4), (8, 2)]:  # whatever PyAV makes of the edit list, cut_clip does the same
            where = f"{video._describe(edited)} frames [{first}, {first + count})"
            assert _outcome(cut_clip, edited, first, count) == _outcome(
                lambda *a, where=where: PYAV_CUT(*a, where),
                edited,
                first,
                count,
            )


# --- the integer frame indexer ---------------------------------------------------------------


def test_round_div_matches_fraction_round() -> None:
    rng = random.Random(0)
    cases = [(n, d) for d in (1, 2, 3, 7, 512, 15360) for n in range(-2 * d, 2 * d + 1)]
    cases += [(rng.randrange(-(10**12), 10**12), rng.randrange(1, 10**7)) for _ in range(2000)]
    for n, d in cases:
        assert video._round_div(n, d) == round(Fraction(n, d)), (n, d)
    dts = np.array([n for n, _ in cases if n >= 0][:500], dtype=np.int64)
    for timescale, fps in [(15360, (30, 1)), (30000 * 512, (30000, 1001)), (1000, (4583424, 152781))]:
        want = [round(Fraction(int(t) * fps[0], timescale * fps[1])) for t in dts]
        assert video._frame_indices(dts, timescale, fps).tolist() == want


def test_converter_modules_do_not_import_torch() -> None:
    code = "import sys, lerobot_shards.convert.run, lerobot_shards.video; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_converter_cuts_every_clip_by_bytes(small_synth: Path, tmp_path: Path, mp4_only: None) -> None:
    from lerobot_shards.convert.run import convert_dataset

    convert_dataset(str(small_synth), str(tmp_path / "out"), workers=1, progress=False)
    assert list((tmp_path / "out/shards").glob("*.tar"))


def test_a_sample_count_beyond_the_file_is_refused_before_any_array(tmp_path: Path) -> None:
    """stsz with one size for every sample holds no table, so its count bounded nothing: 12 bytes
    edited (size 1, count 2^32 - 1) had every reader of the file (convert, verify, the loader's moov
    index of a Hub or bucket mp4) ask numpy for 32 GiB. The count times the size must fit in the file."""
    data = bytearray(_clip(0, 6, "h264"))
    at = data.index(b"stsz")
    struct.pack_into(">II", data, at + 8, 1, 10**6)  # 1 MB of samples in a file of a few KB
    path = tmp_path / "bomb.mp4"
    path.write_bytes(bytes(data))
    with pytest.raises(Mp4CutUnsupported, match=r"stsz: 1000000 samples of 1 bytes, more than the file's \d+ bytes"):
        Mp4File(str(path))
