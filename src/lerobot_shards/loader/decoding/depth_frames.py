"""A depth camera's clip decoded by frame index with PyAV, as 12-bit codes.

torchcodec converts every frame to 8-bit RGB (a gray12le frame comes back as uint8, its low
bits gone), so depth clips are decoded as LeRobot 0.6.1 decodes them: PyAV, each frame read
out as ``gray12le`` (uint16 codes, 0..4095). A frame is found by its index in presentation
order, as torchcodec's exact mode counts them: the clip's frame table (a converted clip's
recorded ``frame_mappings``, else one demux of the file, as torchcodec's exact mode scans it)
gives each frame's pts and the keyframe to seek to; decoding goes forward from there (from where
the last call stopped when that is no further back), the way LeRobot's PyAV path seeks and
decodes forward.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import av
import numpy as np
import torch

from ...depth import DEPTH_PIX_FMT
from .planes import frame_table


class DepthClip:
    """One open depth clip (``source``: bytes, a path, or a readable file object)."""

    def __init__(self, source: Any, frame_mappings: str | None) -> None:
        self._container: av.container.InputContainer = av.open(
            io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source, "r"
        )
        try:
            self._stream = self._container.streams.video[0]
            self._stream.thread_type = "SLICE"  # no frame threads: a seek then never waits on queued frames
            self.pts, self._keys = frame_table(self._container, self._stream, frame_mappings)
        except Exception:
            self._container.close()
            raise
        self._frames: Any = None  # the decode generator, positioned after ``self._last``
        self._last: int | None = None  # pts of the last frame decoded

    def codes(self, indices: Sequence[int]) -> torch.Tensor:
        """Frames ``indices`` (of the clip) as uint16 12-bit codes (N, 1, H, W), in the order asked."""
        n = len(self.pts)
        bad = [int(i) for i in indices if not 0 <= int(i) < n]
        if bad:
            raise IndexError(f"frame(s) {bad} out of range: the clip holds {n} frames")
        wanted = {int(self.pts[int(i)]) for i in indices}
        got: dict[int, np.ndarray] = {}
        for i in sorted({int(i) for i in indices}):
            target = int(self.pts[i])
            if target in got:
                continue
            key = int(self.pts[np.flatnonzero(self._keys[: i + 1])[-1]]) if self._keys[: i + 1].any() else None
            if self._last is None or self._last >= target or (key is not None and key > self._last):
                self._seek(key)
            got.update(self._decode_to(target, wanted))
        return torch.from_numpy(np.stack([got[int(self.pts[int(i)])] for i in indices])[:, None])

    def _seek(self, key: int | None) -> None:
        self._container.seek(0 if key is None else key, stream=self._stream, backward=True, any_frame=False)
        self._frames = self._container.decode(self._stream)
        self._last = None

    def _decode_to(self, target: int, wanted: set[int]) -> dict[int, np.ndarray]:
        """Decode forward to the frame at pts ``target``: the wanted frames on the way."""
        got: dict[int, np.ndarray] = {}
        for frame in self._frames:
            if frame.pts is None:
                continue
            self._last = int(frame.pts)
            if self._last in wanted:
                got[self._last] = frame.to_ndarray(format=DEPTH_PIX_FMT)
            if self._last >= target:
                break
        if target not in got:
            self._last = None  # the generator may be spent: seek again next time
            raise ValueError(f"no frame at pts {target} after seeking to its keyframe")
        return got

    def close(self) -> None:
        self._container.close()
