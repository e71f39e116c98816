"""torch and torchcodec come as a pair (torchcodec 0.N with torch 2.N); a mismatch is named at import."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from lerobot_shards.torch_pair import check_torch_pair
from waits import HANG_GUARD_S


def test_the_installed_pair_and_the_tested_ones_pass() -> None:
    check_torch_pair()
    for torch_version, torchcodec_version in (
        ("2.13.0+cpu", "0.13.0"),
        ("2.11.0", "0.11.1+cu130"),
        ("2.12.1", "0.12.0"),
    ):
        check_torch_pair(torch_version, torchcodec_version)


@pytest.mark.parametrize(
    ("torch_version", "torchcodec_version", "fix"),
    [
        ("2.11.0", "0.13.0", "pip install 'torchcodec==0.11.*', or pip install 'torch==2.13.*' 'torchcodec==0.13.*'"),
        ("2.14.0", "0.17.0", "fix: pip install 'torch==2.13.*' 'torchcodec==0.13.*'"),  # what a user's pip once chose
    ],
)
def test_a_mismatched_pair_is_one_line_naming_both_and_the_fix(
    torch_version: str, torchcodec_version: str, fix: str
) -> None:
    with pytest.raises(ImportError) as info:
        check_torch_pair(torch_version, torchcodec_version)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"torch {torch_version} with torchcodec {torchcodec_version}: ")
    assert message.endswith(fix), message


def test_importing_the_loader_with_a_mismatched_torchcodec_fails_with_that_line(tmp_path: Path) -> None:
    """A torchcodec distribution recorded at another version comes first on the path: the loader's
    import stops before torchcodec loads, naming the pair (not a missing symbol inside torchcodec)."""
    torch_version = metadata.version("torch")
    minor = int(torch_version.split(".")[1])
    fake = tmp_path / f"torchcodec-0.{minor - 2}.0.dist-info"
    fake.mkdir()
    (fake / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torchcodec\nVersion: 0.{minor - 2}.0\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", "import lerobot_shards.loader"],
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_GUARD_S,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"ImportError: torch {torch_version} with torchcodec 0.{minor - 2}.0: torchcodec must match"
    ), result.stderr
