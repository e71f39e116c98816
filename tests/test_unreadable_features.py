"""A LeRobot 0.6.1 feature kind lerobot-shards cannot read yet (a depth-map video) is refused in one
line naming it, by the loader and by convert: never returned wrong.
(tests/lerobot/test_unreadable_features.py: on datasets LeRobot itself wrote.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.format import UNREADABLE
from lerobot_shards.loader import EpisodePoolDataset

CAM = "observation.images.front"


def _edited(small_synth: Path, tmp_path: Path, edit) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(small_synth, root)
    info = json.loads((root / "meta/info.json").read_text())
    edit(info["features"])
    (root / "meta/info.json").write_text(json.dumps(info))
    return root


def _depth(features: dict) -> None:
    features[CAM]["info"]["video.is_depth_map"] = True


@pytest.mark.parametrize(("edit", "name", "kind"), [(_depth, CAM, "depth")])
def test_a_feature_we_cannot_read_is_refused_naming_it(small_synth: Path, tmp_path: Path, edit, name, kind) -> None:
    root = _edited(small_synth, tmp_path, edit)
    for attempt in (
        lambda: EpisodePoolDataset(str(root)),
        lambda: convert_dataset(root, tmp_path / "out", progress=False),
    ):
        with pytest.raises(Exception) as raised:
            attempt()
        message = str(raised.value)
        assert "\n" not in message and f"feature {name!r} {UNREADABLE[kind]}" in message
    assert not (tmp_path / "out/manifest.json").exists()
