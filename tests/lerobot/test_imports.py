"""Next to LeRobot 0.6.1 (which pins av>=15,<16): importing lerobot_shards works and never imports LeRobot,
and ``convert --resize`` (bit-exact libswscale flags) works under that PyAV."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from procs import env

from conftest import Dataset
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset


def test_import_next_to_lerobot_never_imports_it() -> None:
    code = (
        "import sys, av; assert av.__version__.startswith('15.'), av.__version__\n"
        "import lerobot_shards, lerobot_shards.cli, lerobot_shards.loader, lerobot_shards.video\n"
        "from lerobot_shards.loader import EpisodePoolDataset\n"
        "bad = [m for m in sys.modules if m == 'lerobot' or m.startswith('lerobot.')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env(), check=True, timeout=120)


def test_resize_under_this_pyav_matches_the_source_resized(written: Dataset, tmp_path: Path) -> None:
    """``convert --resize`` (libswscale's bit-exact flags as ints, PyAV 15 has no names for them) writes
    clips whose frames ``verify --source`` finds equal to the source frames resized the same way."""
    out = tmp_path / "resized"
    convert_dataset(written.raw, out, ConvertOptions(resize={"*": (32, 48)}, resize_mode="crop"), progress=False)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lerobot_shards.cli",
            "verify",
            str(out),
            "--source",
            str(written.raw),
            "--decode-check",
            "3",
            "--no-progress",
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
