"""The cheaper uint8 kernels (``integrations/image_kernels.py``) give torchvision's kernels' bits: on real
480x640 frames of the so101 recording in either memory layout, on every 24-bit colour for hue, and
through LeRobot's whole ``ImageTransforms`` under many seeds; what they do not take falls back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as F  # noqa: N812

from lerobot_shards.integrations import image_kernels as K  # noqa: N812


@pytest.fixture(scope="module")
def frames(fixture_root: Path) -> torch.Tensor:
    """Six real frames of one camera, as torchcodec decodes them (channels-last memory)."""
    from torchcodec.decoders import VideoDecoder

    video = sorted((fixture_root / "videos").rglob("*.mp4"))[0]
    return VideoDecoder(str(video)).get_frames_at([0, 1, 9, 10, 20, 21]).data


def _layouts(frames: torch.Tensor) -> dict[str, torch.Tensor]:
    window = frames[:2]
    odd = torch.randint(0, 256, (2, 3, 37, 53), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    return {
        "window": window,
        "window, contiguous": window.contiguous(),
        "one frame": frames[2],
        "5-d": frames.reshape(3, 2, *frames.shape[1:]),
        "odd size": odd,
        "odd size, channels-last": odd.contiguous(memory_format=torch.channels_last),
        "one channel": frames[:2, :1],
    }


def test_sharpness_hue_and_affine_are_torchvisions(frames: torch.Tensor) -> None:
    affines = [
        (3.3, [10, -7], 1.0, [0.0, 0.0], 0),
        (-4.9, [-30, 20], 1.0, [0.0, 0.0], None),
        (2.0, [5, 5], 1.1, [3.0, 1.0], [10.0]),
        (45.0, [0, 0], 0.8, [0.0, 0.0], 255),
        (-12.5, [40, 25], 0.9, [2.0, -4.0], [1, 128, 255]),  # a fill per channel, written plane by plane
    ]
    for name, x in _layouts(frames).items():
        for factor in (0.0, 0.5, 0.77, 1.0, 1.31, 2.3):
            assert torch.equal(K.adjust_sharpness(x, factor), F.adjust_sharpness_image(x, factor)), (name, factor)
        for factor in (-0.5, -0.0123, 0.0, 0.031, 0.5):
            assert torch.equal(K.adjust_hue(x, factor), F.adjust_hue_image(x, factor)), (name, factor)
        for angle, translate, scale, shear, fill in affines:
            if isinstance(fill, list) and len(fill) not in (1, x.shape[-3]):
                continue
            want = F.affine_image(x, angle, translate, scale, shear, fill=fill)
            assert torch.equal(K.affine(x, angle, translate, scale, shear, fill=fill), want), (name, angle)


def test_hue_is_torchvisions_on_every_colour() -> None:
    """The distinct-colour shortcut holds for every colour, each at a vector lane other than
    torchvision's own computation put it at (a 1-pixel shift)."""
    c = torch.arange(1 << 24, dtype=torch.int32)
    colours = torch.stack((c >> 16, (c >> 8) & 255, c & 255)).to(torch.uint8).reshape(3, 4096, 4096)
    shifted = torch.cat((colours[:, :1, :1], colours.reshape(3, 1, -1)), dim=2)
    for factor in (-0.0311,):
        mine = K.adjust_hue(shifted, factor)[:, :, 1:].reshape(3, 4096, 4096)
        assert torch.equal(mine, F.adjust_hue_image(colours, factor)), factor


def test_what_the_shortcuts_do_not_take_goes_to_torchvision(frames: torch.Tensor) -> None:
    window = frames[:2]
    as_float = window.float() / 255
    assert torch.equal(K.adjust_sharpness(as_float, 1.4), F.adjust_sharpness_image(as_float, 1.4))
    assert torch.equal(K.adjust_hue(as_float, 0.1), F.adjust_hue_image(as_float, 0.1))
    for kw in (dict(interpolation=InterpolationMode.BILINEAR), dict(fill=127.5), dict(fill=[300])):
        want = F.affine_image(window, 7.0, [3, 4], 1.0, [0.0, 0.0], **kw)  # type: ignore[arg-type]
        assert torch.equal(K.affine(window, 7.0, [3, 4], 1.0, [0.0, 0.0], **kw), want), kw  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hue_factor"):
        K.adjust_hue(window, 0.7)


@pytest.mark.parametrize("random_order", [False, True])
def test_lerobots_image_transforms_give_the_same_bits(frames: torch.Tensor, random_order: bool) -> None:
    """LeRobot's default set, and every transform of its own beside it, through ``ExactKernels``:
    the same frames under the same seed, a plain tensor out, the generator left where it was."""
    from lerobot.transforms import ImageTransforms, ImageTransformsConfig
    from lerobot.transforms.transforms import ImageTransformConfig

    config = ImageTransformsConfig(enable=True, random_order=random_order)
    extra = ["GaussianNoise", "MotionBlur", "GaussianPatchBrightness", "RandomShadow", "CoarseDropout"]
    config.tfs.update({name: ImageTransformConfig(type=name) for name in extra})
    transforms = ImageTransforms(config)
    exact = K.ExactKernels(transforms)
    for seed in range(24):
        window = frames[2 * (seed % 3) : 2 * (seed % 3) + 2]
        torch.manual_seed(seed)
        want = transforms(window)
        after = torch.rand(1)
        torch.manual_seed(seed)
        mine = exact(window)
        assert type(mine) is torch.Tensor and torch.equal(mine, want), seed
        assert torch.equal(torch.rand(1), after), seed
