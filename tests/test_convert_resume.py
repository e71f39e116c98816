"""Determinism and robustness: byte-identical output across runs, worker counts and task splits;
resume after a real kill; refusing foreign destinations; finalize naming missing shards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from convert_helpers import held_cli, output_files, run_cli
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import ConvertError, convert_dataset
from lerobot_shards.format import MANIFEST_NAME, SHARDS_DIR
from waits import HANG_GUARD_S


@pytest.fixture(scope="module")
def source(synth_factory) -> Path:
    """6 episodes, 2 cameras, 3 episodes per mp4, all starting on keyframes.

    Byte identity is asserted for stream-copied clips only: PyAV's libx264 encodes, which the
    off-keyframe fallback uses, differ in rare runs even single-threaded (see the report).
    """
    return synth_factory(num_episodes=6, length_range=(8, 14), episodes_per_video_file=3)


def test_byte_identical_across_runs_workers_and_tasks(source: Path, tmp_path: Path) -> None:
    kw = dict(options=ConvertOptions(episodes_per_shard=2), progress=False)
    convert_dataset(source, tmp_path / "one", **kw)
    reference = output_files(tmp_path / "one")
    assert len([p for p in reference if p.endswith(".tar")]) == 3

    convert_dataset(source, tmp_path / "again", **kw)
    assert output_files(tmp_path / "again") == reference

    convert_dataset(source, tmp_path / "workers", workers=2, **kw)
    assert output_files(tmp_path / "workers") == reference

    results = [convert_dataset(source, tmp_path / "tasks", num_tasks=3, task_index=i, **kw) for i in (2, 0, 1)]
    assert results[0] is None and results[1] is None and results[2] is not None  # the last task writes the manifest
    assert output_files(tmp_path / "tasks") == reference


def test_finalize_names_missing_shards(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert (
        convert_dataset(source, out, ConvertOptions(episodes_per_shard=2), num_tasks=3, task_index=1, progress=False)
        is None
    )
    assert not (out / MANIFEST_NAME).exists()
    assert sorted(os.listdir(out / SHARDS_DIR)) == ["shard-000001.idx.json", "shard-000001.tar"]
    result = run_cli("convert", source, out, "--episodes-per-shard", "2", "--finalize")
    assert result.returncode == 1
    assert "2 of 3 shards are missing" in result.stderr
    assert "shard-000000.tar (no tar)" in result.stderr and "shard-000002.tar (no tar)" in result.stderr
    for task in (0, 2):
        convert_dataset(source, out, ConvertOptions(episodes_per_shard=2), num_tasks=3, task_index=task, progress=False)
    (out / MANIFEST_NAME).unlink()  # the last task wrote it; --finalize must rebuild the same one
    assert convert_dataset(source, out, ConvertOptions(episodes_per_shard=2), finalize_only=True) is not None
    convert_dataset(source, tmp_path / "ref", ConvertOptions(episodes_per_shard=2), progress=False)
    assert output_files(out) == output_files(tmp_path / "ref")


def test_resume_after_kill(synth_factory, tmp_path: Path) -> None:
    """Kill a CLI conversion once its first shard is complete; re-running yields the uninterrupted output."""
    root = synth_factory(num_episodes=24, cameras=("cam",), length_range=(30, 40))
    args = [root, "--episodes-per-shard", "1", "--no-progress"]
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        held_cli(tmp_path, "convert", root, out, *args[1:]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )  # shard 0 is written, every other shard waits: the kill lands mid-conversion
    first = out / SHARDS_DIR / "shard-000000.idx.json"
    deadline = time.monotonic() + HANG_GUARD_S
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert first.exists() and not (out / MANIFEST_NAME).exists(), "the kill should land mid-conversion"
    shards = sorted(os.listdir(out / SHARDS_DIR))
    assert "shard-000023.idx.json" not in shards
    # nothing half-written under a final name: every tar with a sidecar is complete
    for name in shards:
        if name.endswith(".idx.json"):
            tar = out / SHARDS_DIR / name.replace(".idx.json", ".tar")
            assert tar.exists()

    result = run_cli("-v", "convert", root, out, *args[1:])
    assert result.returncode == 0, result.stderr
    assert "already complete" in result.stderr and "resuming" in result.stderr
    convert_dataset(root, tmp_path / "clean", ConvertOptions(episodes_per_shard=1), progress=False)
    assert output_files(out) == output_files(tmp_path / "clean")


def test_resume_rebuilds_only_damaged_shards(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    convert_dataset(source, out, ConvertOptions(episodes_per_shard=2), progress=False)
    reference = output_files(out)
    shards = out / SHARDS_DIR
    inode = {p.name: p.stat().st_ino for p in shards.iterdir()}
    data = bytearray((shards / "shard-000001.tar").read_bytes())
    data[700] ^= 0xFF
    (shards / "shard-000001.tar").write_bytes(bytes(data))
    (shards / "shard-000002.idx.json").unlink()
    (out / MANIFEST_NAME).unlink()

    convert_dataset(source, out, ConvertOptions(episodes_per_shard=2), progress=False)
    assert output_files(out) == reference
    assert (shards / "shard-000000.tar").stat().st_ino == inode["shard-000000.tar"]  # kept, not rewritten
    assert (shards / "shard-000001.tar").stat().st_ino != inode["shard-000001.tar"]
    assert (shards / "shard-000002.tar").stat().st_ino != inode["shard-000002.tar"]


def test_refuses_foreign_destination_unless_overwrite(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("someone else's")
    result = run_cli("convert", source, out, "--no-progress")
    assert result.returncode == 1 and "is not empty and holds no convert.json" in result.stderr
    assert sorted(os.listdir(out)) == ["notes.txt"]

    convert_dataset(source, out, overwrite=True, progress=False)
    assert (out / "notes.txt").read_text() == "someone else's" and (out / MANIFEST_NAME).exists()


def test_refuses_other_settings_unless_overwrite(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    convert_dataset(source, out, ConvertOptions(episodes_per_shard=2), progress=False)
    with pytest.raises(ConvertError, match=r"other settings \(differs in: options, plan_sha256\)"):
        convert_dataset(source, out, ConvertOptions(episodes_per_shard=3), progress=False)
    assert len(list((out / SHARDS_DIR).glob("*.tar"))) == 3
    convert_dataset(source, out, ConvertOptions(episodes_per_shard=3), overwrite=True, progress=False)
    convert_dataset(source, tmp_path / "ref", ConvertOptions(episodes_per_shard=3), progress=False)
    assert output_files(out) == output_files(tmp_path / "ref")


def test_a_source_rewritten_between_tasks_is_another_conversion(source: Path, tmp_path: Path) -> None:
    """Task 0 of 2, then the source's stats rewritten (same episodes, same lengths), then task 1: it
    reused task 0's shards beside its own and wrote a manifest over both. Now it is refused."""
    import shutil

    root = tmp_path / "src"
    shutil.copytree(source, root)
    out = tmp_path / "out"
    task = ["convert", root, out, "--episodes-per-shard", "2", "--num-tasks", "2", "--no-progress"]
    assert run_cli(*task, "--task-index", "0").returncode == 0
    stats = root / "meta" / "stats.json"
    stats.write_text(stats.read_text().replace("1", "2", 1))
    result = run_cli(*task, "--task-index", "1")
    assert result.returncode == 1
    assert "differs in: source_sha256) (the source's files changed since it started)" in result.stderr
    assert not (out / MANIFEST_NAME).exists()


def test_a_run_record_from_before_source_digests_still_resumes(source: Path, tmp_path: Path) -> None:
    """convert.json written before source_sha256 existed (same converter version) was refused as
    "the source's files changed", and --overwrite would have thrown every shard away."""
    import json

    out = tmp_path / "out"
    task = ["convert", source, out, "--episodes-per-shard", "2", "--num-tasks", "2", "--no-progress"]
    assert run_cli(*task, "--task-index", "0").returncode == 0
    record = json.loads((out / "convert.json").read_text())
    del record["source_sha256"]
    (out / "convert.json").write_text(json.dumps(record))
    result = run_cli(*task, "--task-index", "1")
    assert result.returncode == 0, result.stderr
    assert "recorded before source digests: resuming without checking" in result.stderr
    convert_dataset(source, tmp_path / "ref", ConvertOptions(episodes_per_shard=2), progress=False)
    mine, ref = output_files(out), output_files(tmp_path / "ref")
    assert {k: v for k, v in mine.items() if k != "convert.json"} == {
        k: v for k, v in ref.items() if k != "convert.json"
    }


def test_slurm_array_script(source: Path, tmp_path: Path) -> None:
    """slurm/convert.sbatch run as a 1-based array of 2 tasks gives the single-process output."""
    script = Path(__file__).resolve().parents[1] / "slurm/convert.sbatch"
    env = {
        **os.environ,
        "SOURCE": str(source),
        "DEST": str(tmp_path / "array"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SLURM_ARRAY_TASK_COUNT": "2",
        "SLURM_ARRAY_TASK_MIN": "1",
        "SLURM_CPUS_PER_TASK": "1",
    }
    for task_id in (1, 2):
        result = subprocess.run(
            ["bash", str(script), "--episodes-per-shard", "2"],
            capture_output=True,
            text=True,
            env={**env, "SLURM_ARRAY_TASK_ID": str(task_id)},
            timeout=HANG_GUARD_S,
        )
        assert result.returncode == 0, result.stderr
        assert f"task {task_id - 1} of 2" in result.stdout
    convert_dataset(source, tmp_path / "one", ConvertOptions(episodes_per_shard=2), progress=False)
    assert output_files(tmp_path / "array") == output_files(tmp_path / "one")
