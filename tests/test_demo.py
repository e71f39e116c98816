"""README's main command (`lerobot-shards demo`): synthesize, convert, stream, and run again."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from lerobot_shards.cli import main


@pytest.mark.slow
def test_demo_runs_and_is_idempotent(tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["demo", "--out", str(tmp_path / "demo"), "--batches", "3", "--workers", "1"]
    first = runner.invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "every frame is the frame asked for" in first.output
    assert "48 samples checked" in first.output
    manifest = (tmp_path / "demo/converted/manifest.json").read_bytes()
    second = runner.invoke(main, args)  # reuses the dataset and the finished conversion
    assert second.exit_code == 0, second.output
    assert (tmp_path / "demo/converted/manifest.json").read_bytes() == manifest
