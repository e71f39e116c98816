"""Depth-map cameras (LeRobot 0.6.1's ``is_depth_map``: 12-bit codes in lossless gray12le HEVC) are
converted by stream copy and loaded as LeRobot loads them: each frame dequantized to float32 mm (or m),
(1, H, W), windows and padding as for colour cameras, stats rescaled to the unit; never cached,
resized or re-encoded. The synthetic depth frames paint their (episode, frame) into the codes
(``synth.paint_depth``), and every value must be exactly a code's dequantized depth.
(tests/lerobot/test_feature_kinds.py: parity with LeRobot's own dataset on a depth camera it wrote.)"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.verify import verify_dataset
from lerobot_shards.exceptions import ConvertError
from lerobot_shards.format import Manifest
from lerobot_shards.loader import EpisodePoolDataset, slab_loader
from lerobot_shards.synth import SYNTH_DEPTH, read_depth_identity, read_identity

RGB, DEPTH = "observation.images.front", "observation.images.depth"
DELTAS = {DEPTH: [-0.1, 0.0, 0.1], RGB: [-0.1, 0.0]}  # 3 frames each way at 30 fps: pads at both ends


@pytest.fixture(scope="module")
def depth_raw(synth_factory: Callable[..., Path]) -> Path:
    return synth_factory(
        num_episodes=3, cameras=(RGB,), depth_cameras=(DEPTH,), height=64, width=96, length_range=(8, 12)
    )


@pytest.fixture(scope="module")
def depth_shards(depth_raw: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("depth") / "shards"
    convert_dataset(depth_raw, out, progress=False)
    return out


def _check(sample: dict, unit: str = "mm") -> None:
    """Every camera frame of the sample is the one asked for; depth exactly dequantized codes."""
    e, f = int(sample["episode_index"]), int(sample["frame_index"])
    depth, pad = sample[DEPTH], sample[f"{DEPTH}_is_pad"]
    assert depth.dtype == torch.float32 and depth.shape == (3, 1, 64, 96)
    for k, delta in enumerate((-3, 0, 3)):
        got_e, got_f = read_depth_identity(depth[k], SYNTH_DEPTH, unit)
        assert got_e == e
        assert (got_f == f + delta) != bool(pad[k])  # a padded slot holds the episode's first or last frame
    assert read_identity(sample[RGB][-1]) == (e, f)


@pytest.mark.parametrize("source", ["raw", "shards"])
def test_depth_frames_read_back_exact(depth_raw: Path, depth_shards: Path, source: str) -> None:
    root = depth_raw if source == "raw" else depth_shards
    ds = EpisodePoolDataset(str(root), delta_timestamps=DELTAS)
    seen = [(int(s["episode_index"]), int(s["frame_index"])) for s in map(_checked, ds)]
    assert len(seen) == len(set(seen)) == ds.num_frames
    assert ds.meta.depth_keys == [DEPTH]


def _checked(sample: dict) -> dict:
    _check(sample)
    return sample


def test_metres_and_stats_as_lerobot_rescales_them(depth_shards: Path) -> None:
    mm = EpisodePoolDataset(str(depth_shards))
    m = EpisodePoolDataset(str(depth_shards), depth_output_unit="m", delta_timestamps=DELTAS)
    sample = next(iter(m))
    _check(sample, "m")
    assert sample[DEPTH].max() < 10.0  # metres, not millimetres
    one = next(iter(mm))[DEPTH]
    assert one.dtype == torch.float32 and one.shape == (1, 64, 96)
    for stat, value in mm.meta.stats[DEPTH].items():  # recorded in mm: "m" scales every stat but count
        want = value if stat == "count" else value * (1.0 / 1000.0)
        np.testing.assert_array_equal(m.meta.stats[DEPTH][stat], want)
    with pytest.raises(ValueError, match="depth_output_unit must be 'mm' or 'm', got 'cm'"):
        EpisodePoolDataset(str(depth_shards), depth_output_unit="cm")


def test_frame_cache_and_slabs_leave_depth_exact(depth_shards: Path, tmp_path: Path) -> None:
    """The decoded-frame cache holds the colour camera only (depth bypasses it), and depth windows travel
    in the worker's slabs as float32: two epochs, the second read from the cache."""
    ds = EpisodePoolDataset(
        str(depth_shards), delta_timestamps=DELTAS, frame_cache_dir=str(tmp_path / "fc"), image_dtype=torch.uint8
    )
    loader = slab_loader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    for epoch in range(2):
        ds.set_epoch(epoch)
        count = 0
        for batch in loader:
            for i in range(len(batch["index"])):
                _check({k: v[i] for k, v in batch.items() if isinstance(v, torch.Tensor)})
                count += 1
        assert count == ds.num_frames
    entries = list((tmp_path / "fc").rglob("*.frames"))
    assert len(entries) == ds.num_episodes  # one per episode: the colour camera's


def test_convert_records_depth_and_never_resizes_or_reencodes_it(depth_raw: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    options = ConvertOptions(reencode="h264", resize={"*": (48, 64)})
    convert_dataset(depth_raw, out, options, progress=False)
    manifest = Manifest.from_json((out / "manifest.json").read_text())
    assert manifest.depth == {DEPTH: SYNTH_DEPTH}
    assert json.loads((out / "manifest.json").read_text())["depth"][DEPTH]["unit"] == "mm"
    assert manifest.features[DEPTH]["shape"] == [64, 96, 1] and manifest.features[RGB]["shape"] == [48, 64, 3]
    report = verify_dataset(out, depth_raw, decode_check=3)
    assert report.ok, report.problems
    sample = next(iter(EpisodePoolDataset(str(out), delta_timestamps={DEPTH: [-0.1, 0.0, 0.1]})))
    e, f = int(sample["episode_index"]), int(sample["frame_index"])
    assert read_depth_identity(sample[DEPTH][1]) == (e, f)

    with pytest.raises(ValueError) as raised:
        convert_dataset(depth_raw, tmp_path / "named", ConvertOptions(resize={DEPTH: (48, 64)}), progress=False)
    assert "\n" not in str(raised.value) and f"depth camera {DEPTH!r}" in str(raised.value)
    assert not (tmp_path / "named/manifest.json").exists()
    with pytest.raises(ValueError, match=f"depth camera '{DEPTH}'"):
        EpisodePoolDataset(str(depth_raw), resize={DEPTH: (48, 64)})


def test_a_bad_quantizer_is_refused_naming_the_camera(depth_raw: Path, tmp_path: Path) -> None:
    root = tmp_path / "raw"
    shutil.copytree(depth_raw, root)
    info = json.loads((root / "meta/info.json").read_text())
    info["features"][DEPTH]["info"]["video.depth_max"] = 0.001  # below depth_min
    (root / "meta/info.json").write_text(json.dumps(info))
    for attempt in (
        lambda: EpisodePoolDataset(str(root)),
        lambda: convert_dataset(root, tmp_path / "o", progress=False),
    ):
        with pytest.raises((ValueError, ConvertError)) as raised:
            attempt()
        assert "\n" not in str(raised.value) and f"camera {DEPTH!r}: depth_min = 0.01 is not below" in str(raised.value)


def test_a_lossless_reencode_keeps_every_code(depth_raw: Path) -> None:
    """The path a depth clip takes when it cannot be stream-copied (LeRobot's own depth clips hold
    B-frames): re-encoded as lossless 12-bit HEVC, every code decodes back unchanged."""
    from lerobot_shards.loader.decoding.depth_frames import DepthClip
    from lerobot_shards.synth import paint_depth
    from lerobot_shards.video import reencode_clip

    mp4 = next((depth_raw / "videos" / DEPTH).rglob("*.mp4"))
    data, info = reencode_clip(mp4, 3, 6, codec="h264", gop=2, crf=30, depth=True)
    assert (info.codec, info.pix_fmt, info.stream_copied) == ("hevc", "gray12le", False)
    clip = DepthClip(data, info.frame_mappings_json())
    codes = clip.codes([5, 0, 2])
    clip.close()
    assert codes.dtype == torch.uint16 and codes.shape == (3, 1, 64, 96)
    for got, f in zip(codes, (8, 3, 5)):  # episode 0's frames 3..8 of the file
        np.testing.assert_array_equal(got[0].numpy(), paint_depth(0, f, 64, 96))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"video.depth_min": -1e308, "video.depth_max": 1e308, "video.use_log": False}, "beyond float32's range"),
        ({"video.shift": 1e308}, r"depth shift = 1e\+308 is beyond float32's range"),
    ],
)
def test_a_quantizer_beyond_float32_is_refused_before_any_frame(edit: dict, message: str) -> None:
    """Finite in float64 but not in the float32 depth is decoded in: every frame came out NaN (a vast
    shift), or the decode failed mid-epoch naming the mp4, not the field."""
    from lerobot_shards.depth import DepthError, depth_params

    info = {"video.is_depth_map": True, "video.depth_min": 0.01, "video.depth_max": 10.0, "video.shift": 3.5}
    spec = {"dtype": "video", "shape": [64, 96, 1], "info": {**info, **edit}}
    with pytest.raises(DepthError, match=f"camera x: .*{message}") as raised:
        depth_params(spec, "camera x")
    assert "\n" not in str(raised.value)
