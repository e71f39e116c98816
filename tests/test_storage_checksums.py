"""A body the storage client's checksum check refuses (botocore's ``FlexibleChecksumError``, injected into
the real S3 client's reads of one shard): ``verify`` reports it naming the object, the loader raises
naming it, and neither says to check that the server is up (it answered; its bytes were wrong)."""

from __future__ import annotations

from pathlib import Path

import pytest
import s3fs
from botocore.exceptions import FlexibleChecksumError

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.verify import verify_dataset
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.redaction import explain

UP = "check that the storage server is up"
HINT = "do not match the checksum it keeps for the object"


@pytest.fixture
def bucket(s3_server, synth_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    raw = synth_factory(num_episodes=2, length_range=(6, 8), cameras=("observation.images.front",))
    convert_dataset(raw, tmp_path / "out", ConvertOptions(episodes_per_shard=1), progress=False)
    name = f"checksums-{tmp_path.name[-12:].lower().replace('_', '-')}"  # a bucket of this test's own
    fs = s3_server.filesystem()
    fs.mkdir(name)
    fs.put(str(tmp_path / "out") + "/", f"{name}/ds", recursive=True)
    real = s3fs.S3FileSystem._cat_file

    async def damaged(self, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if path.endswith("shard-000000.tar"):
            raise FlexibleChecksumError(error_msg="Expected checksum AAAA== did not match calculated checksum BBBB==")
        return await real(self, path, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_cat_file", damaged)
    # A file system cached by an earlier test with these options mirrored the real method when made
    s3fs.S3FileSystem.clear_instance_cache()
    return f"s3://{name}/ds"


def test_verify_names_the_object_whose_checksum_failed(bucket: str, s3_server) -> None:
    report = verify_dataset(bucket, storage_options=s3_server.storage_options)
    problems = [p for p in report.problems if "shard-000000.tar" in p]
    assert problems and all(UP not in p for p in report.problems), report.problems
    assert problems[0].startswith(f"{bucket}/shards/shard-000000.tar: cannot read it (FlexibleChecksumError"), problems
    assert HINT in problems[0]


def test_the_loader_names_it_without_the_server_hint(bucket: str, s3_server) -> None:
    ds = EpisodePoolDataset(bucket, storage_options=s3_server.storage_options, shuffle=False, episode_pool_size=1)
    with pytest.raises(OSError, match=rf"{bucket}/shards/shard-000000\.tar: episode 0: ") as raised:
        list(ds)
    assert HINT in str(raised.value) and UP not in str(raised.value), str(raised.value)


def test_the_cli_line_for_a_checksum_failure() -> None:
    error = FlexibleChecksumError(error_msg="Expected checksum AAAA== did not match calculated checksum BBBB==")
    line = explain(error, ["s3://checksums/ds"])
    assert line.startswith("s3://checksums/ds: ") and HINT in line and UP not in line, line
