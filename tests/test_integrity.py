"""Wrong bytes are never returned: per-member checksums (format 2) are checked on every episode read,
cached shards are verified and re-fetched, ``on_error="skip"`` drops and counts bad episodes, format 1
shards still load, and decode errors name dataset, shard, episode, camera and frames."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tarfile
from pathlib import Path

import pytest

from convert_helpers import reseal
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.verify import verify_dataset
from lerobot_shards.format import (
    MANIFEST_NAME,
    SHARDS_DIR,
    FormatError,
    Sidecar,
    clip_member,
    member_checksum,
    table_member,
)
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.decoding.decoders import DecodeError
from lerobot_shards.loader.read.integrity import IntegrityError
from lerobot_shards.synth import read_identity
from lerobot_shards.tar_headers import TarHeaderError, member_header

CAM = "observation.images.front"
LENGTHS = {0: 8, 1: 7, 2: 7}  # what synth_factory's seed gives; checked in the fixture


@pytest.fixture(scope="module")
def converted(tmp_path_factory, synth_factory) -> Path:
    raw = synth_factory(num_episodes=3, length_range=(6, 8), cameras=(CAM,))
    out = tmp_path_factory.mktemp("integrity") / "out"
    manifest = convert_dataset(raw, out, ConvertOptions(episodes_per_shard=2), progress=False)
    assert [s.episodes for s in manifest.shards] == [(0, 1), (2,)]
    assert dict(zip((0, 1, 2), (n for s in manifest.shards for n in s.episode_lengths))) == LENGTHS
    return out


def _copy(converted: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(converted, out)
    return out


def _sidecar(out: Path, shard: int) -> Sidecar:
    return Sidecar.from_json((out / SHARDS_DIR / f"shard-{shard:06d}.idx.json").read_bytes())


def _member(out: Path, episode: int, name: str):
    return _sidecar(out, 0 if episode < 2 else 1).episodes[episode % 2].members[name]


def _member_name(kind: str, episode: int) -> str:
    key = f"e{episode:06d}"
    return table_member(key) if kind == "parquet" else clip_member(key, CAM)


def _flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x20
    path.write_bytes(bytes(data))


def _samples(source: str, **kwargs) -> tuple[list[dict], EpisodePoolDataset]:
    kwargs = {"episode_pool_size": 2, "seed": 3, **kwargs}
    ds = EpisodePoolDataset(source, **kwargs)
    return list(ds), ds


def _assert_exact(samples: list[dict], episodes: set[int]) -> None:
    """Every frame of ``episodes`` exactly once, each decoded picture the frame asked for."""
    got = sorted((int(s["episode_index"]), int(s["frame_index"])) for s in samples)
    assert got == sorted((e, f) for e in episodes for f in range(LENGTHS[e]))
    for s in samples:
        assert read_identity(s[CAM]) == (int(s["episode_index"]), int(s["frame_index"]))


def test_sidecar_records_a_checksum_per_member(converted: Path) -> None:
    for shard in (0, 1):
        sidecar = _sidecar(converted, shard)
        assert sidecar.format_version >= 2
        data = (converted / SHARDS_DIR / sidecar.shard).read_bytes()
        for entry in sidecar.episodes:
            for m in entry.members.values():
                assert m.xxh3_128 == member_checksum(data[m.offset : m.offset + m.size]), m.name


@pytest.mark.parametrize("kind", ["parquet", "clip"])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_corrupt_member_is_an_error_naming_it(converted: Path, tmp_path: Path, kind: str, where: str) -> None:
    out = _copy(converted, tmp_path)
    name = _member_name(kind, 1)
    m = _member(out, 1, name)
    position = {"first": m.offset, "middle": m.offset + m.size // 2, "last": m.offset + m.size - 1}[where]
    _flip(out / SHARDS_DIR / "shard-000000.tar", position)
    with pytest.raises(IntegrityError, match=rf"shards/shard-000000\.tar: episode 1: member {name} "):
        _samples(str(out))
    report = verify_dataset(out)
    assert any(f"member {name} does not match its checksum" in p for p in report.problems), str(report)


def test_skip_mode_drops_and_counts_bad_episodes(converted: Path, tmp_path: Path, caplog) -> None:
    out = _copy(converted, tmp_path)
    m = _member(out, 1, _member_name("clip", 1))
    _flip(out / SHARDS_DIR / "shard-000000.tar", m.offset + m.size // 2)
    with caplog.at_level(logging.WARNING):
        samples, ds = _samples(str(out), on_error="skip")
    _assert_exact(samples, {0, 2})
    total = ds.stats()["total"]
    assert (total["episodes_skipped"], total["samples_skipped"]) == (1, LENGTHS[1])
    assert "skipping episode 1" in caplog.text and "reading it again" in caplog.text


@pytest.mark.parametrize("drop", [0, 3])
def test_skip_mode_in_equal_count_mode_keeps_the_count_with_other_frames(
    converted: Path, tmp_path: Path, drop: int
) -> None:
    """DDP's default (equal_samples_per_rank): a dropped sample is replaced by another frame of a
    good resident episode, so the consumer still yields its count; every sample is still exact,
    and none is a frame ``drop_n_last_frames`` leaves unsampled."""
    out = _copy(converted, tmp_path)
    m = _member(out, 1, _member_name("clip", 1))
    _flip(out / SHARDS_DIR / "shard-000000.tar", m.offset + m.size // 2)
    # seed 1: a replacement frame counted over the whole episode, not its sampled frames, was a dropped one
    kw = dict(on_error="skip", equal_samples_per_rank=True, drop_n_last_frames=drop, seed=1 if drop else 3)
    samples, ds = _samples(str(out), **kw)
    got = [(int(s["episode_index"]), int(s["frame_index"])) for s in samples]
    assert 1 not in {e for e, _ in got}
    assert set(got) == {(e, f) for e in (0, 2) for f in range(LENGTHS[e] - drop)}  # each good frame at least once
    for s in samples:
        assert read_identity(s[CAM]) == (int(s["episode_index"]), int(s["frame_index"]))
    total = ds.stats()["total"]
    assert len(samples) == sum(LENGTHS.values()) - 3 * drop  # one consumer: its count is every sampled frame
    assert total["samples_skipped"] == total["samples_substituted"] == LENGTHS[1] - drop
    again, _ = _samples(str(out), **kw)
    assert [(int(s["episode_index"]), int(s["frame_index"])) for s in again] == got  # deterministic


def test_format_1_shards_still_load(converted: Path, tmp_path: Path) -> None:
    out = _copy(converted, tmp_path)
    _to_format_1(out)
    samples, _ = _samples(str(out), legacy_format=True)
    _assert_exact(samples, {0, 1, 2})
    assert verify_dataset(out, legacy_format=True).ok


@pytest.mark.parametrize("version", [1, 2])
def test_a_lowered_format_version_is_refused_unless_asked_for(converted: Path, tmp_path: Path, version: int) -> None:
    """An editor who flips a clip's byte and lowers the version (dropping the digests and member
    checksums with it) switched every check off: the loader served the changed frames silently.
    Nothing in the files can vouch for their version, so a format without digests is read only
    when the caller asks (``legacy_format``), and ``verify`` reports it unless asked too."""
    out = _copy(converted, tmp_path)
    m = _member(out, 1, _member_name("clip", 1))
    _flip(out / SHARDS_DIR / "shard-000000.tar", m.offset + m.size // 2)
    _rewrite_shard_sums(out, 0, {})
    _to_format_1(out)
    for path in (out / MANIFEST_NAME, *(out / SHARDS_DIR).glob("*.idx.json")):
        path.write_text(json.dumps({**json.loads(path.read_text()), "format_version": version}))
    want = rf"{out}/manifest\.json: format_version {version} carries no digests of its metadata .* legacy_format=True"
    with pytest.raises(FormatError, match=want):
        _samples(str(out))
    report = verify_dataset(out)
    assert not report.ok and any("carries no digests" in p for p in report.problems), report.problems


def _to_format_1(out: Path) -> None:
    """Rewrite a converted dataset's JSON as format 1 wrote it: no member checksums."""
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    manifest["format_version"] = 1
    del manifest["manifest_sha256"]
    for record in manifest["shards"]:
        del record["sidecar_sha256"], record["sidecar_bytes"]
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    for path in (out / SHARDS_DIR).glob("*.idx.json"):
        side = json.loads(path.read_text())
        side["format_version"] = 1
        for e in side["episodes"]:
            for m in e["members"]:
                del m["xxh3_128"]
        path.write_text(json.dumps(side))


def _rewrite_shard_sums(out: Path, shard: int, members: dict[str, str]) -> None:
    """Make sidecar and manifest agree with a tampered tar (new member sums, size, sha256)."""
    tar = out / SHARDS_DIR / f"shard-{shard:06d}.tar"
    data = tar.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    side_path = out / SHARDS_DIR / f"shard-{shard:06d}.idx.json"
    side = json.loads(side_path.read_text())
    side.update(sha256=sha, size=len(data))
    for e in side["episodes"]:
        for m in e["members"]:
            m["xxh3_128"] = members.get(m["name"], m["xxh3_128"])
    side_path.write_text(json.dumps(side))
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    manifest["shards"][shard].update(sha256=sha, bytes=len(data))
    manifest["totals"]["bytes"] = sum(s["bytes"] for s in manifest["shards"])
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    reseal(out)


def test_decode_error_names_dataset_shard_episode_camera_frame(converted: Path, tmp_path: Path) -> None:
    """Damaged picture data under a recomputed checksum: decoding itself fails, and says where."""
    out = _copy(converted, tmp_path)
    name = _member_name("clip", 1)
    m = _member(out, 1, name)
    tar = out / SHARDS_DIR / "shard-000000.tar"
    data = bytearray(tar.read_bytes())
    clip = data[m.offset : m.offset + m.size]
    mdat = clip.index(b"mdat") + 4
    clip[mdat:] = bytes(len(clip) - mdat)  # every packet zeroed, the mp4 structure intact
    data[m.offset : m.offset + m.size] = clip
    tar.write_bytes(bytes(data))
    _rewrite_shard_sums(out, 0, {name: member_checksum(bytes(clip))})
    with pytest.raises(DecodeError) as e:  # not an IntegrityError: the bytes are what the sidecar says
        _samples(str(out), episodes=[1])
    message = str(e.value)
    assert f"{out}/shards/shard-000000.tar: episode 1 camera {CAM}: cannot decode frame(s) " in message
    assert "Could not push packet" in message  # torchcodec's own words stay


@pytest.fixture
def bucket(s3_server, converted: Path, request) -> str:
    fs = s3_server.filesystem()
    name = "integ-" + hashlib.sha1(request.node.name.encode()).hexdigest()[:10]
    fs.mkdir(name)
    fs.put(str(converted) + "/", f"{name}/ds", recursive=True)
    return f"s3://{name}/ds"


def _cached(cache: Path, shard: int) -> Path:
    (path,) = cache.glob(f"*/shard-{shard:06d}.tar")
    return path


@pytest.mark.parametrize("damage", ["flip clip", "flip parquet", "truncate"])
def test_damaged_cached_shard_is_fetched_again(
    s3_server, bucket: str, converted: Path, tmp_path: Path, damage: str
) -> None:
    cache = tmp_path / "cache"
    opts = s3_server.storage_options
    samples, _ = _samples(bucket, cache_dir=str(cache), storage_options=opts)
    _assert_exact(samples, {0, 1, 2})
    cached = _cached(cache, 0)
    good = cached.read_bytes()
    if damage.startswith("flip"):
        m = _member(converted, 1, _member_name(damage.split()[1], 1))
        _flip(cached, m.offset + m.size // 3)
    else:
        cached.write_bytes(good[: len(good) // 2])
    samples, _ = _samples(bucket, cache_dir=str(cache), storage_options=opts)
    _assert_exact(samples, {0, 1, 2})
    assert cached.read_bytes() == good
    assert sorted(p.name for p in cached.parent.iterdir()) == ["shard-000000.tar", "shard-000001.tar"]


def test_damaged_cached_raw_mp4_is_fetched_again(s3_server, synth_factory, tmp_path: Path) -> None:
    """A raw dataset's mp4s carry no checksum: the cache records what it wrote and re-checks it."""
    raw = synth_factory(num_episodes=3, length_range=(6, 8), cameras=(CAM,))
    fs = s3_server.filesystem()
    fs.mkdir("integ-raw-mp4")
    fs.put(str(raw) + "/", "integ-raw-mp4/ds", recursive=True)
    cache = tmp_path / "cache"
    opts = s3_server.storage_options
    samples, _ = _samples("s3://integ-raw-mp4/ds", cache_dir=str(cache), storage_options=opts)
    _assert_exact(samples, {0, 1, 2})
    cached = sorted(cache.rglob("*.mp4"))[0]
    good = cached.read_bytes()
    damaged = bytearray(good)
    middle = len(good) // 2
    damaged[middle : middle + 16] = bytes(b ^ 1 for b in damaged[middle : middle + 16])
    cached.write_bytes(bytes(damaged))  # same size
    samples, ds = _samples("s3://integ-raw-mp4/ds", cache_dir=str(cache), storage_options=opts)
    _assert_exact(samples, {0, 1, 2})
    assert cached.read_bytes() == good
    assert ds.stats()["total"]["cache_misses"] >= 1


def test_corrupt_remote_shard_never_enters_the_cache(s3_server, bucket: str, converted: Path, tmp_path: Path) -> None:
    fs = s3_server.filesystem()
    data = bytearray((converted / SHARDS_DIR / "shard-000001.tar").read_bytes())
    m = _member(converted, 2, _member_name("parquet", 2))
    data[m.offset + 5] ^= 0x01
    fs.pipe_file(f"{bucket[5:]}/shards/shard-000001.tar", bytes(data))
    cache = tmp_path / "cache"
    opts = s3_server.storage_options
    # the episode's member checksum (served while the shard downloads) or the whole shard's sha256
    with pytest.raises(
        IntegrityError, match=r"shards/shard-000001\.tar: (downloaded .* the manifest says|episode 2: member)"
    ):
        _samples(bucket, cache_dir=str(cache), storage_options=opts, shuffle=False)
    assert not list(cache.glob("*/shard-000001.tar*"))  # neither the shard nor a temporary file
    # without a cache the episode's bytes are checked as they are read by range
    with pytest.raises(IntegrityError, match=r"shard-000001\.tar: episode 2: member e000002\.parquet"):
        _samples(bucket, storage_options=opts)
    samples, ds = _samples(bucket, storage_options=opts, on_error="skip")
    _assert_exact(samples, {0, 1})
    assert ds.stats()["total"]["episodes_skipped"] == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delta_timestamps": {"action": 0.1}}, r"delta_timestamps\['action'\] = 0\.1 is not a list of seconds"),
        ({"delta_timestamps": {CAM: "0.0"}}, rf"delta_timestamps\['{CAM}'\] = '0\.0' is not a list"),
        ({"delta_timestamps": {"action": ["0"]}}, r"delta_timestamps\['action'\] has '0', which is not a number"),
        ({"delta_timestamps": {"action": [True]}}, r"delta_timestamps\['action'\] has True, which is not a number"),
        ({"cameras": CAM}, rf"cameras must be a list of camera keys, got the string '{CAM}'; write \['{CAM}'\]"),
        ({"seed": -1}, "seed must be a non-negative int, got -1"),
        ({"seed": 1.5}, "seed must be a non-negative int, got 1.5"),
        ({"prefetch_episodes": 0}, "prefetch_episodes must be an int >= 1"),
        ({"decoder_cache_size": 0}, "decoder_cache_size must be an int >= 1"),
        ({"on_error": "ignore"}, "on_error must be one of"),
    ],
)
def test_bad_arguments_are_clear_errors(converted: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EpisodePoolDataset(str(converted), **kwargs)


def test_small_explicit_settings_are_honoured(converted: Path) -> None:
    ds = EpisodePoolDataset(str(converted), episode_pool_size=2, prefetch_episodes=1, decoder_cache_size=1)
    assert (ds.prefetch_episodes, ds.decoder_cache_size) == (1, 1)
    _assert_exact(list(ds), {0, 1, 2})


def test_image_decode_error_names_episode_feature_frame(synth_factory, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    key = "observation.images.wrist"
    root = tmp_path / "raw"
    shutil.copytree(synth_factory(num_episodes=1, cameras=(), image_keys=(key,), length_range=(6, 6)), root)
    (path,) = root.glob("data/*/*.parquet")
    table = pq.read_table(path)
    images = table.column(key).to_pylist()
    images[4] = {**images[4], "bytes": b"not an image"}
    column = table.schema.get_field_index(key)
    table = table.set_column(column, table.schema.field(key), [images])
    pq.write_table(table, path)
    ds = EpisodePoolDataset(str(root), shuffle=False, episode_pool_size=1)
    with pytest.raises(DecodeError, match=rf"{root}: episode 0 feature {key} frame 4: cannot decode the image"):
        list(ds)


def test_a_sidecar_cannot_opt_out_of_checksums(converted: Path, tmp_path: Path) -> None:
    out = _copy(converted, tmp_path)
    path = out / SHARDS_DIR / "shard-000000.idx.json"
    side = json.loads(path.read_text())
    side["format_version"] = 1
    path.write_text(json.dumps(side))
    reseal(out)
    with pytest.raises(FormatError, match=r"shard-000000\.idx\.json: format_version 1, but the manifest's is 3"):
        _samples(str(out))


# -- tar headers: the member's real name is its PAX path record ------------------------------------

ACCENTED = "observation.images.caméra"  # not ASCII: the ustar name field holds "cam?ra"


@pytest.mark.parametrize(
    "name, size",
    [
        ("e000000.json", 5),
        (f"e000000.{ACCENTED}.mp4", 5),
        ("e000000." + "x" * 120 + ".mp4", 5),  # ASCII over the ustar field's 100 bytes
        ("e000000.observation.images." + "カメラ" * 12 + ".mp4", 5),  # 100+ bytes of UTF-8
        ("e000000." + "é" * 400 + ".mp4", 5),  # PAX records over one 512-byte block
        ("e000000.big.mp4", 10**10),  # over the ustar size field's 8 GiB: a PAX size record
    ],
)
def test_member_header_reads_the_name_and_size_tarfile_writes(name: str, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = size
    assert member_header(info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")) == (name, size)


def _pax_block(path: bytes) -> bytes:
    """A PAX header (block and records) holding one ``path`` record, as bytes a writer could put."""
    record = b" path=" + path + b"\n"
    n = len(record) + len(str(len(record)))
    record = str(n + (len(str(n)) > len(str(len(record))))).encode() + record
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, len(record)
    return header.tobuf(tarfile.USTAR_FORMAT) + record + tarfile.NUL * (-len(record) % 512)


def _ustar(name: str, size: int = 5, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(tarfile.USTAR_FORMAT, "ascii", "replace")


@pytest.mark.parametrize(
    "headers, message",
    [
        (b"", "0 bytes of tar headers"),
        (_ustar("e.json")[:300], "300 bytes of tar headers"),
        (b"\x00" * 512, "its ustar header is not a tar header"),
        (_ustar("e.json")[:148] + b"0000000\x00" + _ustar("e.json")[156:], "not a tar header .*checksum"),
        (_ustar("e", kind=tarfile.SYMTYPE), "type b'2', not a regular file"),
        (_ustar("e") + _ustar("e"), "type b'0', not a PAX header"),
        (_pax_block(b"e.mp4")[:512] + _ustar("e"), r"says 14 bytes of records, but 0 bytes lie between"),
        (_pax_block(b"e.mp4") + b"\x00" * 512 + _ustar("e"), r"says 14 bytes of records, but 1024 bytes lie"),
        (_pax_block(b"e.mp4").replace(b"14 path", b"15 path") + _ustar("e"), "record at byte 0 .* does not parse"),
        (_pax_block(b"e.mp4").replace(b"14 path", b"x4 path") + _ustar("e"), "record at byte 0 .* does not parse"),
        (
            _pax_block(b"e.mp4").replace(b"path=e.mp4\n", b"path=e.mp4 ") + _ustar("e"),
            "record at byte 0 .* does not parse",
        ),
        (_pax_block(b"cam\xff\xfe.mp4") + _ustar("e"), r"path record b'cam\\xff\\xfe\.mp4' is not UTF-8"),
    ],
)
def test_member_header_refuses_damaged_or_foreign_headers(headers: bytes, message: str) -> None:
    with pytest.raises(TarHeaderError, match=message):
        member_header(headers)


@pytest.fixture(scope="module")
def accented(tmp_path_factory, synth_factory) -> Path:
    raw = synth_factory(num_episodes=2, length_range=(5, 6), cameras=(ACCENTED,))
    out = tmp_path_factory.mktemp("accented") / "out"
    convert_dataset(raw, out, ConvertOptions(episodes_per_shard=2), progress=False)
    return out


def test_non_ascii_camera_loads_and_verifies(accented: Path) -> None:
    """The hostile tester's case: convert and verify said OK, the loader refused every episode."""
    samples = list(EpisodePoolDataset(str(accented), episode_pool_size=2))
    assert len(samples) == sum(e.length for e in _sidecar(accented, 0).episodes)
    for s in samples:
        assert read_identity(s[ACCENTED]) == (int(s["episode_index"]), int(s["frame_index"]))
    assert verify_dataset(accented).ok


def _clip_headers(out: Path, episode: int) -> tuple[Path, int, bytes]:
    """(tar, offset of the PAX header, PAX header + ustar header) of an episode's camera member."""
    m = _sidecar(out, 0).episodes[episode].members[clip_member(f"e{episode:06d}", ACCENTED)]
    tar = out / SHARDS_DIR / "shard-000000.tar"
    start = m.offset - 3 * 512
    return tar, start, tar.read_bytes()[start : m.offset]


def _replace_headers(out: Path, episode: int, edit) -> str:
    """Edit the camera member's headers of ``episode`` in place (same length: no offset moves), make
    the shard's size and sha256 agree again, and return the member's name."""
    tar, start, headers = _clip_headers(out, episode)
    assert headers[156:157] == tarfile.XHDTYPE and f"path=e{episode:06d}.{ACCENTED}".encode() in headers
    new = edit(headers)
    assert len(new) == len(headers)
    data = bytearray(tar.read_bytes())
    data[start : start + len(new)] = new
    tar.write_bytes(bytes(data))
    _rewrite_shard_sums(out, 0, {})
    return clip_member(f"e{episode:06d}", ACCENTED)


def _gnu_long_name(headers: bytes) -> bytes:
    """The same name as a GNU long-name header instead of a PAX one: ``tarfile`` reads it, the loader
    (which only reads what the converter writes) does not."""
    name = headers[512 : 512 + 1024].split(b"path=", 1)[1].split(b"\n", 1)[0]
    long = tarfile.TarInfo("././@LongLink")
    long.type, long.size = tarfile.GNUTYPE_LONGNAME, len(name) + 1
    return long.tobuf(tarfile.GNU_FORMAT) + (name + b"\x00").ljust(512, b"\x00") + headers[-512:]


HEADER_EDITS = {
    "PAX path names another member": (
        lambda h: h.replace("caméra.mp4".encode(), "camérb.mp4".encode()),
        r"where the tar holds e000001\.observation\.images\.camérb\.mp4",
    ),
    "PAX record length wrong": (lambda h: h.replace(b"47 path", b"48 path"), "PAX header's record at byte 0"),
    "PAX path not UTF-8": (lambda h: h.replace("é".encode(), b"\xff\xfe"), "PAX path record .* is not UTF-8"),
    "GNU long name": (_gnu_long_name, "type b'L', not a PAX header"),
}


@pytest.mark.parametrize("edit", sorted(HEADER_EDITS))
def test_tar_headers_that_lie_or_do_not_parse_are_integrity_errors(accented: Path, tmp_path: Path, edit: str) -> None:
    """Headers edited with the shard's sha256 made to agree and the member's data untouched (its
    checksum still matches): the loader refuses the episode naming shard, episode and member,
    ``on_error="skip"`` drops just that episode, and ``verify`` reports it too."""
    out = _copy(accented, tmp_path)
    change, message = HEADER_EDITS[edit]
    name = _replace_headers(out, 1, change)
    with pytest.raises(IntegrityError, match=rf"shards/shard-000000\.tar: episode 1: .*{message}"):
        list(EpisodePoolDataset(str(out), episode_pool_size=2))
    skipped = list(EpisodePoolDataset(str(out), episode_pool_size=2, on_error="skip"))
    assert {int(s["episode_index"]) for s in skipped} == {0}
    report = verify_dataset(out)
    assert not report.ok and any(name in p or "not a readable tar" in p for p in report.problems), str(report)


def test_verify_reads_member_headers_as_the_loader_does(accented: Path, tmp_path: Path) -> None:
    """A GNU long-name header is a tar that ``tarfile`` reads without complaint, but not one the
    loader reads: ``verify`` says so instead of OK."""
    out = _copy(accented, tmp_path)
    name = _replace_headers(out, 1, _gnu_long_name)
    report = verify_dataset(out)
    at = _sidecar(out, 0).episodes[1].members[name].offset
    assert report.problems == [
        f"{out}/shards/shard-000000.tar: member {name} at byte {at}: the header in front of its ustar header "
        "is of type b'L', not a PAX header"
    ]


def test_a_cached_shard_failing_its_sha256_outside_every_member_is_refused(
    s3_server, bucket: str, converted: Path, tmp_path: Path
) -> None:
    """A byte of a tar header (no member checksum covers it) changed in the bucket: the download
    failed its sha256 silently, every epoch, while the episodes were served. Now the shard is
    downloaded once more, then refused naming it; nothing is left in the cache."""
    fs = s3_server.filesystem()
    data = bytearray((converted / SHARDS_DIR / "shard-000000.tar").read_bytes())
    data[10] ^= 0x01  # the first member's name field in its tar header
    fs.pipe_file(f"{bucket[5:]}/shards/shard-000000.tar", bytes(data))
    cache = tmp_path / "cache"
    with pytest.raises(IntegrityError, match=r"shards/shard-000000\.tar: downloaded .* the manifest says"):
        _samples(bucket, cache_dir=str(cache), storage_options=s3_server.storage_options, shuffle=False)
    assert not list(cache.glob("*/shard-000000.tar*"))


def test_a_format_1_shard_is_served_only_once_its_sha256_is_checked(s3_server, converted: Path, tmp_path: Path) -> None:
    """Format 1 has no member checksums: its cached shard's bytes were served while they downloaded,
    before the sha256 check, so a changed member gave wrong values every epoch, silently."""
    out = _copy(converted, tmp_path)
    _to_format_1(out)
    m = _member(out, 1, _member_name("clip", 1))
    _flip(out / SHARDS_DIR / "shard-000000.tar", m.offset + m.size // 2)
    fs = s3_server.filesystem()
    fs.mkdir("integ-format-1")
    fs.put(str(out) + "/", "integ-format-1/ds", recursive=True)
    cache = tmp_path / "cache"
    with pytest.raises(IntegrityError, match=r"shards/shard-000000\.tar: downloaded .* the manifest says"):
        _samples(
            "s3://integ-format-1/ds",
            cache_dir=str(cache),
            storage_options=s3_server.storage_options,
            legacy_format=True,
        )
    assert not list(cache.glob("*/shard-000000.tar*"))
