"""video.py on real encoders and decoders: GOP structure, stream-copy joins and cuts, re-encoding."""

from __future__ import annotations

import io
import struct
from fractions import Fraction
from pathlib import Path

import av
import pytest
from torchcodec.decoders import VideoDecoder

from lerobot_shards.synth import FIXTURE_BITS, paint_identity, read_identity
from lerobot_shards.video import (
    ClipError,
    concat_clips,
    cut_clip,
    decode_frames,
    encode_video,
    probe_clip,
    reencode_clip,
)

H, W, FPS = 64, 160, 30
TB = (1, FPS * 512)
LENGTHS = (7, 10, 6)  # odd lengths: with gop=2 clip starts are keyframes the GOP grid alone would not give


def _clip(episode: int, length: int, *, codec: str = "h264", gop: int = 2, width: int = W) -> bytes:
    buf = io.BytesIO()
    encode_video((paint_identity(episode, i, H, width) for i in range(length)), buf, fps=FPS, codec=codec, gop=gop)
    return buf.getvalue()


def _packets(src: bytes | str | Path) -> list[av.Packet]:
    with av.open(io.BytesIO(src) if isinstance(src, bytes) else str(src)) as c:
        return [p for p in c.demux(c.streams.video[0]) if p.size]


def _trak_children(data: bytes) -> list[bytes]:
    """Box types directly under moov/trak: an edit list would show as b'edts'."""

    def boxes(start: int, end: int):
        pos = start
        while pos + 8 <= end:
            size, kind = struct.unpack(">I4s", data[pos : pos + 8])
            header = 8
            if size == 1:
                size, header = struct.unpack(">Q", data[pos + 8 : pos + 16])[0], 16
            elif size == 0:
                size = end - pos
            yield kind, pos + header, pos + size
            pos += size

    kinds = []
    for kind, s, e in boxes(0, len(data)):
        if kind == b"moov":
            for k2, s2, e2 in boxes(s, e):
                if k2 == b"trak":
                    kinds += [k3 for k3, _, _ in boxes(s2, e2)]
    assert b"tkhd" in kinds, "mp4 walk found no track header"
    return kinds


@pytest.fixture(scope="module")
def joined(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes], list[float]]:
    """Three episodes encoded one by one and joined by stream copy, as LeRobot does."""
    clips = [_clip(e, n) for e, n in enumerate(LENGTHS)]
    path = tmp_path_factory.mktemp("video") / "file-000.mp4"
    starts = concat_clips(clips, path)
    return path, clips, starts


@pytest.mark.parametrize("codec", ["h264", "hevc", "av1"])
def test_encode_gop_no_bframes_exact_pts(codec: str) -> None:
    data = _clip(5, 10, codec=codec, gop=3)
    probe = probe_clip(data)
    assert (probe.codec, probe.width, probe.height, probe.pix_fmt) == (codec, W, H, "yuv420p")
    assert probe.fps == FPS and probe.time_base == TB
    assert [f.pts for f in probe.frames] == [i * 512 for i in range(10)]
    assert all(f.duration == 512 for f in probe.frames)
    assert [i for i, f in enumerate(probe.frames) if f.key_frame] == [0, 3, 6, 9]
    assert probe.duration_s == pytest.approx(10 / FPS)
    packets = _packets(data)  # decode order
    assert [p.pts for p in packets] == [p.dts for p in packets] == sorted(p.pts for p in packets)
    assert b"edts" not in _trak_children(data)
    decoder = VideoDecoder(data)
    batch = decoder.get_frames_at(list(range(10)))
    assert batch.pts_seconds.tolist() == pytest.approx([i / FPS for i in range(10)])
    assert [read_identity(f) for f in batch.data] == [(5, i) for i in range(10)]


def test_hevc_refuses_frames_libx265_would_abort_on() -> None:
    """FFmpeg's libx265 corrupts its heap and kills the process on frames under 64x64 (48x48,
    64x48 seen): the encoder refuses them first, for synth, re-encoding and convert alike."""
    with pytest.raises(ValueError, match="codec hevc needs frames of at least 64x64, got 48x64"):
        encode_video((paint_identity(0, i, 64, 48) for i in range(3)), io.BytesIO(), fps=FPS, codec="hevc")


def test_encode_fractional_fps() -> None:
    buf = io.BytesIO()
    encode_video((paint_identity(0, i, H, W) for i in range(4)), buf, fps=30000 / 1001)
    probe = probe_clip(buf.getvalue())
    assert Fraction(*probe.time_base) == Fraction(1, 30000 * 512)
    assert [f.pts for f in probe.frames] == [i * 1001 * 512 for i in range(4)]
    assert probe.fps == pytest.approx(30000 / 1001)


def test_encode_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="codec 'vp9'"):
        encode_video([paint_identity(0, 0, H, W)], tmp_path / "a.mp4", fps=FPS, codec="vp9")
    with pytest.raises(ValueError, match=r"frame 1: expected HxWx3 uint8"):
        encode_video([paint_identity(0, 0, H, W), paint_identity(0, 1, H, W)[..., 0]], tmp_path / "b.mp4", fps=FPS)
    with pytest.raises(ValueError, match=r"frame 1: size"):
        encode_video([paint_identity(0, 0, H, W), paint_identity(0, 1, H, W + 16)], tmp_path / "c.mp4", fps=FPS)


def test_concat_offsets_and_bit_identical_packets(joined) -> None:
    path, clips, starts = joined
    assert starts == [0.0, 7 / FPS, 17 / FPS]
    probe = probe_clip(path)
    assert [f.pts for f in probe.frames] == [i * 512 for i in range(sum(LENGTHS))]
    keys = [i for i, f in enumerate(probe.frames) if f.key_frame]
    assert {0, 7, 17} <= set(keys)
    assert [bytes(p) for p in _packets(path)] == [bytes(p) for clip in clips for p in _packets(clip)]
    assert b"edts" not in _trak_children(path.read_bytes())
    decoder = VideoDecoder(str(path))
    for e, (start, n) in enumerate(zip(starts, LENGTHS)):
        frames = decoder.get_frames_played_at([start + i / FPS for i in range(n)]).data
        assert [read_identity(f) for f in frames] == [(e, i) for i in range(n)]


def test_concat_rejects_mismatched_clips(tmp_path: Path) -> None:
    with pytest.raises(ClipError, match="differ from the first clip"):
        concat_clips([_clip(0, 4), _clip(1, 4, width=W + 32)], tmp_path / "x.mp4")


def test_probe_accepts_path_bytes_and_file(joined) -> None:
    path = joined[0]
    with open(path, "rb") as f:
        assert probe_clip(path) == probe_clip(path.read_bytes()) == probe_clip(f)


@pytest.mark.parametrize("first, count", [(7, 10), (9, 4), (0, 7), (17, 6)])
def test_cut_clip_stream_copies(joined, first: int, count: int) -> None:
    path, _, _ = joined
    data, info = cut_clip(path, first, count)
    assert info.stream_copied and info.source_first_frame == first and info.num_frames == count
    assert (info.codec, info.width, info.height, info.fps, info.time_base) == ("h264", W, H, FPS, TB)
    assert [f.pts for f in info.frames] == [i * 512 for i in range(count)]
    assert info.frames[0].key_frame
    assert [bytes(p) for p in _packets(data)] == [bytes(p) for p in _packets(path)[first : first + count]]
    assert b"edts" not in _trak_children(data)
    source = decode_frames(path, range(first, first + count))
    batch = VideoDecoder(data).get_frames_at(list(range(count)))
    assert batch.pts_seconds.tolist() == pytest.approx([i / FPS for i in range(count)])
    assert [read_identity(f) for f in batch.data] == [read_identity(f) for f in source]
    ends = [sum(LENGTHS[: k + 1]) for k in range(len(LENGTHS))]
    episode = next(k for k, end in enumerate(ends) if first < end)
    assert read_identity(batch.data[0]) == (episode, first - (ends[episode] - LENGTHS[episode]))
    mapped = decode_frames(data, [count - 1, 0], frame_mappings=info.frame_mappings_json())
    assert [read_identity(f) for f in mapped] == [read_identity(source[-1]), read_identity(source[0])]


def test_cut_clip_real_av1_fixture(fixture_root: Path) -> None:
    path = fixture_root / "videos/observation.images.front/chunk-000/file-000.mp4"
    data, info = cut_clip(path, 747, 372)  # episode 2
    assert info.codec == "av1" and info.num_frames == 372 and info.frames[0].pts == 0
    assert [bytes(p) for p in _packets(data)] == [bytes(p) for p in _packets(path)[747:1119]]
    frames = decode_frames(data, [0, 1, 371])
    assert [read_identity(f, frame_bits=FIXTURE_BITS[0], episode_bits=FIXTURE_BITS[1]) for f in frames] == [
        (2, 0),
        (2, 1),
        (2, 371),
    ]


def test_cut_clip_off_keyframe_raises(joined) -> None:
    path = joined[0]
    with pytest.raises(ClipError, match=rf"{path.name} frames \[8, 11\): frame 8 is not a keyframe"):
        cut_clip(path, 8, 3)


@pytest.mark.parametrize("first, count, have", [(17, 10, 6), (40, 2, 0)])
def test_too_few_frames_raises(joined, first: int, count: int, have: int) -> None:
    path = joined[0]
    message = rf"{path.name} frames \[{first}, {first + count}\): source has only {have} of those frames"
    with pytest.raises(ClipError, match=message):
        cut_clip(path, first, count)
    with pytest.raises(ClipError, match=message):
        reencode_clip(path, first, count, codec="h264", gop=2, crf=30)


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_reencode_clip_keeps_identity(joined, codec: str) -> None:
    path = joined[0]
    data, info = reencode_clip(path, 8, 6, codec=codec, gop=4, crf=20)  # 8 is not a keyframe
    assert not info.stream_copied and info.source_first_frame == 8 and info.codec == codec
    assert info.num_frames == 6 and info.key_frame_indices() == [0, 4]
    assert [f.pts for f in info.frames] == [i * 512 for i in range(6)]
    assert b"edts" not in _trak_children(data)
    assert [read_identity(f) for f in decode_frames(data, range(6))] == [(1, i) for i in range(1, 7)]
