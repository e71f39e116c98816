"""``EpisodePoolDataset.meta`` and the seeds' compatibility points: LeRobot-shaped metadata, stats
aggregated from episode stats as LeRobot aggregates them, ``buffer_size``, long windows.

(Equality with real LeRobot's ``LeRobotDatasetMetadata`` is tested in tests/lerobot/.)
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from convert_helpers import reseal, unpack
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.format import SHARDS_DIR, FormatError, Manifest
from lerobot_shards.lerobot_v3 import LeRobotV3Source
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.meta import aggregate_stats, episode_stats_rows
from lerobot_shards.loader.mix.dataset import Mixture, MixtureDataset, MixtureSource
from lerobot_shards.synth import read_identity
from waits import HANG_GUARD_S

CAMS = ("observation.images.front", "observation.images.top")


def _close(ours: dict, theirs: dict) -> None:
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert sorted(ours[key]) == sorted(theirs[key]), key
        for name, want in theirs[key].items():
            got = ours[key][name]
            assert got.shape == want.shape, (key, name)
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=f"{key}/{name}")


def test_meta_of_the_real_fixture_matches_its_info_and_stats(fixture_root: Path) -> None:
    ds = EpisodePoolDataset(str(fixture_root))
    meta = ds.meta
    info = json.loads((fixture_root / "meta/info.json").read_text())
    assert meta.features == {k: {**ft, "shape": tuple(ft["shape"])} for k, ft in info["features"].items()}
    assert meta.fps == 30 and isinstance(meta.fps, int)
    assert meta.robot_type == info["robot_type"]
    assert meta.camera_keys == meta.video_keys == list(CAMS) and meta.image_keys == []
    assert (meta.total_episodes, meta.total_frames) == (info["total_episodes"], info["total_frames"])
    assert (ds.num_episodes, ds.num_frames) == (info["total_episodes"], info["total_frames"])
    assert meta.tasks == ds.tasks and not meta.has_language_columns
    assert meta.stats_source == "episodes"
    # LeRobot wrote meta/stats.json by aggregating the same episode stats: equal within float32 rounding
    on_disk = {k: {n: np.atleast_1d(np.array(v)) for n, v in ft.items()} for k, ft in ds.feature_stats.items()}
    _close(meta.stats, on_disk)
    assert meta.stats["action"]["count"].tolist() == [info["total_frames"]]


def test_meta_of_a_subset_aggregates_only_its_episodes(fixture_root: Path) -> None:
    ds = EpisodePoolDataset(str(fixture_root), episodes=[1, 3], cameras=[CAMS[0]])
    src = LeRobotV3Source(str(fixture_root))
    per_episode = episode_stats_rows(src.episode_stats.to_pylist())
    assert ds.meta.episodes == (1, 3)
    want = aggregate_stats([per_episode[1], per_episode[3]])
    _close(ds.meta.stats, {k: v for k, v in want.items() if k != CAMS[1]})
    frames = src.episode(1).length + src.episode(3).length
    assert ds.num_frames == frames == int(ds.meta.stats["action"]["count"][0]) and ds.num_episodes == 2
    assert CAMS[1] not in ds.meta.features and ds.meta.camera_keys == [CAMS[0]]
    assert not np.allclose(
        ds.meta.stats["action"]["mean"], EpisodePoolDataset(str(fixture_root)).meta.stats["action"]["mean"]
    )


def test_meta_of_resized_shards_has_the_stored_shape(small_synth: Path, tmp_path: Path) -> None:
    out = tmp_path / "shards"
    convert_dataset(small_synth, out, ConvertOptions(resize={"*": (32, 48)}), progress=False)
    ds = EpisodePoolDataset(str(out))
    for cam in CAMS:
        assert ds.meta.features[cam]["shape"] == (32, 48, 3)
    assert ds.meta.stats_source == "stats.json"  # the whole dataset: the source's meta/stats.json


@pytest.fixture(scope="module")
def converted_fixture(fixture_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("meta") / "shards"
    convert_dataset(fixture_root, out, ConvertOptions(episodes_per_shard=2), progress=False)
    return out


def test_subset_stats_of_converted_shards_are_the_raw_sources(fixture_root: Path, converted_fixture: Path) -> None:
    """The sidecars keep each episode's stats: a subset spanning shards aggregates exactly what the raw source does."""
    for chosen in ([1, 3], [2]):
        ours = EpisodePoolDataset(str(converted_fixture), episodes=chosen, cameras=[CAMS[1]]).meta
        raw = EpisodePoolDataset(str(fixture_root), episodes=chosen, cameras=[CAMS[1]]).meta
        assert ours.stats_source == raw.stats_source == "episodes" and ours.episodes == tuple(chosen)
        assert sorted(ours.stats) == sorted(raw.stats) and CAMS[0] not in ours.stats
        for key, stats in raw.stats.items():
            assert sorted(ours.stats[key]) == sorted(stats), key
            for name, want in stats.items():
                got = ours.stats[key][name]
                assert got.dtype == want.dtype and got.shape == want.shape, (key, name)
                np.testing.assert_array_equal(got, want, err_msg=f"{key}/{name}")
        assert (
            int(ours.stats["action"]["count"][0]) == EpisodePoolDataset(str(fixture_root), episodes=chosen).num_frames
        )


@pytest.mark.parametrize("packed", [True, False], ids=["pack", "sidecar files"])
def test_subset_stats_from_a_bucket(packed: bool, converted_fixture: Path, s3_server, tmp_path: Path) -> None:
    """From a bucket the sidecars holding the chosen episodes are read (and checked) for ``meta``: from
    the sidecar pack, one GET; without it (an earlier conversion), the sidecar files of those shards."""
    bucket = f"meta-stats-{'pack' if packed else 'files'}"
    local = Path(shutil.copytree(converted_fixture, tmp_path / converted_fixture.name))
    if not packed:
        unpack(local)
    fs = s3_server.filesystem()
    fs.mkdir(bucket)
    fs.put(str(local), f"{bucket}/", recursive=True)
    url = f"s3://{bucket}/{local.name}"
    remote = EpisodePoolDataset(url, episodes=[3], storage_options=s3_server.storage_options).meta
    assert remote.stats_source == "episodes"
    _close(remote.stats, EpisodePoolDataset(str(converted_fixture), episodes=[3]).meta.stats)
    shards = f"{bucket}/{local.name}/shards"
    assert s3_server.requests("GET", f"{bucket}/{local.name}/sidecars.pack") == (1 if packed else 0)
    assert s3_server.requests("GET", f"{shards}/shard-000001.idx.json") == (0 if packed else 1)
    assert s3_server.requests("GET", f"{shards}/shard-000000.idx.json") == 0  # holds no chosen episode


def test_subset_stats_from_a_bucket_fetch_their_sidecars_together(
    converted_fixture: Path, s3_server, monkeypatch, tmp_path: Path
) -> None:
    """Sidecar file reads for a subset's stats (a conversion without the pack) overlap (every shard's
    in flight at once): each read waits at a barrier for another, which a one-at-a-time loop never reaches."""
    from lerobot_shards.loader.read.sources import ShardSource

    files = Path(shutil.copytree(converted_fixture, tmp_path / converted_fixture.name))
    unpack(files)
    fs = s3_server.filesystem()
    fs.mkdir("meta-stats-parallel")
    fs.put(str(files), "meta-stats-parallel/", recursive=True)
    url = f"s3://meta-stats-parallel/{converted_fixture.name}"
    manifest = Manifest.from_json((converted_fixture / "manifest.json").read_text())
    chosen = [rec.episodes[0] for rec in manifest.shards[:2]]  # in two shards
    local = EpisodePoolDataset(str(converted_fixture), episodes=chosen).meta
    meet = threading.Barrier(2, timeout=HANG_GUARD_S)
    read = ShardSource._read_sidecar

    def together(self, shard):
        meet.wait()  # BrokenBarrierError after 30 s alone
        return read(self, shard)

    monkeypatch.setattr(ShardSource, "_read_sidecar", together)
    remote = EpisodePoolDataset(url, episodes=chosen, storage_options=s3_server.storage_options).meta
    assert remote.stats_source == "episodes"
    _close(remote.stats, local.stats)


def test_reading_meta_leaves_no_thread_behind(fixture_root: Path, converted_fixture: Path, s3_server) -> None:
    """LeRobot's trainer reads ``ds.meta`` in the main process and then forks DataLoader workers: a
    thread, pool or event loop that meta (or the dataset) left running would be orphaned in them.
    Every path that reads files for meta: a raw source's episode table, a converted subset's
    sidecars (local and from a bucket), a mixture of both."""
    fs = s3_server.filesystem()
    fs.mkdir("meta-threads")
    fs.put(str(converted_fixture), "meta-threads/", recursive=True)
    url = f"s3://meta-threads/{converted_fixture.name}"
    before = set(threading.enumerate())  # the bucket client's own loop included
    datasets = [
        EpisodePoolDataset(str(fixture_root), episodes=[1, 3]),
        EpisodePoolDataset(str(converted_fixture), episodes=[1, 3]),
        EpisodePoolDataset(url, episodes=[3], storage_options=s3_server.storage_options),
        EpisodePoolDataset(url, episodes=[0, 3], storage_options=s3_server.storage_options),  # two sidecars
        MixtureDataset(
            Mixture(
                [
                    MixtureSource(str(fixture_root), name="raw", repeat=1),
                    MixtureSource(str(converted_fixture), repeat=1),
                ]
            )
        ),
    ]
    for ds in datasets:  # checked at once after each: no thread left to finish in its own time
        assert ds.meta.stats
        assert set(threading.enumerate()) == before, ds
    assert [ds.meta.stats_source for ds in datasets[:4]] == ["episodes"] * 4


def _edit_sidecars(out: Path, fn) -> None:
    for side in (out / SHARDS_DIR).glob("*.idx.json"):
        d = json.loads(side.read_text())
        for entry in d["episodes"]:
            fn(entry)
        side.write_text(json.dumps(d, separators=(",", ":")))


def test_a_conversion_without_episode_stats_still_loads_and_warns(converted_fixture: Path, tmp_path: Path) -> None:
    """The previous layout (sidecars without stats): a subset falls back to meta/stats.json, with a warning."""
    out = tmp_path / "old"
    shutil.copytree(converted_fixture, out)
    _edit_sidecars(out, lambda entry: entry.pop("stats"))
    reseal(out)
    with pytest.warns(UserWarning, match="no per-episode stats.*re-convert"):
        meta = EpisodePoolDataset(str(out), episodes=[0, 3]).meta
    assert meta.stats_source == "stats.json" and meta.stats["action"]["count"].tolist() == [1492]
    assert next(iter(EpisodePoolDataset(str(out), episodes=[3])))["episode_index"] == 3


@pytest.mark.parametrize("packed", [True, False], ids=["pack", "sidecar files"])
def test_edited_episode_stats_are_refused(packed: bool, converted_fixture: Path, tmp_path: Path) -> None:
    """An edited sidecar file: refused by its digest where the files are read (no pack); with the pack
    the loader reads its untouched slice. Carried into the pack with the digests made to agree: the
    sidecar's own check names the field, either way."""
    out = tmp_path / "edited"
    shutil.copytree(converted_fixture, out)
    if not packed:
        unpack(out)
    _edit_sidecars(out, lambda entry: entry["stats"]["action"].update(mean=[0.0] * 6))
    if not packed:
        with pytest.raises(FormatError, match=r"shard-000000.idx.json: does not match the sha256"):
            EpisodePoolDataset(str(out), episodes=[0]).meta  # noqa: B018
    _edit_sidecars(out, lambda entry: entry["stats"]["action"].update(std=[0.0] * 5))
    reseal(out)  # consistent digests, inconsistent stats: the sidecar's own check names the field
    with pytest.raises(FormatError, match=r"episodes\[0\]\.stats\['action'\]: its stats have different shapes"):
        EpisodePoolDataset(str(out), episodes=[0]).meta  # noqa: B018


def test_buffer_size_is_accepted_ignored_and_deprecated(small_synth: Path) -> None:
    with pytest.warns(DeprecationWarning, match="episode_pool_size"):
        ds = EpisodePoolDataset(str(small_synth), buffer_size=1000, episode_pool_size=2)
    assert ds.episode_pool_size == 2


def test_a_160_step_window_reaches_real_frames(synth_factory) -> None:
    """Reward models look 160 steps back: every slot inside the episode holds its own frame."""
    root = synth_factory(num_episodes=2, cameras=(CAMS[0],), length_range=(170, 190), height=32, width=160)
    offsets = list(range(-159, 1))
    ds = EpisodePoolDataset(
        str(root), delta_timestamps={CAMS[0]: [i / 30 for i in offsets]}, seed=1, episode_pool_size=2
    )
    reached = 0
    for n, sample in enumerate(ds):
        frame, ep = int(sample["frame_index"]), int(sample["episode_index"])
        wanted = np.array(offsets) + frame
        assert sample[f"{CAMS[0]}_is_pad"].tolist() == (wanted < 0).tolist()
        assert [read_identity(f) for f in sample[CAMS[0]]] == [(ep, int(x)) for x in np.clip(wanted, 0, None)]
        reached += frame >= 159
        if reached >= 2 or n >= 40:
            break
    assert reached >= 2  # windows lying wholly inside the episode: 160 real frames each
