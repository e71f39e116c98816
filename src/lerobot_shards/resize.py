"""Training-resolution geometry: parse ``--resize`` targets and plan each camera's crop/scale/pad.

Policies train on small frames (pi0-style models pad to 224x224, diffusion policies crop to
84-96 px), and decoding a 480p frame only to throw most of it away bounds the input pipeline.
The converter stores clips at the training size and the loader can resize at decode time; both
plan the same ``FrameTransform`` here. Pure: no pixels, no I/O.

Every size and offset the plan produces is even, so 4:2:0 chroma planes crop and pad exactly
(no half-pixel chroma shift) and every encoder accepts the stored size.
"""

from __future__ import annotations

import copy
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .format import RESIZE_MODES, FrameTransform

DEFAULT_MODE = "pad"
FILTER = "area"  # libswscale's area averaging: the anti-aliased downscale
MAX_SIDE = 8192  # pixels a side: beyond 8K video (7680x4320) a size is a typo, not a training resolution
_SIZE_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def parse_size(text: str) -> tuple[int, int]:
    """(height, width) from ``WIDTHxHEIGHT`` (``224x224``, ``320x240``), as FFmpeg and ``inspect`` write sizes."""
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"cannot read {text!r} as a size: write WIDTHxHEIGHT, e.g. 224x224")
    width, height = int(m.group(1)), int(m.group(2))
    check_size((height, width), text)
    return height, width


def check_size(size: Sequence[int], what: str = "") -> None:
    """Stored sizes must be even and positive: 4:2:0 video has half-size chroma planes. Ints only
    (2.5 would be truncated silently, True is not a size), and at most ``MAX_SIDE``: a typo such
    as 10**6 would otherwise pass and allocate terabytes at the first frame."""
    if len(size) != 2 or any(
        isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 2 <= v <= MAX_SIDE or v % 2 for v in size
    ):
        label = f"{what!r}: " if what else ""
        raise ValueError(
            f"{label}resize size {tuple(size)} (height, width) must be two even numbers >= 2 and <= {MAX_SIDE} (ints)"
        )


def check_mode(mode: str) -> None:
    if mode not in RESIZE_MODES:
        raise ValueError(f"resize mode {mode!r} is not one of {', '.join(RESIZE_MODES)}")


def parse_resize(values: Iterable[str]) -> dict[str, tuple[int, int]]:
    """``--resize`` values: ``224x224`` for every camera (key ``"*"``) or ``CAMERA=224x224`` for one."""
    out: dict[str, tuple[int, int]] = {}
    for value in values:
        camera, sep, size = value.rpartition("=")
        key = camera.strip() if sep else "*"
        if sep and not key:
            raise ValueError(f"--resize {value!r}: empty camera name before '='")
        if key in out:
            raise ValueError(f"--resize given twice for {'all cameras' if key == '*' else key}")
        out[key] = parse_size(size)
    return out


def camera_sizes(
    resize: Mapping[str, Sequence[int]], cameras: Iterable[str], depth: Iterable[str] = ()
) -> dict[str, tuple[int, int]]:
    """Target (height, width) per camera: its own entry, else the ``"*"`` one; cameras without either stay.

    Depth cameras (``depth``) keep their size: resampling would blend 12-bit depth codes into
    depths no sensor measured. ``"*"`` passes them over; naming one is refused."""
    cameras, depth = list(cameras), set(depth)
    unknown = sorted(set(resize) - {"*"} - set(cameras))
    if unknown:
        raise ValueError(f"--resize names unknown cameras {unknown}; the dataset has {cameras}")
    named = sorted(set(resize) & depth)
    if named:
        raise ValueError(
            f"--resize names depth camera {named[0]!r}: depth maps keep their size (resampling would blend "
            'their 12-bit depth codes); leave it out ("*" passes depth cameras over)'
        )
    out = {}
    for cam in cameras:
        if cam in depth:
            continue
        size = resize.get(cam, resize.get("*"))
        if size is not None:
            out[cam] = (int(size[0]), int(size[1]))
    return out


def _even(x: float, lo: int = 2) -> int:
    return max(lo, 2 * round(x / 2))


def _even_floor(x: int) -> int:
    return x - x % 2


def plan_transform(source: Sequence[int], size: Sequence[int], mode: str) -> FrameTransform | None:
    """How frames of ``source`` (height, width) become ``size`` frames; None when nothing changes.

    ``pad`` scales the whole frame to fit and letterboxes; ``crop`` keeps the largest centred
    region of the target's aspect and scales it; ``stretch`` scales the whole frame to the size.
    """
    check_mode(mode)
    check_size(size)
    sh, sw = int(source[0]), int(source[1])
    th, tw = int(size[0]), int(size[1])
    if sh < 1 or sw < 1:
        raise ValueError(f"source frame size {(sh, sw)} is empty")
    if (sh, sw) == (th, tw):
        return None
    crop, scaled, pad = (0, 0, sh, sw), (th, tw), (0, 0)
    wider = sw * th > sh * tw  # the source is wider than the target's aspect
    if mode == "crop":
        if wider:
            ch = _even_floor(sh) or sh
            cw = min(_even_floor(sw) or sw, _even(ch * tw / th))
        else:
            cw = _even_floor(sw) or sw
            ch = min(_even_floor(sh) or sh, _even(cw * th / tw))
        crop = (_even_floor((sh - ch) // 2), _even_floor((sw - cw) // 2), ch, cw)
    elif mode == "pad":
        if wider:
            scaled = (min(th, _even(sh * tw / sw)), tw)
        else:
            scaled = (th, min(tw, _even(sw * th / sh)))
        pad = (_even_floor((th - scaled[0]) // 2), _even_floor((tw - scaled[1]) // 2))
    return FrameTransform(mode=mode, source=(sh, sw), crop=crop, scaled=scaled, pad=pad, size=(th, tw), filter=FILTER)


def map_box(
    t: FrameTransform, top: float, left: float, bottom: float, right: float
) -> tuple[float, float, float, float]:
    """Where the source rectangle [top, bottom) x [left, right) lands in the stored frame.

    Clipped to the kept region: a rectangle the crop cuts away comes back empty (bottom <= top
    or right <= left). Lets readers find source-placed content (identity bands) after a resize.
    """
    ct, cl, ch, cw = t.crop
    top, bottom = max(top, ct), min(bottom, ct + ch)
    left, right = max(left, cl), min(right, cl + cw)
    ys, xs = t.scaled[0] / ch, t.scaled[1] / cw
    pt, pl = t.pad
    return pt + (top - ct) * ys, pl + (left - cl) * xs, pt + (bottom - ct) * ys, pl + (right - cl) * xs


CHANNELS = (1, 3, 4)  # gray, RGB, RGBA


def _size_axes(spec: Mapping[str, Any]) -> tuple[int, int] | None:
    """Where a camera feature's ``shape`` holds height and width: as its ``names`` place them, else
    (height, width, channels) as LeRobot writes it, or (channels, height, width) for an unnamed
    shape whose first size alone is a channel count; ``None`` for a shape of fewer than 3 sizes."""
    shape, names = spec.get("shape") or [], spec.get("names") or []
    names = list(names) if isinstance(names, (list, tuple)) else []
    if {"height", "width"} <= set(names):
        at = (names.index("height"), names.index("width"))
    elif isinstance(shape, (list, tuple)) and len(shape) == 3 and shape[0] in CHANNELS and shape[2] not in CHANNELS:
        at = (1, 2)
    else:
        at = (0, 1)
    return at if isinstance(shape, (list, tuple)) and len(shape) >= 3 and max(at) < len(shape) else None


def feature_size(spec: Mapping[str, Any]) -> tuple[int, int] | None:
    """The (height, width) a camera feature's ``names`` place in its ``shape``; ``None`` where they
    place none (a shape without names may be channels-first: it says nothing for certain)."""
    names = spec.get("names")
    at = _size_axes(spec) if isinstance(names, (list, tuple)) and {"height", "width"} <= set(names) else None
    return None if at is None else (int(spec["shape"][at[0]]), int(spec["shape"][at[1]]))


def resized_features(
    features: Mapping[str, Any], sizes: Mapping[str, Sequence[int]], codec: str | None = None
) -> dict[str, Any]:
    """LeRobot ``info.json`` features with each resized camera's shape (and codec) as stored."""
    out = copy.deepcopy(dict(features))
    for cam, (h, w) in sizes.items():
        spec = out.get(cam)
        if spec is None:
            continue
        at = _size_axes(spec)
        shape = list(spec["shape"]) if at is not None else [h, w, 3]
        at = at or (0, 1)
        shape[at[0]], shape[at[1]] = int(h), int(w)
        spec["shape"] = shape
        info = spec.get("info")
        if isinstance(info, dict):
            info["video.height"], info["video.width"] = int(h), int(w)
            if codec is not None:
                info["video.codec"] = codec
    return out
