"""The LeRobot v3.0 reader: the real fixture, synthetic shapes, and every bad input's error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lerobot_shards.lerobot_v3 import LeRobotV3Source, SourceError

EPISODES = "meta/episodes/chunk-000/file-000.parquet"
DATA = "data/chunk-000/file-000.parquet"


@pytest.fixture
def fixture_copy(fixture_root: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ds"
    shutil.copytree(fixture_root, dst)
    return dst


def _edit_parquet(path: Path, fn) -> None:
    pq.write_table(fn(pq.read_table(path)), path)


def _set_column(table: pa.Table, name: str, values) -> pa.Table:
    i = table.column_names.index(name)
    return table.set_column(i, name, pa.array(values, type=table.schema.field(name).type))


def test_reads_real_fixture(fixture_root: Path) -> None:
    src = LeRobotV3Source(str(fixture_root))
    assert src.fps == 30
    assert src.camera_keys == ("observation.images.front", "observation.images.top")
    assert src.tasks == ("Pick the orange cube and place it in the box",)
    assert [e.length for e in src.episodes] == [373, 374, 372, 373]
    assert src.total_frames == 1492
    ep = src.episode(2)
    assert ep.videos["observation.images.top"].first_frame(src.fps) == 747
    rows = src.read_episode_table(ep)
    assert rows.column("index").to_pylist() == list(range(747, 1119))
    assert rows.column("frame_index").to_pylist() == list(range(372))
    assert rows.schema.field("action").type == pa.list_(pa.float32(), 6)
    assert "stats/action/mean" in src.episode_stats_row(2)
    assert "stats/action/mean" not in rows.column_names
    src.validate()
    sizes = src.episode_sizes()
    assert [s.episode_index for s in sizes] == [0, 1, 2, 3] and all(s.est_bytes > 0 for s in sizes)


@pytest.mark.parametrize(
    "shape",
    [
        dict(num_episodes=5, episodes_per_video_file=2, episodes_per_data_file=3),
        dict(num_episodes=3, episodes_per_video_file=1, episodes_per_data_file=1),
        dict(num_episodes=4, episodes_per_video_file=1, episodes_per_data_file=1, chunks_size=2),
        dict(num_episodes=3, cameras=(), episodes_per_data_file=2),
        dict(num_episodes=3, vector_storage="list", image_keys=("observation.images.wrist",)),
    ],
    ids=["multi-file", "one-episode-per-file", "multi-chunk", "no-video", "list-vectors-and-images"],
)
def test_reads_synthetic_shapes(synth_factory, shape) -> None:
    root = synth_factory(**shape)
    src = LeRobotV3Source(str(root))
    assert len(src.episodes) == shape["num_episodes"]
    if "chunks_size" in shape:
        assert any("chunk-001" in e.data_path for e in src.episodes)
    expected_index = 0
    for ep, rows in src.iter_episode_tables(src.episodes):
        assert rows.num_rows == ep.length
        assert rows.column("index").to_pylist() == list(range(expected_index, expected_index + ep.length))
        assert set(rows.column("episode_index").to_pylist()) == {ep.episode_index}
        state = np.asarray(rows.column("observation.state").to_pylist(), dtype=np.float32)
        frames = np.arange(ep.length)
        np.testing.assert_allclose(state[:, 0], ep.episode_index * 1000 + frames)
        for key in src.image_keys:
            assert rows.column(key)[0].as_py()["bytes"][:8] == b"\x89PNG\r\n\x1a\n"
        expected_index += ep.length
    assert set(src.camera_keys) == set(shape.get("cameras", src.camera_keys))
    src.validate()


def test_rejects_v21_with_upgrade_hint(fixture_copy: Path) -> None:
    info = json.loads((fixture_copy / "meta/info.json").read_text())
    info["codebase_version"] = "v2.1"
    (fixture_copy / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(SourceError, match=r"info\.json.*v2\.1.*v2\.1-to-v3\.0 conversion"):
        LeRobotV3Source(str(fixture_copy))


def test_lists_missing_files(fixture_copy: Path) -> None:
    (fixture_copy / DATA).unlink()
    (fixture_copy / "videos/observation.images.top/chunk-000/file-000.mp4").unlink()
    with pytest.raises(SourceError) as err:
        LeRobotV3Source(str(fixture_copy))
    msg = str(err.value)
    assert "2 missing file(s)" in msg and DATA in msg and "observation.images.top/chunk-000/file-000.mp4" in msg


def test_length_disagreeing_with_index_range(fixture_copy: Path) -> None:
    _edit_parquet(fixture_copy / EPISODES, lambda t: _set_column(t, "length", [373, 375, 372, 373]))
    with pytest.raises(SourceError, match=r"episode 1: length is 375 but .* spans 374 rows"):
        LeRobotV3Source(str(fixture_copy))


def test_length_disagreeing_with_rows(fixture_copy: Path) -> None:
    def grow(t: pa.Table) -> pa.Table:
        t = _set_column(t, "length", [373, 374, 372, 380])
        return _set_column(t, "dataset_to_index", [373, 747, 1119, 1499])

    _edit_parquet(fixture_copy / EPISODES, grow)
    src = LeRobotV3Source(str(fixture_copy))
    with pytest.raises(SourceError, match=r"file-000\.parquet: episode 3 has length 380 .* holds 373"):
        src.read_episode_table(3)


def test_rows_of_another_episode(fixture_copy: Path) -> None:
    _edit_parquet(fixture_copy / DATA, lambda t: _set_column(t, "episode_index", [0] * 400 + [1] * 1092))
    src = LeRobotV3Source(str(fixture_copy))
    with pytest.raises(SourceError, match=r"belong to episode 1 but field 'episode_index' holds 0"):
        src.read_episode_table(1)


def test_non_contiguous_index(fixture_copy: Path) -> None:
    index = list(range(1492))
    index[500:] = [i + 1 for i in index[500:]]
    _edit_parquet(fixture_copy / DATA, lambda t: _set_column(t, "index", index))
    src = LeRobotV3Source(str(fixture_copy))
    with pytest.raises(SourceError, match=r"file-000\.parquet: column 'index' is not contiguous \(row 499"):
        src.read_episode_table(0)


def test_timestamps_outside_video(fixture_copy: Path) -> None:
    """The rows decide an episode's frames: a bogus to_timestamp is tolerated, rows past the video are not."""
    col = "videos/observation.images.front/to_timestamp"
    _edit_parquet(fixture_copy / EPISODES, lambda t: _set_column(t, col, [12.4333, 24.9, 37.3, 60.0]))
    src = LeRobotV3Source(str(fixture_copy))
    src.check_episode_videos(3)
    assert src.span_mismatches() == [3]
    col = "videos/observation.images.front/from_timestamp"
    _edit_parquet(fixture_copy / EPISODES, lambda t: _set_column(t, col, [0.0, 12.4333, 24.9, 40.0]))
    src = LeRobotV3Source(str(fixture_copy))
    src.check_episode_videos(0)
    with pytest.raises(
        SourceError,
        match=r"file-000\.mp4: episode 3 field videos/observation\.images\.front/"
        r"from_timestamp = 40\.0000 s plus its \d+ rows ends at .* outside the video",
    ):
        src.check_episode_videos(3)


def test_unknown_feature_dtype(fixture_copy: Path) -> None:
    info = json.loads((fixture_copy / "meta/info.json").read_text())
    info["features"]["action"]["dtype"] = "complex128"
    (fixture_copy / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(SourceError, match=r"info\.json: feature 'action' has unknown dtype 'complex128'"):
        LeRobotV3Source(str(fixture_copy))


def test_missing_metadata_field_is_not_a_bare_key_error(fixture_copy: Path) -> None:
    _edit_parquet(fixture_copy / EPISODES, lambda t: t.drop_columns(["videos/observation.images.top/from_timestamp"]))
    with pytest.raises(
        SourceError, match=r"episode 0: missing field\(s\) videos/observation\.images\.top/from_timestamp"
    ):
        LeRobotV3Source(str(fixture_copy))


def test_corrupt_parquet(fixture_copy: Path) -> None:
    (fixture_copy / DATA).write_bytes(b"not parquet at all")
    src = LeRobotV3Source(str(fixture_copy))
    with pytest.raises(SourceError, match=r"file-000\.parquet: not a readable parquet file"):
        src.read_episode_table(0)


def test_corrupt_mp4(fixture_copy: Path) -> None:
    (fixture_copy / "videos/observation.images.top/chunk-000/file-000.mp4").write_bytes(b"\x00" * 100)
    src = LeRobotV3Source(str(fixture_copy))
    with pytest.raises(SourceError, match=r"observation\.images\.top/chunk-000/file-000\.mp4: not a readable mp4"):
        src.check_episode_videos(0)


def test_unknown_episode(fixture_root: Path) -> None:
    with pytest.raises(SourceError, match="no episode 9"):
        LeRobotV3Source(str(fixture_root)).episode(9)


@pytest.mark.parametrize(
    "values, type_",
    [
        ([1, -2, 3], pa.int8()),
        ([1, -2, 3], pa.int64()),
        ([1, 2, 3], pa.uint16()),
        ([2**64 - 1, 0, 7], pa.uint64()),
        ([0.5, -1.25, 3.0], pa.float16()),
        ([0.5, -1.25, 3.0], pa.float32()),
        ([0.5, -1.25, 3.0], pa.float64()),
        ([True, False, True, True, False, False, True, False, True], pa.bool_()),
        ([], pa.float32()),
        ([], pa.bool_()),
    ],
)
def test_numpy_of_equals_to_numpy_for_chunks_slices_and_empties(values, type_) -> None:
    from lerobot_shards.lerobot_v3 import numpy_of

    arr = pa.array(values, type=type_)
    chunked = pa.chunked_array([arr, arr.slice(1)], type=type_)
    for col in (arr, arr.slice(1), arr.slice(2, 1), chunked):
        got, want = numpy_of(col), col.to_numpy(zero_copy_only=False)
        assert got.dtype == want.dtype and got.tolist() == want.tolist()


def test_numpy_of_keeps_nulls_as_to_numpy_does() -> None:
    from lerobot_shards.lerobot_v3 import numpy_of

    col = pa.array([1.0, None, 3.0], type=pa.float32())
    assert np.isnan(numpy_of(col)[1]) and numpy_of(col)[2] == 3.0


def test_a_dataset_path_with_glob_characters_reads_its_own_episodes(synth_factory, tmp_path: Path) -> None:
    """meta/episodes was found by a glob on the dataset's path: "ds[x]" read nothing alone and its
    sibling "dsx"'s episodes beside it."""
    shutil.copytree(synth_factory(num_episodes=3, cameras=()), tmp_path / "ds[x]")
    shutil.copytree(synth_factory(num_episodes=5, cameras=()), tmp_path / "dsx")
    assert len(LeRobotV3Source(str(tmp_path / "ds[x]")).episodes) == 3


def test_files_under_folders_of_other_names_are_found(synth_factory, tmp_path: Path) -> None:
    """info.json's templates may name folders other than data/ and videos/: their files were listed
    as missing."""
    root = tmp_path / "ds"
    shutil.copytree(synth_factory(num_episodes=2), root)
    (root / "videos").rename(root / "clips")
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["video_path"].startswith("videos/")
    info["video_path"] = "clips/" + info["video_path"][len("videos/") :]
    (root / "meta" / "info.json").write_text(json.dumps(info))
    src = LeRobotV3Source(str(root))
    assert not src.missing_files and len(src.episodes) == 2


def test_a_camera_folder_symlinked_elsewhere_is_named_as_such(synth_factory, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    shutil.copytree(synth_factory(num_episodes=2), root)
    camera = next((root / "videos").iterdir())
    camera.rename(tmp_path / "elsewhere")
    camera.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SourceError, match="reached only through a symlink, which is not followed"):
        LeRobotV3Source(str(root))
