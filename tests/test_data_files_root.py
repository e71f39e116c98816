"""``data_files_root``: a raw dataset's metadata from one place (a Hub repo id, a path), its parquet
and mp4 files from another fsspec root (a bucket mirror on the S3 server, an ``hf://buckets/``
path on the Hub server, a local folder): the same samples and shards as the plain local copy, the
data root's own storage options, and a missing file named with the root it is missing from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from hub_server import HubServer
from lerobot_shards.filesystems import resolve_source
from lerobot_shards.lerobot_v3 import LeRobotV3Source, SourceError
from lerobot_shards.loader import EpisodePoolDataset, MixtureDataset, load_mixture
from lerobot_shards.storage import StorageLocation
from s3_server import S3Server
from test_hub import CAMS, _assert_same, _cli, _stream

WINDOW = {CAMS[0]: [-1 / 30, 0.0, 1 / 30]}


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory, raw: Path) -> tuple[Path, Path]:
    """(a folder with the dataset's meta/ only, a folder with its data/ and videos/ only)."""
    top = tmp_path_factory.mktemp("split")
    shutil.copytree(raw / "meta", top / "meta_only/meta")
    for sub in ("data", "videos"):
        shutil.copytree(raw / sub, top / "mirror" / sub)
    return top / "meta_only", top / "mirror"


def test_hub_metadata_with_data_files_on_s3_or_a_folder_gives_the_local_samples(
    hub: HubServer, s3_server: S3Server, raw: Path, split: tuple[Path, Path], tmp_path: Path
) -> None:
    meta, mirror = split
    hub.add_dataset("me/ds", meta)
    fs = s3_server.filesystem()
    fs.mkdir("dfr-mirror")
    fs.put(str(mirror) + "/", "dfr-mirror/ds", recursive=True)
    local = _stream(str(raw), delta_timestamps=WINDOW)
    _assert_same(local, _stream("me/ds", delta_timestamps=WINDOW, data_files_root=str(mirror)))
    on_s3 = StorageLocation("s3://dfr-mirror/ds", s3_server.storage_options)  # its own options, not the Hub's
    _assert_same(local, _stream("me/ds", delta_timestamps=WINDOW, data_files_root=on_s3))
    # DataLoader workers, and the prefetch-on-admit cache downloading the mp4s from the mirror
    workers = _stream(str(raw), num_workers=2, delta_timestamps=WINDOW)
    cached = _stream(
        "me/ds", num_workers=2, delta_timestamps=WINDOW, data_files_root=on_s3, cache_dir=str(tmp_path / "c")
    )
    _assert_same(workers, cached)
    assert s3_server.requests("GET", "dfr-mirror/ds/videos/observation.images.front/chunk-000/file-000.mp4")
    assert not [p for _, p, _ in hub.requests() if "/data/" in p or "/videos/" in p]  # the Hub served metadata only


def test_a_file_missing_at_the_data_files_root_is_one_line_naming_it_and_the_root(
    hub: HubServer, split: tuple[Path, Path], tmp_path: Path
) -> None:
    meta, mirror = split
    hub.add_dataset("me/ds", meta)
    partial = tmp_path / "partial"
    shutil.copytree(mirror, partial)
    (partial / "data/chunk-000/file-001.parquet").unlink()
    done = _cli("inspect", "me/ds", "--data-files-root", str(partial))
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert str(partial) in lines[0] and "data/chunk-000/file-001.parquet" in lines[0], lines[0]
    assert "data files root of hf://datasets/me/ds@" in lines[0]
    with pytest.raises(SourceError, match="file-001.parquet"):
        EpisodePoolDataset("me/ds", data_files_root=str(partial))


def test_names_from_the_metadata_are_checked_before_they_reach_the_data_files_root(
    raw: Path, split: tuple[Path, Path], tmp_path: Path
) -> None:
    _, mirror = split
    hostile = tmp_path / "hostile"
    shutil.copytree(raw / "meta", hostile / "meta")
    info = json.loads((hostile / "meta/info.json").read_text())
    info["data_path"] = "../../outside/{chunk_index}-{file_index}.parquet"
    (hostile / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(SourceError, match="data_path"):
        LeRobotV3Source(str(hostile), data_files=str(mirror))


def test_convert_inspect_and_verify_take_a_data_files_root(
    hub: HubServer, raw: Path, split: tuple[Path, Path], tmp_path: Path
) -> None:
    from lerobot_shards.convert.inspect import inspect_path
    from lerobot_shards.convert.plan import ConvertOptions
    from lerobot_shards.convert.run import convert_dataset
    from lerobot_shards.convert.verify import verify_dataset

    meta, mirror = split
    hub.add_dataset("me/ds", meta)
    convert_dataset(raw, tmp_path / "plain", ConvertOptions(episodes_per_shard=2), progress=False)
    done = _cli(
        "convert", "me/ds", str(tmp_path / "out"), "--data-files-root", str(mirror), "--episodes-per-shard", "2"
    )
    assert done.returncode == 0, done.stderr
    shards = sorted((tmp_path / "plain/shards").glob("*.tar"))  # the same bytes as from the plain local copy
    assert shards and [p.read_bytes() for p in shards] == [
        (tmp_path / "out/shards" / p.name).read_bytes() for p in shards
    ]
    shown = _cli("inspect", "me/ds", "--data-files-root", str(mirror))
    assert shown.returncode == 0 and f"at {mirror}" in shown.stdout, shown.stderr
    report = verify_dataset(tmp_path / "out", resolve_source("me/ds"), data_files_root=str(mirror))
    assert report.ok, str(report)
    with pytest.raises(ValueError, match="converted dataset holds its own files"):
        inspect_path(tmp_path / "out", data_files_root=str(mirror))


def test_a_mixture_source_takes_its_own_data_files_root(
    hub: HubServer, raw: Path, split: tuple[Path, Path], tmp_path: Path
) -> None:
    meta, mirror = split
    hub.add_dataset("me/ds", meta)
    (tmp_path / "mirror").symlink_to(mirror)
    file = tmp_path / "mix.yaml"
    file.write_text(
        "samples_per_epoch: 24\nsources:\n  - {source: me/ds, weight: 1, data_files_root: mirror, name: ds}\n"
    )
    (source,) = load_mixture(file).sources
    assert isinstance(source.data_files_root, StorageLocation) and source.data_files_root.url == str(
        tmp_path / "mirror"
    )
    local = tmp_path / "local.yaml"
    local.write_text(f"samples_per_epoch: 24\nsources:\n  - {{source: {raw}, weight: 1, name: ds}}\n")

    def samples(path: Path) -> list[dict]:
        ds = MixtureDataset(path, seed=3, episode_pool_size=2, episodes_per_shard=2)
        return list(DataLoader(ds, batch_size=4))

    _assert_same(samples(local), samples(file))
