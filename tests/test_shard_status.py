"""One answer to "is this shard complete?", as resume, finalize and verify ask it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lerobot_shards.convert.destination import Destination
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.shard_status import shard_status
from lerobot_shards.format import SHARDS_DIR, shard_name, sidecar_name

TAR, SIDE = shard_name(1), sidecar_name(1)


@pytest.fixture()
def out(small_synth: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("status") / "out"
    convert_dataset(small_synth, root, ConvertOptions(episodes_per_shard=2), progress=False)
    return root


def _status(out: Path, **kw):  # type: ignore[no-untyped-def]
    return shard_status(Destination(str(out)), TAR, SIDE, **kw)


def test_a_converted_shard_is_complete_and_holds_its_episodes(out: Path) -> None:
    status = _status(out, check_sha256=True)
    assert status.complete and status.problem is None
    assert status.holds([2, 3]) and not status.holds([3, 2]) and not status.holds([2, 3, 4])
    present = set(Destination(str(out)).entries(SHARDS_DIR))
    assert _status(out, present=present).complete


def test_each_way_a_shard_is_incomplete_is_named(out: Path) -> None:
    tar, side = out / SHARDS_DIR / TAR, out / SHARDS_DIR / SIDE
    data = bytearray(tar.read_bytes())
    data[-2000] ^= 0xFF  # same size, other bytes: only the hash tells
    tar.write_bytes(bytes(data))
    assert _status(out).complete
    assert _status(out, check_sha256=True).problem == "sha256 differs from the sidecar's"
    tar.write_bytes(bytes(data[:-512]))
    assert _status(out).problem == f"{len(data) - 512} bytes, sidecar says {len(data)}"
    text = side.read_text()
    side.write_text(text[:-10])
    assert _status(out).problem.startswith("unreadable sidecar")
    side.unlink()
    assert _status(out).problem == "no sidecar"
    tar.unlink()
    assert _status(out).problem == "no tar"


def test_a_sidecar_with_skipped_episodes_holds_the_plan(out: Path) -> None:
    side = out / SHARDS_DIR / SIDE
    doc = json.loads(side.read_text())
    doc["skipped"] = {"3": "bad clip"}
    doc["episodes"] = [e for e in doc["episodes"] if e["episode_index"] == 2]
    side.write_text(json.dumps(doc))
    status = _status(out)
    assert status.holds([2, 3]) and not status.holds([2]) and not status.holds([2, 4])
