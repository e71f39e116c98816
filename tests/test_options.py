"""Every option has one home: the shard target rule, defaults and choices shared by library and CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from convert_helpers import run_cli
from lerobot_shards.convert.plan import ConvertOptions, parse_size
from lerobot_shards.shard_plan import DEFAULT_SHARD_BYTES, EpisodeSize, plan_shards, shard_target


def test_shard_target_is_a_size_or_an_episode_count() -> None:
    assert shard_target() == (DEFAULT_SHARD_BYTES, None)
    assert shard_target(episodes_per_shard=3) == (None, 3)
    assert shard_target(shard_bytes=10) == (10, None)
    with pytest.raises(ValueError, match="not both"):
        shard_target(10, 3)
    with pytest.raises(ValueError, match="episodes_per_shard must be positive"):
        shard_target(episodes_per_shard=0)


def test_convert_options_resolve_the_shard_target() -> None:
    assert ConvertOptions().shard_bytes == DEFAULT_SHARD_BYTES
    options = ConvertOptions(episodes_per_shard=3)
    assert (options.shard_bytes, options.episodes_per_shard) == (None, 3)
    assert ConvertOptions(shard_bytes=parse_size("1MB")).to_dict()["shard_bytes"] == 2**20
    with pytest.raises(ValueError, match="not both"):
        ConvertOptions(shard_bytes=10, episodes_per_shard=3)
    with pytest.raises(ValueError, match="not both"):
        plan_shards([EpisodeSize(0, 5, 100)], target_bytes=10, episodes_per_shard=3)
    assert [s.episodes for s in plan_shards([EpisodeSize(e, 5, 100) for e in range(4)], episodes_per_shard=2)] == [
        (0, 1),
        (2, 3),
    ]


def test_cli_refuses_both_shard_targets_before_touching_anything(tmp_path: Path) -> None:
    result = run_cli("convert", tmp_path / "src", tmp_path / "out", "--shard-size", "1MB", "--episodes-per-shard", "2")
    assert result.returncode == 2
    assert "not both" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()
