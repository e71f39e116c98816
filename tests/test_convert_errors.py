"""Bad input: each fault gets an error naming episode and file; --skip-bad-episodes converts the rest."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import av
import pyarrow.parquet as pq
import pytest

from convert_helpers import CLI, edit_episodes, garble_frames, load, output_files, reseal, run_cli, set_column
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import ConvertError, convert_dataset
from lerobot_shards.convert.verify import verify_dataset
from lerobot_shards.lerobot_v3 import LeRobotV3Source, SourceError
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.video import encode_video
from waits import HANG_GUARD_S

FRONT = "videos/observation.images.front/chunk-000"


@pytest.fixture
def src(small_synth: Path, tmp_path: Path) -> Path:
    """A private copy of the 4-episode synth dataset (episodes 2 and 3 share file-001 of each kind)."""
    return Path(shutil.copytree(small_synth, tmp_path / "src"))


def _convert(src: Path, tmp_path: Path, **kw):
    return convert_dataset(src, tmp_path / "out", progress=False, **kw)


def test_v2_dataset_is_refused_with_upgrade_hint(src: Path, tmp_path: Path) -> None:
    info = json.loads((src / "meta/info.json").read_text())
    (src / "meta/info.json").write_text(json.dumps({**info, "codebase_version": "v2.1"}))
    result = run_cli("convert", src, tmp_path / "out", "--no-progress")
    assert result.returncode == 1
    assert f"{src}/meta/info.json: codebase_version is 'v2.1', expected 'v3.0'" in result.stderr
    assert "convert_dataset_v21_to_v30" in result.stderr
    assert not (tmp_path / "out").exists()


def test_missing_mp4_names_file_and_episode(src: Path, tmp_path: Path) -> None:
    (src / FRONT / "file-001.mp4").unlink()
    with pytest.raises(SourceError, match=r"missing file.*file-001\.mp4 \(first needed by episode 2\)"):
        _convert(src, tmp_path)


def test_corrupt_mp4_names_episode_and_file(src: Path, tmp_path: Path) -> None:
    (src / FRONT / "file-001.mp4").write_bytes(b"\x00\x00\x00\x18ftypisom" + b"garbage" * 100)
    with pytest.raises(ConvertError, match=rf"episode 2: .*{FRONT}/file-001\.mp4: not a readable mp4"):
        _convert(src, tmp_path)


def test_corrupt_parquet_names_episode_and_file(src: Path, tmp_path: Path) -> None:
    (src / "data/chunk-000/file-001.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ConvertError, match=r"episode 2: .*data/chunk-000/file-001\.parquet: not a readable parquet"):
        _convert(src, tmp_path)


def test_clip_shorter_than_rows_names_episode_and_file(src: Path, tmp_path: Path) -> None:
    path = src / FRONT / "file-001.mp4"
    with av.open(str(path)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    encode_video(frames[:-3], path, fps=30, codec="h264", gop=2, crf=30, threads=1)  # episode 3 loses 3 frames
    with pytest.raises(
        ConvertError,
        match=rf"{FRONT}/file-001\.mp4: episode 3 field videos/observation\.images\.front"
        r"/from_timestamp = .* plus its \d+ rows ends at .* outside the video .*the mp4 lacks frames of this episode",
    ):
        _convert(src, tmp_path)


def test_clip_span_differing_from_rows_converts_by_the_rows(src: Path, tmp_path: Path) -> None:
    """to_timestamp two frames short of the rows while the mp4 holds the frames: the rows decide."""
    key = "videos/observation.images.top/to_timestamp"
    edit_episodes(
        src,
        lambda t: set_column(t, key, [v - (2 / 30 if i == 1 else 0) for i, v in enumerate(t.column(key).to_pylist())]),
    )
    manifest = _convert(src, tmp_path)
    assert manifest.total_episodes == 4 and not manifest.skipped_episodes
    assert verify_dataset(tmp_path / "out", src, decode_check=1).ok


def test_skip_bad_episodes_converts_the_rest_and_records_reasons(src: Path, tmp_path: Path) -> None:
    (src / FRONT / "file-001.mp4").write_bytes(b"not an mp4")
    result = run_cli(
        "convert", src, tmp_path / "out", "--episodes-per-shard", "1", "--skip-bad-episodes", "--no-progress"
    )
    assert result.returncode == 0, result.stderr
    assert "2 episodes skipped" in result.stdout
    manifest, sidecars = load(tmp_path / "out")
    assert [s.episodes for s in manifest.shards] == [(0,), (1,)]  # shards of skipped-only episodes are left out
    assert sorted(manifest.skipped_episodes) == [2, 3]
    assert all(
        manifest.skipped_episodes[e].startswith(f"episode {e}: ")
        and f"{FRONT}/file-001.mp4: not a readable mp4" in manifest.skipped_episodes[e]
        for e in (2, 3)
    )
    report = verify_dataset(tmp_path / "out", src)
    assert report.ok, str(report)
    skipped = (
        r"episodes \[2\] are not in the dataset \(episode 2 was skipped by convert: episode 2: .*not a readable mp4"
    )
    with pytest.raises(ValueError, match=skipped):
        EpisodePoolDataset(str(tmp_path / "out"), episodes=[2])

    # without the flag, the same command fails again rather than accepting the skips
    result = run_cli("convert", src, tmp_path / "out", "--episodes-per-shard", "1", "--no-progress")
    assert result.returncode == 1 and f"episode 2: {src}/{FRONT}/file-001.mp4: not a readable mp4" in result.stderr


def test_skip_bad_episodes_skips_episodes_whose_files_are_missing(src: Path, tmp_path: Path) -> None:
    (src / "data/chunk-000/file-001.parquet").unlink()
    manifest = _convert(src, tmp_path, options=ConvertOptions(episodes_per_shard=2), skip_bad_episodes=True)
    assert [s.episodes for s in manifest.shards] == [(0, 1)]
    assert sorted(manifest.skipped_episodes) == [2, 3]
    assert "data/chunk-000/file-001.parquet: file not found (needed by episode 2)" in manifest.skipped_episodes[2]


def test_feature_missing_from_parquet_names_file_and_feature(src: Path, tmp_path: Path) -> None:
    path = src / "data/chunk-000/file-001.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["observation.state"]), path)
    with pytest.raises(
        ConvertError,
        match=r"episode 2: .*data/chunk-000/file-001\.parquet: feature\(s\) 'observation\.state' declared in "
        r"meta/info\.json have no column",
    ):
        _convert(src, tmp_path)
    manifest = _convert(src, tmp_path, skip_bad_episodes=True)
    assert sorted(manifest.skipped_episodes) == [2, 3] and manifest.total_episodes == 2
    assert verify_dataset(tmp_path / "out", src).ok


def test_corrupt_packets_inside_a_clip(src: Path, tmp_path: Path) -> None:
    """A garbled packet mid-clip: the default boundary check lets it through, verify's decode check
    and convert --check-decode name file, episode, camera and frame."""
    garble_frames(src / FRONT / "file-001.mp4", [8])  # episode 2's frame 8 (a keyframe: gop 2)
    cam = "observation.images.front"
    result = run_cli("convert", src, tmp_path / "out", "--no-progress")
    assert result.returncode == 0, result.stderr
    report = verify_dataset(tmp_path / "out", src, decode_check=1)
    assert len(report.problems) == 1, report.problems
    assert re.search(
        rf"episode 2 camera {cam}: e000002\.{cam}\.mp4 frames \[0, \d+\): frame 8 does not decode", report.problems[0]
    )

    result = run_cli("convert", src, tmp_path / "checked", "--check-decode", "--no-progress")
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert f"{src}/{FRONT}/file-001.mp4: episode 2 camera {cam}: " in result.stderr
    assert "frame 8 does not decode" in result.stderr and "the source is corrupt" in result.stderr

    out = tmp_path / "skipped"
    manifest = convert_dataset(src, out, check_decode=True, skip_bad_episodes=True, progress=False)
    assert sorted(manifest.skipped_episodes) == [2]
    assert verify_dataset(out, src, decode_check=1).ok


def test_corrupt_packet_at_a_clip_boundary_fails_by_default(src: Path, tmp_path: Path) -> None:
    """The default check decodes each clip's first frame and last GOP: a garbled packet there fails the episode."""
    assert LeRobotV3Source(str(src)).episode(2).length == 30  # frames 0..29 of file-001: last GOP 28, 29
    garble_frames(src / FRONT / "file-001.mp4", [28])
    with pytest.raises(
        ConvertError, match=r"file-001\.mp4: episode 2 camera observation\.images\.front: .*frame 28 does not decode"
    ):
        _convert(src, tmp_path)


def _place(src: Path, tmp_path: Path, where: str) -> Path:
    """An output location that is the source, lies inside it or holds it, directly or through a symlink."""
    link = tmp_path / "link"
    link.symlink_to(src, target_is_directory=True)
    return {
        "same": src,
        "same, spelled with ..": src / "meta" / "..",
        "inside": src / "out",
        "holds": tmp_path,
        "symlink to it": link,
        "inside, through a symlink": link / "out",
    }[where]


@pytest.mark.parametrize(
    "where",
    ["same", "same, spelled with ..", "inside", "holds", "symlink to it", "inside, through a symlink"],
)
def test_output_overlapping_the_source_is_refused_even_with_overwrite(src: Path, tmp_path: Path, where: str) -> None:
    """Converting into the source (or into a folder in it, or one holding it) would write manifest,
    shards and convert.json among the user's files, and --overwrite would replace them: refused
    before anything is written, whatever the flags."""
    dest = _place(src, tmp_path, where)
    before = output_files(tmp_path)
    relation = {"inside": "lies inside", "inside, through a symlink": "lies inside", "holds": "holds"}.get(where, "is")
    with pytest.raises(
        ConvertError, match=rf"{re.escape(str(dest))}: {relation} the source dataset {re.escape(str(src))}"
    ):
        convert_dataset(src, dest, ConvertOptions(episodes_per_shard=2), overwrite=True, progress=False)
    assert output_files(tmp_path) == before


def test_cli_convert_into_the_source_does_not_suggest_overwrite(src: Path) -> None:
    before = output_files(src)
    for flags in ([], ["--overwrite"]):
        result = run_cli("convert", src, src, "--no-progress", *flags)
        assert result.returncode == 1, result.stderr
        assert f"{src}: is the source dataset {src}" in result.stderr
        assert "--overwrite" not in result.stderr and "nothing was written" in result.stderr
    assert output_files(src) == before


@pytest.mark.parametrize("n, dest", list(enumerate(["ds", "ds/", "ds/out", "ds/./out", "ds/x/..", "", "ds//out"])))
def test_bucket_output_overlapping_a_bucket_source_is_refused(s3_server, small_synth: Path, n: int, dest: str) -> None:
    fs = s3_server.filesystem()
    bucket = f"overlap-{n}"
    fs.mkdir(bucket)
    fs.put(str(small_synth), f"{bucket}/ds", recursive=True)
    before = sorted(fs.find(bucket))
    with pytest.raises(ConvertError, match=r"the source dataset s3://overlap-\d+/ds; refusing"):
        convert_dataset(
            f"s3://{bucket}/ds",
            f"s3://{bucket}/{dest}",
            overwrite=True,
            source_options=s3_server.storage_options,
            dest_options=s3_server.storage_options,
            progress=False,
        )
    fs.invalidate_cache()
    assert sorted(fs.find(bucket)) == before


def test_another_tasks_run_record_temporary_does_not_make_the_destination_foreign(src: Path, tmp_path: Path) -> None:
    """An array task started at the same moment may have its ``convert.json`` still under its temporary
    name (and the lock file) when this task looks: that is this conversion's own output, not foreign."""
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").touch()
    (out / "convert.json.12345-0123abcd.tmp").write_text("{")
    result = run_cli(
        "convert", src, out, "--episodes-per-shard", "1", "--num-tasks", "2", "--task-index", "0", "--no-progress"
    )
    assert result.returncode == 0, result.stderr
    assert (out / "convert.json").is_file()


def test_array_tasks_started_together_both_convert(src: Path, tmp_path: Path) -> None:
    """Two real task processes started at once on an empty destination: neither refuses it."""
    out = tmp_path / "out"
    args = ["convert", src, out, "--episodes-per-shard", "1", "--num-tasks", "2", "--no-progress"]
    procs = [
        subprocess.Popen([*CLI, *map(str, args), "--task-index", str(i)], stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    errors = [p.communicate(timeout=HANG_GUARD_S)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert (out / "manifest.json").is_file()


@pytest.mark.slow
def test_fifo_mp4_is_refused_in_one_line_not_read(src: Path, tmp_path: Path) -> None:
    fifo = src / FRONT / "file-000.mp4"
    fifo.unlink()
    os.mkfifo(fifo)
    result = subprocess.run(
        [*CLI, "convert", str(src), str(tmp_path / "out"), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert result.returncode == 1 and f"{fifo}: not a regular file" in result.stderr.strip().splitlines()[-1]
    loader = f"from lerobot_shards.loader import EpisodePoolDataset; list(EpisodePoolDataset({str(src)!r}))"
    result = subprocess.run([sys.executable, "-c", loader], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 1
    assert (
        result.stderr.strip().splitlines()[-1] == f"lerobot_shards.lerobot_v3.SourceError: {fifo}: not a regular file"
    )


def test_skip_bad_episodes_with_every_episode_bad_fails(src: Path, tmp_path: Path) -> None:
    for name in ("file-000.mp4", "file-001.mp4"):
        (src / FRONT / name).write_bytes(b"not an mp4")
    result = run_cli("convert", src, tmp_path / "out", "--skip-bad-episodes", "--no-progress")
    assert result.returncode == 1
    assert re.search(
        r"no episode was converted \(4 skipped; episode 0: .*file-000\.mp4: not a readable mp4", result.stderr
    )
    assert not (tmp_path / "out/manifest.json").exists()


def test_verify_reports_a_conversion_without_episodes(small_synth: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    convert_dataset(small_synth, out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.update(
        shards=[],
        skipped_episodes={str(e): f"episode {e}: bad" for e in range(4)},
        totals={"episodes": 0, "frames": 0, "bytes": 0, "shards": 0},
    )
    (out / "manifest.json").write_text(json.dumps(manifest))
    reseal(out)
    report = verify_dataset(out)
    assert not report.ok and "lists no episodes (all 4 skipped; episode 0: episode 0: bad)" in str(report)


@pytest.mark.parametrize("command", ["convert", "upload"])
def test_destination_holding_a_lerobot_dataset_is_refused_even_with_overwrite(
    small_synth: Path, tmp_path: Path, command: str
) -> None:
    other = Path(shutil.copytree(small_synth, tmp_path / "other"))
    before = sorted(p.relative_to(other) for p in other.rglob("*"))
    what = small_synth
    if command == "upload":
        what = tmp_path / "conv"
        convert_dataset(small_synth, what, progress=False)
    result = run_cli(command, what, other, "--overwrite", "--no-progress")
    assert result.returncode == 1
    assert f"{other}/meta/info.json: {other} holds a LeRobot dataset; refusing" in result.stderr
    assert sorted(p.relative_to(other) for p in other.rglob("*")) == before


def test_verify_on_a_raw_dataset_says_so(small_synth: Path) -> None:
    report = verify_dataset(small_synth)
    assert "a raw LeRobot dataset (meta/info.json), not a conversion" in str(report)


def test_destination_that_is_a_file_is_named_in_one_line(small_synth: Path, tmp_path: Path) -> None:
    dest = tmp_path / "afile"
    dest.write_text("mine")
    result = run_cli("convert", small_synth, dest, "--overwrite", "--no-progress")
    assert result.returncode == 1
    assert (
        result.stderr.strip().splitlines()[-1]
        == f"Error: {dest}: exists and is not a folder; choose another destination (nothing was written)"
    )
    assert dest.read_text() == "mine"


def test_negative_shuffle_seed_names_the_option(small_synth: Path, tmp_path: Path) -> None:
    result = run_cli("convert", small_synth, tmp_path / "out", "--shuffle-episodes=-1", "--no-progress")
    assert result.returncode == 2 and "--shuffle-episodes" in result.stderr
    with pytest.raises(ValueError, match="shuffle_seed"):
        ConvertOptions(shuffle_seed=-1)
