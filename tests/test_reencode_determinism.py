"""reencode_clip is byte-deterministic (in one process, and across processes running at once) and
keeps the decoded YUV samples: no RGB round trip between decoder and encoder."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest

from lerobot_shards.synth import paint_identity, read_identity
from lerobot_shards.video import decode_frames, encode_video, reencode_clip
from waits import HANG_GUARD_S

H, W, FPS = 64, 160, 30
EPISODE, LENGTH, SOURCE_GOP = 3, 24, 5
FIRST, COUNT, GOP = 3, 12, 4  # frame 3 is not a keyframe of the source: only a re-encode can start there
CODECS = ("h264", "hevc", "av1")
REPEATS = 3

_CHILD = """
import hashlib, json, sys
from lerobot_shards.video import reencode_clip
src, first, count, gop, repeats = sys.argv[1], *map(int, sys.argv[2:6])
out = {}
for codec in sys.argv[6:]:
    out[codec] = [
        hashlib.sha256(reencode_clip(src, first, count, codec=codec, gop=gop, crf=25, threads=1)[0]).hexdigest()
        for _ in range(repeats)
    ]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reencode") / "source.mp4"
    frames = (paint_identity(EPISODE, i, H, W) for i in range(LENGTH))
    encode_video(frames, path, fps=FPS, codec="h264", gop=SOURCE_GOP, crf=20, threads=1)
    return path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _yuv(src: Path | bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(src) if isinstance(src, bytes) else str(src)) as c:
        return [f.to_ndarray(format="yuv420p").astype(np.int16) for f in c.decode(c.streams.video[0])]


def _rgb_round_trip_reencode(src: Path, codec: str, crf: int) -> bytes:
    """What reencode_clip did before: decode, convert to RGB, encode from RGB."""
    with av.open(str(src)) as c:
        images = [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])][FIRST : FIRST + COUNT]
    buf = io.BytesIO()
    encode_video(images, buf, fps=FPS, codec=codec, gop=GOP, crf=crf, threads=1)
    return buf.getvalue()


def test_same_bytes_in_process_and_across_concurrent_processes(source: Path) -> None:
    expected = {}
    for codec in CODECS:
        hashes = {
            _sha(reencode_clip(source, FIRST, COUNT, codec=codec, gop=GOP, crf=25, threads=1)[0])
            for _ in range(REPEATS)
        }
        assert len(hashes) == 1, f"{codec}: {len(hashes)} different outputs from {REPEATS} in-process runs"
        expected[codec] = hashes.pop()

    args = [sys.executable, "-c", _CHILD, str(source), str(FIRST), str(COUNT), str(GOP), str(REPEATS), *CODECS]
    children = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for child in children:
        out, err = child.communicate(timeout=HANG_GUARD_S)
        assert child.returncode == 0, err
        for codec, hashes in json.loads(out).items():
            assert hashes == [expected[codec]] * REPEATS, f"{codec}: a concurrent process encoded other bytes"


@pytest.mark.parametrize("codec", CODECS)
def test_frames_keep_identity_and_gain_accuracy(source: Path, codec: str) -> None:
    data, info = reencode_clip(source, FIRST, COUNT, codec=codec, gop=GOP, crf=20, threads=1)
    assert not info.stream_copied and info.source_first_frame == FIRST and info.codec == codec
    assert info.num_frames == COUNT and info.key_frame_indices() == list(range(0, COUNT, GOP))
    assert [f.pts for f in info.frames] == [i * 512 for i in range(COUNT)]
    assert info.pix_fmt == "yuv420p"
    assert [read_identity(f) for f in decode_frames(data, range(COUNT))] == [(EPISODE, FIRST + i) for i in range(COUNT)]

    reference = _yuv(source)[FIRST : FIRST + COUNT]
    new = _yuv(data)
    old = _yuv(_rgb_round_trip_reencode(source, codec, crf=20))
    assert len(new) == len(old) == COUNT
    new_err = np.mean([np.abs(a - b).mean() for a, b in zip(new, reference)])
    old_err = np.mean([np.abs(a - b).mean() for a, b in zip(old, reference)])
    assert new_err < old_err, f"{codec}: mean abs error {new_err:.3f} is not below the RGB round trip's {old_err:.3f}"


def test_lossless_h264_reencode_is_exact(source: Path) -> None:
    """x264 at crf 0 is lossless: decoded YUV must equal the source's exactly (RGB lost up to ±7)."""
    data, _ = reencode_clip(source, FIRST, COUNT, codec="h264", gop=GOP, crf=0, threads=1)
    reference = _yuv(source)[FIRST : FIRST + COUNT]
    assert max(int(np.abs(a - b).max()) for a, b in zip(_yuv(data), reference)) == 0
    old = _yuv(_rgb_round_trip_reencode(source, "h264", crf=0))
    assert max(int(np.abs(a - b).max()) for a, b in zip(old, reference)) > 0
