"""Depth-map cameras as LeRobot 0.6.1 stores and reads them: 12-bit codes in gray12le HEVC, dequantized.

LeRobot quantizes each depth frame to 12-bit codes (``DEPTH_QMAX = 4095``, logarithmic by
default) with the parameters its feature ``info`` records as ``video.depth_min``,
``video.depth_max``, ``video.shift`` and ``video.use_log`` (metres; missing ones take
``DepthEncoderConfig``'s defaults), and the unit the frames were recorded in as ``depth_unit``.
On read it decodes the codes with PyAV (``gray12le``) and dequantizes them to float32 mm (its
default ``depth_output_unit``) or m, (C=1, H, W) per frame. ``dequantize`` repeats
``lerobot.datasets.depth_utils.dequantize_depth``'s torch path operation for operation, in the
same dtype, so the values are LeRobot's bit for bit. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .exceptions import LeRobotShardsError

if TYPE_CHECKING:  # torch is imported where frames are dequantized: the converter never imports it
    import torch

DEPTH_QMAX = 4095  # 12-bit codes
DEPTH_PIX_FMT = "gray12le"
UNITS = ("mm", "m")
MM_PER_METRE = 1000.0
_UINT16_MAX = 65535
_FLOAT32_MAX = 3.4028234663852886e38  # float32's largest: dequantize computes in float32, LeRobot's too
# DepthEncoderConfig's defaults (lerobot/configs/video.py), for a field the feature does not record
_DEFAULTS = {"depth_min": 0.01, "depth_max": 10.0, "shift": 3.5, "use_log": True}


class DepthError(LeRobotShardsError, ValueError):
    """A depth camera's recorded parameters cannot be dequantized (the message names the field)."""


def is_depth(spec: Mapping[str, Any]) -> bool:
    """A feature LeRobot treats as a depth map (``meta.depth_keys``): ``info.is_depth_map``, or the
    legacy ``video.is_depth_map`` in ``info`` or ``video_info``."""
    info, video_info = spec.get("info") or {}, spec.get("video_info") or {}
    if not isinstance(info, Mapping) or not isinstance(video_info, Mapping):
        return False
    return bool(info.get("is_depth_map") or info.get("video.is_depth_map") or video_info.get("video.is_depth_map"))


@dataclass(frozen=True)
class DepthParams:
    """One depth camera's quantizer (metres) and the unit its stats were recorded in (None: unknown)."""

    depth_min: float
    depth_max: float
    shift: float
    use_log: bool
    unit: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "depth_min": self.depth_min,
            "depth_max": self.depth_max,
            "shift": self.shift,
            "use_log": self.use_log,
            "unit": self.unit,
        }

    @classmethod
    def from_dict(cls, d: Any, what: str) -> DepthParams:
        """A manifest's record, checked (``DepthError`` naming ``what``)."""
        if not isinstance(d, Mapping) or set(d) != {"depth_min", "depth_max", "shift", "use_log", "unit"}:
            raise DepthError(f"{what}: not a depth record (depth_min, depth_max, shift, use_log, unit)")
        return _checked(d["depth_min"], d["depth_max"], d["shift"], d["use_log"], d["unit"], what)


def depth_params(spec: Mapping[str, Any], what: str) -> DepthParams | None:
    """A depth feature's parameters as LeRobot reads them (``DepthEncoderConfig.from_video_info``:
    a missing field takes its default), or None for a feature that is no depth map."""
    if not is_depth(spec):
        return None
    info = spec.get("info") or {}
    values = {k: info.get(f"video.{k}") for k in _DEFAULTS}
    values = {k: _DEFAULTS[k] if v is None else v for k, v in values.items()}
    return _checked(
        values["depth_min"], values["depth_max"], values["shift"], values["use_log"], info.get("depth_unit"), what
    )


def _checked(depth_min: Any, depth_max: Any, shift: Any, use_log: Any, unit: Any, what: str) -> DepthParams:
    for name, value in (("depth_min", depth_min), ("depth_max", depth_max), ("shift", shift)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise DepthError(f"{what}: depth {name} = {value!r} is not a finite number")
    if not isinstance(use_log, bool):
        raise DepthError(f"{what}: depth use_log = {use_log!r} is not true or false")
    if unit is not None and unit not in UNITS:
        raise DepthError(f"{what}: depth_unit = {unit!r} is not one of {UNITS}")
    if not depth_min < depth_max:
        raise DepthError(f"{what}: depth_min = {depth_min!r} is not below depth_max = {depth_max!r}")
    if use_log and depth_min + shift <= 0:
        raise DepthError(f"{what}: depth_min + shift = {depth_min + shift!r} must be above 0 for log quantization")
    for name, value in (("depth_min", depth_min), ("depth_max", depth_max), ("shift", shift)):
        # torch's clamp refused it mid-decode ("cannot be converted to type float"), naming the mp4; a
        # vast shift made every frame NaN. Within the range, the clamp keeps every depth finite.
        if abs(value) > _FLOAT32_MAX:
            raise DepthError(f"{what}: depth {name} = {value!r} is beyond float32's range, in which depth is decoded")
    return DepthParams(float(depth_min), float(depth_max), float(shift), use_log, unit)


def check_unit(unit: Any, what: str = "depth_output_unit") -> str:
    if unit not in UNITS:
        raise ValueError(f"{what} must be 'mm' or 'm', got {unit!r}")
    return str(unit)


def dequantize(codes: torch.Tensor, p: DepthParams, unit: str) -> torch.Tensor:
    """12-bit codes (N, 1, H, W) or (1, H, W), any integer dtype, as float32 depth in ``unit``, the
    same shape: LeRobot's ``dequantize_depth`` (torch path, ``output_tensor=True``), step for step."""
    if p.use_log:
        log_min, log_max = math.log(p.depth_min + p.shift), math.log(p.depth_max + p.shift)
        scale, offset = (log_max - log_min) / DEPTH_QMAX, log_min
    else:
        scale, offset = (p.depth_max - p.depth_min) / DEPTH_QMAX, p.depth_min
    import torch

    buf = codes.squeeze(-3).to(dtype=torch.float32, copy=True)
    buf.mul_(scale).add_(offset)
    if p.use_log:
        buf.exp_().sub_(p.shift)
    buf.clamp_(p.depth_min, p.depth_max)
    buf.unsqueeze_(-3)
    if unit == "m":
        return buf
    return buf.mul_(MM_PER_METRE).round_().clamp_(0.0, _UINT16_MAX)


def stats_factor(p: DepthParams, unit: str) -> float | None:
    """What LeRobot's ``meta.rescale_depth_stats(unit)`` multiplies a depth camera's stats by (every
    stat but ``count``), or None where it leaves them (unit unknown or already ``unit``)."""
    if p.unit is None or p.unit == unit:
        return None
    return MM_PER_METRE if p.unit == "m" else 1.0 / MM_PER_METRE
