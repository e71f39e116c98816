"""Feature kinds beyond cameras and vectors, on datasets LeRobot 0.6.1's own writer recorded: a string
feature reads as LeRobot's dataset gives it, from shards and raw; the kinds lerobot-shards cannot read
yet are refused in one line naming them, loader and convert alike, never returned wrong: a depth
camera (12-bit HEVC, gray12le). (Language columns: test_language.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.format import UNREADABLE
from lerobot_shards.loader import EpisodePoolDataset


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


def _refused(root: Path, out: Path, name: str, kind: str) -> None:
    for attempt in (lambda: EpisodePoolDataset(str(root)), lambda: convert_dataset(root, out, progress=False)):
        with pytest.raises(Exception) as raised:
            attempt()
        message = str(raised.value)
        assert "\n" not in message and f"feature {name!r} {UNREADABLE[kind]}" in message
    assert not (out / "manifest.json").exists()


def test_a_depth_camera_lerobot_wrote_is_refused(tmp_path: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {
        "observation.images.depth": {
            "dtype": "video",
            "shape": (48, 64, 1),
            "names": ["height", "width", "channels"],
            "info": {"is_depth_map": True},
        },
        "observation.state": {"dtype": "float32", "shape": (2,), "names": ["a", "b"]},
    }
    ds = LeRobotDataset.create("local/depth", fps=30, features=features, root=tmp_path / "raw", use_videos=True)
    for i in range(8):
        depth = np.full((48, 64, 1), 0.5 + 0.1 * i, np.float32)
        ds.add_frame({"observation.images.depth": depth, "observation.state": np.zeros(2, np.float32), "task": "t"})
    ds.save_episode()
    ds.finalize()
    info = json.loads((tmp_path / "raw/meta/info.json").read_text())["features"]["observation.images.depth"]["info"]
    assert info["is_depth_map"] and info["video.pix_fmt"] == "gray12le"
    _refused(tmp_path / "raw", tmp_path / "out", "observation.images.depth", "depth")


def test_a_storage_bucket_goes_to_lerobots_own_dataset(tmp_path: Path) -> None:
    """``--dataset.repo_type=bucket`` (no root): LeRobot's streaming dataset reads it, said in one line, never
    looked up as a dataset repo of that name (offline here, so LeRobot's own read then fails)."""
    from procs import CLI, env, started

    args = ["--dataset.repo_id=me/bucket", "--dataset.repo_type=bucket", "--dataset.streaming=true"]
    args += ["--policy.type=act", "--policy.device=cpu", "--policy.push_to_hub=false", f"--output_dir={tmp_path / 'o'}"]
    with started([*CLI, "train", *args], tmp_path / "log.txt", env()) as proc:
        assert proc.wait(timeout=300) != 0
    log = (tmp_path / "log.txt").read_text()
    assert "--dataset.repo_type=bucket: LeRobot's own streaming dataset reads hf://buckets/me/bucket" in log
