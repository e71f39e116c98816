"""synth.py: identity painting, and synthetic datasets that read back frame-exactly like LeRobot's."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner
from torchcodec.decoders import VideoDecoder

from lerobot_shards.cli import main
from lerobot_shards.synth import FIXTURE_BITS, paint_identity, read_identity, synth_dataset
from lerobot_shards.video import probe_clip

EPISODES = "meta/episodes/chunk-000/file-000.parquet"

SHAPES = {
    "multi-file": dict(num_episodes=5, episodes_per_video_file=2, episodes_per_data_file=3),
    "one-per-file": dict(num_episodes=3, episodes_per_video_file=1, episodes_per_data_file=1),
    "multi-chunk": dict(num_episodes=4, episodes_per_video_file=1, episodes_per_data_file=2, chunks_size=1),
    "av1-jitter": dict(num_episodes=4, codec="av1", episodes_per_video_file=3, from_timestamp_jitter_s=0.004),
    "hevc-list-images": dict(
        num_episodes=3, codec="hevc", vector_storage="list", image_keys=("observation.images.wrist",), num_tasks=3
    ),
}


def _episodes(root: Path) -> list[dict[str, Any]]:
    return pq.read_table(root / EPISODES).to_pylist()


def _info(root: Path) -> dict[str, Any]:
    return json.loads((root / "meta/info.json").read_text())


def _data(root: Path, ep: dict[str, Any]) -> dict[str, list[Any]]:
    path = root / _info(root)["data_path"].format(chunk_index=ep["data/chunk_index"], file_index=ep["data/file_index"])
    rows = pq.read_table(path)
    start = rows.column("index").to_pylist().index(ep["dataset_from_index"])
    return rows.slice(start, ep["length"]).to_pydict()


def _nearest_frames(decoder: VideoDecoder, queries: list[float], fps: float):
    """Frames nearest to ``from_timestamp + timestamp``, as LeRobot picks them.

    Not ``get_frames_played_at``: the float32 timestamp column rounds k/fps down as often as up
    (float32(17/30) < 17/30), and a jittered from_timestamp may sit before the frame's pts, so
    "the frame on screen at t" is the previous frame there.
    """
    return decoder.get_frames_at([round(q * fps) for q in queries])


# ---------------------------------------------------------------- painting


@pytest.mark.parametrize("episode, frame", [(0, 0), (1, 1), (513, 682), (1023, 1023)])
def test_paint_read_roundtrip_all_layouts(episode: int, frame: int) -> None:
    img = paint_identity(episode, frame, 64, 160, camera_index=1)
    assert img.shape == (64, 160, 3) and img.dtype == np.uint8
    chw = torch.from_numpy(img).permute(2, 0, 1)
    for view in (img, chw, chw.float() / 255, img.astype(np.float32) / 255):
        assert read_identity(view) == (episode, frame)


def test_paint_identity_bits_and_bounds() -> None:
    bits = dict(frame_bits=4, episode_bits=4)
    assert read_identity(paint_identity(5, 9, 48, 64, **bits), **bits) == (5, 9)
    assert read_identity(paint_identity(15, 0, 48, 64, **bits), **bits) == (15, 0)
    with pytest.raises(ValueError, match="frame_index 16 does not fit in frame_bits=4"):
        paint_identity(0, 16, 48, 64, frame_bits=4, episode_bits=4)
    with pytest.raises(ValueError, match="width 10 is narrower than the 20 identity bands"):
        paint_identity(0, 0, 48, 10)
    with pytest.raises(ValueError, match="one frame"):
        read_identity(np.zeros((2, 3, 48, 64), np.uint8))


def test_cameras_differ_only_above_the_bands() -> None:
    a, b = paint_identity(3, 4, 64, 160, 0), paint_identity(3, 4, 64, 160, 1)
    assert not np.array_equal(a[: 64 // 6], b[: 64 // 6])
    assert np.array_equal(a[64 // 3 :], b[64 // 3 :])


def test_realistic_texture_lies_under_the_bands_and_moves() -> None:
    flat = [paint_identity(7, f, 96, 160, 1) for f in range(3)]
    real = [paint_identity(7, f, 96, 160, 1, texture="realistic", seed=3) for f in range(3)]
    under = [r.astype(np.int16) - fl for r, fl in zip(real, flat)]
    assert all(read_identity(img) == (7, f) for f, img in enumerate(real))
    assert all(u[96 // 3 :].std() > 10 for u in under)  # texture inside the bands too, not only above
    assert not np.array_equal(under[0], under[1]) and not np.array_equal(under[1], under[2])  # camera shake
    assert np.array_equal(real[1], paint_identity(7, 1, 96, 160, 1, texture="realistic", seed=3))
    assert not np.array_equal(real[1], paint_identity(7, 1, 96, 160, 1, texture="realistic", seed=4))
    with pytest.raises(ValueError, match="texture 'noisy'"):
        paint_identity(0, 0, 96, 160, texture="noisy")


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_realistic_texture_weighs_more_and_reads_back(tmp_path: Path, codec: str) -> None:
    kwargs = dict(num_episodes=2, cameras=("cam",), height=120, width=160, codec=codec, length_range=(5, 5))
    flat = synth_dataset(tmp_path / "flat", **kwargs)
    real = synth_dataset(tmp_path / "real", texture="realistic", **kwargs)
    again = synth_dataset(tmp_path / "again", texture="realistic", **kwargs)
    mp4 = "videos/cam/chunk-000/file-000.mp4"
    assert (real / mp4).stat().st_size > 1.5 * (flat / mp4).stat().st_size
    assert (real / mp4).read_bytes() == (again / mp4).read_bytes()
    decoder = VideoDecoder(str(real / mp4))
    got = [read_identity(decoder.get_frame_at(i).data) for i in range(decoder.metadata.num_frames)]
    assert got == [(e, f) for e in range(2) for f in range(5)]


def test_fixture_identity_scheme(fixture_root: Path) -> None:
    info = _info(fixture_root)
    frame_bits, episode_bits = FIXTURE_BITS
    for camera in ("observation.images.front", "observation.images.top"):
        decoder = None
        for ep in _episodes(fixture_root):
            path = fixture_root / info["video_path"].format(
                video_key=camera,
                chunk_index=ep[f"videos/{camera}/chunk_index"],
                file_index=ep[f"videos/{camera}/file_index"],
            )
            decoder = decoder or VideoDecoder(str(path))
            timestamps = _data(fixture_root, ep)["timestamp"]
            picks = [0, 1, ep["length"] // 2, ep["length"] - 1]
            start = ep[f"videos/{camera}/from_timestamp"]
            frames = _nearest_frames(decoder, [start + timestamps[i] for i in picks], info["fps"]).data
            got = [read_identity(f, frame_bits=frame_bits, episode_bits=episode_bits) for f in frames]
            assert got == [(ep["episode_index"], i) for i in picks], (camera, ep["episode_index"])


# ---------------------------------------------------------------- datasets


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_every_frame_reads_back_its_identity(synth_factory, shape: dict[str, Any]) -> None:
    root = synth_factory(**shape)
    info = _info(root)
    fps = info["fps"]
    cameras = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    assert cameras == ["observation.images.front", "observation.images.top"]
    jitter = shape.get("from_timestamp_jitter_s", 0.0)  # within LeRobot's 1e-4 s tolerance without it
    for camera in cameras:
        for ep in _episodes(root):
            path = root / info["video_path"].format(
                video_key=camera,
                chunk_index=ep[f"videos/{camera}/chunk_index"],
                file_index=ep[f"videos/{camera}/file_index"],
            )
            start = ep[f"videos/{camera}/from_timestamp"]
            assert ep[f"videos/{camera}/to_timestamp"] == pytest.approx(start + ep["length"] / fps)
            queries = [start + t for t in _data(root, ep)["timestamp"]]
            batch = _nearest_frames(VideoDecoder(str(path)), queries, fps)
            assert np.abs(batch.pts_seconds.numpy() - queries).max() <= max(jitter, 1e-4) + 1e-6
            got = [read_identity(f) for f in batch.data]
            assert got == [(ep["episode_index"], i) for i in range(ep["length"])], (camera, ep["episode_index"])
            assert probe_clip(path).frames[round(start * fps)].key_frame  # episodes start on a keyframe


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_rows_encode_identity(synth_factory, shape: dict[str, Any]) -> None:
    root = synth_factory(**shape)
    info = _info(root)
    episodes = _episodes(root)
    tasks = pq.read_table(root / "meta/tasks.parquet").to_pydict()
    num_tasks = shape.get("num_tasks", 2)
    assert tasks == {"task_index": list(range(num_tasks)), "__index_level_0__": [f"task {k}" for k in range(num_tasks)]}
    assert [e["episode_index"] for e in episodes] == list(range(shape["num_episodes"]))
    assert info["total_frames"] == sum(e["length"] for e in episodes) == episodes[-1]["dataset_to_index"]
    for ep in episodes:
        e, n = ep["episode_index"], ep["length"]
        assert ep["tasks"] == [f"task {e % num_tasks}"]
        rows = _data(root, ep)
        f = np.arange(n)
        assert rows["index"] == list(range(ep["dataset_from_index"], ep["dataset_to_index"]))
        assert rows["episode_index"] == [e] * n and rows["frame_index"] == f.tolist()
        assert rows["task_index"] == [e % num_tasks] * n
        np.testing.assert_array_equal(rows["timestamp"], (f / info["fps"]).astype(np.float32))
        state, action = np.array(rows["observation.state"]), np.array(rows["action"])
        np.testing.assert_allclose(state, e * 1000 + f[:, None] + np.arange(6) / 10, rtol=0, atol=1e-3)
        np.testing.assert_allclose(action, state + 0.5, rtol=0, atol=1e-3)
        assert ep["stats/observation.state/min"] == pytest.approx(state.min(axis=0).tolist())
        assert ep["stats/frame_index/max"] == [n - 1] and ep["stats/frame_index/count"] == [n]
        for key in shape.get("image_keys", ()):
            for i in (0, n - 1):
                with av.open(io.BytesIO(rows[key][i]["bytes"])) as png:
                    assert read_identity(next(png.decode(video=0)).to_ndarray(format="rgb24")) == (e, i)


def test_layout_and_schemas_mirror_lerobot(synth_factory, fixture_root: Path) -> None:
    root = synth_factory(**SHAPES["multi-chunk"])
    info, ref = _info(root), _info(fixture_root)
    assert list(info) == list(ref)
    assert info["features"]["observation.images.front"]["info"]["video.codec"] == "h264"
    assert info["splits"] == {"train": "0:4"} and info["chunks_size"] == 1
    episodes = _episodes(root)
    assert [(e["data/chunk_index"], e["data/file_index"]) for e in episodes] == [(0, 0), (0, 0), (1, 0), (1, 0)]
    assert [e["videos/observation.images.top/chunk_index"] for e in episodes] == [0, 1, 2, 3]
    assert all(e["videos/observation.images.top/from_timestamp"] == 0.0 for e in episodes)
    for rel in (EPISODES, "data/chunk-000/file-000.parquet", "meta/tasks.parquet"):
        assert pq.read_schema(root / rel).remove_metadata() == pq.read_schema(fixture_root / rel).remove_metadata(), rel
    stats, ref_stats = (json.loads((r / "meta/stats.json").read_text()) for r in (root, fixture_root))
    assert set(stats) == set(ref_stats) and all(set(stats[k]) == set(ref_stats[k]) for k in stats)
    assert np.shape(stats["observation.images.front"]["mean"]) == (3, 1, 1)
    assert stats["index"]["min"] == [0] and stats["index"]["max"] == [info["total_frames"] - 1]
    assert stats["index"]["count"] == [info["total_frames"]]
    assert not list(root.rglob("*.tmp"))


def test_no_video_dataset(synth_factory) -> None:
    root = synth_factory(num_episodes=3, cameras=(), episodes_per_data_file=2)
    info = _info(root)
    assert info["video_path"] is None and not (root / "videos").exists()
    assert not [c for c in pq.read_schema(root / EPISODES).names if c.startswith("videos/")]
    assert sorted(p.name for p in (root / "data/chunk-000").iterdir()) == ["file-000.parquet", "file-001.parquet"]


def test_deterministic_output(tmp_path: Path) -> None:
    kwargs = dict(num_episodes=3, length_range=(4, 9), codec="av1", from_timestamp_jitter_s=0.001, seed=7)
    a, b = synth_dataset(tmp_path / "a", **kwargs), synth_dataset(tmp_path / "b", **kwargs)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert any(f.suffix == ".mp4" for f in files) and any(f.suffix == ".json" for f in files)
    for rel in files:  # parquet and json always; mp4 too, as encoders run single-threaded
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    c = synth_dataset(tmp_path / "c", **{**kwargs, "seed": 8})
    assert [e["length"] for e in _episodes(c)] != [e["length"] for e in _episodes(a)]


def test_workers_write_the_same_bytes(tmp_path: Path) -> None:
    """Clips painted and encoded in spawned processes are joined in order: every file hashes the same."""
    kwargs = dict(num_episodes=3, height=48, width=64, length_range=(4, 7), codec="av1", texture="realistic")
    kwargs |= dict(episodes_per_video_file=2, from_timestamp_jitter_s=0.001, seed=5)
    digests = []
    for workers in (1, 2):
        root = synth_dataset(tmp_path / f"w{workers}", workers=workers, **kwargs)
        files = sorted(p for p in root.rglob("*") if p.is_file())
        digests.append({str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files})
    assert digests[0] == digests[1]
    assert sum(name.endswith(".mp4") for name in digests[0]) == 4  # 2 cameras x 2 files


def test_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="from_timestamp_jitter_s 0.02 must be in"):
        synth_dataset(tmp_path / "x", from_timestamp_jitter_s=0.02)
    with pytest.raises(ValueError, match="length_range"):
        synth_dataset(tmp_path / "x", length_range=(0, 5))
    with pytest.raises(ValueError, match="codec 'vp9'"):
        synth_dataset(tmp_path / "x", codec="vp9")
    with pytest.raises(ValueError, match="workers 0 must be >= 1"):
        synth_dataset(tmp_path / "x", workers=0)
    with pytest.raises(ValueError, match="codec hevc needs frames of at least 64x64, got 48x64"):
        synth_dataset(tmp_path / "x", codec="hevc", height=64, width=48)  # libx265 would abort the process
    (tmp_path / "full").mkdir()
    (tmp_path / "full/keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="full is not empty"):
        synth_dataset(tmp_path / "full")


def test_cli_synth(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    args = ["synth", str(out), "--episodes", "3", "--cameras", "cam", "--min-length", "3", "--max-length", "5"]
    result = CliRunner().invoke(main, args + ["--episodes-per-video-file", "1", "--chunks-size", "2", "--workers", "1"])
    assert result.exit_code == 0, result.output
    info = _info(out)
    assert f"3 episodes, {info['total_frames']} frames" in result.output
    assert (out / "videos/cam/chunk-001/file-000.mp4").is_file()
    textured = CliRunner().invoke(main, ["synth", str(tmp_path / "tex"), "--texture", "realistic", "--episodes", "1"])
    assert textured.exit_code == 0, textured.output
    bad = CliRunner().invoke(main, ["synth", str(tmp_path / "bad"), "--texture", "noisy"])
    assert bad.exit_code != 0 and "noisy" in bad.output
    again = CliRunner().invoke(main, args)
    assert again.exit_code != 0 and "is not empty" in again.output
    none = CliRunner().invoke(main, ["synth", str(tmp_path / "nv"), "--cameras", "0", "--episodes", "2"])
    assert none.exit_code == 0 and _info(tmp_path / "nv")["video_path"] is None
