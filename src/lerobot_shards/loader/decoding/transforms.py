"""Decoded frames resized at decode time: the loader's counterpart of the converter's
``video.transform_frame``, on uint8 RGB tensors (CPU or CUDA), as ``DecodeOptions.resize`` asks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...format import FrameTransform


def transform_rgb(frames: torch.Tensor, t: FrameTransform) -> torch.Tensor:
    """Decoded uint8 (N, C, H, W) frames cropped, scaled and padded as ``t`` says, in one batched call.

    The RGB counterpart of ``transform_frame`` (anti-aliased bilinear instead of area, pads
    black): the loader's decode-time resize, and the reference when comparing resized clips with
    their source. On the CPU torch resizes uint8 directly (its vectorised path, ~10x faster than
    a float round trip); CUDA tensors go through float.
    """
    if tuple(frames.shape[-2:]) != t.source:
        raise ValueError(f"frames are {tuple(frames.shape[-2:])}, the transform expects {t.source}")
    top, left, ch, cw = t.crop
    x = frames[..., top : top + ch, left : left + cw]
    if (ch, cw) != t.scaled:
        if x.is_cuda:
            x = F.interpolate(x.float(), size=t.scaled, mode="bilinear", antialias=True, align_corners=False)
            x = x.round_().clamp_(0, 255).to(torch.uint8)
        else:
            x = F.interpolate(x, size=t.scaled, mode="bilinear", antialias=True, align_corners=False)
    return pad_rgb(x, t)


def pad_rgb(frames: torch.Tensor, t: FrameTransform) -> torch.Tensor:
    """Scaled (N, C, *t.scaled) frames placed at ``t.pad`` in black (N, C, *t.size) frames."""
    if tuple(frames.shape[-2:]) == t.size:
        return frames.contiguous()
    out = torch.zeros((*frames.shape[:-2], *t.size), dtype=frames.dtype, device=frames.device)
    (pt, pl), (sh, sw) = t.pad, t.scaled
    out[..., pt : pt + sh, pl : pl + sw] = frames
    return out
