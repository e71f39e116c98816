"""Training-resolution shards (``convert --resize``) and the loader's decode-time resize.

Identity-painted frames are read back through every transform; resized clips are compared with
their source frames resized the same way; re-runs, resumes and the loader behave as at full size.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from convert_helpers import assert_frame_identity, load, member_bytes, output_files, run_cli
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.verify import verify_dataset
from lerobot_shards.format import MANIFEST_NAME, SHARDS_DIR, ClipInfo, FormatError, FrameTransform, Manifest
from lerobot_shards.lerobot_v3 import LeRobotV3Source
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.decoding.transforms import transform_rgb
from lerobot_shards.resize import parse_resize, parse_size, plan_transform, resized_features
from lerobot_shards.synth import paint_identity, read_identity
from lerobot_shards.video import decode_frames, encode_video, reencode_clip, transform_frame

FRONT, TOP = "observation.images.front", "observation.images.top"
MODES = ("pad", "crop", "stretch")
SIZE = (224, 224)


def _options(**kwargs) -> ConvertOptions:
    return ConvertOptions(episodes_per_shard=1, **kwargs)


@pytest.fixture(scope="module")
def portrait(synth_factory) -> Path:
    """Taller than wide: a centre crop cuts rows (the tint and band tops), never identity bands."""
    return synth_factory(num_episodes=3, height=120, width=96, length_range=(22, 26), seed=5)


@pytest.fixture(scope="module")
def resized(portrait: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The portrait dataset converted at 224x224 in each mode, one episode per shard."""
    base = tmp_path_factory.mktemp("resized")
    out = {}
    for mode in MODES:
        out[mode] = base / mode
        convert_dataset(portrait, out[mode], _options(resize={"*": SIZE}, resize_mode=mode), progress=False)
    return out


# -- geometry -----------------------------------------------------------------------------------


def test_geometry_of_the_three_modes() -> None:
    pad = plan_transform((480, 640), SIZE, "pad")
    assert (pad.crop, pad.scaled, pad.pad, pad.size) == ((0, 0, 480, 640), (168, 224), (28, 0), SIZE)
    crop = plan_transform((480, 640), SIZE, "crop")
    assert (crop.crop, crop.scaled, crop.pad) == ((0, 80, 480, 480), SIZE, (0, 0))
    stretch = plan_transform((480, 640), (96, 128), "stretch")
    assert (stretch.crop, stretch.scaled, stretch.pad) == ((0, 0, 480, 640), (96, 128), (0, 0))
    tall = plan_transform((640, 480), SIZE, "crop")
    assert tall.crop == (80, 0, 480, 480)
    assert plan_transform((224, 224), SIZE, "pad") is None  # nothing to do
    for t in (pad, crop, stretch, tall, plan_transform((481, 639), (84, 84), "crop")):
        assert all(v % 2 == 0 for v in (*t.crop, *t.scaled, *t.pad, *t.size)), t  # 4:2:0-exact
    assert FrameTransform.from_dict(json.loads(json.dumps(pad.to_dict()))) == pad


def test_resized_features_place_the_size_where_the_shape_holds_it() -> None:
    """Named axes, LeRobot's (height, width, channels), and an unnamed channels-first shape."""
    features = {
        "named": {"dtype": "video", "shape": [3, 480, 640], "names": ["channels", "height", "width"]},
        "lerobot": {"dtype": "video", "shape": [480, 640, 3], "names": ["height", "width", "channels"]},
        "bare_first": {"dtype": "video", "shape": [3, 480, 640]},
        "bare_last": {"dtype": "video", "shape": [480, 640, 3]},
    }
    out = resized_features(features, {name: (224, 256) for name in features})
    shapes = {name: out[name]["shape"] for name in features}
    assert shapes == {
        "named": [3, 224, 256],
        "lerobot": [224, 256, 3],
        "bare_first": [3, 224, 256],
        "bare_last": [224, 256, 3],
    }
    assert features["bare_first"]["shape"] == [3, 480, 640]  # the input is left as it was


def test_size_parsing_and_clear_errors() -> None:
    assert parse_size("320x240") == (240, 320)  # WIDTHxHEIGHT, as FFmpeg and inspect write it
    assert parse_resize(["224x224", f"{TOP}=96x96"]) == {"*": (224, 224), TOP: (96, 96)}
    for bad, message in [("224", "WIDTHxHEIGHT"), ("223x224", "even"), ("0x0", "even")]:
        with pytest.raises(ValueError, match=message):
            parse_size(bad)
    with pytest.raises(ValueError, match="twice"):
        parse_resize(["224x224", "96x96"])
    with pytest.raises(ValueError, match=r"resize size \(2\.5, 4\)"):  # the Python API: refused, not truncated to 2
        ConvertOptions(resize={"*": (2.5, 4)})
    with pytest.raises(ValueError, match="not one of"):
        plan_transform((480, 640), SIZE, "squash")
    pad = plan_transform((480, 640), SIZE, "pad").to_dict()
    with pytest.raises(FormatError, match="mode"):
        FrameTransform.from_dict({**pad, "mode": "squash"})
    for field, value in [("crop", [0, 0, 481, 640]), ("pad", [60, 0]), ("scaled", [0, 224]), ("size", [224])]:
        with pytest.raises(FormatError):
            FrameTransform.from_dict({**pad, field: value})


def test_full_size_records_stay_as_they_were() -> None:
    """No transform, no new key: sidecars and manifests of other conversions keep their bytes."""
    info = reencode_clip(_clip_bytes(), 0, 4, codec="h264", gop=2, crf=20, threads=1)[1]
    assert "transform" not in info.to_dict() and ClipInfo.from_dict(info.to_dict()).transform is None
    other = plan_transform((480, 640), SIZE, "pad").to_dict()
    with pytest.raises(FormatError, match="transform stores"):  # 160x64 clip claiming 224x224 frames
        ClipInfo.from_dict({**info.to_dict(), "transform": other})


def _clip_bytes(height: int = 64, width: int = 160, length: int = 8) -> bytes:
    import io

    buf = io.BytesIO()
    encode_video((paint_identity(2, i, height, width) for i in range(length)), buf, fps=30, threads=1)
    return buf.getvalue()


def test_pad_letterboxes_and_crop_cuts_the_sides() -> None:
    """Landscape frames: pad keeps every band between black bars; crop loses the outer bands."""
    import av

    src = _clip_bytes()
    pad = plan_transform((64, 160), SIZE, "pad")
    with av.open(__import__("io").BytesIO(src)) as c:
        frame = next(c.decode(video=0))
    out = transform_frame(frame, pad).to_ndarray(format="rgb24")
    assert out.shape == (224, 224, 3)
    assert out[: pad.pad[0] - 1].max() <= 2 and out[pad.pad[0] + pad.scaled[0] + 1 :].max() <= 2  # black bars
    data, info = reencode_clip(src, 0, 8, codec="h264", gop=2, crf=18, threads=1, size=SIZE, resize_mode="crop")
    with pytest.raises(ValueError, match="identity band 0 is not in the stored frame"):
        read_identity(decode_frames(data, [0])[0], transform=info.transform)


# -- converter ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_identity_survives_every_frame_and_metadata_records_the_transform(
    resized: dict[str, Path], portrait: Path, mode: str
) -> None:
    out = resized[mode]
    src = LeRobotV3Source(str(portrait))
    assert assert_frame_identity(out, stride=1) == 2 * src.total_frames  # every frame of both cameras
    want = plan_transform((120, 96), SIZE, mode)
    manifest, sidecars = load(out)
    assert manifest.transforms == {FRONT: want, TOP: want}
    assert manifest.video["resize"] == {"*": list(SIZE)} and manifest.video["resize_mode"] == mode
    assert manifest.video["fallback_reencoded_episodes"] == []  # resizing is not a fallback
    for cam in (FRONT, TOP):
        feature = manifest.features[cam]
        assert feature["shape"] == [224, 224, 3] and feature["info"]["video.width"] == 224
        assert manifest.source_info["features"][cam]["shape"] == [120, 96, 3]  # the source's, verbatim
    for sidecar in sidecars.values():
        for entry in sidecar.episodes:
            for clip in entry.clips.values():
                assert (clip.height, clip.width, clip.transform) == (*SIZE, want)
                assert not clip.stream_copied and clip.key_frame_indices() == list(range(0, entry.length, 2))
    report = verify_dataset(out, portrait, 3, progress=False)
    assert report.ok, report.problems
    assert report.frames_compared and report.min_psnr_db >= 30


@pytest.mark.parametrize("mode", MODES)
def test_each_frame_is_closest_to_the_source_frame_it_claims(
    resized: dict[str, Path], portrait: Path, mode: str
) -> None:
    """A resized frame i is nearer the resized source frame i than source frames i-10 and i+10."""
    out = resized[mode]
    src = LeRobotV3Source(str(portrait))
    manifest, sidecars = load(out)
    compared = 0
    for record in manifest.shards:
        sidecar = sidecars[record.name]
        for entry in sidecar.episodes:
            for cam, clip in entry.clips.items():
                got = decode_frames(
                    member_bytes(out, record.name, sidecar, f"{entry.key}.{cam}.mp4"), range(entry.length)
                )
                ref = src.episode(entry.episode_index).videos[cam]
                first = ref.first_frame(src.fps)
                source = decode_frames(src.local_path(ref.path), range(first, first + entry.length))
                want = transform_rgb(source, clip.transform).float().flatten(1)
                got = got.float().flatten(1)
                n = entry.length
                same = (got - want).pow(2).mean(1)
                before = torch.full((n,), float("inf"))
                after = torch.full((n,), float("inf"))
                before[10:] = (got[10:] - want[:-10]).pow(2).mean(1)  # frame i against source frame i - 10
                after[:-10] = (got[:-10] - want[10:]).pow(2).mean(1)  # and against i + 10
                worse = (same >= torch.minimum(before, after)).nonzero().flatten().tolist()
                assert not worse, f"episode {entry.episode_index} {cam}: frames {worse} are nearer other frames"
                compared += n
    assert compared == 2 * src.total_frames


def _member_differences(a: Path, b: Path) -> str:
    """Which tar members of two conversions differ, and for a clip by how much its decoded frames do."""
    import io
    import tarfile

    import av
    import numpy as np

    def members(out: Path) -> dict[str, bytes]:
        found = {}
        for path in sorted((out / SHARDS_DIR).glob("*.tar")):
            with tarfile.open(path) as tar:
                for m in tar.getmembers():
                    found[f"{path.name}/{m.name}"] = tar.extractfile(m).read()  # type: ignore[union-attr]
        return found

    def frames(data: bytes) -> list[np.ndarray]:
        with av.open(io.BytesIO(data)) as c:
            return [f.to_ndarray(format="yuv420p").astype(np.int16) for f in c.decode(video=0)]

    left, right = members(a), members(b)
    lines = []
    for name in sorted(set(left) | set(right)):
        x, y = left.get(name), right.get(name)
        if x == y:
            continue
        if x is not None and y is not None and name.endswith(".mp4"):
            worst = [int(np.abs(p - q).max()) for p, q in zip(frames(x), frames(y))]
            lines.append(f"{name}: {len(x)} vs {len(y)} bytes, max |YUV difference| per frame {worst}")
        else:
            lines.append(f"{name}: differs")
    return "; ".join(lines) or "only files outside the tars differ"


def test_cli_per_camera_sizes_inspect_and_identical_rerun(portrait: Path, tmp_path: Path) -> None:
    args = ["--resize", "128x128", "--resize", f"{TOP}=96x64", "--resize-mode", "crop", "--episodes-per-shard", "1"]
    result = run_cli("convert", portrait, tmp_path / "a", *args, "--workers", "2", "--no-progress")
    assert result.returncode == 0, result.stderr
    manifest, sidecars = load(tmp_path / "a")
    assert manifest.features[FRONT]["shape"] == [128, 128, 3] and manifest.features[TOP]["shape"] == [64, 96, 3]
    assert manifest.transforms[TOP] == plan_transform((120, 96), (64, 96), "crop")
    assert_frame_identity(tmp_path / "a")

    # Same bytes from one process as from two, on a re-run in another folder.
    options = _options(resize=parse_resize(["128x128", f"{TOP}=96x64"]), resize_mode="crop")
    convert_dataset(portrait, tmp_path / "b", options, progress=False)
    a, b = output_files(tmp_path / "a"), output_files(tmp_path / "b")
    assert a == b, _member_differences(tmp_path / "a", tmp_path / "b")  # rare: unexplained (notes, 2026-12-05)

    shown = run_cli("inspect", tmp_path / "a")
    assert shown.returncode == 0, shown.stderr
    assert f"resized (crop, re-encoded h264): all 128x128, {TOP} 96x64" in shown.stdout
    assert any(
        line.split()[:3] == [TOP, "h264", "96x64"] and "96x120 crop" in line for line in shown.stdout.splitlines()
    )

    result = run_cli("convert", portrait, tmp_path / "bad", "--resize", "observation.images.side=96x96")
    assert result.returncode != 0 and "unknown cameras" in result.stderr and "Traceback" not in result.stderr


def test_resume_rebuilds_only_what_is_missing(portrait: Path, resized: dict[str, Path], tmp_path: Path) -> None:
    """A resized conversion resumes like any other, to the same bytes as an uninterrupted run."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(resized["pad"], out)
    reference = output_files(out)
    shards = out / SHARDS_DIR
    kept = (shards / "shard-000000.tar").stat().st_ino
    (shards / "shard-000001.idx.json").unlink()
    (out / MANIFEST_NAME).unlink()
    convert_dataset(portrait, out, _options(resize={"*": SIZE}, resize_mode="pad"), progress=False)
    assert output_files(out) == reference
    assert (shards / "shard-000000.tar").stat().st_ino == kept
    # Other resize settings are another conversion: refused, not mixed in.
    with pytest.raises(Exception, match="other settings"):
        convert_dataset(portrait, out, _options(resize={"*": SIZE}, resize_mode="crop"), progress=False)


# -- loader -------------------------------------------------------------------------------------


def _identity_pairs(batch: dict) -> list[tuple[int, int]]:
    return list(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist()))


def test_loader_reads_resized_shards_without_options(resized: dict[str, Path]) -> None:
    """Same keys, windows, padding and exactly-once coverage; frames at the stored size; resume exact."""
    out = resized["crop"]
    manifest = Manifest.from_json((out / MANIFEST_NAME).read_text())
    deltas = {FRONT: [-0.1, 0.0, 0.1], "action": [0.0, 1 / 30]}
    ds = EpisodePoolDataset(str(out), delta_timestamps=deltas, episode_pool_size=2, image_dtype=torch.uint8, seed=1)
    assert ds.features[FRONT]["shape"] == [224, 224, 3]
    lengths = {e: n for s in manifest.shards for e, n in zip(s.episodes, s.episode_lengths)}
    batches = list(DataLoader(ds, batch_size=4, num_workers=2))
    seen = collections.Counter(sum((_identity_pairs(b) for b in batches), []))
    assert seen == collections.Counter((e, f) for e, n in lengths.items() for f in range(n))
    for batch in batches:
        assert batch[FRONT].shape[1:] == (3, 3, 224, 224) and batch[TOP].shape[1:] == (3, 224, 224)
        for k, (e, f) in enumerate(_identity_pairs(batch)):
            want = [min(max(f + d, 0), lengths[e] - 1) for d in (-3, 0, 3)]
            got = [read_identity(img, transform=manifest.transforms[FRONT]) for img in batch[FRONT][k]]
            assert got == [(e, w) for w in want]
            assert batch[f"{FRONT}_is_pad"][k].tolist() == [f - 3 < 0, False, f + 3 >= lengths[e]]
            assert read_identity(batch[TOP][k], transform=manifest.transforms[TOP]) == (e, f)

    cut = len(batches) // 2
    again = EpisodePoolDataset(str(out), delta_timestamps=deltas, episode_pool_size=2, image_dtype=torch.uint8, seed=1)
    again.load_state_dict(ds.state_dict(batches_consumed=cut, batch_size=4))
    rest = list(DataLoader(again, batch_size=4, num_workers=2))
    assert len(rest) == len(batches) - cut
    for a, b in zip(batches[cut:], rest):
        assert _identity_pairs(a) == _identity_pairs(b) and torch.equal(a[FRONT], b[FRONT])


@pytest.mark.parametrize("mode", MODES)
def test_decode_time_resize_of_a_raw_dataset(portrait: Path, mode: str) -> None:
    size = (100, 120)
    ds = EpisodePoolDataset(
        str(portrait),
        delta_timestamps={FRONT: [-0.1, 0.0]},
        episode_pool_size=2,
        image_dtype=torch.uint8,
        resize=size,
        resize_mode=mode,
        cameras=[FRONT],
    )
    assert ds.features[FRONT]["shape"] == [100, 120, 3]
    t = plan_transform((120, 96), size, mode)
    n = 0
    for sample in ds:
        e, f = int(sample["episode_index"]), int(sample["frame_index"])
        assert sample[FRONT].shape == (2, 3, *size)
        assert read_identity(sample[FRONT][1], transform=t) == (e, f)
        n += 1
    assert n == LeRobotV3Source(str(portrait)).total_frames


def test_decode_time_resize_per_camera_and_errors(portrait: Path) -> None:
    ds = EpisodePoolDataset(str(portrait), episode_pool_size=1, resize={TOP: (64, 48)}, resize_mode="stretch")
    sample = next(iter(ds))
    assert sample[TOP].shape == (3, 64, 48) and sample[FRONT].shape == (3, 120, 96)
    assert sample[TOP].dtype == torch.float32 and 0 <= float(sample[TOP].min()) <= float(sample[TOP].max()) <= 1
    with pytest.raises(ValueError, match="unknown cameras"):
        EpisodePoolDataset(str(portrait), resize={"observation.images.side": (64, 64)})
    with pytest.raises(ValueError, match="even"):
        EpisodePoolDataset(str(portrait), resize=(63, 64))
    with pytest.raises(ValueError, match="not one of"):
        EpisodePoolDataset(str(portrait), resize=(64, 64), resize_mode="squash")


def test_transform_rgb_matches_the_converter_closely() -> None:
    """The loader's RGB resize and the converter's YUV area scale agree to within codec-noise levels."""
    src = _clip_bytes(120, 96, 4)
    for mode in MODES:
        data, info = reencode_clip(src, 0, 4, codec="h264", gop=2, crf=10, threads=1, size=(64, 64), resize_mode=mode)
        a = decode_frames(data, range(4)).float()
        b = transform_rgb(decode_frames(src, range(4)), info.transform).float()
        assert a.shape == b.shape and float((a - b).abs().mean()) < 6, mode
    assert np.isfinite(float(a.mean()))


def test_verify_compares_a_downscaled_clip_with_the_source_scaled_as_the_converter_scales(
    synth_factory, tmp_path: Path
) -> None:
    """A lossless (crf 0) downscale of small frames: verify's reference is the converter's own area scale
    in YUV; an RGB bilinear reference put it at 27-28 dB, below the 30 dB threshold."""
    small = synth_factory(num_episodes=2, height=32, width=48, length_range=(8, 10), seed=7)
    out = tmp_path / "out"
    convert_dataset(small, out, _options(resize={"*": (16, 24)}, crf=0), progress=False)
    report = verify_dataset(out, small, 4, progress=False)
    assert report.ok, report.problems
    assert report.frames_compared and report.min_psnr_db >= 40
