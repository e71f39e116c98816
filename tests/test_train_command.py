"""``lerobot-shards train`` where LeRobot is absent (this host: Python 3.11) and its pure layout choice.

Training itself runs against real LeRobot in tests/lerobot/test_train.py.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from lerobot_shards.integrations.lerobot_train import _pool_size, _storage_options, choose_layout, slab_layout


def test_without_lerobot_one_line_names_the_supported_versions_and_the_install() -> None:
    try:  # (not `import lerobot`: tests/lerobot/ on sys.path would import as a namespace package)
        importlib.metadata.version("lerobot")
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        pytest.fail("this host test expects no LeRobot (tests/lerobot/ runs where LeRobot is)")
    proc = subprocess.run(
        [sys.executable, "-m", "lerobot_shards.cli", "train", "--policy.type=act"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "LeRobot 0.6.x" in lines[0] and 'pip install "lerobot[training]==0.6.1"' in lines[0]


@pytest.mark.parametrize(
    ("cpus", "ranks", "want"),
    [
        (2, 1, (0, 2)),
        (2, 2, (0, 1)),
        (4, 1, (0, 4)),
        (5, 1, (2, 2)),
        (16, 1, (8, 2)),
        (16, 2, (4, 2)),
        (64, 8, (4, 2)),
        (32, 1, (8, 4)),
        (256, 1, (8, 8)),
        (1, 4, (0, 1)),
    ],
)
def test_layout_choice(cpus: int, ranks: int, want: tuple[int, int]) -> None:
    assert choose_layout(cpus, ranks) == want


def test_the_slab_layout_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEROBOT_SHARDS_SLAB_LAYOUT", raising=False)
    assert slab_layout() == "sample"
    monkeypatch.setenv("LEROBOT_SHARDS_SLAB_LAYOUT", "contiguous")
    assert slab_layout() == "contiguous"
    monkeypatch.setenv("LEROBOT_SHARDS_SLAB_LAYOUT", "nchw")
    with pytest.raises(ValueError, match="LEROBOT_SHARDS_SLAB_LAYOUT must be 'sample' or 'contiguous', got 'nchw'"):
        slab_layout()


def test_environment_options_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEROBOT_SHARDS_EPISODE_POOL_SIZE", "abc")
    with pytest.raises(ValueError, match="LEROBOT_SHARDS_EPISODE_POOL_SIZE must be a whole number >= 1, got 'abc'"):
        _pool_size()
    monkeypatch.setenv("LEROBOT_SHARDS_EPISODE_POOL_SIZE", "4")
    assert _pool_size() == 4
    monkeypatch.setenv("LEROBOT_SHARDS_STORAGE_OPTIONS", "notjson")
    with pytest.raises(ValueError, match="LEROBOT_SHARDS_STORAGE_OPTIONS is not JSON"):
        _storage_options()
