"""Stream-copy cut of one video track out of an MP4 by bytes, without demuxing packets.

Why: cutting an episode with PyAV demuxes and muxes every packet in Python, which costs far
more than copying the same bytes. An episode of a LeRobot mp4 is a run of samples that the
sample tables locate exactly, and usually one contiguous byte range of the file. So this
module reads the source's moov, copies the sample bytes with one read per contiguous byte range
and writes a new minimal MP4 whose tables it builds itself: ftyp, moov, then mdat (faststart),
no edit list (decoders disagree about edit lists; torchcodec < 0.15 miscounts frames with them),
no creation times (the same cut gives the same bytes), stsd copied verbatim so the codec
configuration (avcC/hvcC/av1C) is untouched.

Only the simple files LeRobot writes are handled: one video track, progressive (not
fragmented), samples in presentation order. Anything else raises ``Mp4CutUnsupported`` so the
caller can fall back to the PyAV cut; this module never guesses.
"""

from __future__ import annotations

import io
import math
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Union

import numpy as np

from .exceptions import LeRobotShardsError

Mp4Source = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, BinaryIO]

# Sample entries whose codec configuration lives in the sample entry (avcC, hvcC, av1C).
SAMPLE_ENTRIES = {b"avc1": "h264", b"avc3": "h264", b"hvc1": "hevc", b"hev1": "hevc", b"av01": "av1"}
_BRANDS = {"h264": b"avc1", "av1": b"av01"}  # the codec brand FFmpeg's mp4 muxer adds to ftyp
MOVIE_TIMESCALE = 1000  # mvhd/tkhd time scale, as FFmpeg writes it
_UNITY_MATRIX = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)
# Boxes that carry nothing the cut needs (metadata, padding, hints for players): skipped.
_IGNORED = {b"free", b"skip", b"udta", b"meta", b"iods", b"uuid", b"wide", b"sdtp", b"cslg"}


class Mp4CutUnsupported(LeRobotShardsError):
    """The source uses an MP4 feature this byte-level cutter does not handle: use the PyAV cut."""


@dataclass(frozen=True)
class Mp4Track:
    """The one video track of a source: what writing a cut needs, sample tables as int64 arrays."""

    codec: str  # "h264", "hevc" or "av1", from the sample entry's type
    sample_entry: bytes  # four-character type of the stsd entry (avc1, hvc1, av01, ...)
    stsd: bytes  # the whole stsd box, copied verbatim into every cut
    timescale: int  # media time scale (mdhd); the stream time base is 1/timescale
    language: int  # mdhd packed ISO-639 code
    display: bytes  # tkhd matrix, width and height (44 bytes): rotation and display size
    offsets: np.ndarray  # file offset of each sample, decode order
    sizes: np.ndarray
    durations: np.ndarray  # from stts, in timescale units
    dts: np.ndarray  # start of each sample, first sample at 0
    sync: np.ndarray  # bool: stss says it is a sync sample (all True without stss)
    composition_offset: int = 0  # ctts's one offset (pts - dts before an edit list), 0 without ctts

    @property
    def num_samples(self) -> int:
        return len(self.sizes)

    def average_rate(self) -> tuple[int, int]:
        """Frame rate as FFmpeg's mov demuxer reports it (avg_frame_rate): samples per total duration.

        Exact (reduced) or Mp4CutUnsupported when FFmpeg would have to approximate, so callers
        compute frame indices exactly as the PyAV cut does.
        """
        num, den = self.timescale * self.num_samples, int(self.durations.sum())
        g = math.gcd(num, den)
        num, den = num // g, den // g
        if max(num, den) > 2**31 - 1:
            raise Mp4CutUnsupported(f"frame rate {num}/{den} does not reduce exactly")
        return num, den


class _Reader:
    """Positioned reads on a path, bytes or a binary file-like object (e.g. an fsspec file).

    A local file is memory-mapped: ``view`` then hands out slices of the page cache, so the
    sample bytes are copied once, straight into the output clip (a read() into a fresh buffer
    and a second copy into the clip cost three times as much). A file-like object is read
    with seek/read and its position is restored on close, so a fallback reader starts where
    the caller left it.
    """

    def __init__(self, src: Mp4Source) -> None:
        self._file: BinaryIO | None = None
        self._mmap: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._restore = 0
        if isinstance(src, (bytes, bytearray, memoryview)):
            self._view = memoryview(src).cast("B")
        elif isinstance(src, (str, os.PathLike)):
            with open(src, "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    raise Mp4CutUnsupported("empty file")
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._view = memoryview(self._mmap)
        else:
            self._file = src
            self._restore = src.tell()
            self.size = src.seek(0, io.SEEK_END)
        if self._view is not None:
            self.size = len(self._view)

    def view(self, offset: int, size: int) -> bytes | memoryview:
        """``size`` bytes at ``offset``; a memoryview (no copy) is valid until it is released or close()."""
        if offset < 0 or size < 0 or offset + size > self.size:
            raise Mp4CutUnsupported(f"read of {size} bytes at {offset} runs past the end ({self.size} bytes)")
        if self._view is not None:
            return self._view[offset : offset + size]
        assert self._file is not None
        self._file.seek(offset)
        data = self._file.read(size)
        while len(data) < size:  # some remote files return short reads
            more = self._file.read(size - len(data))
            if not more:
                raise Mp4CutUnsupported(f"file ended after {offset + len(data)} bytes")
            data += more
        return data

    def read(self, offset: int, size: int) -> bytes:
        return bytes(self.view(offset, size))

    def close(self) -> None:
        if self._view is not None:
            self._view.release()
        if self._mmap is not None:
            self._mmap.close()
        if self._file is not None:
            self._file.seek(self._restore)

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _boxes(buf: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, box end) of the boxes in buf[start:end]."""
    pos = start
    while pos < end:
        if pos + 8 > end:
            raise Mp4CutUnsupported(f"truncated box header at {pos}")
        size, kind = struct.unpack_from(">I4s", buf, pos)
        header = 8
        if size == 1:
            size, header = struct.unpack_from(">Q", buf, pos + 8)[0], 16
        elif size == 0:
            size = end - pos
        if size < header or pos + size > end:
            raise Mp4CutUnsupported(f"box {kind!r} at {pos} has a bad size {size}")
        yield kind, pos + header, pos + size
        pos += size


def _children(
    buf: bytes, start: int, end: int, required: set[bytes], optional: set[bytes]
) -> dict[bytes, tuple[int, int]]:
    """Child boxes by type; refuses duplicates, missing required ones and unknown types."""
    found: dict[bytes, tuple[int, int]] = {}
    for kind, s, e in _boxes(buf, start, end):
        if kind in _IGNORED:
            continue
        if kind not in required | optional:
            raise Mp4CutUnsupported(f"unexpected box {kind.decode('latin-1')!r}")
        if kind in found:
            raise Mp4CutUnsupported(f"more than one {kind.decode('latin-1')!r} box (several tracks?)")
        found[kind] = (s, e)
    missing = required - found.keys()
    if missing:
        raise Mp4CutUnsupported(f"missing boxes {sorted(k.decode('latin-1') for k in missing)}")
    return found


def _table(buf: bytes, pos: int, count: int, fmt: str, width: int) -> np.ndarray:
    """``count`` big-endian rows of ``width`` unsigned ints starting at ``pos``, as int64."""
    itemsize = np.dtype(fmt).itemsize
    if pos + count * width * itemsize > len(buf):
        raise Mp4CutUnsupported("sample table runs past its box")
    rows = np.frombuffer(buf, dtype=fmt, count=count * width, offset=pos).astype(np.int64)
    return rows.reshape(count, width) if width > 1 else rows


def _full_box(buf: bytes, s: int) -> tuple[int, int]:
    """(version, flags) of a full box whose payload starts at ``s``."""
    head = struct.unpack_from(">I", buf, s)[0]
    return head >> 24, head & 0xFFFFFF


def _find_moov(reader: _Reader) -> bytes:
    """Walk the top-level boxes (headers only) up to moov and return moov's payload."""
    pos = 0
    while pos + 8 <= reader.size:
        head = reader.read(pos, min(16, reader.size - pos))
        size, kind = struct.unpack_from(">I4s", head)
        header = 8
        if size == 1:
            if len(head) < 16:
                raise Mp4CutUnsupported("truncated top-level box header")
            size, header = struct.unpack_from(">Q", head, 8)[0], 16
        elif size == 0:
            size = reader.size - pos
        if size < header:
            raise Mp4CutUnsupported(f"top-level box {kind!r} has a bad size {size}")
        if kind == b"moov":
            return reader.read(pos + header, size - header)
        if kind not in {b"ftyp", b"mdat", b"free", b"skip", b"wide", b"uuid", b"meta", b"pdin"}:
            raise Mp4CutUnsupported(f"top-level box {kind.decode('latin-1')!r} (fragmented or not a plain mp4)")
        pos += size
    raise Mp4CutUnsupported("no moov box")


def _parse_moov(moov: bytes, file_size: int) -> Mp4Track:
    """The only track's tables; every count bounded by the bytes holding it before an array is made
    (a constant-size stsz's count by the file's size: 12 bytes edited asked for 32 GiB)."""
    top = _children(moov, 0, len(moov), {b"mvhd", b"trak"}, set())  # mvex (fragments) is refused here
    version, _ = _full_box(moov, top[b"mvhd"][0])
    movie_timescale = struct.unpack_from(">I", moov, top[b"mvhd"][0] + (20 if version == 1 else 12))[0]
    trak = _children(moov, *top[b"trak"], {b"tkhd", b"mdia"}, {b"edts"})
    s, _ = trak[b"tkhd"]
    display = moov[s + (52 if _full_box(moov, s)[0] == 1 else 40) :][:44]
    if len(display) != 44:
        raise Mp4CutUnsupported("truncated tkhd")
    mdia = _children(moov, *trak[b"mdia"], {b"mdhd", b"hdlr", b"minf"}, set())
    s, _ = mdia[b"mdhd"]
    if _full_box(moov, s)[0] == 1:
        timescale, media_duration, language = struct.unpack_from(">IQH", moov, s + 20)
    else:
        timescale, media_duration, language = struct.unpack_from(">IIH", moov, s + 12)
    if timescale == 0:
        raise Mp4CutUnsupported("media time scale is 0")
    if moov[mdia[b"hdlr"][0] + 8 : mdia[b"hdlr"][0] + 12] != b"vide":
        raise Mp4CutUnsupported("the only track is not a video track")
    minf = _children(moov, *mdia[b"minf"], {b"dinf", b"stbl"}, {b"vmhd"})
    _check_self_contained(moov, *minf[b"dinf"])
    stbl = _children(moov, *minf[b"stbl"], {b"stsd", b"stts", b"stsc", b"stsz"}, {b"stss", b"ctts", b"stco", b"co64"})
    if (b"stco" in stbl) == (b"co64" in stbl):
        raise Mp4CutUnsupported("needs exactly one of stco/co64")

    s, e = stbl[b"stsd"]
    if struct.unpack_from(">I", moov, s + 4)[0] != 1:
        raise Mp4CutUnsupported("stsd holds more than one sample description")
    entry = moov[s + 12 : s + 16]
    if entry not in SAMPLE_ENTRIES:
        raise Mp4CutUnsupported(f"sample entry {entry!r} is not one of {sorted(SAMPLE_ENTRIES)}")
    stsd = struct.pack(">I4s", e - s + 8, b"stsd") + moov[s:e]  # payload verbatim, header always 32-bit

    s, _ = stbl[b"stsz"]
    sample_size, n = struct.unpack_from(">II", moov, s + 4)
    if sample_size and n * sample_size > file_size:
        raise Mp4CutUnsupported(f"stsz: {n} samples of {sample_size} bytes, more than the file's {file_size} bytes")
    sizes = np.full(n, sample_size, np.int64) if sample_size else _table(moov, s + 12, n, ">u4", 1)
    if n == 0:
        raise Mp4CutUnsupported("no samples")

    s, _ = stbl[b"stts"]
    stts = _table(moov, s + 8, struct.unpack_from(">I", moov, s + 4)[0], ">u4", 2)
    if stts[:, 0].sum() != n or (stts[:, 1] == 0).any() or (stts[:, 1] >= 2**31).any():
        raise Mp4CutUnsupported("stts does not give every sample a positive duration")
    durations = np.repeat(stts[:, 1], stts[:, 0])
    dts = np.concatenate(([0], np.cumsum(durations)[:-1]))

    ctts_shift = 0
    if b"ctts" in stbl:  # composition offsets: harmless only when constant (pts = dts + shift)
        s, _ = stbl[b"ctts"]
        ctts = _table(moov, s + 8, struct.unpack_from(">I", moov, s + 4)[0], ">u4", 2)
        if ctts[:, 0].sum() != n or len(np.unique(ctts[:, 1])) > 1:
            raise Mp4CutUnsupported("ctts reorders frames (B-frames)")
        ctts_shift = int(ctts[0, 1]) if len(ctts) else 0
        if ctts_shift >= 2**31:
            raise Mp4CutUnsupported("negative composition offset")
    if b"edts" in trak:
        _check_edit_list(moov, *trak[b"edts"], ctts_shift, media_duration, timescale, movie_timescale)

    if b"stss" in stbl:
        s, _ = stbl[b"stss"]
        numbers = _table(moov, s + 8, struct.unpack_from(">I", moov, s + 4)[0], ">u4", 1)
        if ((numbers < 1) | (numbers > n)).any():
            raise Mp4CutUnsupported("stss names samples that do not exist")
        sync = np.zeros(n, bool)
        sync[numbers - 1] = True
    else:
        sync = np.ones(n, bool)

    return Mp4Track(
        codec=SAMPLE_ENTRIES[entry],
        sample_entry=entry,
        stsd=stsd,
        timescale=timescale,
        language=language,
        display=display,
        offsets=_sample_offsets(moov, stbl, sizes),
        sizes=sizes,
        durations=durations,
        dts=dts,
        sync=sync,
        composition_offset=ctts_shift,
    )


def _check_self_contained(buf: bytes, start: int, end: int) -> None:
    """The samples must be in this file: one dref entry, a 'url ' with the self-contained flag."""
    dinf = _children(buf, start, end, {b"dref"}, set())
    s, e = dinf[b"dref"]
    if struct.unpack_from(">I", buf, s + 4)[0] != 1:
        raise Mp4CutUnsupported("dref has more than one data reference")
    kind, es, _ = next(_boxes(buf, s + 8, e))
    if kind != b"url " or not _full_box(buf, es)[1] & 1:
        raise Mp4CutUnsupported("samples live in another file (dref)")


def _check_edit_list(
    buf: bytes, start: int, end: int, ctts_shift: int, media_duration: int, timescale: int, movie_timescale: int
) -> None:
    """Accept only an edit list that changes nothing: one edit, at the first frame, at rate 1, to the end."""
    edts = _children(buf, start, end, set(), {b"elst"})
    if b"elst" not in edts:
        return
    s, _ = edts[b"elst"]
    version, _ = _full_box(buf, s)
    count = struct.unpack_from(">I", buf, s + 4)[0]
    if count == 0:
        return
    if count > 1:
        raise Mp4CutUnsupported(f"edit list with {count} edits")
    if version == 1:
        segment, media_time, rate = struct.unpack_from(">QqI", buf, s + 8)
    else:
        segment, media_time, rate = struct.unpack_from(">IiI", buf, s + 8)
    # The segment may be rounded down to the movie time scale: allow one movie tick short. FFmpeg
    # reads a duration of 0 as an empty edit (one frame), not as "everything".
    whole = segment > 0 and (segment + 1) * timescale >= media_duration * movie_timescale
    if media_time != ctts_shift or rate != 0x10000 or not whole:
        raise Mp4CutUnsupported(f"edit list shifts or trims the media (media_time={media_time}, segment={segment})")


def _sample_offsets(buf: bytes, stbl: dict[bytes, tuple[int, int]], sizes: np.ndarray) -> np.ndarray:
    """File offset of every sample from stsc (samples per chunk) and stco/co64 (chunk offsets)."""
    if b"stco" in stbl:
        s, _ = stbl[b"stco"]
        chunks = _table(buf, s + 8, struct.unpack_from(">I", buf, s + 4)[0], ">u4", 1)
    else:
        s, _ = stbl[b"co64"]
        chunks = _table(buf, s + 8, struct.unpack_from(">I", buf, s + 4)[0], ">u8", 1)
    s, _ = stbl[b"stsc"]
    stsc = _table(buf, s + 8, struct.unpack_from(">I", buf, s + 4)[0], ">u4", 3)
    if len(stsc) == 0 or stsc[0, 0] != 1 or (np.diff(stsc[:, 0]) <= 0).any() or stsc[-1, 0] > len(chunks):
        raise Mp4CutUnsupported("stsc does not map samples to chunks")
    if (stsc[:, 2] != 1).any():
        raise Mp4CutUnsupported("samples refer to another sample description")
    runs = np.diff(np.append(stsc[:, 0], len(chunks) + 1))  # chunks covered by each stsc entry
    per_chunk = np.repeat(stsc[:, 1], runs)
    if per_chunk.sum() != len(sizes):
        raise Mp4CutUnsupported("stsc and stsz disagree about the number of samples")
    chunk_of = np.repeat(np.arange(len(chunks)), per_chunk)
    before = np.concatenate(([0], np.cumsum(sizes)[:-1]))  # bytes of all earlier samples
    chunk_first = np.concatenate(([0], np.cumsum(per_chunk)[:-1]))  # first sample of each chunk
    return chunks[chunk_of] + before - before[chunk_first[chunk_of]]


# --- writing ---------------------------------------------------------------------------------


def _box(kind: bytes, *parts: bytes) -> bytes:
    payload = b"".join(parts)
    return struct.pack(">I4s", 8 + len(payload), kind) + payload


def _full(kind: bytes, version: int, flags: int, *parts: bytes) -> bytes:
    return _box(kind, struct.pack(">I", version << 24 | flags), *parts)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _runs(values: np.ndarray) -> np.ndarray:
    """Run-length encoding as rows (count, value), the layout of stts."""
    starts = np.concatenate(([0], np.flatnonzero(np.diff(values)) + 1))
    counts = np.diff(np.append(starts, len(values)))
    return np.stack([counts, values[starts]], axis=1)


def _moov(track: Mp4Track, sizes: np.ndarray, durations: np.ndarray, sync: np.ndarray, chunk_offset: int) -> bytes:
    """moov for one chunk holding ``len(sizes)`` samples at ``chunk_offset``: no edts, times 0."""
    n = len(sizes)
    media = int(durations.sum())
    movie = _ceil_div(media * MOVIE_TIMESCALE, track.timescale)
    v_media, v_movie = int(media >= 2**32), int(movie >= 2**32)
    times = "QQ" if v_movie else "II"  # creation and modification times, always 0
    mvhd = _full(
        b"mvhd",
        v_movie,
        0,
        struct.pack(f">{times}I{'Q' if v_movie else 'I'}IH10x", 0, 0, MOVIE_TIMESCALE, movie, 0x10000, 0x100),
        _UNITY_MATRIX,
        bytes(24),
        struct.pack(">I", 2),
    )
    tkhd = _full(
        b"tkhd",
        v_movie,
        3,  # enabled, in movie
        struct.pack(f">{times}II{'Q' if v_movie else 'I'}8xhhhH", 0, 0, 1, 0, movie, 0, 0, 0, 0),
        track.display,
    )
    mdhd = _full(
        b"mdhd",
        v_media,
        0,
        struct.pack(
            f">{'QQ' if v_media else 'II'}I{'Q' if v_media else 'I'}HH", 0, 0, track.timescale, media, track.language, 0
        ),
    )
    hdlr = _full(b"hdlr", 0, 0, struct.pack(">I4s12x", 0, b"vide"), b"VideoHandler\0")
    vmhd = _full(b"vmhd", 0, 1, bytes(8))
    dinf = _box(b"dinf", _full(b"dref", 0, 0, struct.pack(">I", 1), _full(b"url ", 0, 1)))
    stts = _runs(durations)
    stbl_parts = [track.stsd, _full(b"stts", 0, 0, struct.pack(">I", len(stts)), stts.astype(">u4").tobytes())]
    if not sync.all():
        keys = np.flatnonzero(sync) + 1
        stbl_parts.append(_full(b"stss", 0, 0, struct.pack(">I", len(keys)), keys.astype(">u4").tobytes()))
    if (sizes == sizes[0]).all():
        stbl_parts.append(_full(b"stsz", 0, 0, struct.pack(">II", int(sizes[0]), n)))
    else:
        stbl_parts.append(_full(b"stsz", 0, 0, struct.pack(">II", 0, n), sizes.astype(">u4").tobytes()))
    stbl_parts.append(_full(b"stsc", 0, 0, struct.pack(">IIII", 1, 1, n, 1)))
    stbl_parts.append(_full(b"stco", 0, 0, struct.pack(">II", 1, chunk_offset)))
    minf = _box(b"minf", vmhd, dinf, _box(b"stbl", *stbl_parts))
    return _box(b"moov", mvhd, _box(b"trak", tkhd, _box(b"mdia", mdhd, hdlr, minf)))


def _ftyp(codec: str) -> bytes:
    brands = [b"isom", b"iso2", *([_BRANDS[codec]] if codec in _BRANDS else []), b"mp41"]
    return _box(b"ftyp", b"isom", struct.pack(">I", 0x200), *brands)


@dataclass(frozen=True)
class Mp4Clip:
    """A cut: the mp4 bytes and its frame table (pts from 0, decode = presentation order)."""

    data: bytes
    pts: np.ndarray
    durations: np.ndarray
    sync: np.ndarray


@dataclass(frozen=True)
class Mp4Layout:
    """A cut described, not copied: ``prefix`` (ftyp, moov, mdat header) then source byte ranges.

    The clip's bytes are ``prefix`` followed by the bytes at each (source offset, size) of
    ``ranges``, in order; ``size`` is known before any sample byte is read, so a writer can copy
    the ranges file to file (``os.copy_file_range``) without the clip ever being in memory.
    Frame table as in Mp4Clip.
    """

    prefix: bytes
    ranges: tuple[tuple[int, int], ...]
    pts: np.ndarray
    durations: np.ndarray
    sync: np.ndarray

    @property
    def size(self) -> int:
        return len(self.prefix) + sum(size for _, size in self.ranges)


class Mp4File:
    """An open source mp4 with its parsed track; ``cut`` copies sample ranges out of it.

    Parsing and cutting are separate so the caller can check the frame range (keyframe, length)
    against ``track`` before any sample byte is read.
    """

    def __init__(self, src: Mp4Source) -> None:
        try:
            self._reader = _Reader(src)
        except (OSError, ValueError) as e:  # missing, unreadable or unmappable: PyAV reports it its way
            raise Mp4CutUnsupported(f"cannot open the source: {e}") from e
        try:
            self.track = _parse_moov(_find_moov(self._reader), self._reader.size)
        except (struct.error, ValueError, IndexError, StopIteration) as e:  # malformed: let PyAV judge it
            self._reader.close()
            raise Mp4CutUnsupported(f"cannot parse the mp4: {e}") from e
        except BaseException:
            self._reader.close()
            raise

    def layout(self, first: int, count: int) -> Mp4Layout:
        """Samples [first, first+count) as a new faststart mp4, described as prefix + source ranges.

        One range per run of samples that lie back to back in the source (usually one for the
        whole clip). No sample byte is read; ranges are checked against the source's size.
        """
        track = self.track
        if first < 0 or count < 1 or first + count > track.num_samples:
            raise ValueError(f"samples [{first}, {first + count}) not in [0, {track.num_samples})")
        end = first + count
        offsets, sizes = track.offsets[first:end], track.sizes[first:end]
        durations, sync = track.durations[first:end], track.sync[first:end]
        if not sizes.all():
            raise Mp4CutUnsupported("empty samples (demuxers drop them)")
        payload = int(sizes.sum())
        ftyp = _ftyp(track.codec)
        moov_size = len(_moov(track, sizes, durations, sync, 0))  # stco's size does not depend on the offset
        if payload + 8 < 2**32:
            mdat_header = struct.pack(">I4s", 8 + payload, b"mdat")
        else:
            mdat_header = struct.pack(">I4sQ", 1, b"mdat", 16 + payload)
        prefix = b"".join(
            [ftyp, _moov(track, sizes, durations, sync, len(ftyp) + moov_size + len(mdat_header)), mdat_header]
        )
        breaks = np.flatnonzero(offsets[1:] != offsets[:-1] + sizes[:-1]) + 1
        bounds = np.concatenate(([0], breaks, [count])).tolist()
        ranges = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            start = int(offsets[a])
            size = int(offsets[b - 1] + sizes[b - 1]) - start
            if start < 0 or start + size > self._reader.size:
                raise Mp4CutUnsupported(
                    f"read of {size} bytes at {start} runs past the end ({self._reader.size} bytes)"
                )
            ranges.append((start, size))
        pts = np.concatenate(([0], np.cumsum(durations)[:-1]))
        return Mp4Layout(prefix=prefix, ranges=tuple(ranges), pts=pts, durations=durations, sync=sync)

    def cut(self, first: int, count: int) -> Mp4Clip:
        """Samples [first, first+count) as a new faststart mp4, one read per contiguous byte run."""
        layout = self.layout(first, count)
        views: list[bytes | memoryview] = []
        try:
            for start, size in layout.ranges:
                views.append(self._reader.view(start, size))
            data = b"".join([layout.prefix, *views])  # the only copy of the sample bytes
        finally:  # a memory map cannot close while slices of it are alive
            for v in views:
                if isinstance(v, memoryview):
                    v.release()
        return Mp4Clip(data=data, pts=layout.pts, durations=layout.durations, sync=layout.sync)

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> Mp4File:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
