"""Frame cache entries kept as YUV 4:2:0: the planes PyAV decodes, converted by ``swscale`` as
torchcodec converts, are torchcodec's RGB frames bit for bit (every codec kept so, B-frames, a
clip starting mid-file, BT.709 tags, a destination at any alignment); what cannot be kept so is
refused before a frame is written, and a fill that finds out mid-clip starts again in RGB."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch

from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.decoding import planes, swscale
from lerobot_shards.loader.decoding.frame_cache import ALIGN, ENTRIES_DIR, _parse_header
from lerobot_shards.loader.read.sources import ClipRef
from lerobot_shards.torch_pair import VideoDecoder
from lerobot_shards.video import encode_video

FRAMES = 12


def _frames(height: int, width: int) -> list[np.ndarray]:
    """Frames with texture and colour (a flat picture would hide a conversion's rounding)."""
    rng = np.random.default_rng(7)
    base = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    return [np.roll(base, 3 * i, axis=1) // 2 + np.uint8(8 * i) for i in range(FRAMES)]


def _bt709_clip(path: Path, height: int, width: int) -> None:
    """H.264 tagged BT.709 (the others are untagged: BT.601's coefficients)."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=Fraction(30), options={"g": "4", "bf": "0"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.colorspace = 1  # AVCOL_SPC_BT709
        stream.codec_context.color_range = 1
        for i, img in enumerate(_frames(height, width)):
            frame = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuv420p", dst_colorspace=1)
            frame.colorspace, frame.pts = 1, i
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))


def _vp9_clip(path: Path, height: int, width: int) -> None:
    """VP9 in mp4 (libvpx, keyframe every 4 frames)."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libvpx-vp9", rate=Fraction(30), options={"g": "4", "crf": "30", "b": "0"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i, img in enumerate(_frames(height, width)):
            frame = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuv420p")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))


CLIPS: dict[str, Callable[[Path], None]] = {
    "h264": lambda p: encode_video(_frames(48, 96), p, fps=30, codec="h264", gop=4),
    "h264-bframes": lambda p: encode_video(_frames(48, 96), p, fps=30, codec="h264", gop=6, bframes=2),
    "hevc": lambda p: encode_video(_frames(64, 128), p, fps=30, codec="hevc", gop=4),
    "av1": lambda p: encode_video(_frames(48, 64), p, fps=30, codec="av1", gop=4),
    "h264-bt709": lambda p: _bt709_clip(p, 48, 96),
    "vp9": lambda p: _vp9_clip(p, 48, 64),
    # coded 1088 rows, cropped to 1080 by the decoder (the planes' pointers and strides are the crop's)
    "h264-1080p": lambda p: encode_video(_frames(1080, 1920), p, fps=30, codec="h264", gop=4),
    "av1-360p": lambda p: encode_video(_frames(360, 640), p, fps=30, codec="av1", gop=4),
}


def _clip(path: Path, first: int = 0) -> ClipRef:
    return ClipRef(cache_key=str(path), data=None, url=str(path), first_frame=first, frame_mappings=None)


def _planes_rgb(clip: ClipRef, length: int, offset: int = 0) -> np.ndarray:
    """The clip's frames through a ``PlaneReader`` and ``swscale.to_rgb`` (into a destination
    ``offset`` bytes past an aligned one)."""
    reader = planes.PlaneReader(clip, length, threads=1)
    try:
        h, w = reader.height, reader.width
        buf = np.empty(reader.frame_bytes, np.uint8)
        out = []
        for _ in range(length):
            reader.read_into(buf)
            dst = np.empty(h * w * 3 + offset, np.uint8)[offset:]
            swscale.to_rgb(buf, dst, h, w, reader.colorspace)
            out.append(dst.reshape(h, w, 3).copy())
        return np.stack(out)
    finally:
        reader.close()


@pytest.mark.parametrize("kind", sorted(CLIPS))
def test_planes_converted_are_torchcodecs_frames(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"{kind}.mp4"
    CLIPS[kind](path)
    want = VideoDecoder(str(path), dimension_order="NHWC", seek_mode="exact").get_frames_in_range(0, FRAMES).data
    assert np.array_equal(_planes_rgb(_clip(path), FRAMES), want.numpy())
    # a clip that starts mid-file (a raw mp4's later episode): seek to its keyframe, decode forward
    assert np.array_equal(_planes_rgb(_clip(path, first=5), FRAMES - 5), want[5:].numpy())
    # any alignment of the destination (a slab's slot lies where its batch puts it)
    assert np.array_equal(_planes_rgb(_clip(path, first=9), 3, offset=1), want[9:].numpy())
    if kind == "h264-bt709":
        reader = planes.PlaneReader(_clip(path), FRAMES, threads=1)
        assert reader.colorspace == 1
        reader.close()


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: encode_video(_frames(48, 80), p, fps=30, codec="h264"), "80x48"),  # width not a multiple of 32
        (lambda p: encode_video(_frames(48, 96), p, fps=30, codec="h264", pix_fmt="yuv444p"), "yuv444p"),
        (lambda p: _mpeg4(p), "codec mpeg4"),
        (lambda p: _full_range_av1(p), "full range"),  # yuv420p tagged full range: FFmpeg versions differ
    ],
)
def test_what_cannot_be_kept_as_yuv_is_refused_at_open(make: Callable[[Path], None], why: str, tmp_path: Path) -> None:
    path = tmp_path / "clip.mp4"
    make(path)
    with pytest.raises(planes.PlanesUnsupported, match=why):
        planes.PlaneReader(_clip(path), FRAMES, threads=1)


def _remuxed(src: Path, dst: Path, shift_frames: int = 0, rotation: int = 0) -> None:
    """``src``'s packets copied into ``dst``: ``shift_frames`` earlier (an mp4 then holds them
    before its edit list's start, as ``ffmpeg -ss`` stream copies do: demuxed, flagged discard, and
    not decoded), and with a display matrix of ``rotation`` degrees (a phone's, a camera mounted on
    its side)."""
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        stream = inp.streams.video[0]
        copy = out.add_stream_from_template(stream)
        if rotation:
            copy.set_display_rotation(rotation)
        shift = shift_frames * int(1 / (30 * stream.time_base))
        for packet in inp.demux(stream):
            if packet.dts is None:
                continue
            packet.pts, packet.dts, packet.stream = packet.pts - shift, packet.dts - shift, copy
            out.mux(packet)


def test_a_clip_with_frames_an_edit_list_discards_is_refused(tmp_path: Path) -> None:
    """A clip whose first 3 packets lie before its edit list (flagged discard): torchcodec 0.13
    counts its frames from the keyframe after them (its frame 0 is the clip's sixth), a PyAV table
    from the discarded keyframe; matched by pts, a clip starting mid-file (a raw mp4's later
    episode) would be other frames than torchcodec's. Such clips are kept as RGB."""
    src, path = tmp_path / "src.mp4", tmp_path / "cut.mp4"
    encode_video(_frames(48, 96) + _frames(48, 96), src, fps=30, codec="h264", gop=8, threads=1)
    _remuxed(src, path, shift_frames=3)
    for first in (0, 9):
        with pytest.raises(planes.PlanesUnsupported, match="discarded"):
            planes.PlaneReader(_clip(path, first), 4, threads=1)


@pytest.mark.parametrize("degrees", [90, 180])
def test_a_rotated_clip_is_refused(degrees: int, tmp_path: Path) -> None:
    """torchcodec turns the frames of a stream with a display matrix (its filtergraph): its planes
    converted as they are would be other frames (180) or of another shape (90)."""
    if not hasattr(av.video.stream.VideoStream, "set_display_rotation"):
        pytest.skip(f"PyAV {av.__version__} cannot write a display matrix (PyAV >= 16 can)")
    src, path = tmp_path / "src.mp4", tmp_path / "rotated.mp4"
    CLIPS["h264"](src)
    _remuxed(src, path, rotation=degrees)
    frames = VideoDecoder(str(path), dimension_order="NHWC", seek_mode="exact").get_frames_in_range(0, 2).data
    unrotated = VideoDecoder(str(src), dimension_order="NHWC", seek_mode="exact").get_frames_in_range(0, 2).data
    assert not torch.equal(frames, unrotated)  # torchcodec turns them
    with pytest.raises(planes.PlanesUnsupported, match="rotated"):
        planes.PlaneReader(_clip(path), FRAMES, threads=1)


def test_a_damaged_clip_is_refused_or_read_never_another_error(tmp_path: Path) -> None:
    """Bytes flipped or cut anywhere (a codec tag, the index, the frames): opening and reading
    the clip raises ``PlanesUnsupported`` or nothing, so that its fill is made in RGB by
    torchcodec, whose errors the samples report as without the cache (an AttributeError or an
    FFmpeg error from a demux would escape the fill, taking the iteration with it)."""
    src, path = tmp_path / "src.mp4", tmp_path / "bad.mp4"
    encode_video(_frames(48, 96), src, fps=30, codec="h264", gop=4, bframes=2, threads=1)
    data = src.read_bytes()
    tag = data.index(b"avc1")
    rng = np.random.default_rng(0)
    damaged = [data[:tag] + b"xxxx" + data[tag + 4 :]]
    for trial in range(60):
        bad = bytearray(data[: int(rng.integers(0, len(data)))] if trial % 3 == 0 else data)
        for _ in range(0 if trial % 3 == 0 else int(rng.integers(1, 20))):
            bad[int(rng.integers(0, len(bad)))] = int(rng.integers(0, 256))
        damaged.append(bytes(bad))
    for bad in damaged:
        path.write_bytes(bad)
        for first in (0, 5):
            try:
                reader = planes.PlaneReader(_clip(path, first), FRAMES - first, threads=1)
            except planes.PlanesUnsupported:
                continue
            try:
                buf = np.empty(reader.frame_bytes, np.uint8)
                for _ in range(FRAMES - first):
                    reader.read_into(buf)
            except planes.PlanesUnsupported:
                pass
            finally:
                reader.close()


def _full_range_av1(path: Path) -> None:
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libsvtav1", rate=Fraction(30), options={"g": "4"})
        stream.width, stream.height, stream.pix_fmt = 96, 48, "yuv420p"
        stream.codec_context.color_range = 2  # AVCOL_RANGE_JPEG
        for i, img in enumerate(_frames(48, 96)):
            frame = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuv420p")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))


def _mpeg4(path: Path) -> None:
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=Fraction(30))
        stream.width, stream.height, stream.pix_fmt = 96, 48, "yuv420p"
        for i, img in enumerate(_frames(48, 96)):
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))


def _entry_pixels(cache: Path) -> list[str]:
    found = []
    for path in sorted((cache / ENTRIES_DIR).glob("*.frames")):
        with open(path, "rb") as f:
            found.append(_parse_header(f.read(ALIGN), str(path))[1].pixels)
    return found


def _batches(ds: EpisodePoolDataset) -> list[dict[str, Any]]:
    return [
        {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()}
        for b in torch.utils.data.DataLoader(ds, batch_size=4)
    ]


def test_a_fill_finding_its_frames_changed_mid_clip_starts_again_in_rgb(
    synth_factory: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frames found not to be keepable after some were written (here: the reader says so at its
    fourth frame): the partial entry is dropped and the clip filled in RGB, the frames the same."""
    raw = synth_factory(num_episodes=2, length_range=(12, 16), seed=11)
    opts: dict[str, Any] = {"episodes_per_shard": 1, "episode_pool_size": 2, "image_dtype": torch.uint8}
    want = _batches(EpisodePoolDataset(str(raw), **opts))
    read_into = planes.PlaneReader.read_into

    def changing(self: planes.PlaneReader, out: np.ndarray) -> None:
        if self.done == 3:
            raise planes.PlanesUnsupported("frame 3 changes format, size or colour space")
        read_into(self, out)

    monkeypatch.setattr(planes.PlaneReader, "read_into", changing)
    ds = EpisodePoolDataset(str(raw), frame_cache_dir=str(tmp_path), **opts)
    got = _batches(ds)
    assert len(got) == len(want)
    for x, y in zip(want, got):
        for k in x:
            assert torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k], k
    assert _entry_pixels(tmp_path) == ["rgb"] * 4  # 2 episodes x 2 cameras
    assert ds.stats()["total"]["frame_cache_fills"] == 4


def test_a_torchcodec_whose_conversion_is_not_known_here_keeps_rgb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another torchcodec may convert otherwise: its frames are cached as RGB, never converted here."""
    path = tmp_path / "clip.mp4"
    CLIPS["h264"](path)
    monkeypatch.setattr(swscale, "TORCHCODEC_VERSIONS", ("9.9.",))
    swscale.library.cache_clear()
    try:
        assert swscale.library() is None
        with pytest.raises(planes.PlanesUnsupported, match="yuv420p 96x48"):
            planes.PlaneReader(_clip(path), FRAMES, threads=1)
    finally:
        swscale.library.cache_clear()
