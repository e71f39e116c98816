"""Next to LeRobot 0.6.1 (which pins av>=15,<16): importing lerobot_shards works and never imports LeRobot,
and ``convert --resize`` (bit-exact libswscale flags) stays byte-deterministic under that PyAV."""

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


def test_resize_under_this_pyav_is_deterministic(written: Dataset, tmp_path: Path) -> None:
    options = ConvertOptions(resize={"*": (32, 48)}, resize_mode="crop")
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        convert_dataset(written.raw, out, options, progress=False)
    files = [{p.relative_to(o): p.read_bytes() for p in sorted(o.rglob("*")) if p.is_file()} for o in outs]
    assert files[0] == files[1] and any(str(k).endswith(".tar") for k in files[0])
