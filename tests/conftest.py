"""Shared fixtures: the real LeRobot v3.0 fixture and cached synthetic datasets."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lerobot_shards.synth import synth_dataset

pytest_plugins = ["s3_server"]

FIXTURE_ENV = "LEROBOT_SHARDS_FIXTURE"


@pytest.fixture(scope="session")
def fixture_root() -> Path:
    """The real so101_record_test dataset (read-only). Missing it is an error, not a skip."""
    candidates = [Path(__file__).resolve().parents[2] / "shared/fixtures/so101_record_test"]
    if os.environ.get(FIXTURE_ENV):
        candidates.append(Path(os.environ[FIXTURE_ENV]))
    for root in candidates:
        if (root / "meta/info.json").is_file():
            return root
    pytest.fail(
        f"LeRobot fixture so101_record_test not found at {', '.join(map(str, candidates))}; "
        f"put it there or point {FIXTURE_ENV} at it"
    )


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
