"""Names read from a dataset never reach a path unchecked: manifests, sidecars, tar members and
info.json path templates that are absolute, climb out, hold separators or NUL are refused with
an error naming the file and field, by the loader (local, from a bucket, with a cache dir),
``verify`` and ``inspect``; nothing outside the dataset is read and nothing outside the cache written."""

from __future__ import annotations

import json
import shutil
import tarfile
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from convert_helpers import reseal, run_cli
from lerobot_shards.convert.destination import Destination
from lerobot_shards.convert.inspect import inspect_path
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.verify import verify_dataset
from lerobot_shards.format import MANIFEST_NAME, SHARDS_DIR, FormatError
from lerobot_shards.lerobot_v3 import LeRobotV3Source, SourceError
from lerobot_shards.loader import EpisodePoolDataset, ReadOptions
from lerobot_shards.loader.read.shard_cache import FileCache, IOCounters
from lerobot_shards.loader.read.sources import ShardSource
from lerobot_shards.names import UnsafeNameError, check_name, check_relpath, confined_join
from lerobot_shards.synth import read_identity

# name forms an attacker writes; "{outside}" is a directory next to the dataset holding a real shard
ATTACKS = {
    "absolute": "{outside}/evil.tar",
    "climbing": "../../outside/evil.tar",
    "separator": "sub/evil.tar",
    "backslash": "..\\evil.tar",
    "nul": "evil\x00.tar",
    "empty": "",
    "dotdot": "..",
}


@pytest.fixture(scope="module")
def clean(tmp_path_factory, small_synth: Path) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "out"
    convert_dataset(small_synth, out, ConvertOptions(episodes_per_shard=2), progress=False)
    return out


def _tampered(clean: Path, base: Path, edit) -> Path:
    """A copy of ``clean`` at ``base/out`` with ``edit(manifest, sidecar0)`` applied to its JSON."""
    out = base / "out"
    shutil.copytree(clean, out)
    (base / "outside").mkdir(exist_ok=True)
    shutil.copy(out / SHARDS_DIR / "shard-000000.tar", base / "outside" / "evil.tar")  # a readable target
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    side_path = out / SHARDS_DIR / "shard-000000.idx.json"
    sidecar = json.loads(side_path.read_text())
    edit(manifest, sidecar)
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    side_path.write_text(json.dumps(sidecar))
    reseal(out)  # digests made to agree: the name checks themselves must refuse
    return out


def _attack(form: str, base: Path) -> str:
    return ATTACKS[form].format(outside=base / "outside")


@pytest.mark.parametrize("form", sorted(ATTACKS))
def test_name_checks_refuse_every_form(form: str, tmp_path: Path) -> None:
    value = _attack(form, tmp_path)
    with pytest.raises(UnsafeNameError, match="manifest.json: shards"):
        check_name(value, "manifest.json: shards[0].name")
    if form not in ("separator", "climbing") or ".." in value.split("/"):
        with pytest.raises(UnsafeNameError):
            check_relpath(value, "field")
    with pytest.raises(UnsafeNameError):
        confined_join(str(tmp_path / "cache"), value, "shard name")
    assert check_name("e000001.observation.images.front.mp4", "x") == "e000001.observation.images.front.mp4"
    assert check_relpath("videos/cam/chunk-000/file-000.mp4", "x") == "videos/cam/chunk-000/file-000.mp4"


@pytest.mark.parametrize("form", ["absolute", "climbing", "separator", "nul", "empty"])
@pytest.mark.parametrize("field", ["name", "sidecar"])
def test_manifest_shard_names_refused_locally(clean: Path, tmp_path: Path, form: str, field: str) -> None:
    out = _tampered(clean, tmp_path, lambda m, s: m["shards"][0].update({field: _attack(form, tmp_path)}))
    expected = rf"manifest\.json: shards\[0\]\.{field} = "
    with pytest.raises(FormatError, match=expected):
        EpisodePoolDataset(str(out), episode_pool_size=2)
    with pytest.raises(FormatError, match=expected):
        inspect_path(out)
    report = verify_dataset(out)
    assert not report.ok and any(f"shards[0].{field}" in p for p in report.problems), str(report)
    if form != "absolute":
        return  # the CLI once per field: one clear line, no traceback, not OK
    result = run_cli("verify", out, "--no-progress")
    assert result.returncode == 1 and "OK" not in result.stdout.splitlines()[0]
    result = run_cli("inspect", out)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert f"shards[0].{field}" in result.stderr


@pytest.mark.parametrize(
    ("where", "edit"),
    [
        ("shard", lambda m, s, bad: s.update(shard=bad)),
        ("episodes[0].key", lambda m, s, bad: s["episodes"][0].update(key=bad)),
        ("episodes[0].members[1].name", lambda m, s, bad: s["episodes"][0]["members"][1].update(name=bad)),
        ("episodes[0].clips key", lambda m, s, bad: s["episodes"][0]["clips"].update({bad: {}})),
    ],
)
@pytest.mark.parametrize("form", ["absolute", "climbing", "nul"])
def test_sidecar_names_refused(clean: Path, tmp_path: Path, where: str, edit, form: str) -> None:
    out = _tampered(clean, tmp_path, lambda m, s: edit(m, s, _attack(form, tmp_path)))
    ds = EpisodePoolDataset(str(out), episode_pool_size=2, shuffle=False)
    with pytest.raises(FormatError, match=r"shard-000000\.idx\.json: " + where.replace("[", r"\[").replace("]", r"\]")):
        list(ds)
    report = verify_dataset(out)
    assert not report.ok and any("shard-000000.idx.json" in p and where in p for p in report.problems), str(report)


def test_member_name_must_belong_to_its_episode(clean: Path, tmp_path: Path) -> None:
    out = _tampered(clean, tmp_path, lambda m, s: s["episodes"][0]["members"][1].update(name="e000001.parquet"))
    with pytest.raises(FormatError, match="does not belong to episode key 'e000000'"):
        list(EpisodePoolDataset(str(out), episode_pool_size=2, shuffle=False))


def test_tar_member_names_checked_by_verify(clean: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(clean, out)
    path = out / SHARDS_DIR / "shard-000000.tar"
    data = bytearray(path.read_bytes())
    header = tarfile.TarInfo.frombuf(bytes(data[:512]), tarfile.ENCODING, "surrogateescape")
    evil = "/" + header.name[1:]  # same length: the rest of the tar stays in place
    header.name = evil
    data[:512] = header.tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape")
    path.write_bytes(bytes(data))
    report = verify_dataset(out)
    assert not report.ok
    assert any("tar member name" in p and repr(evil) in p for p in report.problems), str(report)


def test_defence_in_depth_at_the_joins(clean: Path, tmp_path: Path) -> None:
    """Even a name that skipped parsing cannot leave the cache dir or the dataset."""
    src = ShardSource(str(clean), ReadOptions(cache_dir=str(tmp_path / "cache")))
    with ThreadPoolExecutor(1) as pool:
        cache = FileCache(str(tmp_path / "cache"), 1 << 20, pool, IOCounters())
    for form in ("absolute", "climbing", "nul"):
        with pytest.raises(UnsafeNameError):
            cache.acquire(lambda start, end: b"x", f"dataset/{_attack(form, tmp_path)}", 1, None, "shard")
        with pytest.raises(UnsafeNameError):
            src._shard_path(_attack(form, tmp_path))
    dest = Destination(str(clean))
    for rel in ("/etc/passwd", "../x", "shards/../../x", "a\x00b"):
        with pytest.raises(UnsafeNameError):
            dest.path(rel)
    assert not (tmp_path / "outside").exists()


@pytest.mark.parametrize("form", ["absolute", "climbing", "nul"])
def test_bucket_manifest_with_cache_dir(s3_server, clean: Path, tmp_path: Path, form: str) -> None:
    """The reported attack: a remote manifest whose shard name escapes the cache dir."""
    fs = s3_server.filesystem()
    bucket = f"hostile-{form}"
    fs.mkdir(bucket)
    target = tmp_path / "outside" / "evil.tar"
    bad = {"absolute": str(target), "climbing": "../../../../" + str(target).lstrip("/"), "nul": "a\x00.tar"}[form]
    out = _tampered(clean, tmp_path / "src", lambda m, s: m["shards"][0].update(name=bad))
    fs.put(str(out) + "/", f"{bucket}/ds", recursive=True)
    opts = s3_server.storage_options
    url = f"s3://{bucket}/ds"
    with pytest.raises(FormatError, match=r"manifest\.json: shards\[0\]\.name"):
        EpisodePoolDataset(url, cache_dir=str(tmp_path / "cache"), storage_options=opts)
    report = verify_dataset(url, storage_options=opts)
    assert not report.ok and any("shards[0].name" in p for p in report.problems)
    with pytest.raises(FormatError, match=r"shards\[0\]\.name"):
        inspect_path(url, storage_options=opts)
    assert not target.exists()


@pytest.mark.parametrize("form", ["absolute", "climbing", "nul"])
def test_bucket_sidecar_member_with_cache_dir(s3_server, clean: Path, tmp_path: Path, form: str) -> None:
    fs = s3_server.filesystem()
    bucket = f"hostile-side-{form}"
    fs.mkdir(bucket)
    out = _tampered(clean, tmp_path, lambda m, s: s.update(shard=_attack(form, tmp_path)))
    fs.put(str(out) + "/", f"{bucket}/ds", recursive=True)
    ds = EpisodePoolDataset(
        f"s3://{bucket}/ds", cache_dir=str(tmp_path / "cache"), storage_options=s3_server.storage_options
    )
    with pytest.raises(FormatError, match=r"shard-000000\.idx\.json: shard = "):
        list(ds)


INFO_ATTACKS = {
    "absolute data_path": ("data_path", "/abs/data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"),
    "climbing data_path": ("data_path", "../../data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"),
    "climbing video_path": ("video_path", "videos/../../{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"),
    "nul video_path": ("video_path", "videos/{video_key}\x00/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"),
    "empty part": ("data_path", "data//chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"),
    "bad template": ("data_path", "data/{secret}/file.parquet"),
}


@pytest.fixture
def raw_copy(small_synth: Path, tmp_path: Path) -> Path:
    root = tmp_path / "raw"
    shutil.copytree(small_synth, root)
    return root


@pytest.mark.parametrize("attack", sorted(INFO_ATTACKS))
def test_info_json_path_templates(raw_copy: Path, clean: Path, attack: str) -> None:
    key, template = INFO_ATTACKS[attack]
    info = json.loads((raw_copy / "meta/info.json").read_text())
    info[key] = template
    (raw_copy / "meta/info.json").write_text(json.dumps(info))
    expected = rf"meta/info\.json.*{key}"
    with pytest.raises(SourceError, match=expected):
        LeRobotV3Source(raw_copy)
    with pytest.raises(SourceError, match=expected):
        EpisodePoolDataset(str(raw_copy))
    with pytest.raises(SourceError, match=expected):
        inspect_path(raw_copy)
    report = verify_dataset(clean, raw_copy)
    assert not report.ok and any("meta/info.json" in p and key in p for p in report.problems)


def test_camera_key_with_separator(raw_copy: Path) -> None:
    info = json.loads((raw_copy / "meta/info.json").read_text())
    info["features"]["../evil"] = info["features"]["observation.images.front"]
    (raw_copy / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(SourceError, match=r"meta/info\.json: camera feature name = '\.\./evil'"):
        LeRobotV3Source(raw_copy)


# -- names that are not ASCII: written as they are, read back as they are ---------------------------

NFC = "observation.images.caméra"
NFD = unicodedata.normalize("NFD", NFC)  # the same word, other code points: another camera
LONG_UTF8 = "observation.images." + "カメラ" * 12  # 127 bytes of UTF-8: over the ustar name field
LONG_ASCII = "observation.images." + "c" * 100


def _tar_names(out: Path) -> dict[str, int]:
    """Every member's name and size as ``tarfile`` reads the shards (PAX records applied)."""
    names = {}
    for tar in sorted((out / SHARDS_DIR).glob("*.tar")):
        with tarfile.open(tar) as t:
            names.update({m.name: m.size for m in t.getmembers()})
    return names


@pytest.mark.parametrize(
    "cameras", [(NFC,), (NFC, NFD), (LONG_UTF8,), (LONG_ASCII,)], ids=["nfc", "nfc+nfd", "long", "ascii"]
)
def test_non_ascii_and_long_camera_keys_convert_verify_and_load(synth_factory, tmp_path: Path, cameras) -> None:
    """Camera keys become tar member names; the converter writes them exactly as the source spells
    them (no Unicode normalization: NFC and NFD spellings are two cameras, as in the source), and
    ``verify`` and the loader read the same names back."""
    raw = synth_factory(num_episodes=2, length_range=(5, 6), cameras=cameras)
    out = tmp_path / "out"
    manifest = convert_dataset(raw, out, ConvertOptions(episodes_per_shard=2), progress=False)
    assert sorted(manifest.cameras) == sorted(cameras)
    sidecar = json.loads((out / SHARDS_DIR / "shard-000000.idx.json").read_text())
    listed = {m["name"]: m["size"] for e in sidecar["episodes"] for m in e["members"]}
    assert _tar_names(out) == listed
    assert {f"e000000.{c}.mp4" for c in cameras} <= set(listed)
    assert verify_dataset(out).ok
    samples = list(EpisodePoolDataset(str(out), episode_pool_size=2))
    assert len(samples) == manifest.total_frames
    for s in samples:
        for cam in cameras:
            assert read_identity(s[cam]) == (int(s["episode_index"]), int(s["frame_index"]))


def _rename_feature(root: Path, old: str, new: str) -> None:
    """Rename a tabular feature throughout a LeRobot v3.0 dataset: info.json, stats.json, the data
    files' columns and the episode metadata's ``stats/<name>/...`` columns."""
    info = json.loads((root / "meta/info.json").read_text())
    info["features"] = {new if k == old else k: v for k, v in info["features"].items()}
    (root / "meta/info.json").write_text(json.dumps(info, ensure_ascii=False))
    stats = json.loads((root / "meta/stats.json").read_text())
    (root / "meta/stats.json").write_text(json.dumps({new if k == old else k: v for k, v in stats.items()}))
    for path in [*root.glob("data/*/*.parquet"), *root.glob("meta/episodes/*/*.parquet")]:
        table = pq.read_table(path)
        names = [new if c == old else c.replace(f"stats/{old}/", f"stats/{new}/") for c in table.column_names]
        pq.write_table(table.rename_columns(names), path)


def test_non_ascii_feature_name_round_trips(synth_factory, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    shutil.copytree(synth_factory(num_episodes=2, length_range=(5, 6), cameras=(NFC,)), raw)
    _rename_feature(raw, "observation.state", "observation.état")
    out = tmp_path / "out"
    convert_dataset(raw, out, ConvertOptions(episodes_per_shard=2), progress=False)
    assert verify_dataset(out, raw).ok
    expected = {
        (int(s["episode_index"]), int(s["frame_index"])): s["observation.état"] for s in EpisodePoolDataset(str(raw))
    }
    samples = list(EpisodePoolDataset(str(out), episode_pool_size=2))
    assert len(samples) == len(expected)
    for s in samples:
        assert s["observation.état"].tolist() == expected[int(s["episode_index"]), int(s["frame_index"])].tolist()


def test_camera_key_that_is_no_text_is_refused(raw_copy: Path) -> None:
    """A lone surrogate (JSON ``"\\ud800"``) cannot be written as a UTF-8 tar member name."""
    info = json.loads((raw_copy / "meta/info.json").read_text())
    info["features"]["observation.images.\ud800"] = info["features"]["observation.images.front"]
    (raw_copy / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(SourceError, match=r"camera feature name = .* is not valid Unicode text"):
        LeRobotV3Source(raw_copy)
