"""The converter on synthetic datasets of several shapes and on the real fixture: layout, content,
frame identity at every episode boundary, WebDataset compatibility, re-encoding."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import av
import pyarrow.parquet as pq
import pytest
import webdataset as wds

from convert_helpers import assert_frame_identity, load, member_bytes, reencode_continuous, run_cli
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.verify import verify_dataset
from lerobot_shards.format import SHARDS_DIR, EpisodeHeader, clip_member, header_member, table_member
from lerobot_shards.lerobot_v3 import LeRobotV3Source
from lerobot_shards.synth import FIXTURE_BITS

SHAPES = {
    "jitter-multi-file": dict(
        num_episodes=5, episodes_per_video_file=2, episodes_per_data_file=3, from_timestamp_jitter_s=0.012
    ),
    "one-camera-chunks-lists": dict(
        num_episodes=6,
        cameras=("cam.a",),
        episodes_per_video_file=4,
        episodes_per_data_file=1,
        chunks_size=2,
        vector_storage="list",
        length_range=(5, 9),
    ),
    "no-video": dict(num_episodes=3, cameras=()),
}


@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_converts_synthetic_shapes(synth_factory, tmp_path: Path, shape: str) -> None:
    root = synth_factory(**SHAPES[shape])
    source = LeRobotV3Source(str(root))
    manifest = convert_dataset(root, tmp_path / "out", ConvertOptions(episodes_per_shard=2), progress=False)
    out = tmp_path / "out"

    assert manifest.total_episodes == len(source.episodes) and manifest.total_frames == source.total_frames
    assert [s.episodes for s in manifest.shards][0] == (0, 1)
    assert [e for s in manifest.shards for e in s.episodes] == [e.episode_index for e in source.episodes]
    assert manifest.cameras == tuple(sorted(source.camera_keys)) and manifest.tasks == source.tasks
    assert manifest.source_info == source.info and manifest.source_stats == source.stats
    assert manifest.video["mode"] == "copy" and manifest.video["fallback_reencoded_episodes"] == []

    _, sidecars = load(out)
    for record in manifest.shards:
        sidecar = sidecars[record.name]
        with tarfile.open(out / SHARDS_DIR / record.name) as tar:
            names = tar.getnames()
            headers = {i.name: (i.mtime, i.uid, i.gid, i.uname, i.gname, i.mode) for i in tar.getmembers()}
        expected = [
            name
            for e in sidecar.episodes
            for name in [header_member(e.key), table_member(e.key)]
            + [clip_member(e.key, c) for c in sorted(source.camera_keys)]
        ]
        assert names == expected
        assert set(headers.values()) == {(0, 0, 0, "", "", 0o644)}
        for entry in sidecar.episodes:
            raw_header = member_bytes(out, record.name, sidecar, header_member(entry.key))
            header = EpisodeHeader.from_dict(json.loads(raw_header))
            src_ep = source.episode(entry.episode_index)
            assert (header.episode_index, header.length, header.tasks) == (
                src_ep.episode_index,
                src_ep.length,
                src_ep.tasks,
            )
            assert header.cameras == manifest.cameras and header.dataset_from_index == src_ep.dataset_from_index
            rows = pq.read_table(io.BytesIO(member_bytes(out, record.name, sidecar, table_member(entry.key))))
            assert rows.equals(source.read_episode_table(src_ep)) and rows.schema.equals(
                source.read_episode_table(src_ep).schema, check_metadata=True
            )
            for cam, clip in entry.clips.items():
                assert clip.num_frames == entry.length and clip.stream_copied
                assert clip.source_first_frame == src_ep.videos[cam].first_frame(source.fps)
                data = member_bytes(out, record.name, sidecar, clip_member(entry.key, cam))
                assert b"edts" not in data and data[4:8] == b"ftyp"
    if source.camera_keys:
        assert assert_frame_identity(out) == 4 * len(source.camera_keys) * len(source.episodes)
    assert verify_dataset(out, root, decode_check=2).ok


def test_jittered_timestamps_are_really_off_the_frame_grid(synth_factory) -> None:
    """Guards the jitter shape above: from_timestamp must not be a whole frame for the test to mean anything."""
    source = LeRobotV3Source(str(synth_factory(**SHAPES["jitter-multi-file"])))
    offs = [
        abs(v.from_timestamp * source.fps - round(v.from_timestamp * source.fps))
        for e in source.episodes
        for v in e.videos.values()
        if v.from_timestamp > 0
    ]
    assert offs and max(offs) > 0.05


def test_real_fixture_every_frame(fixture_root: Path, tmp_path: Path) -> None:
    manifest = convert_dataset(fixture_root, tmp_path / "out", progress=False)
    assert [s.episodes for s in manifest.shards] == [(0, 1, 2, 3)] and manifest.total_frames == 1492
    _, sidecars = load(tmp_path / "out")
    clip = sidecars["shard-000000.tar"].episodes[2].clips["observation.images.top"]
    assert (clip.codec, clip.width, clip.height, clip.source_first_frame, clip.stream_copied) == (
        "av1",
        640,
        480,
        747,
        True,
    )
    assert assert_frame_identity(tmp_path / "out", bits=FIXTURE_BITS, stride=40) >= 2 * 4 * 12
    report = verify_dataset(tmp_path / "out", fixture_root, decode_check=3)
    assert report.ok and report.frames_identical == report.frames_compared == 4 * 2 * 3, str(report)


def test_plain_webdataset_reads_one_sample_per_episode(synth_factory, tmp_path: Path) -> None:
    root = synth_factory(**SHAPES["jitter-multi-file"])
    manifest = convert_dataset(root, tmp_path / "out", ConvertOptions(episodes_per_shard=2), progress=False)
    urls = [str(tmp_path / "out" / SHARDS_DIR / s.name) for s in manifest.shards]
    samples = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in samples] == [f"e{e:06d}" for e in range(5)]
    cams = ["observation.images.front.mp4", "observation.images.top.mp4"]
    for e, s in enumerate(samples):
        assert sorted(k for k in s if not k.startswith("__")) == sorted(["json", "parquet", *cams])
        assert json.loads(s["json"])["episode_index"] == e
        assert (
            pq.read_table(io.BytesIO(s["parquet"])).column("episode_index").to_pylist()
            == [e] * json.loads(s["json"])["length"]
        )


def test_off_keyframe_episodes_are_reencoded_frame_exact(synth_factory, tmp_path: Path) -> None:
    """A continuously encoded source (gop 5): episodes starting off a keyframe are re-encoded, the rest copied."""
    import shutil

    root = tmp_path / "src"
    shutil.copytree(synth_factory(**SHAPES["jitter-multi-file"]), root)
    reencode_continuous(root, gop=5)
    source = LeRobotV3Source(str(root))
    off_grid = sorted(
        {e.episode_index for e in source.episodes for v in e.videos.values() if v.first_frame(source.fps) % 5}
    )
    assert off_grid, "the shape must put some episode starts off the keyframe grid"

    manifest = convert_dataset(root, tmp_path / "out", progress=False)
    assert manifest.video["fallback_reencoded_episodes"] == off_grid
    _, sidecars = load(tmp_path / "out")
    for entry in sidecars["shard-000000.tar"].episodes:
        for clip in entry.clips.values():
            assert clip.stream_copied == (entry.episode_index not in off_grid)
            if not clip.stream_copied:
                assert clip.codec == "h264" and clip.key_frame_indices() == list(range(0, entry.length, 2))
    assert assert_frame_identity(tmp_path / "out") == 4 * 2 * 5
    report = verify_dataset(tmp_path / "out", root, decode_check=2)
    assert report.ok, str(report)
    assert report.min_psnr_db is not None and report.frames_identical < report.frames_compared


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_reencode_mode(synth_factory, tmp_path: Path, codec: str) -> None:
    root = synth_factory(num_episodes=3, cameras=("cam",), length_range=(7, 9))
    result = run_cli(
        "convert", root, tmp_path / "out", "--reencode", codec, "--gop", "3", "--crf", "20", "--no-progress"
    )
    assert result.returncode == 0, result.stderr
    manifest, sidecars = load(tmp_path / "out")
    assert manifest.video == {"mode": "reencode", "codec": codec, "gop": 3, "crf": 20, "bframes": 0}
    for entry in sidecars["shard-000000.tar"].episodes:
        clip = entry.clips["cam"]
        assert clip.codec == codec and not clip.stream_copied
        assert clip.key_frame_indices() == list(range(0, entry.length, 3))
        data = member_bytes(
            tmp_path / "out", "shard-000000.tar", sidecars["shard-000000.tar"], clip_member(entry.key, "cam")
        )
        with av.open(io.BytesIO(data)) as container:  # no B-frames: decode order is presentation order
            pts = [p.pts for p in container.demux(video=0) if p.size]
        assert pts == sorted(pts) and len(pts) == entry.length
    assert assert_frame_identity(tmp_path / "out", stride=1) == manifest.total_frames
    assert verify_dataset(tmp_path / "out", root, decode_check=3).ok


def test_shard_size_and_shuffle_plan(synth_factory, tmp_path: Path) -> None:
    root = synth_factory(num_episodes=8, cameras=("cam",), length_range=(10, 10))
    source = LeRobotV3Source(str(root))
    per_episode = source.episode_sizes()[0].est_bytes
    a = convert_dataset(root, tmp_path / "a", ConvertOptions(shard_bytes=3 * per_episode), progress=False)
    assert [len(s.episodes) for s in a.shards] == [3, 3, 2]  # the last holds 2 (at least half the target)
    b = convert_dataset(root, tmp_path / "b", ConvertOptions(episodes_per_shard=3, shuffle_seed=7), progress=False)
    order = [e for s in b.shards for e in s.episodes]
    assert sorted(order) == list(range(8)) and order != sorted(order)
    _, sidecars = load(tmp_path / "b")
    assert [e.episode_index for e in sidecars["shard-000000.tar"].episodes] == list(b.shards[0].episodes)
    assert b.converter["arguments"]["shuffle_seed"] == 7
