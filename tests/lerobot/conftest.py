"""The LeRobot suite's shared datasets: the real fixture, one written by LeRobot's own writer, their
conversions, and small training shards in the local S3-protocol server. Built once per session.

Runs only inside the LeRobot environment (tests/lerobot/env.sh, ``make test-lerobot``): a missing
LeRobot fails the suite (a skip would not count).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.synth import paint_identity

try:
    import lerobot  # noqa: F401
except ImportError as e:  # pragma: no cover - the suite must run against LeRobot, never skip
    raise RuntimeError("tests/lerobot needs LeRobot 0.6.1: run `make test-lerobot`") from e

LEROBOT_VERSION = importlib.metadata.version("lerobot")
TRAIN_SIZE = (48, 64)  # height, width of the training shards: tiny models, fast CPU steps


@dataclass(frozen=True)
class Dataset:
    repo_id: str
    raw: Path  # the LeRobot v3.0 dataset
    shards: Path  # its conversion


@pytest.fixture(scope="session", autouse=True)
def lerobot_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch_session: pytest.MonkeyPatch) -> Path:
    """HF_LEROBOT_HOME inside the session's temp dir: nothing is read from or written to ~/.cache."""
    home = tmp_path_factory.mktemp("hf_lerobot_home")
    monkeypatch_session.setenv("HF_LEROBOT_HOME", str(home))
    monkeypatch_session.setenv("HF_HUB_OFFLINE", "1")
    return home


@pytest.fixture(scope="session")
def monkeypatch_session() -> pytest.MonkeyPatch:
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="session")
def real(fixture_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    """The real so101 recording (2 AV1 cameras, 480x640) and its stream-copied conversion."""
    out = tmp_path_factory.mktemp("real") / "shards"
    convert_dataset(fixture_root, out, progress=False)
    return Dataset("local/so101_record_test", fixture_root, out)


@pytest.fixture(scope="session")
def written(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    """A dataset recorded through LeRobot's own writer (``LeRobotDataset.create/add_frame/save_episode``),
    identity-painted frames, and its conversion."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    base = tmp_path_factory.mktemp("written")
    features = {
        "observation.images.cam": {"dtype": "video", "shape": (48, 64, 3), "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": (3,), "names": ["a", "b", "c"]},
        "action": {"dtype": "float32", "shape": (3,), "names": ["a", "b", "c"]},
    }
    ds = LeRobotDataset.create(
        "local/written", fps=30, features=features, root=base / "raw", robot_type="synthetic", use_videos=True
    )
    rng = np.random.default_rng(0)
    for ep in range(3):
        for i in range(40 + 7 * ep):
            ds.add_frame(
                {
                    "observation.images.cam": paint_identity(ep, i, 48, 64),
                    "observation.state": rng.normal(size=3).astype(np.float32),
                    "action": rng.normal(size=3).astype(np.float32),
                    "task": f"task {ep % 2}",
                }
            )
        ds.save_episode()
    ds.finalize()
    convert_dataset(base / "raw", base / "shards", progress=False)
    return Dataset("local/written", base / "raw", base / "shards")


@pytest.fixture(scope="session")
def train_shards(fixture_root: Path, s3_server, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The real fixture converted with ``--resize`` to TRAIN_SIZE into a bucket of the local S3 server."""
    fs = s3_server.filesystem()
    fs.mkdir("train-shards")
    url = "s3://train-shards/so101"
    h, w = TRAIN_SIZE
    convert_dataset(
        fixture_root,
        url,
        ConvertOptions(resize={"*": (h, w)}, resize_mode="pad"),
        dest_options=s3_server.storage_options,
        progress=False,
    )
    return url


@pytest.fixture(scope="session")
def written_bucket(written: Dataset, s3_server) -> str:
    """The LeRobot-written dataset's conversion (one 48x64 camera) in a bucket: Diffusion's training data."""
    fs = s3_server.filesystem()
    fs.mkdir("written-shards")
    fs.put(str(written.shards), "written-shards/", recursive=True)
    return f"s3://written-shards/{written.shards.name}"
