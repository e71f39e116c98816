"""verify catches flipped bytes, missing members, missing episodes and frames that differ from the
source; inspect summarises sources and converted datasets."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tarfile
from pathlib import Path

import pytest

from convert_helpers import reencode_continuous, reseal, run_cli
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.verify import verify_dataset
from lerobot_shards.format import MANIFEST_NAME, SHARDS_DIR


@pytest.fixture
def converted(small_synth: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    convert_dataset(small_synth, out, ConvertOptions(episodes_per_shard=2), progress=False)
    return out


def _rewrite_checksums(out: Path, shard: str) -> None:
    """Make manifest and sidecar agree with a tampered tar, so only the deeper checks can notice."""
    data = (out / SHARDS_DIR / shard).read_bytes()
    sha, size = hashlib.sha256(data).hexdigest(), len(data)
    side_path = out / SHARDS_DIR / shard.replace(".tar", ".idx.json")
    side = json.loads(side_path.read_text())
    side.update(sha256=sha, size=size)
    side_path.write_text(json.dumps(side))
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    for record in manifest["shards"]:
        if record["name"] == shard:
            record.update(sha256=sha, bytes=size)
    manifest["totals"]["bytes"] = sum(r["bytes"] for r in manifest["shards"])
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    reseal(out)


def test_clean_conversion_verifies(converted: Path, small_synth: Path) -> None:
    result = run_cli("verify", converted, "--source", small_synth, "--decode-check", "2", "--no-progress")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"verify {converted}: OK")
    assert "shards 2, episodes 4" in result.stdout
    assert "16 frames compared with the source, 16 bit-identical" in result.stdout


def test_flipped_byte(converted: Path) -> None:
    path = converted / SHARDS_DIR / "shard-000001.tar"
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))
    result = run_cli("verify", converted, "--no-progress")
    assert result.returncode == 1
    assert "FAILED" in result.stdout
    assert f"{path}: sha256" in result.stdout and "does not match the manifest" in result.stdout
    assert "shard-000000.tar" not in result.stdout


def test_a_damaged_table_is_one_problem_and_the_rest_is_still_checked(converted: Path) -> None:
    """pyarrow's OSError on a damaged parquet member ended verify with a traceback, unreported."""
    path = converted / SHARDS_DIR / "shard-000000.tar"
    with tarfile.open(path) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".parquet"))
    data = bytearray(path.read_bytes())
    data[member.offset_data + member.size - 10] ^= 0x01  # in the footer: pyarrow raises OSError
    path.write_bytes(bytes(data))
    (converted / SHARDS_DIR / "shard-000001.tar").unlink()
    result = run_cli("verify", converted, "--no-progress")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = result.stdout.splitlines()
    assert any(f"unreadable table {member.name}" in line for line in lines), result.stdout
    assert any("shard-000001.tar: no tar" in line for line in lines), result.stdout


def test_missing_member(converted: Path) -> None:
    path = converted / SHARDS_DIR / "shard-000000.tar"
    gone = "e000001.observation.images.front.mp4"
    with tarfile.open(path) as src:
        kept = [(m, src.extractfile(m).read()) for m in src.getmembers() if m.name != gone]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as dst:
        for member, payload in kept:
            dst.addfile(member, io.BytesIO(payload))
    path.write_bytes(buf.getvalue())
    _rewrite_checksums(converted, "shard-000000.tar")

    report = verify_dataset(converted)
    assert not report.ok
    assert f"{path}: member {gone} of episode 1 is missing" in report.problems
    assert any("e000001.observation.images.top.mp4 lies at offset" in p for p in report.problems)
    assert not any("sha256" in p for p in report.problems)


def test_missing_episode(converted: Path, small_synth: Path) -> None:
    manifest = json.loads((converted / MANIFEST_NAME).read_text())
    manifest["shards"] = manifest["shards"][:1]
    (converted / MANIFEST_NAME).write_text(json.dumps(manifest))
    report = verify_dataset(converted)  # the manifest's own digest notices first
    assert len(report.problems) == 1 and "content does not match its manifest_sha256" in report.problems[0]
    manifest["totals"].update(episodes=2, frames=manifest["shards"][0]["frames"], shards=1)
    manifest["totals"]["bytes"] = manifest["shards"][0]["bytes"]
    (converted / MANIFEST_NAME).write_text(json.dumps(manifest))
    reseal(converted)  # consistent and sealed again: the manifest's coverage of its source_info tells
    for source in (None, small_synth):
        report = verify_dataset(converted, source)
        assert len(report.problems) == 1, report.problems
        assert "episodes [2, 3] of source_info.total_episodes = 4 are in no shard" in report.problems[0]
    assert run_cli("verify", converted, "--no-progress").returncode == 1


def test_frames_differing_from_source(converted: Path, small_synth: Path, tmp_path: Path) -> None:
    """Against a re-encoded copy of its source, stream-copied clips no longer decode identically."""
    other = Path(shutil.copytree(small_synth, tmp_path / "other"))
    reencode_continuous(other, gop=2)
    assert verify_dataset(converted, small_synth, decode_check=1).ok
    report = verify_dataset(converted, other, decode_check=1)
    # per clip: the in-order decode differs at its first frame, and the random frame differs
    sequential = [
        p for p in report.problems if "frame 0: e00000" in p and "mp4 decodes differently from source frame" in p
    ]
    assert len(sequential) == 4 * 2 and len(report.problems) == 4 * 2 * 2, report.problems
    assert all("decodes differently from source frame" in p for p in report.problems)


def test_missing_manifest(converted: Path) -> None:
    (converted / MANIFEST_NAME).unlink()
    report = verify_dataset(converted)
    assert not report.ok and "missing: the conversion is unfinished (run the same convert" in report.problems[0]
    assert "FAILED (1 problem)\n" in str(report)


def test_a_path_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    """A mistyped path is named once, in one line, with no advice about finishing a conversion."""
    missing = tmp_path / "no-such-conversion"
    with pytest.raises(FileNotFoundError, match="no-such-conversion: no such file or directory"):
        verify_dataset(missing)
    result = run_cli("verify", missing)
    assert result.returncode == 1 and result.stdout == "", result.stdout
    assert result.stderr.strip() == f"Error: {missing}: no such file or directory"


def test_a_folder_without_a_conversion_says_so_once(tmp_path: Path) -> None:
    result = run_cli("verify", tmp_path)
    assert result.returncode == 1 and result.stderr == "", result.stderr  # the report alone, not logged again
    assert result.stdout.count("no conversion here (neither manifest.json nor convert.json)") == 1
    assert "FAILED (1 problem)" in result.stdout and "--finalize" not in result.stdout


def test_inspect(converted: Path, small_synth: Path) -> None:
    result = run_cli("inspect", converted)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "episodes 4, frames" in lines[1] and "shards 2" in lines[1]
    assert any(line.split()[:4] == ["observation.images.front", "h264", "160x64", "yuv420p"] for line in lines)
    assert any(line.split()[:3] == ["shard-000001.tar", "2-3", "2"] for line in lines)

    result = run_cli("inspect", small_synth)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"LeRobot v3.0 dataset {small_synth}") and "episodes 4" in result.stdout
    assert "video files 4" in result.stdout

    result = run_cli("inspect", converted / SHARDS_DIR)
    assert result.returncode == 1 and "neither a converted dataset" in result.stderr


def test_episode_stats_are_checked(converted: Path, small_synth: Path) -> None:
    """The stats a sidecar records: against the episode's own rows, and with --source against the source's."""
    side_path = converted / SHARDS_DIR / "shard-000000.idx.json"
    side = json.loads(side_path.read_text())
    stats = side["episodes"][1]["stats"]
    stats["action"]["min"][0] -= 0.5  # no longer the rows' minimum
    stats["observation.state"]["mean"][0] += 0.5  # only the source can tell
    side_path.write_text(json.dumps(side))
    reseal(converted)
    result = run_cli("verify", converted, "--no-progress")
    assert result.returncode == 1
    assert "episode 1: stats['action']['min'] is not the min of its e000001.parquet rows" in result.stdout
    assert "differ from the source" not in result.stdout and result.stdout.count("stats[") == 1
    result = run_cli("verify", converted, "--source", small_synth, "--no-progress")
    assert result.returncode == 1 and "episode 1's stats differ from the source's" in result.stdout


def test_the_real_fixtures_conversion_verifies(fixture_root: Path, tmp_path: Path) -> None:
    """LeRobot computed the real recording's episode stats: they describe the converted rows."""
    convert_dataset(fixture_root, tmp_path / "out", progress=False)
    report = verify_dataset(tmp_path / "out", source=fixture_root, progress=False)
    assert report.ok, report.problems
    assert report.episodes == 4


@pytest.fixture(scope="module")
def pristine(small_synth: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("verify-edits") / "out"
    convert_dataset(small_synth, out, ConvertOptions(episodes_per_shard=2), progress=False)
    return out


def _fps(m: dict) -> None:
    m["fps"] = m["source_info"]["fps"] = m["fps"] * 2


def _drop_state(m: dict) -> None:
    del m["features"]["observation.state"], m["source_info"]["features"]["observation.state"]


def _state_shape(m: dict) -> None:
    m["features"]["observation.state"]["shape"] = m["source_info"]["features"]["observation.state"]["shape"] = [99]


def _lower_length(out: Path) -> None:
    """Episode 0 two frames shorter in the manifest and in its sidecar (clips and frame tables too)."""
    side_path = out / SHARDS_DIR / "shard-000000.idx.json"
    side = json.loads(side_path.read_text())
    episode = side["episodes"][0]
    episode["length"] -= 2
    for clip in episode["clips"].values():
        clip["num_frames"] -= 2
        clip["frames"] = {k: v[:-2] if isinstance(v, list) else v for k, v in clip["frames"].items()}
    side_path.write_text(json.dumps(side))
    m = json.loads((out / MANIFEST_NAME).read_text())
    m["shards"][0]["episode_lengths"][0] -= 2
    m["shards"][0]["frames"] -= 2
    m["totals"]["frames"] -= 2
    (out / MANIFEST_NAME).write_text(json.dumps(m))


def _manifest(edit):
    def apply(out: Path) -> None:
        m = json.loads((out / MANIFEST_NAME).read_text())
        edit(m)
        (out / MANIFEST_NAME).write_text(json.dumps(m))

    return apply


# Edits that keep the manifest consistent with itself (digests recomputed): what verify --source says
# about each (it compares every field with the source), and what verify alone still finds (None: only
# the source can tell).
CONSISTENT_EDITS = {
    "fps changed": (
        _manifest(_fps),
        r"manifest\.json: fps 60\.0, the source's 30\.0",
        r"says fps 30\.0, the manifest 60\.0",
    ),
    "tasks swapped": (
        _manifest(lambda m: m["tasks"].reverse()),
        r"manifest\.json: tasks \['task 1', 'task 0'\], the source's \['task 0', 'task 1'\]",
        r"task_index names tasks \['task \d'\], the episode lists \['task \d'\]",
    ),
    "task renamed": (
        _manifest(lambda m: m["tasks"].__setitem__(0, "renamed")),
        r"manifest\.json: tasks \['renamed', 'task 1'\], the source's",
        r"has tasks \['task 0'\] that the manifest's tasks do not list",
    ),
    "feature dropped": (
        _manifest(_drop_state),
        r"manifest\.json: features \[.*\], the source's \[.*'observation\.state'",
        r"stats for \['observation\.state'\], which are not features of the dataset",  # the sidecars' episode stats
    ),
    "feature shape changed": (
        _manifest(_state_shape),
        r"manifest\.json: features\['observation\.state'\] differs from the source's",
        r"column 'observation\.state' holds 6 value\(s\) per frame, its feature's shape \[99\]",
    ),
    "episode length lowered": (
        _lower_length,
        r"shard-000000\.tar: episode_lengths says \d+ frames for episode 0, the source \d+",
        r"e000000\.json says episode 0 of \d+ frames, the sidecar episode 0 of \d+",
    ),
}


@pytest.mark.parametrize("kind", sorted(CONSISTENT_EDITS))
def test_verify_compares_every_manifest_field_with_the_source(
    kind: str, pristine: Path, small_synth: Path, tmp_path: Path
) -> None:
    edit, with_source, alone = CONSISTENT_EDITS[kind]
    out = tmp_path / "out"
    shutil.copytree(pristine, out)
    edit(out)
    reseal(out)
    report = verify_dataset(out, small_synth)
    assert any(re.search(with_source, p) for p in report.problems), report.problems
    problems = verify_dataset(out).problems
    if alone is None:
        assert problems == []
    else:
        assert any(re.search(alone, p) for p in problems), problems
