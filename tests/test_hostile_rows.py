"""Rows the metadata contradicts, refused alike by convert, ``verify`` and the loaders (the third hostile
round): a row whose ``timestamp`` is not ``frame_index / fps`` (LeRobot decodes at the timestamp, we by
position) and a task string listed twice in ``meta/tasks.parquet`` (LeRobot maps a string to one index)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_shards.convert import shard_writer
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.verify import verify_dataset
from lerobot_shards.exceptions import LeRobotShardsError
from lerobot_shards.loader import EpisodePoolDataset

DATA0 = "data/chunk-000/file-000.parquet"
ROW = r"data/chunk-000/file-000\.parquet: episode 0: row 1: timestamp 0\.0666\d* s is not frame_index 1 / fps 30"


@pytest.fixture
def swapped(synth_factory, tmp_path: Path) -> Path:
    """A raw dataset whose episode 0 has rows 1 and 2's timestamps swapped."""
    root = Path(shutil.copytree(synth_factory(num_episodes=2, length_range=(6, 6)), tmp_path / "raw"))
    table = pq.read_table(root / DATA0)
    stamps = table.column("timestamp").to_pylist()
    stamps[1], stamps[2] = stamps[2], stamps[1]
    column = table.schema.get_field_index("timestamp")
    pq.write_table(
        table.set_column(column, table.schema.field(column), pa.array(stamps, table.schema.field(column).type)),
        root / DATA0,
    )
    return root


def test_convert_refuses_a_row_whose_timestamp_is_not_its_frame(swapped: Path, tmp_path: Path) -> None:
    with pytest.raises(LeRobotShardsError, match=ROW) as raised:
        convert_dataset(swapped, tmp_path / "out", ConvertOptions(episodes_per_shard=1), progress=False)
    assert "\n" not in str(raised.value)


def test_verify_and_the_loader_refuse_what_an_older_converter_copied(
    swapped: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversion that kept the swapped rows (the converter's check switched off, as before it
    existed): ``verify --source`` reports the row, the loader refuses the episode naming it."""
    monkeypatch.setattr(shard_writer, "check_timestamps", lambda *args: None)
    out = tmp_path / "out"
    convert_dataset(swapped, out, ConvertOptions(episodes_per_shard=1), progress=False)
    report = verify_dataset(out, swapped)
    assert any("row 1: timestamp 0.0666" in p and "e000000.parquet" in p for p in report.problems), report.problems
    with pytest.raises(
        LeRobotShardsError, match=r"shard-000000\.tar.*row 1: timestamp 0\.0666\d* s is not frame_index 1"
    ):
        list(EpisodePoolDataset(str(out), shuffle=False))


def test_a_task_listed_twice_is_refused_at_convert_as_by_the_raw_loader(synth_factory, tmp_path: Path) -> None:
    root = Path(shutil.copytree(synth_factory(num_episodes=2, length_range=(6, 6)), tmp_path / "raw"))
    table = pq.read_table(root / "meta/tasks.parquet")
    name = next(c for c in table.column_names if c != "task_index")
    values = table.column(name).to_pylist()
    values[1] = values[0]
    pq.write_table(
        table.set_column(table.schema.get_field_index(name), name, pa.array(values)), root / "meta/tasks.parquet"
    )
    want = rf"meta/tasks\.parquet: task {values[0]!r} is listed twice \(task_index 0 and 1\)"
    with pytest.raises(LeRobotShardsError, match=want) as raised:
        convert_dataset(root, tmp_path / "out", ConvertOptions(episodes_per_shard=1), progress=False)
    assert "\n" not in str(raised.value)
    with pytest.raises(LeRobotShardsError, match=want):
        EpisodePoolDataset(str(root))
