"""Shared fixtures: the real LeRobot v3.0 fixture and cached synthetic datasets."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lerobot_shards.synth import synth_dataset

pytest_plugins = ["s3_server", "hub_server"]


@pytest.fixture(scope="session")
def fixture_root() -> Path:
    """The real so101_record_test dataset (read-only), shipped in tests/fixtures (see its README)."""
    root = Path(__file__).resolve().parent / "fixtures/so101_record_test"
    if not (root / "meta/info.json").is_file():
        pytest.fail(f"LeRobot fixture missing at {root}: the checkout is incomplete")
    return root


@pytest.fixture(scope="session")
def synth_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``synth_factory(**synth_dataset_kwargs) -> Path``, built once per distinct kwargs per session.

    The datasets are shared between tests: treat them as read-only and copy one before editing it.
    """
    base = tmp_path_factory.mktemp("synth")
    cache: dict[str, Path] = {}

    def make(**kwargs: Any) -> Path:
        key = repr(sorted(kwargs.items()))
        if key not in cache:
            cache[key] = synth_dataset(base / hashlib.sha1(key.encode()).hexdigest()[:12], **kwargs)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def small_synth(synth_factory: Callable[..., Path]) -> Path:
    """synth_dataset with default arguments: 4 episodes, 2 H.264 cameras, 2 episodes per file."""
    return synth_factory()


HUB_CAMS = ("observation.images.front", "observation.images.wrist")


@pytest.fixture(scope="session")
def raw(synth_factory: Callable[..., Path]) -> Path:
    """The raw dataset the Hub tests serve (repo, bucket, data files root): 4 episodes of 10-16 frames,
    two cameras (``HUB_CAMS``), 3 episodes per mp4 (a camera in two files), 2 per parquet. Read-only."""
    return synth_factory(
        num_episodes=4,
        cameras=HUB_CAMS,
        length_range=(10, 16),
        episodes_per_video_file=3,
        episodes_per_data_file=2,
        seed=5,
    )


# tests/lerobot/ runs against real LeRobot inside its own Python 3.13 environment (`make test-lerobot`,
# tests/lerobot/env.sh); the host suite (`make test`) never collects it.
collect_ignore = [] if os.environ.get("LEROBOT_SHARDS_LEROBOT_SUITE") == "1" else ["lerobot"]
