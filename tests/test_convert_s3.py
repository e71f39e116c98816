"""Converting to (and from) an S3 bucket on a local moto server, then verifying it there."""

from __future__ import annotations

import json
from pathlib import Path

from convert_helpers import claims_at_once, output_files, run_cli
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.verify import verify_dataset


def test_convert_to_bucket_and_verify_there(s3_server, small_synth: Path, tmp_path: Path) -> None:
    fs = s3_server.filesystem()
    fs.mkdir("convert-out")
    opts = s3_server.storage_options
    manifest = convert_dataset(
        small_synth, "s3://convert-out/ds", ConvertOptions(episodes_per_shard=2), dest_options=opts, progress=False
    )
    assert [s.episodes for s in manifest.shards] == [(0, 1), (2, 3)]
    keys = sorted(p.split("/", 2)[2] for p in fs.find("convert-out/ds"))
    assert keys == [
        "convert.json",
        "manifest.json",
        "shards/shard-000000.idx.json",
        "shards/shard-000000.tar",
        "shards/shard-000001.idx.json",
        "shards/shard-000001.tar",
        "sidecars.pack",
    ]  # no temporary objects

    convert_dataset(small_synth, tmp_path / "local", ConvertOptions(episodes_per_shard=2), progress=False)
    local = output_files(tmp_path / "local")
    for key in keys:
        assert fs.cat_file(f"convert-out/ds/{key}") == local[key], key

    report = verify_dataset("s3://convert-out/ds", small_synth, decode_check=1, storage_options=opts)
    assert report.ok, str(report)
    result = run_cli("verify", "s3://convert-out/ds", "--storage-options", json.dumps(opts), "--no-progress")
    assert result.returncode == 0 and "shards 2, episodes 4" in result.stdout, result.stderr

    # a re-run finds its own complete output and keeps it
    before = {k: fs.info(f"convert-out/ds/{k}")["ETag"] for k in keys if k.endswith(".tar")}
    convert_dataset(
        small_synth, "s3://convert-out/ds", ConvertOptions(episodes_per_shard=2), dest_options=opts, progress=False
    )
    fs.invalidate_cache()
    assert {k: fs.info(f"convert-out/ds/{k}")["ETag"] for k in before} == before


def test_convert_from_bucket(s3_server, small_synth: Path, tmp_path: Path) -> None:
    fs = s3_server.filesystem()
    fs.mkdir("convert-src")
    fs.put(str(small_synth), "convert-src/ds", recursive=True)
    convert_dataset(
        "s3://convert-src/ds",
        tmp_path / "from-s3",
        ConvertOptions(episodes_per_shard=2),
        source_options=s3_server.storage_options,
        progress=False,
    )
    convert_dataset(small_synth, tmp_path / "from-disk", ConvertOptions(episodes_per_shard=2), progress=False)
    a, b = output_files(tmp_path / "from-s3"), output_files(tmp_path / "from-disk")
    shards = [k for k in b if k.startswith("shards/")]
    assert len(shards) == 4 and {k: a[k] for k in shards} == {k: b[k] for k in shards}


def test_tasks_claiming_a_bucket_at_once_with_other_options_one_wins(s3_server) -> None:
    """In a bucket the run record is created with a conditional PUT (If-None-Match): of tasks started
    at once with other options exactly one claims the destination (a look then a PUT let several)."""
    s3_server.filesystem().mkdir("claim-race")
    won = claims_at_once("s3://claim-race/out", s3_server.storage_options)
    assert len(won) == 1
    assert json.loads(s3_server.filesystem().cat_file("claim-race/out/convert.json"))["crf"] == won[0]
