"""Quirks of real recordings that LeRobot tolerates: each converts (and loads) with the right frames.

One synthetic dataset per quirk (``synth_dataset`` options reproduce them); every test converts it,
checks the painted identity of each clip's boundary frames, and streams a few samples through
the loader checking theirs.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from convert_helpers import assert_frame_identity, edit_episodes, set_column
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import ConvertError, convert_dataset
from lerobot_shards.convert.verify import verify_dataset
from lerobot_shards.lerobot_v3 import LeRobotV3Source, SourceError
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.synth import read_identity
from waits import HANG_GUARD_S

CAM = "cam"
SMALL = dict(num_episodes=4, cameras=(CAM,), length_range=(10, 16))


def _loads_right_frames(source: Path | str, **kwargs) -> int:
    """Stream a few batches; every sample's image shows its own (episode, frame). Returns samples seen."""
    ds = EpisodePoolDataset(str(source), seed=3, episode_pool_size=2, **kwargs)
    seen = 0
    for batch in DataLoader(ds, batch_size=8, num_workers=0):
        for i, (ep, frame) in enumerate(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist())):
            assert read_identity(batch[CAM][i]) == (ep, frame)
            seen += 1
        if seen >= 24:
            break
    return seen


def _convert_and_check(root: Path, out: Path, **kw) -> None:
    manifest = convert_dataset(root, out, ConvertOptions(episodes_per_shard=2), progress=False, **kw)
    assert manifest.total_episodes == 4 and not manifest.skipped_episodes
    assert assert_frame_identity(out) > 0
    assert verify_dataset(out, root).ok
    assert _loads_right_frames(out) >= 24


def test_to_timestamp_one_frame_short(synth_factory, tmp_path: Path, caplog) -> None:
    """Every episode's to_timestamp a frame short of its rows, the mp4 holding every frame: converted
    by the rows with one warning counting the episodes (the raw loader reads them the same way)."""
    root = synth_factory(**SMALL, to_timestamp_short_frames=1)
    assert LeRobotV3Source(str(root)).span_mismatches() == [0, 1, 2, 3]
    with caplog.at_level(logging.WARNING, logger="lerobot_shards"):
        _convert_and_check(root, tmp_path / "out")
    warnings = [r.getMessage() for r in caplog.records if "to_timestamp" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("4 of 4 episodes (first: episode 0)")
    assert _loads_right_frames(root) >= 24


def test_rows_reaching_into_another_episode_fail(synth_factory, tmp_path: Path) -> None:
    """Rows whose frames belong to the next episode of the file are refused, naming both episodes."""
    root = Path(shutil.copytree(synth_factory(**SMALL), tmp_path / "src"))
    key = f"videos/{CAM}/from_timestamp"
    edit_episodes(
        root, lambda t: set_column(t, key, [v - (3 / 30 if i == 1 else 0) for i, v in enumerate(t[key].to_pylist())])
    )
    with pytest.raises(
        ConvertError, match=r"episode 0 field videos/cam/from_timestamp = .* overlap episode 1's frames"
    ):
        convert_dataset(root, tmp_path / "out", progress=False)


def test_row_timestamps_jitter_within_tolerance(synth_factory, tmp_path: Path) -> None:
    root = synth_factory(**SMALL, timestamp_jitter_s=5e-5, from_timestamp_jitter_s=4e-3)
    _convert_and_check(root, tmp_path / "out")


def test_codec_label_differs_from_stream(synth_factory, tmp_path: Path) -> None:
    root = synth_factory(**SMALL, codec="h264", codec_label="av1")  # info.json says av1, the stream is H.264
    _convert_and_check(root, tmp_path / "out")
    assert _loads_right_frames(root) >= 24


def test_one_episode_per_file(synth_factory, tmp_path: Path) -> None:
    root = synth_factory(**SMALL, episodes_per_video_file=1, episodes_per_data_file=1)
    _convert_and_check(root, tmp_path / "out")


def test_b_frames_in_the_source(synth_factory, tmp_path: Path) -> None:
    """Clips with B-frames cannot be cut by stream copy safely: they are re-encoded (counted), frames intact."""
    root = synth_factory(**SMALL, gop=6, bframes=2, episodes_per_video_file=2)
    manifest = convert_dataset(root, tmp_path / "out", ConvertOptions(episodes_per_shard=2), progress=False)
    assert manifest.video["fallback_reencoded_episodes"] == [0, 1, 2, 3]
    assert assert_frame_identity(tmp_path / "out", stride=1) > 0
    assert _loads_right_frames(tmp_path / "out") >= 24
    assert _loads_right_frames(root) >= 24


def test_raw_subset_needs_only_its_episodes_files(synth_factory, tmp_path: Path) -> None:
    """As LeRobot downloads only the chosen episodes' files, a raw subset opens without the others'."""
    root = Path(shutil.copytree(synth_factory(**SMALL), tmp_path / "src"))
    (root / f"videos/{CAM}/chunk-000/file-001.mp4").unlink()  # episodes 2 and 3
    (root / "data/chunk-000/file-001.parquet").unlink()
    ds = EpisodePoolDataset(str(root), episodes=[0, 1], seed=0, episode_pool_size=2)
    got = {(ep, frame) for s in ds for ep, frame in [(int(s["episode_index"]), int(s["frame_index"]))]}
    lengths = {e.episode_index: e.length for e in LeRobotV3Source(str(root), allow_missing_files=True).episodes}
    assert got == {(e, f) for e in (0, 1) for f in range(lengths[e])}
    assert _loads_right_frames(root, episodes=[0, 1]) >= 24
    with pytest.raises(
        SourceError, match=r"missing file\(s\) for the chosen episodes: .*file-001\.mp4 \(needed by episode 2\)"
    ):
        EpisodePoolDataset(str(root), episodes=[1, 2])
    with pytest.raises(SourceError, match=r"missing file"):
        EpisodePoolDataset(str(root))


def test_an_fps_the_files_lack_fails_alike_in_converter_and_raw_loader(synth_factory, tmp_path: Path) -> None:
    """info.json (and video.fps) say 60 while rows and mp4s are at 30: found by position at 60, episode 1's
    rows would take frames of episode 2 of the same file. The converter and the raw loader refuse it with
    one error naming the mp4, the episode and the camera, before any frame is cut or returned."""
    root = Path(shutil.copytree(synth_factory(**SMALL, episodes_per_video_file=4), tmp_path / "src"))
    info = json.loads((root / "meta/info.json").read_text())
    info["fps"] = info["features"][CAM]["info"]["video.fps"] = 60
    (root / "meta/info.json").write_text(json.dumps(info))
    message = (
        rf"{root}/videos/cam/chunk-000/file-000\.mp4: episode \d camera cam: the mp4 holds \d+ frames over .* s "
        r"\(30 fps\), but meta/info\.json has fps = 60"
    )
    with pytest.raises(ConvertError, match=message):
        convert_dataset(root, tmp_path / "out", progress=False)
    with pytest.raises(SourceError, match=message):
        _loads_right_frames(root)


def _move_clip(root: Path, episode: int, frames: float) -> None:
    """Move one episode's from_timestamp by a fraction of a frame (30 fps)."""
    key = f"videos/{CAM}/from_timestamp"
    edit_episodes(
        root,
        lambda t: set_column(
            t, key, [v + (frames / 30 if i == episode else 0) for i, v in enumerate(t[key].to_pylist())]
        ),
    )


def test_a_from_timestamp_off_the_grid_takes_the_nearest_frame_or_fails(synth_factory, tmp_path: Path) -> None:
    """Off the frame grid by under half a frame, an episode starts at the nearest frame (converted and
    read raw, the right one). By more, its rows reach into the next episode's frames (the raw loader
    refuses the dataset when it opens it, with the converter's error) or past the video's end (refused
    when the episode is read)."""
    clean = synth_factory(**SMALL)  # two episodes per mp4
    root = Path(shutil.copytree(clean, tmp_path / "near"))
    _move_clip(root, 1, 0.45)
    _convert_and_check(root, tmp_path / "out")
    assert _loads_right_frames(root) >= 24
    for name, episode, message in [
        (
            "into_next",
            0,
            r"episode 0 field videos/cam/from_timestamp = 0\.0200 s: its \d+ rows \(field 'length'\) would "
            r"take frames 1\.\..* overlap episode 1's frames",
        ),
        ("past_end", 1, r"episode 1 field videos/cam/from_timestamp = .* rows ends at .* outside the video"),
    ]:
        root = Path(shutil.copytree(clean, tmp_path / name))
        _move_clip(root, episode, 0.6)
        with pytest.raises(ConvertError, match=message):
            convert_dataset(root, tmp_path / f"out_{name}", progress=False)
        with pytest.raises(SourceError, match=message):
            _loads_right_frames(root)


def test_a_raw_episodes_mp4_headers_are_read_together_from_a_bucket(fixture_root: Path, s3_server, monkeypatch) -> None:
    """Admitting an episode checks its rows against each camera mp4's header; from a bucket each
    header costs round trips, so the cameras' headers are read at once, not one after another."""
    fs = s3_server.filesystem()
    fs.mkdir("raw-headers")
    fs.put(str(fixture_root), "raw-headers/", recursive=True)
    meet = threading.Barrier(2, timeout=HANG_GUARD_S)
    header = LeRobotV3Source.video_header

    def together(self, rel_path, local_path=None):
        if rel_path not in self._video_headers:
            meet.wait()  # BrokenBarrierError after 30 s alone
        return header(self, rel_path, local_path)

    monkeypatch.setattr(LeRobotV3Source, "video_header", together)
    ds = EpisodePoolDataset(f"s3://raw-headers/{fixture_root.name}", storage_options=s3_server.storage_options)
    sample = next(iter(ds))
    assert sample["observation.images.front"].shape[0] == 3 and sample["observation.images.top"].shape[0] == 3
