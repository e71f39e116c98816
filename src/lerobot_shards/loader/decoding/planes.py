"""A clip's frames decoded in order with PyAV, kept as the decoder's YUV 4:2:0 planes.

The frame cache's fills (``frame_fill``) write such frames into entries that hold half the bytes
of RGB (``swscale`` converts them back at each read, as torchcodec does). The planes are the
decoder's output before any conversion, and for the codecs in ``NORMATIVE_CODECS`` that output is
specified bit for bit by the standard: PyAV's FFmpeg and the one torchcodec loads give the same
planes (tests compare the RGB of both). Frames are matched to their indices by pts against the
clip's frame table, as torchcodec's exact mode counts them; a frame that does not match (pts,
size, pixel format, colour space) raises ``PlanesUnsupported`` and the fill starts again in RGB.
"""

from __future__ import annotations

import io
import json
from typing import Any

import av
import numpy as np
from av.sidedata.sidedata import Type as SideDataType

from ...exceptions import LeRobotShardsError
from ..read.sources import ClipRef
from . import swscale

# Codecs whose decoded pictures the standard fixes bit for bit (any conforming decoder gives the
# same planes); MPEG-4 part 2 and older leave the IDCT to the decoder, so their entries stay RGB.
NORMATIVE_CODECS = frozenset({"av1", "h264", "hevc", "vp9"})
FULL_RANGE = 2  # AVCOL_RANGE_JPEG
DISPLAYMATRIX = SideDataType.DISPLAYMATRIX  # FFmpeg >= 7 gives frames the stream's


class PlanesUnsupported(LeRobotShardsError):
    """This clip's frames cannot be kept as YUV (their RGB is then decoded by torchcodec)."""


def frame_table(
    container: Any, stream: Any, frame_mappings: str | None, exact_only: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(pts, is keyframe) of every frame of ``stream``, in presentation order: the clip's recorded
    ``frame_mappings``, else one demux of the file (as torchcodec's exact mode scans it; the
    container is then rewound). ``exact_only``: a file with packets an edit list discards (an
    ``ffmpeg -ss`` stream copy starts at the keyframe before its cut) or without a pts raises
    ``PlanesUnsupported``: torchcodec 0.13 counts and seeks such files' frames otherwise (its
    frame 0 of a clip cut 3 frames after a keyframe is the clip's sixth), which no table here
    repeats."""
    if frame_mappings is not None:
        frames = json.loads(frame_mappings)["frames"]
        pts = np.array([int(f["pts"]) for f in frames], np.int64)
        keys = np.array([bool(f["key_frame"]) for f in frames], bool)
    else:
        packets = list(container.demux(stream))
        if exact_only and any(p.is_discard or (p.pts is None and p.size) for p in packets):  # not the last, empty
            raise PlanesUnsupported("packets discarded by an edit list, or without pts")
        found = [(p.pts, p.is_keyframe) for p in packets if p.pts is not None]
        pts = np.array([p for p, _ in found], np.int64)
        keys = np.array([k for _, k in found], bool)
        container.seek(0, stream=stream)
    order = np.argsort(pts, kind="stable")
    return pts[order], keys[order]


def open_source(clip: ClipRef) -> Any:
    """What PyAV opens for a clip whose bytes are here (a converted clip's, or a local file)."""
    if clip.data is not None:
        return io.BytesIO(clip.data)
    assert clip.url is not None and "://" not in clip.url
    return clip.url


class PlaneReader:
    """Frames ``first``.. of a clip, one at a time in order, as contiguous YUV 4:2:0 bytes."""

    def __init__(self, clip: ClipRef, length: int, threads: int) -> None:
        try:
            self._container = av.open(open_source(clip), "r")
        except (av.FFmpegError, OSError, ValueError) as e:
            raise PlanesUnsupported(f"cannot open ({e})") from None
        try:
            self._open(clip, length, threads)
        except av.FFmpegError as e:  # a damaged file's demux or seek: its RGB decode reports it
            self._container.close()
            raise PlanesUnsupported(f"cannot read ({e})") from None
        except BaseException:
            self._container.close()
            raise

    def _open(self, clip: ClipRef, length: int, threads: int) -> None:
        if not self._container.streams.video:
            raise PlanesUnsupported("no video stream")
        stream = self._stream = self._container.streams.video[0]
        ctx = stream.codec_context
        if ctx is None or ctx.codec is None:  # no decoder for its codec tag (a damaged or exotic file)
            raise PlanesUnsupported("no decoder")
        if ctx.codec.canonical_name not in NORMATIVE_CODECS:  # the format's name, not the decoder's
            raise PlanesUnsupported(f"codec {ctx.codec.canonical_name}")
        stream.thread_type = "SLICE"
        ctx.thread_count = threads
        pts, keys = frame_table(self._container, stream, clip.frame_mappings, exact_only=True)
        first = clip.first_frame
        if first + length > len(pts):
            raise PlanesUnsupported(f"{len(pts)} frames, {first + length} needed")
        self._pts = pts[first : first + length]
        earlier = np.flatnonzero(keys[: first + 1])
        if first > 0:
            if not len(earlier):
                raise PlanesUnsupported(f"no keyframe before frame {first}")
            self._container.seek(int(pts[earlier[-1]]), stream=stream, backward=True, any_frame=False)
        self._frames = self._container.decode(stream)
        self.done = 0
        self._ahead: Any = None
        frame = self._next_frame()
        self.height, self.width = frame.height, frame.width
        self.colorspace = int(frame.colorspace)
        if not swscale.convertible(self.height, self.width):
            raise PlanesUnsupported(f"{frame.format.name} {frame.width}x{frame.height}")
        if not 0 <= self.colorspace <= swscale.MAX_COLORSPACE:
            raise PlanesUnsupported(f"colour space {self.colorspace}")
        self._check(frame)
        if any(data.type == DISPLAYMATRIX for data in frame.side_data):
            # torchcodec rotates such frames (the stream's display matrix) with its filtergraph
            raise PlanesUnsupported(f"rotated {frame.rotation} degrees")
        self._ahead = frame
        self.frame_bytes = swscale.frame_bytes(self.height, self.width)

    def _next_frame(self) -> Any:
        """The next decoded frame at or after the clip's next pts (frames before ``first`` skipped)."""
        want = int(self._pts[self.done])
        try:
            for frame in self._frames:
                if frame.pts is None:
                    raise PlanesUnsupported("a frame without pts")
                if frame.pts < want and self.done == 0:
                    continue  # decoded from the keyframe up to the clip's first frame
                if frame.pts != want:
                    raise PlanesUnsupported(f"frame {self.done}: pts {frame.pts}, the table says {want}")
                return frame
        except av.FFmpegError as e:
            raise PlanesUnsupported(f"frame {self.done}: {e}") from None
        raise PlanesUnsupported(f"the stream ends before frame {self.done}")

    def _check(self, frame: Any) -> None:
        """A frame is kept as YUV only as the clip's first frame was: 8-bit 4:2:0, the same size and
        colour space, and not full range (FFmpeg versions disagree on whether such frames are
        yuv420p or yuvj420p, which swscale converts with other ranges)."""
        if int(frame.color_range) == FULL_RANGE:
            raise PlanesUnsupported(f"frame {self.done}: full range")
        if (frame.format.name, frame.height, frame.width, int(frame.colorspace)) != (
            "yuv420p",
            self.height,
            self.width,
            self.colorspace,
        ):
            raise PlanesUnsupported(
                f"frame {self.done}: {frame.format.name} {frame.width}x{frame.height}, colour space "
                f"{int(frame.colorspace)}, not the clip's yuv420p {self.width}x{self.height}, {self.colorspace}"
            )

    def read_into(self, out: np.ndarray) -> None:
        """The next frame's planes into ``out`` (``frame_bytes``, contiguous): Y, U, V, unpadded."""
        frame, self._ahead = (self._ahead, None) if self._ahead is not None else (self._next_frame(), None)
        self._check(frame)
        h, w = self.height, self.width
        at = 0
        for plane, (ph, pw) in zip(frame.planes, ((h, w), (h // 2, w // 2), (h // 2, w // 2))):
            rows = np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)[:ph, :pw]
            out[at : at + ph * pw].reshape(ph, pw)[...] = rows
            at += ph * pw
        self.done += 1

    def close(self) -> None:
        self._container.close()
