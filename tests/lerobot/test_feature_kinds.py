"""Feature kinds beyond cameras and vectors, on datasets LeRobot 0.6.1's own writer recorded: a string
feature and a depth camera (12-bit gray12le HEVC, dequantized to mm or m) read as LeRobot's dataset
gives them, from shards and raw. (Language columns: test_language.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.synth import paint_identity


def test_a_string_feature_is_lerobots(tmp_path: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        "observation.state": {"dtype": "float32", "shape": (2,), "names": ["a", "b"]},
        "observation.note": {"dtype": "string", "shape": (1,), "names": None},
    }
    ds = LeRobotDataset.create("local/notes", fps=30, features=features, root=tmp_path / "raw", use_videos=True)
    rng = np.random.default_rng(0)
    for ep in range(2):
        for i in range(12):
            state = rng.normal(size=2).astype(np.float32)
            ds.add_frame({"observation.state": state, "observation.note": f"ep {ep} note {i}", "task": f"task {ep}"})
        ds.save_episode()
    ds.finalize()
    convert_dataset(tmp_path / "raw", tmp_path / "shards", progress=False)
    theirs = LeRobotDataset("local/notes", root=tmp_path / "raw")
    for source in ("raw", "shards"):
        seen = 0
        for sample in EpisodePoolDataset(str(tmp_path / source)):
            want = theirs[int(sample["index"])]
            assert sorted(sample) == sorted(want)
            for key, value in want.items():
                got = sample[key]
                assert type(got) is type(value), (source, key)
                assert torch.equal(got, value) if isinstance(value, torch.Tensor) else got == value, (source, key)
            seen += 1
        assert seen == 24


DEPTH, RGB = "observation.images.depth", "observation.images.rgb"


@pytest.fixture(scope="module")
def depth_written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A depth camera (metres, varying per pixel and frame) and a colour one through LeRobot's own
    writer (12-bit gray12le HEVC, its default quantizer), converted beside it."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    base = tmp_path_factory.mktemp("depth")
    hwc = ["height", "width", "channels"]
    features = {
        DEPTH: {"dtype": "video", "shape": (64, 96, 1), "names": hwc, "info": {"is_depth_map": True}},
        RGB: {"dtype": "video", "shape": (64, 96, 3), "names": hwc},
        "observation.state": {"dtype": "float32", "shape": (2,), "names": ["a", "b"]},
    }
    ds = LeRobotDataset.create("local/depth", fps=30, features=features, root=base / "raw", use_videos=True)
    y, x = np.mgrid[0:64, 0:96].astype(np.float32)
    for ep in range(3):
        for i in range(15 + 4 * ep):
            depth = 0.05 + 0.04 * x + 0.02 * y + 0.3 * i + 1.5 * ep  # metres: 0.05 .. ~9.4
            ds.add_frame(
                {
                    DEPTH: depth[..., None],
                    RGB: paint_identity(ep, i, 64, 96),
                    "observation.state": np.array([ep, i], np.float32),
                    "task": f"task {ep % 2}",
                }
            )
        ds.save_episode()
    ds.finalize()
    info = json.loads((base / "raw/meta/info.json").read_text())["features"][DEPTH]["info"]
    assert info["is_depth_map"] and info["video.pix_fmt"] == "gray12le" and info["depth_unit"] == "m"
    convert_dataset(base / "raw", base / "shards", progress=False)
    return base


@pytest.mark.parametrize("unit", ["mm", "m"])
def test_a_depth_camera_lerobot_wrote_reads_as_lerobots(depth_written: Path, unit: str) -> None:
    """Every sample, window and padding flag, raw and converted, equals LeRobotDataset's (depth in ``unit``:
    float32 (T, 1, H, W), the same bits), and so do the depth camera's stats (rescaled to ``unit``; equal
    to 2e-6 as every aggregated stat of test_parity)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    deltas = {DEPTH: [-0.1, 0.0, 0.1], RGB: [-0.1, 0.0], "observation.state": [0.0, 0.1]}
    theirs = LeRobotDataset(
        "local/depth", root=depth_written / "raw", delta_timestamps=deltas, return_uint8=True, depth_output_unit=unit
    )
    assert theirs.meta.depth_keys == [DEPTH]
    for source in ("raw", "shards"):
        ours = EpisodePoolDataset(
            str(depth_written / source), delta_timestamps=deltas, image_dtype=torch.uint8, depth_output_unit=unit
        )
        assert ours.meta.depth_keys == [DEPTH]
        for stat, value in theirs.meta.stats[DEPTH].items():  # aggregated from the episodes' stats, as test_parity
            np.testing.assert_allclose(ours.meta.stats[DEPTH][stat], value, rtol=2e-6, err_msg=f"{source} {stat}")
        seen = 0
        for sample in ours:
            want = theirs[int(sample["index"])]
            assert sorted(sample) == sorted(want)
            for key, value in want.items():
                got = sample[key]
                assert type(got) is type(value), (source, key)
                if isinstance(value, torch.Tensor):
                    assert got.dtype == value.dtype and got.shape == value.shape, (source, key)
                    assert torch.equal(got, value), (source, key, int(sample["index"]))
                else:
                    assert got == value, (source, key)
            seen += 1
        assert seen == theirs.num_frames == 15 + 19 + 23
