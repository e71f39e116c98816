"""Encode, concatenate, probe, cut and decode mp4 clips.

Every mp4 written here has pts that are exact multiples of the frame duration starting at 0, no
B-frames and no edit list, because decoders disagree about edit lists and a frame table is only
trustworthy when presentation order equals decode order. PyAV (bundled FFmpeg with encoders)
writes; torchcodec (the system FFmpeg, as the loader uses it) decodes.
"""

from __future__ import annotations

import functools
import io
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Union

import av
import numpy as np

from .depth import DEPTH_PIX_FMT, DEPTH_QMAX
from .exceptions import LeRobotShardsError
from .format import CODECS, ClipInfo, FrameEntry, FrameTransform
from .mp4cut import Mp4CutUnsupported, Mp4File, Mp4Layout, Mp4Track
from .resize import plan_transform

if TYPE_CHECKING:  # torch costs 1-2 s and ~180 MB per process: only decode_frames imports it
    import torch

log = logging.getLogger(__name__)

Source = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, BinaryIO]

TICKS_PER_FRAME = 512  # stream time base 1/(fps*512), as LeRobot's mp4s have (1/15360 at 30 fps)
_MUXER_OPTIONS = {"use_editlist": "0"}


class ClipError(LeRobotShardsError, ValueError):
    """A clip cannot be cut or joined as asked (too few frames, not on a keyframe, mismatch)."""


@dataclass(frozen=True)
class ProbeResult:
    """What demuxing (no decoding) tells about a clip's video stream."""

    codec: str
    width: int
    height: int
    pix_fmt: str
    fps: float
    time_base: tuple[int, int]
    frames: tuple[FrameEntry, ...]  # presentation order
    duration_s: float

    @property
    def num_frames(self) -> int:
        return len(self.frames)

    def clip_info(
        self,
        *,
        stream_copied: bool,
        source_first_frame: int,
        fps: float | None = None,
        transform: FrameTransform | None = None,
    ) -> ClipInfo:
        return ClipInfo(
            codec=self.codec,
            width=self.width,
            height=self.height,
            pix_fmt=self.pix_fmt,
            fps=self.fps if fps is None else fps,
            num_frames=self.num_frames,
            time_base=self.time_base,
            frames=self.frames,
            stream_copied=stream_copied,
            source_first_frame=source_first_frame,
            transform=transform,
        )


def _describe(src: Source) -> str:
    if isinstance(src, (str, os.PathLike)):
        return str(src)
    if isinstance(src, (bytes, bytearray, memoryview)):
        return f"<{len(src)} bytes in memory>"
    return str(getattr(src, "name", None) or f"<{type(src).__name__}>")


def _open(src: Source) -> av.container.InputContainer:
    if isinstance(src, (str, os.PathLike)):
        return av.open(str(src), "r")
    if isinstance(src, (bytes, bytearray, memoryview)):
        return av.open(io.BytesIO(bytes(src)), "r")
    return av.open(src, "r")


def _open_output(dst: str | os.PathLike[str] | BinaryIO) -> av.container.OutputContainer:
    return av.open(str(dst) if isinstance(dst, os.PathLike) else dst, "w", format="mp4", options=_MUXER_OPTIONS)


def _video_stream(container: av.container.InputContainer, src: Source) -> av.video.stream.VideoStream:
    if not container.streams.video:
        raise ClipError(f"{_describe(src)}: no video stream")
    return container.streams.video[0]


def _time_base(stream: av.video.stream.VideoStream) -> Fraction:
    if stream.time_base is None:
        raise ClipError(f"stream {stream.index}: time base unknown")
    return stream.time_base


def _ts(value: int | None, what: str) -> int:
    """A packet's pts/dts/duration where the clip must have one (PyAV gives None when absent)."""
    if value is None:
        raise ClipError(f"a packet has no {what}")
    return value


def _stream_fps(stream: av.video.stream.VideoStream) -> Fraction:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    if not rate:
        raise ClipError(f"stream {stream.index}: frame rate unknown")
    return Fraction(rate)


def _fps_fraction(fps: float) -> Fraction:
    return Fraction(fps).limit_denominator(1001)


def _encoder_options(
    codec: str, gop: int, crf: int, threads: int, bframes: int = 0, lossless: bool = False
) -> dict[str, str]:
    if codec not in CODECS:
        raise ValueError(f"codec {codec!r} is not one of {sorted(CODECS)}")
    if gop < 1:
        raise ValueError(f"gop must be >= 1, got {gop}")
    if bframes and codec != "h264":
        raise ValueError(f"bframes: only h264 here, got codec {codec!r}")
    options = {"crf": str(crf), "g": str(gop)}
    if codec == "h264":
        options["x264-params"] = f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes={bframes}"
        if threads == 1:  # no lookahead or sliced threads either: the bytes must not depend on scheduling
            options["x264-params"] += ":threads=1:lookahead-threads=1:sliced-threads=0"
    elif codec == "hevc":
        options["x265-params"] = f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes=0:log-level=none"
        if threads == 1:  # no thread pool at all: x265's output depends on its pool size
            options["x265-params"] += ":pools=none:frame-threads=1"
        if lossless:
            options["x265-params"] += ":lossless=1"
    else:
        options["svtav1-params"] = f"keyint={gop}:scd=0"
    return options


HEVC_MIN_SIDE = 64  # FFmpeg 5.1's libx265 corrupted its heap and aborted at 48x48, 64x48, 32x48


class _Encoder:
    """One mp4 video stream fed frame by frame (pts 0, 1, 2, ... in frames), see ``encode_video``."""

    def __init__(
        self,
        dst: str | os.PathLike[str] | BinaryIO,
        *,
        fps: float,
        codec: str,
        gop: int,
        crf: int,
        pix_fmt: str,
        threads: int,
        bframes: int = 0,
        lossless: bool = False,
    ) -> None:
        self._options = _encoder_options(codec, gop, crf, threads, bframes, lossless)
        if codec == "av1":
            os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints a banner per encoder unless told
        self._codec, self._pix_fmt, self._threads = codec, pix_fmt, threads
        self._rate = _fps_fraction(fps)
        self._dst = dst
        self._out = _open_output(dst)
        self.stream: av.video.stream.VideoStream | None = None
        self.count = 0

    def open(self, width: int, height: int) -> None:
        if self._codec == "hevc" and min(width, height) < HEVC_MIN_SIDE:
            raise ValueError(
                f"codec hevc needs frames of at least {HEVC_MIN_SIDE}x{HEVC_MIN_SIDE}, got {width}x{height} "
                "(width x height): FFmpeg's libx265 aborts the process on smaller ones; choose h264 or av1"
            )
        stream = self._out.add_stream(CODECS[self._codec], rate=self._rate, options=self._options)
        if not isinstance(stream, av.video.stream.VideoStream):
            raise TypeError(f"{CODECS[self._codec]} is not a video encoder")
        stream.height, stream.width = height, width
        stream.pix_fmt = self._pix_fmt
        stream.codec_context.thread_count = self._threads
        stream.codec_context.time_base = 1 / self._rate
        stream.time_base = Fraction(1, self._rate.numerator * TICKS_PER_FRAME)
        self.stream = stream

    def encode(self, frame: av.VideoFrame) -> None:
        if self.stream is None:
            raise ValueError(f"{_describe(self._dst)}: open() the encoder before encoding")
        frame.pts = self.count
        self.count += 1
        self._out.mux(self.stream.encode(frame))

    def finish(self) -> None:
        if self.stream is None:
            raise ValueError(f"{_describe(self._dst)}: no frames to encode")
        self._out.mux(self.stream.encode(None))

    def close(self) -> None:
        self._out.close()


def encode_video(
    frames: Iterable[np.ndarray],
    dst: str | os.PathLike[str] | BinaryIO,
    *,
    fps: float,
    codec: str = "h264",
    gop: int = 2,
    crf: int = 30,
    pix_fmt: str = "yuv420p",
    threads: int = 0,
    bframes: int = 0,
) -> None:
    """Encode HxWx3 uint8 RGB frames to an mp4 with a keyframe exactly every ``gop`` frames.

    No B-frames (unless ``bframes``, H.264 only: to reproduce sources that have them) and no
    scene-cut keyframes, so every ``gop``-th frame is a cut point for stream copy. ``threads=1``
    makes the bytes independent of the machine's core count (x265 output depends on it); 0 lets
    the encoder choose.
    """
    enc = _Encoder(dst, fps=fps, codec=codec, gop=gop, crf=crf, pix_fmt=pix_fmt, threads=threads, bframes=bframes)
    try:
        for i, img in enumerate(frames):
            img = np.ascontiguousarray(img)
            if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
                raise ValueError(f"frame {i}: expected HxWx3 uint8 RGB, got {img.dtype} {img.shape}")
            if enc.stream is None:
                enc.open(img.shape[1], img.shape[0])
            elif img.shape[:2] != (enc.stream.height, enc.stream.width):
                first = (enc.stream.height, enc.stream.width)
                raise ValueError(f"frame {i}: size {img.shape[:2]} differs from frame 0's {first}")
            enc.encode(av.VideoFrame.from_ndarray(img, format="rgb24"))
        enc.finish()
    finally:
        enc.close()


def encode_depth_video(
    codes: Iterable[np.ndarray], dst: str | os.PathLike[str] | BinaryIO, *, fps: float, gop: int = 2
) -> None:
    """Encode (H, W) uint16 12-bit depth codes as LeRobot 0.6.1 stores depth maps: HEVC (libx265),
    gray12le, lossless (so every code decodes back exactly), a keyframe every ``gop`` frames, no
    B-frames, single-threaded (the same bytes on every machine)."""
    enc = _Encoder(dst, fps=fps, codec="hevc", gop=gop, crf=0, pix_fmt=DEPTH_PIX_FMT, threads=1, lossless=True)
    try:
        for i, q in enumerate(codes):
            if q.dtype != np.uint16 or q.ndim != 2 or int(q.max(initial=0)) > DEPTH_QMAX:
                raise ValueError(f"frame {i}: expected HxW uint16 codes up to {DEPTH_QMAX}, got {q.dtype} {q.shape}")
            if enc.stream is None:
                enc.open(q.shape[1], q.shape[0])
            enc.encode(_depth_frame(q))
        enc.finish()
    finally:
        enc.close()


def _depth_frame(codes: np.ndarray) -> av.VideoFrame:
    """A fresh gray12le frame of (H, W) uint16 codes (rows padded to the plane's line size: written
    row by row, as LeRobot's ``write_u16_plane`` does)."""
    height, width = codes.shape
    frame = av.VideoFrame(width, height, DEPTH_PIX_FMT)
    plane = frame.planes[0]
    np.frombuffer(memoryview(plane), np.uint16).reshape(height, plane.line_size // 2)[:, :width] = codes
    return frame


def _packets(container: av.container.InputContainer, stream: av.video.stream.VideoStream) -> Iterator[av.Packet]:
    """Demuxed packets with data (the demuxer ends with an empty flush packet)."""
    for packet in container.demux(stream):
        if packet.size:
            yield packet


def _check_order(packets: Sequence[av.Packet], where: str) -> None:
    if any(p.pts is None or p.dts is None or p.pts != p.dts for p in packets):
        raise ClipError(f"{where}: frames are reordered (B-frames) or lack timestamps; re-encode instead")


def concat_clips(
    srcs: Sequence[Source], dst: str | os.PathLike[str] | BinaryIO, *, reordered: bool = False
) -> list[float]:
    """Join same-codec clips by stream copy, as LeRobot builds a camera's multi-episode mp4.

    Packets stay bit-identical; each clip's pts/dts are shifted by the summed duration of the
    clips before it, exactly in the stream time base (LeRobot's concat demuxer rounds the offset
    to microseconds, which is where real files drift). Returns each clip's start in seconds: the
    ``from_timestamp`` an episode row records. ``reordered`` accepts clips with B-frames (their
    decode delay, the first pts minus the first dts, stays the stream's start time).
    """
    if not srcs:
        raise ValueError("concat_clips: no source clips")
    out = _open_output(dst)
    starts: list[float] = []
    try:
        out_stream = None
        first: tuple[str, int, int, Fraction, bytes | None] | None = None
        offset = 0
        for src in srcs:
            with _open(src) as container:
                stream = _video_stream(container, src)
                ctx = stream.codec_context
                tb = _time_base(stream)
                signature = (ctx.codec.canonical_name, ctx.width, ctx.height, tb, ctx.extradata)
                if out_stream is None or first is None:
                    out_stream = out.add_stream_from_template(stream, opaque=True)
                    out_stream.time_base = tb
                    first = signature
                elif signature != first:
                    raise ClipError(
                        f"{_describe(src)}: codec/size/time base/extradata {signature[:4]} differ from the first "
                        f"clip's {first[:4]}; stream copy needs identical encoder settings"
                    )
                packets = list(_packets(container, stream))
                if not packets:
                    raise ClipError(f"{_describe(src)}: no video packets")
                if not reordered:
                    _check_order(packets, _describe(src))
                start = min(_ts(p.pts, "pts") for p in packets)
                end = max(_ts(p.pts, "pts") + _ts(p.duration, "duration") for p in packets)
                delay = start - _ts(packets[0].dts, "dts")  # 0 without B-frames
                for p in packets:
                    p.pts = _ts(p.pts, "pts") - start + offset + delay
                    p.dts = _ts(p.dts, "dts") - start + offset + delay
                    p.stream = out_stream
                    out.mux(p)
                starts.append(float(offset * tb))
                offset += end - start
    finally:
        out.close()
    return starts


def probe_clip(src: Source) -> ProbeResult:
    """Frame table (presentation order) and stream facts from demuxing alone, no decoding."""
    with _open(src) as container:
        stream = _video_stream(container, src)
        ctx = stream.codec_context
        frames = sorted(
            (
                FrameEntry(_ts(p.pts, "pts"), _ts(p.duration, "duration"), bool(p.is_keyframe))
                for p in _packets(container, stream)
            ),
            key=lambda f: f.pts,
        )
        if not frames:
            raise ClipError(f"{_describe(src)}: no video packets")
        tb = _time_base(stream)
        span = frames[-1].pts + frames[-1].duration - frames[0].pts
        return ProbeResult(
            codec=ctx.codec.canonical_name,
            width=ctx.width,
            height=ctx.height,
            pix_fmt=ctx.pix_fmt or "",
            fps=float(_stream_fps(stream)),
            time_base=(tb.numerator, tb.denominator),
            frames=tuple(frames),
            duration_s=float(span * tb),
        )


def _round_div(n: int, d: int) -> int:
    """round(n / d) for d > 0, exactly, with round()'s ties to even (as round(Fraction) does)."""
    q, r = divmod(n, d)
    return q + (2 * r > d or (2 * r == d and q & 1))


class _Indexer:
    """Frame index of a pts: rounding absorbs real files' sub-millisecond drift from k/fps.

    Integer arithmetic only: this runs once or twice per packet, and Fraction arithmetic there
    cost more than the demuxing itself. Results equal round(pts * time_base * fps) exactly.
    """

    def __init__(self, stream: av.video.stream.VideoStream) -> None:
        fps, tb = _stream_fps(stream), _time_base(stream)
        self.fps = fps
        self.start = stream.start_time or 0
        self._num = tb.numerator * fps.numerator  # index = (ts - start) * _num / _den
        self._den = tb.denominator * fps.denominator

    def index(self, ts: int) -> int:
        return _round_div((ts - self.start) * self._num, self._den)

    def pts(self, index: int) -> int:
        return self.start + _round_div(index * self._den, self._num)


def _check_range(src: Source, first_frame: int, num_frames: int) -> None:
    if first_frame < 0 or num_frames < 1:
        raise ClipError(f"{_describe(src)}: bad frame range first_frame={first_frame} num_frames={num_frames}")


def cut_clip(src: Source, first_frame: int, num_frames: int) -> tuple[bytes, ClipInfo]:
    """Stream-copy source frames [first_frame, first_frame+num_frames) into a new mp4 starting at pts 0.

    Plain mp4s are cut by bytes (``mp4cut``: sample tables rewritten, each contiguous run of
    sample data copied at once); anything that cutter refuses goes through PyAV packet by packet. Both take the same
    frames and give the same packets and ClipInfo. Raises ClipError when the range does not
    start on a keyframe or runs past the end: callers re-encode.
    """
    _check_range(src, first_frame, num_frames)
    where = f"{_describe(src)} frames [{first_frame}, {first_frame + num_frames})"
    try:
        return _cut_clip_mp4(src, first_frame, num_frames, where)
    except Mp4CutUnsupported as e:
        log.debug("%s: cutting with PyAV (%s)", where, e)
    return _cut_clip_pyav(src, first_frame, num_frames, where)


_FACTS_CACHE: dict[bytes, tuple[str, int, int, str]] = {}
_FACTS_CACHE_SIZE = 64
# Sample entries whose parameter sets are all in stsd: the stream facts depend on stsd alone.
_OUT_OF_BAND = {b"avc1", b"hvc1", b"av01"}


def _stream_facts(track: Mp4Track, clip: Callable[[], bytes]) -> tuple[str, int, int, str]:
    """(codec, width, height, pix_fmt) as probe_clip reports them, from PyAV's header parse.

    Cached by the stsd bytes, which hold the codec configuration, so a source's episodes pay
    for one header parse per process (not when parameter sets may change in-band: avc3, hev1).
    ``clip`` makes the clip's bytes, only on a cache miss.
    """
    cacheable = track.sample_entry in _OUT_OF_BAND
    facts = _FACTS_CACHE.get(track.stsd) if cacheable else None
    if facts is None:
        data = clip()
        with av.open(io.BytesIO(data)) as container:
            ctx = _video_stream(container, data).codec_context
            facts = (ctx.codec.canonical_name, ctx.width, ctx.height, ctx.pix_fmt or "")
        if cacheable:
            if len(_FACTS_CACHE) >= _FACTS_CACHE_SIZE:
                _FACTS_CACHE.clear()
            _FACTS_CACHE[track.stsd] = facts
    return facts


def _frame_indices(dts: np.ndarray, timescale: int, fps: tuple[int, int]) -> np.ndarray:
    """_Indexer.index of each dts (time base 1/timescale, start 0), vectorised."""
    num, den = fps[0], timescale * fps[1]
    if dts.size and int(dts.max()) * num >= 2**62:
        raise Mp4CutUnsupported("timestamps too large for int64 frame indexing")
    n = dts * num
    q, r = np.divmod(n, den)
    return q + ((2 * r > den) | ((2 * r == den) & (q % 2 == 1)))


def _checked_layout(mp4: Mp4File, first_frame: int, num_frames: int, where: str) -> Mp4Layout:
    """The byte-level cut's checks; Mp4CutUnsupported where the PyAV cut could select other frames."""
    end = first_frame + num_frames
    track = mp4.track
    count = track.num_samples
    # The PyAV cut takes the packets whose rounded frame index is in range. Sample k is frame k
    # here; insist that rounding agrees around the range, else leave the choice to PyAV.
    lo, hi = min(max(first_frame - 1, 0), count - 1), min(end + 1, count)
    if not np.array_equal(_frame_indices(track.dts[lo:hi], track.timescale, track.average_rate()), np.arange(lo, hi)):
        raise Mp4CutUnsupported("timestamps drift more than half a frame from the sample count")
    available = max(0, min(end, count) - first_frame)
    if available < num_frames:
        raise ClipError(f"{where}: source has only {available} of those frames")
    if not track.sync[first_frame]:
        raise ClipError(f"{where}: frame {first_frame} is not a keyframe; stream copy would not decode")
    return mp4.layout(first_frame, num_frames)


def _layout_info(track: Mp4Track, layout: Mp4Layout, facts: tuple[str, int, int, str], first_frame: int) -> ClipInfo:
    codec, width, height, pix_fmt = facts
    fps = track.average_rate()
    frames = tuple(map(FrameEntry, layout.pts.tolist(), layout.durations.tolist(), layout.sync.tolist()))
    return ClipInfo(
        codec=codec,
        width=width,
        height=height,
        pix_fmt=pix_fmt,
        fps=fps[0] / fps[1],
        num_frames=len(frames),
        time_base=(1, track.timescale),
        frames=frames,
        stream_copied=True,
        source_first_frame=first_frame,
    )


def cut_clip_layout(src: Source, first_frame: int, num_frames: int) -> tuple[Mp4Layout, ClipInfo]:
    """``cut_clip``'s byte-level cut as a layout: the new clip's prefix plus source byte ranges.

    For writers that copy the ranges file to file (``os.copy_file_range``) so the clip never
    sits in memory. Raises Mp4CutUnsupported where ``cut_clip`` would go on to PyAV, and
    ClipError where it would refuse.
    """
    _check_range(src, first_frame, num_frames)
    where = f"{_describe(src)} frames [{first_frame}, {first_frame + num_frames})"
    with Mp4File(src) as mp4:
        layout = _checked_layout(mp4, first_frame, num_frames, where)
        facts = _stream_facts(mp4.track, lambda: mp4.cut(first_frame, num_frames).data)
        return layout, _layout_info(mp4.track, layout, facts, first_frame)


def _cut_clip_mp4(src: Source, first_frame: int, num_frames: int, where: str) -> tuple[bytes, ClipInfo]:
    """The byte-level cut, materialised."""
    with Mp4File(src) as mp4:
        layout = _checked_layout(mp4, first_frame, num_frames, where)
        data = mp4.cut(first_frame, num_frames).data
        return data, _layout_info(mp4.track, layout, _stream_facts(mp4.track, lambda: data), first_frame)


def _cut_clip_pyav(src: Source, first_frame: int, num_frames: int, where: str) -> tuple[bytes, ClipInfo]:
    """The packet-by-packet cut: seeks to the keyframe at or before ``first_frame``, demuxes, muxes."""
    end = first_frame + num_frames
    with _open(src) as container:
        stream = _video_stream(container, src)
        ix = _Indexer(stream)
        fps = float(ix.fps)
        container.seek(ix.pts(first_frame), stream=stream, backward=True, any_frame=False)
        packets = []
        for p in _packets(container, stream):
            if p.dts is not None and ix.index(p.dts) >= end:
                break  # dts <= pts and dts only grows: nothing later is in range
            if p.pts is not None and first_frame <= ix.index(p.pts) < end:
                packets.append(p)
        if len(packets) < num_frames:
            raise ClipError(f"{where}: source has only {len(packets)} of those frames")
        _check_order(packets, where)
        if ix.index(_ts(packets[0].pts, "pts")) != first_frame or not packets[0].is_keyframe:
            raise ClipError(f"{where}: frame {first_frame} is not a keyframe; stream copy would not decode")
        buf = io.BytesIO()
        with _open_output(buf) as out:
            out_stream = out.add_stream_from_template(stream, opaque=True)
            out_stream.time_base = stream.time_base
            start = _ts(packets[0].pts, "pts")
            for p in packets:
                p.pts = p.dts = _ts(p.pts, "pts") - start
                p.stream = out_stream
                out.mux(p)
    data = buf.getvalue()
    return data, probe_clip(data).clip_info(stream_copied=True, source_first_frame=first_frame, fps=fps)


# A corrupt packet raises instead of being concealed (FFmpeg's decoders otherwise paint over
# damage and return a plausible wrong picture).
STRICT_DECODE = {"err_detect": "explode"}


def _strict(stream: av.video.stream.VideoStream) -> None:
    """Strict error detection, one thread: an error surfaces at the packet that caused it."""
    ctx = stream.codec_context
    ctx.options = dict(STRICT_DECODE)
    ctx.thread_type = "NONE"
    ctx.thread_count = 1


def decoded_frames(
    src: Source, first_frame: int, num_frames: int, *, boundaries_only: bool = False, label: str | None = None
) -> Iterator[tuple[int, av.VideoFrame]]:
    """Decode source frames [first_frame, first_frame+num_frames) in order with strict error detection.

    Yields (frame index relative to ``first_frame``, frame). ``boundaries_only`` decodes just
    what the first and the last frame need (their GOPs): a cheap check that a cut starts and
    ends on decodable data. Raises ClipError naming the frame whose packet does not decode,
    or the first frame the source lacks; ``label`` names ``src`` in messages.
    """
    _check_range(src, first_frame, num_frames)
    with _open(src) as container:
        stream = _video_stream(container, src)
        yield from _decode_range(
            container, stream, label or _describe(src), first_frame, num_frames, boundaries_only=boundaries_only
        )


def _decode_range(
    container: av.container.InputContainer,
    stream: av.video.stream.VideoStream,
    label: str,
    first_frame: int,
    num_frames: int,
    *,
    boundaries_only: bool = False,
) -> Iterator[tuple[int, av.VideoFrame]]:
    """``decoded_frames`` on an open container (``label`` names it in messages)."""
    end = first_frame + num_frames
    where = f"{label} frames [{first_frame}, {end})"
    _strict(stream)
    ix = _Indexer(stream)
    spans = (
        [(first_frame, first_frame + 1), (end - 1, end)] if boundaries_only and num_frames > 1 else [(first_frame, end)]
    )

    def decode(packet: av.Packet | None) -> list[av.VideoFrame]:
        try:
            return stream.codec_context.decode(packet)
        except av.FFmpegError as e:
            at = (
                "the end of the stream" if packet is None else f"frame {ix.index(_ts(packet.pts, 'pts')) - first_frame}"
            )
            raise ClipError(f"{where}: {at} does not decode ({e}); the source is corrupt") from None

    for lo, hi in spans:
        want = lo
        container.seek(ix.pts(lo), stream=stream, backward=True, any_frame=False)
        packets: Iterator[av.Packet | None] = iter(_packets(container, stream))
        while want < hi:
            packet = next(packets, None)
            if packet is not None:
                _ts(packet.pts, "pts")
                if ix.index(_ts(packet.dts, "dts")) >= hi:
                    packet = None  # dts <= pts and grows: nothing later is in range; flush the decoder
            for frame in decode(packet):
                i = ix.index(_ts(frame.pts, "pts"))
                if want <= i < hi:
                    if i != want:
                        raise ClipError(f"{where}: frame {want - first_frame} is missing (next is {i - first_frame})")
                    yield i - first_frame, frame
                    want += 1
            if packet is None:
                break
        if want < hi:
            raise ClipError(f"{where}: source has only {want - first_frame} of those frames")


def check_decodes(src: Source, first_frame: int, num_frames: int, *, every_frame: bool) -> int:
    """Raise ClipError unless frames [first_frame, +num_frames) decode cleanly; returns frames decoded.

    ``every_frame`` False decodes only the boundary GOPs (see ``decoded_frames``).
    """
    return sum(1 for _ in decoded_frames(src, first_frame, num_frames, boundaries_only=not every_frame))


_REENCODE_PIX_FMT = "yuv420p"


def _fresh_frame(frame: av.VideoFrame, pix_fmt: str) -> av.VideoFrame:
    """A new frame holding only ``frame``'s pixels in ``pix_fmt``: no side data, timestamps or flags.

    Decoded frames come from the decoder's buffer pool with padded line sizes and carry the
    source's side data (its encoder's SEI, for one); none of that may reach the encoder. Pixels
    stay in the decoded YUV (reformatted only when the format differs), so no RGB round trip
    costs accuracy.
    """
    if frame.format.name != pix_fmt:
        frame = frame.reformat(format=pix_fmt)
    return av.VideoFrame.from_ndarray(frame.to_ndarray(), format=pix_fmt)


# Area averaging for the anti-aliased downscale; ACCURATE_RND and BITEXACT make libswscale's
# output independent of the CPU's SIMD paths, so a re-run elsewhere writes the same bytes.
# libswscale's own flag bits (swscale.h, unchanged across FFmpeg releases), passed as a plain int:
# PyAV hands an int to libswscale as is, while its ``Interpolation`` enum names ACCURATE_RND and
# BITEXACT only in releases newer than 15 (LeRobot 0.6 pins av 15), where naming them at import
# broke ``import lerobot_shards.loader``.
SWS_AREA, SWS_ACCURATE_RND, SWS_BITEXACT = 0x20, 0x40000, 0x80000
_SCALE_FLAGS = SWS_AREA | SWS_ACCURATE_RND | SWS_BITEXACT


@functools.cache
def _single_threaded_scale() -> dict[str, int]:
    """``{"threads": 1}`` where PyAV's ``reformat`` takes it (newer PyAV scales on several threads
    unless told not to); ``{}`` on PyAV 15, whose libswscale context is single-threaded already."""
    probe = av.VideoFrame(16, 16, "yuv420p")
    try:
        probe.reformat(width=8, height=8, threads=1)
    except TypeError:
        return {}
    return {"threads": 1}


_BLACK_YUV = (16, 128, 128)  # limited-range black, what decoders turn into RGB (0, 0, 0)


def _planes(frame: av.VideoFrame) -> list[np.ndarray]:
    """The Y, U, V planes of a yuv420p frame as 2-D views without line padding."""
    return [
        np.frombuffer(memoryview(p), np.uint8).reshape(-1, p.line_size)[: p.height, : p.width] for p in frame.planes
    ]


def _from_planes(y: np.ndarray, u: np.ndarray, v: np.ndarray) -> av.VideoFrame:
    """A fresh yuv420p frame (no side data, timestamps or flags) from even-sized planes."""
    h, w = y.shape
    packed = np.concatenate([y.reshape(-1), u.reshape(-1), v.reshape(-1)]).reshape(h * 3 // 2, w)
    return av.VideoFrame.from_ndarray(packed, format=_REENCODE_PIX_FMT)


def transform_frame(frame: av.VideoFrame, t: FrameTransform) -> av.VideoFrame:
    """``frame`` cropped, scaled (area, single-threaded, bit-exact) and padded as ``t`` says, in yuv420p.

    Crop and pad work on the planes at even offsets, so chroma never shifts by half a pixel;
    the frame never leaves YUV, as in ``reencode_clip``.
    """
    if frame.format.name != _REENCODE_PIX_FMT:
        frame = frame.reformat(format=_REENCODE_PIX_FMT)
    if (frame.height, frame.width) != t.source:
        raise ClipError(f"frame is {frame.height}x{frame.width}, the transform expects {t.source}")
    top, left, ch, cw = t.crop
    if (ch, cw) != t.source:
        y, u, v = _planes(frame)
        y = y[top : top + ch, left : left + cw]
        u, v = (p[top // 2 : (top + ch) // 2, left // 2 : (left + cw) // 2] for p in (u, v))
        frame = _from_planes(np.ascontiguousarray(y), np.ascontiguousarray(u), np.ascontiguousarray(v))
    sh, sw = t.scaled
    scaled = frame.reformat(
        width=sw, height=sh, format=_REENCODE_PIX_FMT, interpolation=_SCALE_FLAGS, **_single_threaded_scale()
    )  # a new frame from swscale's output: no side data carried over
    planes = _planes(scaled)
    th, tw = t.size
    if (sh, sw) == (th, tw):
        return _from_planes(*planes)
    out = []
    for i, p in enumerate(planes):
        k = 1 if i == 0 else 2
        canvas = np.full((th // k, tw // k), _BLACK_YUV[i], np.uint8)
        pt, pl = t.pad[0] // k, t.pad[1] // k
        canvas[pt : pt + p.shape[0], pl : pl + p.shape[1]] = p
        out.append(canvas)
    return _from_planes(*out)


def reencode_clip(
    src: Source,
    first_frame: int,
    num_frames: int,
    *,
    codec: str,
    gop: int,
    crf: int,
    threads: int = 0,
    size: tuple[int, int] | None = None,
    resize_mode: str = "pad",
    depth: bool = False,
) -> tuple[bytes, ClipInfo]:
    """Decode source frames [first_frame, first_frame+num_frames) and encode them as a fresh clip.

    For cuts that do not start on a keyframe, or a codec/GOP the training side needs (e.g. H.264
    for NVDEC, which cannot decode AV1 on Hopper). ``threads=1`` gives the same bytes on every
    machine and under any load (x264 with automatic threads does not), as in ``encode_video``.
    The decoder always runs single-threaded, in this thread: no decoder threads run alongside
    the encoder; it detects errors strictly, so a corrupt source packet fails the clip instead of
    being re-encoded as a concealed picture. Frames go from decoder to encoder in YUV (yuv420p),
    copied into fresh frames. ``size`` (height, width) stores the frames at that size
    (``transform_frame``, ``resize_mode`` pad/crop/stretch); the ClipInfo records the transform.

    ``depth``: a depth camera's 12-bit codes, read as gray12le and encoded losslessly as
    ``encode_depth_video`` does (``codec``, ``crf`` and ``size`` do not apply), so every code
    decodes back unchanged: LeRobot's own depth clips hold B-frames, which a stream copy cannot cut.
    """
    if depth and size is not None:
        raise ValueError("reencode_clip: a depth clip is never resized")
    _check_range(src, first_frame, num_frames)
    end = first_frame + num_frames
    where = f"{_describe(src)} frames [{first_frame}, {end})"
    buf = io.BytesIO()
    transform: FrameTransform | None = None
    source_size: tuple[int, int] | None = None
    with _open(src) as container:
        stream = _video_stream(container, src)
        fps = float(_stream_fps(stream))
        enc = (
            _Encoder(buf, fps=fps, codec="hevc", gop=gop, crf=0, pix_fmt=DEPTH_PIX_FMT, threads=1, lossless=True)
            if depth
            else _Encoder(buf, fps=fps, codec=codec, gop=gop, crf=crf, pix_fmt=_REENCODE_PIX_FMT, threads=threads)
        )
        try:
            for i, frame in _decode_range(container, stream, _describe(src), first_frame, num_frames):
                if enc.stream is None:
                    source_size = (frame.height, frame.width)
                    transform = plan_transform(source_size, size, resize_mode) if size is not None else None
                    enc.open(*(transform.size[::-1] if transform is not None else (frame.width, frame.height)))
                elif (frame.height, frame.width) != source_size:
                    raise ClipError(f"{where}: frame {i} changes size to {frame.width}x{frame.height}")
                if depth:
                    enc.encode(_depth_frame(frame.to_ndarray(format=DEPTH_PIX_FMT)))
                elif transform is None:
                    enc.encode(_fresh_frame(frame, _REENCODE_PIX_FMT))
                else:
                    enc.encode(transform_frame(frame, transform))
            enc.finish()
        finally:
            enc.close()
    data = buf.getvalue()
    info = probe_clip(data).clip_info(stream_copied=False, source_first_frame=first_frame, fps=fps, transform=transform)
    return data, info


def decode_frames(
    src: str | Path | bytes, indices: Sequence[int], *, frame_mappings: str | None = None
) -> torch.Tensor:
    """Frames at ``indices`` as uint8 NCHW, decoded by torchcodec like the loader does.

    torchcodec (and with it torch) is imported here, not at module level: the converter never
    decodes, and each of its spawned workers would pay 1-2 s and ~180 MB for the import.
    """
    from .torch_pair import VideoDecoder

    source = str(src) if isinstance(src, (str, os.PathLike)) else bytes(src)
    decoder = VideoDecoder(source, custom_frame_mappings=frame_mappings)
    return decoder.get_frames_at(list(indices)).data
