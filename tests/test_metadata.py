"""Metadata is verified like data: every kind of manifest and sidecar edit is refused by the loader
before it is used (by the digests of format 3, and by the cross-checks when the digests are made
to agree again), and ``verify`` reports it; older formats still load."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from convert_helpers import reseal, unpack
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.verify import verify_dataset
from lerobot_shards.format import MANIFEST_NAME, MAX_MANIFEST_BYTES, SHARDS_DIR, FormatError
from lerobot_shards.format import SIDECAR_PACK_NAME as PACK_NAME
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.read.sources import ShardSource

CAMS = ("observation.images.front", "observation.images.top")
SIDE0 = "shard-000000.idx.json"


@pytest.fixture(scope="module")
def converted(tmp_path_factory, synth_factory) -> tuple[Path, Path]:
    raw = synth_factory(num_episodes=3, length_range=(6, 8), cameras=CAMS)
    out = tmp_path_factory.mktemp("metadata") / "out"
    convert_dataset(raw, out, ConvertOptions(episodes_per_shard=2), progress=False)
    return raw, out


def _read_all(out: Path, **kwargs) -> list[tuple[int, int]]:
    ds = EpisodePoolDataset(str(out), shuffle=False, episode_pool_size=1, **kwargs)
    return [(int(s["episode_index"]), int(s["frame_index"])) for s in ds]


def _edit(converted: tuple[Path, Path], tmp_path: Path, manifest_edit=None, sidecar_edit=None) -> Path:
    out = tmp_path / "out"
    shutil.copytree(converted[1], out)
    if manifest_edit is not None:
        m = json.loads((out / MANIFEST_NAME).read_text())
        manifest_edit(m)
        (out / MANIFEST_NAME).write_text(json.dumps(m, indent=1))
    if sidecar_edit is not None:
        path = out / SHARDS_DIR / SIDE0
        side = json.loads(path.read_text())
        sidecar_edit(side)
        path.write_text(json.dumps(side, separators=(",", ":")))
    return out


def _pts(side: dict[str, Any]) -> None:
    frames = side["episodes"][0]["clips"][CAMS[0]]["frames"]
    frames["pts"][2], frames["pts"][3] = frames["pts"][3], frames["pts"][2]  # neighbours swapped


def _pts_shift(side: dict[str, Any]) -> None:
    side["episodes"][0]["clips"][CAMS[0]]["frames"]["pts"][2] += 1  # still increasing


def _swap_cameras(side: dict[str, Any]) -> None:
    members = side["episodes"][0]["members"]
    a, b = (m for m in members if m["name"].endswith(".mp4"))
    a["name"], b["name"] = b["name"], a["name"]


def _lengths_lowered(m: dict[str, Any]) -> None:
    m["shards"][0]["episode_lengths"][0] -= 2
    m["shards"][0]["frames"] -= 2
    m["totals"]["frames"] -= 2


def _duplicated_shard(m: dict[str, Any]) -> None:
    m["shards"].append(dict(m["shards"][0]))


def _renamed_task(m: dict[str, Any]) -> None:
    m["tasks"][0] = "some other task"


def _dropped_feature(m: dict[str, Any]) -> None:
    del m["features"]["observation.state"]


def _dropped_camera(m: dict[str, Any]) -> None:
    m["cameras"] = m["cameras"][:1]
    del m["features"][CAMS[1]]


def _fps(m: dict[str, Any]) -> None:
    m["fps"] = m["fps"] * 2


def _huge_length(m: dict[str, Any]) -> None:
    m["shards"][0]["episode_lengths"][0] = 10**9
    m["shards"][0]["frames"] = sum(m["shards"][0]["episode_lengths"])


# Each edit, unsealed: the digest refuses it; resealed: the cross-check named here refuses it.
MANIFEST_EDITS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "episode_lengths lowered": (_lengths_lowered, r"episode lengths \[\d+, \d+\], the manifest's episode_lengths"),
    "shard listed twice": (_duplicated_shard, "two records share one index"),
    "task renamed": (_renamed_task, "tasks .* that the manifest's tasks do not list"),
    "feature dropped": (_dropped_feature, r"differ from source_info\.features"),
    "camera dropped": (_dropped_camera, r"differ from source_info\.features"),
    "fps changed": (_fps, "source_info.fps"),
    "episode_lengths 10^9": (_huge_length, r"episode_lengths\[0\] = 1000000000 is out of range"),
}


@pytest.mark.parametrize("kind", sorted(MANIFEST_EDITS))
def test_manifest_edit_is_refused(kind: str, converted: tuple[Path, Path], tmp_path: Path) -> None:
    edit, resealed_error = MANIFEST_EDITS[kind]
    out = _edit(converted, tmp_path, manifest_edit=edit)
    with pytest.raises(FormatError, match="manifest.json: content does not match its manifest_sha256"):
        _read_all(out)
    assert not verify_dataset(out).ok
    reseal(out)  # digests agree again: the cross-checks must still refuse it, before any frame is returned
    with pytest.raises(FormatError, match=resealed_error):
        _read_all(out)
    report = verify_dataset(out, converted[0])
    assert not report.ok and any("does not match" not in p for p in report.problems), (
        report.problems
    )  # found by what it contradicts, not only by a digest


@pytest.mark.parametrize(
    "edit,resealed_error",
    [
        (_pts, "pts is not strictly increasing"),
        (_pts_shift, None),  # consistent: found by the digest only in the loader, by verify's demux
        (_swap_cameras, None),
    ],
    ids=["pts swapped", "pts shifted", "camera members swapped"],
)
@pytest.mark.parametrize("packed", [True, False], ids=["pack", "sidecar files"])
def test_sidecar_edit_is_refused(
    edit, resealed_error, packed: bool, converted: tuple[Path, Path], tmp_path: Path
) -> None:
    """An edited sidecar file is refused by its digest where the loader reads the files (a conversion
    without the pack); with the pack, the loader reads the sidecar's slice of it, which the edit left
    as it was, and loads the clean frames, while ``verify`` finds the file. An edit carried into the
    pack with every digest made to agree (``reseal``) is left to the cross-checks either way."""
    out = _edit(converted, tmp_path)
    if not packed:
        unpack(out)
    clean = _read_all(out)
    path = out / SHARDS_DIR / SIDE0
    side = json.loads(path.read_text())
    edit(side)
    path.write_text(json.dumps(side, separators=(",", ":")))
    if packed:
        assert _read_all(out) == clean
    else:
        with pytest.raises(FormatError, match=rf"{SIDE0}: does not match the sha256 the manifest records for it"):
            _read_all(out)
    assert not verify_dataset(out).ok
    reseal(out)
    if resealed_error is not None:
        with pytest.raises(FormatError, match=resealed_error):
            _read_all(out)
    report = verify_dataset(out)
    assert not report.ok, "verify reads the tar and the clips: it finds what the sidecar misstates"


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0, -30, "30", True])
def test_fps_that_is_no_frame_rate_names_the_field(value, converted: tuple[Path, Path], tmp_path: Path) -> None:
    out = _edit(converted, tmp_path, manifest_edit=lambda m: m.update(fps=value))
    reseal(out)
    with pytest.raises(FormatError, match=r"manifest\.json: fps = .* (not a finite number|not a frame rate)"):
        ShardSource(str(out))


def test_float_and_bool_sizes_are_refused_not_truncated(converted: tuple[Path, Path], tmp_path: Path) -> None:
    out = _edit(converted, tmp_path, manifest_edit=lambda m: m["shards"][0].update(frames=4.9))
    reseal(out)
    with pytest.raises(FormatError, match=r"shards\[0\]\.frames = 4\.9 is not an integer"):
        ShardSource(str(out))


def test_manifest_that_is_not_a_regular_file_is_refused(converted: tuple[Path, Path], tmp_path: Path) -> None:
    out = _edit(converted, tmp_path)
    (out / MANIFEST_NAME).unlink()
    os.mkfifo(out / MANIFEST_NAME)  # a read would block forever
    with pytest.raises(FormatError, match="manifest.json: not a regular file"):
        ShardSource(str(out))


def test_oversized_manifest_is_refused_unread(converted: tuple[Path, Path], tmp_path: Path) -> None:
    out = _edit(converted, tmp_path)
    with open(out / MANIFEST_NAME, "r+b") as f:
        f.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: nothing is written, nothing must be read
    with pytest.raises(FormatError, match="more than the .* a metadata file may have"):
        ShardSource(str(out))


@pytest.mark.parametrize("rel", [PACK_NAME, f"{SHARDS_DIR}/{SIDE0}"])
def test_sidecar_symlinked_out_of_the_dataset_is_refused(
    rel: str, converted: tuple[Path, Path], tmp_path: Path
) -> None:
    """The pack, or a sidecar file where the loader reads the files, symlinked out of the dataset."""
    out = _edit(converted, tmp_path)
    if rel != PACK_NAME:
        unpack(out)
    outside = tmp_path / "elsewhere.json"
    shutil.move(out / rel, outside)
    os.symlink(outside, out / rel)
    with pytest.raises(FormatError, match=rf"{re.escape(rel)}: is a symlink to .*, outside the dataset"):
        _read_all(out)


def test_an_edited_sidecar_pack_is_refused_naming_it(converted: tuple[Path, Path], tmp_path: Path) -> None:
    """One byte of the pack changed (its digests not made to agree): refused before any sidecar in it
    is used, in one line naming the pack; ``verify`` reports it too. Removing the pack's record from
    the manifest breaks the manifest's own digest."""
    out = _edit(converted, tmp_path)
    data = bytearray((out / PACK_NAME).read_bytes())
    data[len(data) // 2] ^= 1
    (out / PACK_NAME).write_bytes(bytes(data))
    with pytest.raises(FormatError, match=rf"{PACK_NAME}: does not match the size and sha256 the manifest records"):
        _read_all(out)
    assert any(PACK_NAME in p for p in verify_dataset(out).problems)
    out = _edit(converted, tmp_path / "dropped", manifest_edit=lambda m: m.pop("sidecar_pack"))
    with pytest.raises(FormatError, match=r"manifest\.json: content does not match its manifest_sha256"):
        _read_all(out)


def test_a_missing_sidecar_pack_falls_back_to_the_sidecar_files(
    converted: tuple[Path, Path], tmp_path: Path, caplog
) -> None:
    """A pack the manifest names but the dataset lacks (an older version's upload did not send it):
    the loader says so once and reads the sidecar files, the same samples."""
    clean = _read_all(converted[1])
    out = _edit(converted, tmp_path)
    (out / PACK_NAME).unlink()
    with caplog.at_level("WARNING", logger="lerobot_shards"):
        assert _read_all(out) == clean
    assert sum(f"{PACK_NAME}: missing" in r.getMessage() for r in caplog.records) == 1


def test_shard_symlinked_out_of_the_dataset_is_refused(converted: tuple[Path, Path], tmp_path: Path) -> None:
    out = _edit(converted, tmp_path)
    tar = out / SHARDS_DIR / "shard-000000.tar"
    shutil.move(tar, tmp_path / "elsewhere.tar")
    os.symlink(tmp_path / "elsewhere.tar", tar)
    with pytest.raises(FormatError, match=r"shard-000000\.tar: is a symlink to .*, outside the dataset"):
        _read_all(out)


def test_format_2_still_loads_with_the_cross_checks(converted: tuple[Path, Path], tmp_path: Path) -> None:
    """Format 2 (no metadata digests) is read when asked for; a consistent edit can pass there, an
    inconsistent one cannot."""
    out = _edit(converted, tmp_path)
    _to_format_2(out)
    want = _read_all(converted[1])
    assert _read_all(out, legacy_format=True) == want and verify_dataset(out, legacy_format=True).ok
    m = json.loads((out / MANIFEST_NAME).read_text())
    _lengths_lowered(m)
    (out / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(FormatError, match="the manifest's episode_lengths"):
        _read_all(out, legacy_format=True)


def _to_format_2(out: Path) -> None:
    m = json.loads((out / MANIFEST_NAME).read_text())
    m["format_version"] = 2
    del m["manifest_sha256"]
    for record in m["shards"]:
        del record["sidecar_sha256"], record["sidecar_bytes"]
    (out / MANIFEST_NAME).write_text(json.dumps(m, indent=1))
    for path in (out / SHARDS_DIR).glob("*.idx.json"):
        side = json.loads(path.read_text())
        side["format_version"] = 2
        path.write_text(json.dumps(side, separators=(",", ":")))


def test_a_pack_over_the_bound_is_not_read(converted: tuple[Path, Path], tmp_path: Path, monkeypatch, caplog) -> None:
    """A pack larger than ``PACK_WHOLE_BYTES`` is never fetched (a rank would hold sidecars its shards
    do not use): the sidecar files are read, the same samples; here the pack is gone and nobody asks."""
    from lerobot_shards.loader.read import sources

    clean = _read_all(converted[1])
    out = _edit(converted, tmp_path)
    (out / PACK_NAME).unlink()
    monkeypatch.setattr(sources, "PACK_WHOLE_BYTES", 1)
    with caplog.at_level("WARNING", logger="lerobot_shards"):
        assert _read_all(out) == clean
    assert not [r for r in caplog.records if PACK_NAME in r.getMessage()]


def test_a_directory_whose_name_ends_in_manifest_json_is_a_dataset(
    converted: tuple[Path, Path], tmp_path: Path
) -> None:
    """Only a path whose last part is ``manifest.json`` names a dataset's manifest: a directory named
    ``so101_manifest.json`` was cut to ``so101_`` ("neither a converted dataset nor ..."), and a
    mixture file ``mix_manifest.json`` was taken for a dataset."""
    from lerobot_shards.loader.mix.spec import is_mixture_file

    out = tmp_path / "so101_manifest.json"
    shutil.copytree(converted[1], out)
    assert _read_all(out) == _read_all(converted[1]) and _read_all(out / MANIFEST_NAME) == _read_all(out)
    assert is_mixture_file(tmp_path / "mix_manifest.json") and not is_mixture_file(out / MANIFEST_NAME)
