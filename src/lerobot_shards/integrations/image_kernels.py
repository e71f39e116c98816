"""Cheaper kernels, equal bit for bit, for the costliest torchvision transforms on uint8 frames.

LeRobot's default ``ImageTransforms`` (three of ColorJitter's brightness, contrast, saturation and
hue, its ``SharpnessJitter`` and ``RandomAffine``, per camera value) cost about 55 CPU ms per 480p
two-frame window, nine times what decoding the two frames costs; hue (45 ms a call) and affine
(10 ms) are most of it.
Each has an exact shortcut on uint8 frames (the dtype LeRobot's trainer augments):

- sharpness: torchvision blurs with a float depthwise 3x3 convolution and rounds the result. The
  blur is ``S / 13`` for an integer ``S`` (the 3x3 sum plus four times the centre), which is never
  within 1/26 of a half-integer, while the float convolution errs by < 1e-3 at 8 bits: its rounded
  value is the nearest integer to ``S / 13``, computed here in int16 adds. The blend, clamp and cast
  after it are torchvision's own operations on the same values.
- hue: the result is a function of each pixel's (r, g, b) alone, so torchvision's own kernel runs
  once per distinct colour of the window and the pixels gather their colour's result.
- affine (nearest): each output pixel copies one source pixel or the fill. torchvision's own grid,
  sampled once over a map of pixel numbers, says which; the uint8 frames are gathered from it,
  every channel and frame at once (plane by plane when contiguous), instead of sampling them in
  float.

Measured 2026-12-07 (the 2-core development machine at load 3-4, one intra-op thread as on the
decode pool's threads, CPU ms per call on a real AV1 2x3x480x640 uint8 window; torchvision's
kernel / this module's), in the process's default glibc allocator and, after the arrow, under
``lerobot-shards train``'s fixed allocator thresholds (``train_process``: the float temporaries of
brightness, contrast and saturation stop faulting in fresh pages each call):

=============  =========================================  =========================================
kernel         channels-last (as decoded)                 contiguous (as the frame cache reads)
=============  =========================================  =========================================
brightness     5.0 -> 1.9 (torchvision's)                 1.9 -> 1.9 (torchvision's)
contrast       7.3 -> 4.0 (torchvision's)                 3.5 -> 3.4 (torchvision's)
saturation     8.2 -> 4.9 (torchvision's)                 3.6 -> 3.5 (torchvision's)
hue            66.6 / 22.8 -> 42.8 / 21.8                 52.9 / 20.7 -> 34.0 / 19.7
sharpness      4.9 / 6.0 (before this dispatch) -> 5.1    51.3 / 6.4 -> 37.0 / 6.1
affine         3.9 / 4.3 -> 3.7 / 4.2                     4.2 / 5.2 -> 3.9 / 4.9 (pixel gather)
=============  =========================================  =========================================

Sharpness on a channels-last 4-D window takes torchvision's kernel (its convolution is cheaper
there than the integer blur, 4.9-5.1 against 6.0 ms); on contiguous frames the integer blur is 6-8x
cheaper. Brightness, contrast and saturation stay torchvision's: their float ops are few and
vectorized, and an exact uint8 lookup table (the result is a function of the value, or of the
value and the grey, under a given factor) costs as much to apply in torch (an int32 index_select,
2.5 ms a window) as the float ops do once the allocator keeps their blocks. Affine: at load 3-4
torchvision's float grid_sample was a little cheaper than the gather (table above), at load 8-9
(contiguous window, medians of 8) 9.7 ms against 5.8; the gather is kept, and on contiguous frames
now gathers plane by plane (``gather``, the fill written where the source is outside: 6.2 -> 5.8 ms
there) instead of padding and index-selecting pixels. Hue's 20 ms is mostly ``torch.unique`` (11
ms for ~60,000 colours of 614,400 pixels) and torchvision's kernel on the distinct colours (~7 ms).

Frames take these kernels through torchvision's own dispatch: ``as_frames`` marks a tensor as
``Frames`` (a ``tv_tensors.Image``), for which the kernels are registered; every other transform,
and every transform's random parameters, run unchanged (the parameters come from the same draws
of the same generator), and anything but uint8 takes torchvision's kernel. The equality is tested
against torchvision's kernels on real frames and every 24-bit colour
(tests/lerobot/test_augment_kernels.py) and end to end against LeRobot's dataset.
Imported only when transforms are given (torchvision comes with LeRobot, not with this package).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torchvision import tv_tensors
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as F  # noqa: N812
from torchvision.transforms.v2.functional import _geometry


class Frames(tv_tensors.Image):
    """uint8 camera frames ``[..., C, H, W]`` whose sharpness, hue and affine kernels are the exact
    shortcuts of this module."""


def as_frames(value: torch.Tensor) -> torch.Tensor:
    """``value`` marked for these kernels (no copy)."""
    return value.as_subclass(Frames)


def as_tensor(value: Any) -> Any:
    """A transform's result as the plain tensor it would have been without the mark."""
    return value.as_subclass(torch.Tensor) if isinstance(value, tv_tensors.TVTensor) else value


class ExactKernels:
    """``transforms`` (a torchvision v2 transform, such as LeRobot's ``ImageTransforms``) applied to
    frames marked ``Frames``: the same random draws, the same bits, the cheaper kernels. A v2
    transform treats one ``tv_tensors.Image`` as it treats one plain tensor, so the mark changes
    which kernel runs, never what a transform does; a plain callable should not be wrapped."""

    def __init__(self, transforms: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.transforms = transforms

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        return as_tensor(self.transforms(as_frames(frames)))


@F.register_kernel(F.adjust_sharpness, Frames)
def adjust_sharpness(image: torch.Tensor, sharpness_factor: float) -> torch.Tensor:
    """``F.adjust_sharpness_image`` with its rounded float blur computed exactly in integers."""
    channels, height, width = image.shape[-3:]
    plain = image.dtype != torch.uint8 or channels not in (1, 3) or sharpness_factor < 0 or min(height, width) <= 2
    if plain or _channels_last(image):  # frames as decoded: torchvision's convolution is the cheaper there
        return F.adjust_sharpness_image(image, sharpness_factor)
    shape = image.shape
    if image.ndim > 4:
        image = image.reshape(-1, channels, height, width)
    output = image.to(dtype=torch.float32, copy=True)  # as torchvision: the same values, layout and blend
    wide = image.to(torch.int16)
    rows = wide[..., :-2, :] + wide[..., 1:-1, :]
    rows += wide[..., 2:, :]
    total = rows[..., :-2] + rows[..., 1:-1]
    total += rows[..., 2:]
    total += wide[..., 1:-1, 1:-1] * 4  # the kernel's 5/13 centre: the box's 1 plus 4
    layout = torch.channels_last if _channels_last(output) else torch.contiguous_format  # as the convolution's
    blurred = total.to(torch.float32).div_(13.0).round_().contiguous(memory_format=layout)
    view = output[..., 1:-1, 1:-1]
    view.add_(blurred.sub_(view), alpha=(1.0 - sharpness_factor))
    return output.clamp_(0, 255).to(torch.uint8).reshape(shape)


def _channels_last(image: torch.Tensor) -> bool:
    return image.ndim == 4 and not image.is_contiguous() and image.is_contiguous(memory_format=torch.channels_last)


@F.register_kernel(F.adjust_hue, Frames)
def adjust_hue(image: torch.Tensor, hue_factor: float) -> torch.Tensor:
    """``F.adjust_hue_image`` run on the distinct colours only (it maps each pixel on its own)."""
    if image.dtype != torch.uint8 or image.shape[-3] != 3 or image.numel() == 0 or not -0.5 <= hue_factor <= 0.5:
        return F.adjust_hue_image(image, hue_factor)
    r, g, b = image.to(torch.int32).unbind(dim=-3)
    colours, inverse = torch.unique(r.mul_(65536).add_(g.mul_(256)).add_(b), return_inverse=True)
    planes = torch.stack((colours >> 16, (colours >> 8) & 255, colours & 255)).to(torch.uint8)
    mapped = F.adjust_hue_image(planes.unsqueeze(1), hue_factor).reshape(3, -1)
    return mapped[:, inverse].movedim(0, -3)


@F.register_kernel(F.affine, Frames)
def affine(
    image: torch.Tensor,
    angle: float,
    translate: list[float],
    scale: float,
    shear: list[float],
    interpolation: InterpolationMode | int = InterpolationMode.NEAREST,
    fill: Any = None,
    center: list[float] | None = None,
) -> torch.Tensor:
    """``F.affine_image`` under nearest interpolation: torchvision's grid sampled once over pixel
    numbers (exact in float32 below 2^24 pixels), then every channel gathered in uint8."""
    mode = _geometry._check_interpolation(interpolation)
    height, width = image.shape[-2:]
    fills = [0] if fill is None else list(fill) if isinstance(fill, (list, tuple)) else [fill]
    plain = (
        image.dtype != torch.uint8
        or mode != InterpolationMode.NEAREST
        or image.numel() == 0
        or height * width >= 1 << 24
        or not all(float(v).is_integer() and 0 <= float(v) <= 255 for v in fills)  # a uint8 pixel, exactly
        or len(fills) not in (1, image.shape[-3])
    )
    if plain:
        return F.affine_image(image, angle, translate, scale, shear, interpolation, fill, center)
    angle, translate, shear, center = _geometry._affine_parse_args(angle, translate, scale, shear, mode, center)
    center_f = [0.0, 0.0] if center is None else [c - s * 0.5 for c, s in zip(center, [width, height], strict=True)]
    matrix = _geometry._get_inverse_affine_matrix(center_f, angle, [float(t) for t in translate], scale, shear)
    _geometry._assert_grid_transform_inputs(image, matrix, mode.value, fill, ["nearest", "bilinear"])
    theta = torch.tensor(matrix, dtype=torch.float32).reshape(1, 2, 3)
    grid = _geometry._affine_grid(theta, w=width, h=height, ow=width, oh=height)
    numbers = torch.arange(1, height * width + 1, dtype=torch.float32).reshape(1, 1, height, width)
    sampled = torch.nn.functional.grid_sample(numbers, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    source = sampled.reshape(-1).to(torch.int64)  # 0: outside the frame, the fill
    channels = image.shape[-3]
    filler = torch.tensor([int(v) for v in fills], dtype=torch.uint8).expand(channels)
    if not image.is_contiguous():  # channels-last (as decoded): a pixel's channels gathered at once
        pixels = image.reshape(-1, channels, height, width).permute(0, 2, 3, 1).reshape(-1, height * width, channels)
        padded = torch.cat((filler.expand(pixels.shape[0], 1, channels), pixels), dim=1)
        moved = padded.index_select(1, source).reshape(-1, height, width, channels)
        return moved.permute(0, 3, 1, 2).contiguous().reshape(image.shape)  # torchvision's layout
    planes = image.reshape(-1, channels, height * width)  # contiguous (as the frame cache reads): plane by plane
    outside = source == 0
    gathered = planes.gather(2, source.sub(1).clamp_(min=0).expand(*planes.shape))
    for c in range(channels):  # the fill where the source is outside the frame
        gathered[:, c].masked_fill_(outside, int(filler[c]))
    return gathered.reshape(image.shape)
