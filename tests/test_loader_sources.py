"""The loader over converted shards vs the raw LeRobot source, the real fixture, and a bucket."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.format import Manifest
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.loader.read.sources import ShardSource
from lerobot_shards.synth import FIXTURE_BITS, read_identity, synth_dataset
from waits import HANG_GUARD_S

CAMS = ("observation.images.front", "observation.images.top")


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """A raw dataset with jittered from_timestamps (as real files), and its conversion."""
    base = tmp_path_factory.mktemp("pair")
    raw = synth_dataset(
        base / "raw",
        num_episodes=5,
        cameras=CAMS,
        length_range=(10, 24),
        episodes_per_video_file=3,
        episodes_per_data_file=2,
        from_timestamp_jitter_s=0.004,
        codec="av1",
        seed=8,
    )
    convert_dataset(raw, base / "converted", ConvertOptions(episodes_per_shard=2), progress=False)
    return raw, base / "converted"


def _stream(source: Path | str, num_workers: int = 0, **kwargs) -> list[dict]:
    kwargs.setdefault("episodes_per_shard", 2)
    ds = EpisodePoolDataset(str(source), seed=13, episode_pool_size=2, **kwargs)
    return list(DataLoader(ds, batch_size=4, num_workers=num_workers))


def _assert_same_batches(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], torch.Tensor):
                assert x[key].dtype == y[key].dtype and torch.equal(x[key], y[key]), key
            else:
                assert x[key] == y[key], key


def test_raw_and_converted_sources_give_identical_samples(pair) -> None:
    raw, converted = pair
    window = {CAMS[0]: [-1 / 30, 0.0, 1 / 30], "action": [0.0, 1 / 30]}
    a = _stream(raw, delta_timestamps=window, num_workers=2)
    b = _stream(converted, delta_timestamps=window, num_workers=2)
    _assert_same_batches(a, b)  # stream-copied clips decode to the very same pixels
    for batch in b:
        for i, (ep, frame) in enumerate(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist())):
            assert read_identity(batch[CAMS[1]][i]) == (ep, frame)
            assert read_identity(batch[CAMS[0]][i, 1]) == (ep, frame)


def test_fixture_end_to_end(fixture_root: Path, tmp_path: Path) -> None:
    convert_dataset(fixture_root, tmp_path / "out", ConvertOptions(episodes_per_shard=1), progress=False)
    ds = EpisodePoolDataset(
        str(tmp_path / "out"),
        delta_timestamps={"observation.images.top": [-2 / 30, 0.0, 2 / 30]},
        episode_pool_size=2,
        seed=0,
        image_dtype=torch.uint8,
    )
    frame_bits, episode_bits = FIXTURE_BITS
    lengths = {0: 373, 1: 374, 2: 372, 3: 373}
    seen = 0
    for batch in DataLoader(ds, batch_size=8, num_workers=2):
        for i, (ep, frame) in enumerate(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist())):
            got = read_identity(batch["observation.images.front"][i], frame_bits=frame_bits, episode_bits=episode_bits)
            assert got == (ep, frame)
            window = [min(max(frame + d, 0), lengths[ep] - 1) for d in (-2, 0, 2)]
            top = [
                read_identity(f, frame_bits=frame_bits, episode_bits=episode_bits)
                for f in batch["observation.images.top"][i]
            ]
            assert top == [(ep, w) for w in window]
            assert batch["task"][i] == "Pick the orange cube and place it in the box"
        seen += len(batch["index"])
        if seen >= 200:  # decoding 640x480 AV1 on 2 cores: a sample of the epoch is enough here
            break
    assert seen >= 200


def test_loads_from_a_bucket_with_and_without_cache(pair, s3_server, tmp_path: Path) -> None:
    raw, converted = pair
    url = "s3://loader-test/converted"
    opts = s3_server.storage_options
    import fsspec

    fs = fsspec.filesystem("s3", **opts)
    fs.makedirs("loader-test", exist_ok=True)
    fs.put(str(converted) + "/", url, recursive=True)
    local = _stream(converted, cameras=[CAMS[0]])
    streamed = _stream(url, cameras=[CAMS[0]], storage_options=opts)
    _assert_same_batches(local, streamed)
    cached = _stream(url, cameras=[CAMS[0]], storage_options=opts, cache_dir=str(tmp_path / "cache"), num_workers=2)
    _assert_same_batches(_stream(converted, cameras=[CAMS[0]], num_workers=2), cached)
    assert len(list((tmp_path / "cache").rglob("shard-*.tar"))) == 3  # every shard downloaded whole, once
    assert not list((tmp_path / "cache").rglob("*.tmp"))


def test_iteration_shuts_down_its_shard_downloads(pair, s3_server, tmp_path: Path) -> None:
    """Each iterator opens and closes its own source; closing stops the downloader thread."""
    import fsspec

    _, converted = pair
    url = "s3://loader-close/converted"
    opts = s3_server.storage_options
    fs = fsspec.filesystem("s3", **opts)
    fs.makedirs("loader-close", exist_ok=True)
    fs.put(str(converted) + "/", url, recursive=True)
    batches = _stream(url, cameras=[], storage_options=opts, cache_dir=str(tmp_path / "cache"))
    assert (
        sum(len(b["index"]) for b in batches)
        == Manifest.from_json((converted / "manifest.json").read_text()).total_frames
    )
    downloaders = [t for t in threading.enumerate() if t.name.startswith("shard-prefetch")]
    for t in downloaders:
        t.join(timeout=HANG_GUARD_S)
    assert not [t for t in downloaders if t.is_alive()]


def test_planning_reads_no_sidecar(pair) -> None:
    """The manifest carries per-episode lengths: workers plan without fetching every sidecar."""

    _, converted = pair
    manifest = Manifest.from_json((converted / "manifest.json").read_text())
    source = ShardSource(str(converted))
    for rec, spec in zip(manifest.shards, source.info.shards):
        assert dict(zip(spec.episodes, spec.lengths)) == {
            e.episode_index: e.length for e in source.sidecar(rec.index).episodes
        }
    fresh = ShardSource(str(converted))
    lengths = [dict(zip(spec.episodes, spec.lengths)) for spec in fresh.info.shards]
    assert sum(sum(d.values()) for d in lengths) == manifest.total_frames
    assert not fresh._sidecars


@pytest.mark.parametrize("which", [0, 1])
def test_decode_threads_give_identical_samples_in_the_same_order(pair, which: int) -> None:
    """0 (inline), 1 and 3 decode threads, raw and converted: same samples, same order, same pixels."""
    window = {CAMS[0]: [-1 / 30, 0.0], "action": [0.0, 1 / 30]}
    for workers in (0, 2):
        inline = _stream(pair[which], workers, delta_timestamps=window, decode_threads=0, image_dtype=torch.uint8)
        for threads in (1, 3) if workers == 0 else (3,):
            threaded = _stream(
                pair[which], workers, delta_timestamps=window, decode_threads=threads, image_dtype=torch.uint8
            )
            _assert_same_batches(inline, threaded)
        for batch in inline:
            for i, (ep, frame) in enumerate(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist())):
                assert read_identity(batch[CAMS[1]][i]) == (ep, frame)


def test_decode_lookahead_is_bounded(pair, monkeypatch) -> None:
    """Frames are decoded at most 2 x decode_threads samples ahead of what was emitted."""
    import lerobot_shards.loader.emission as dataset_module

    submitted = []

    class CountingPool(dataset_module.DecodePool):
        def submit(self, clip, *args, **kwargs):
            submitted.append(clip.cache_key)
            return super().submit(clip, *args, **kwargs)

    monkeypatch.setattr(dataset_module, "DecodePool", CountingPool)
    ds = EpisodePoolDataset(str(pair[1]), seed=13, episode_pool_size=2, decode_threads=2)
    it = iter(ds)
    for emitted in range(1, 12):
        next(it)
        assert len(submitted) <= (emitted + 4) * len(CAMS)
    assert len(submitted) > 11 * len(CAMS)  # it did decode ahead
    it.close()


def test_decode_threads_rejects_bad_values(pair) -> None:
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match="decode_threads must be None .automatic. or an int >= 0"):
            EpisodePoolDataset(str(pair[1]), decode_threads=bad)


@pytest.mark.parametrize("workers", [0, 2])
def test_automatic_decode_threads_one_per_core_in_the_main_process_the_cores_left_in_workers(
    pair, workers: int
) -> None:
    ds = EpisodePoolDataset(str(pair[1]), seed=13, episode_pool_size=2, episodes_per_shard=2)
    assert ds.decode_threads is None
    batches = list(DataLoader(ds, batch_size=4, num_workers=workers))
    cpus = len(os.sched_getaffinity(0))
    expected = min(8, cpus) if workers == 0 else workers * min(8, cpus // workers)  # summed over the workers
    total = ds.stats()["total"]
    assert total["decode_threads"] == expected
    assert sum(len(b["index"]) for b in batches) == total["frames_emitted"] > 0


@pytest.mark.parametrize("names", [["height", "width", "channels"], None])
def test_a_declared_camera_size_the_video_lacks_is_said_once_and_frames_stay_right(
    pair, tmp_path: Path, names, recwarn
) -> None:
    """A feature whose ``names`` place height and width at another size than the video's gets one
    warning naming the file, episode, camera and both sizes; the samples are the same. A shape
    without names (channels first or last cannot be told) is not compared."""
    import json
    import shutil

    from lerobot_shards.loader.decoding import decoders as decode

    decode._warned_size.clear()
    raw = tmp_path / "raw"
    shutil.copytree(pair[0], raw)
    info_path = raw / "meta/info.json"
    info = json.loads(info_path.read_text())
    h, w = info["features"][CAMS[0]]["shape"][:2]
    info["features"][CAMS[0]].update(shape=[h // 2, w // 2, 3], names=names)
    info_path.write_text(json.dumps(info))
    _assert_same_batches(_stream(raw), _stream(pair[0]))
    said = [str(m.message) for m in recwarn if "declares" in str(m.message)]
    if names is None:
        assert said == []
    else:
        assert len(said) == 1, said
        assert str(raw) in said[0] and re.search(rf"episode \d+ camera {re.escape(CAMS[0])} \(videos/", said[0]), said
        assert f"frames are {w}x{h} (width x height), but the camera's feature declares {w // 2}x{h // 2}" in said[0]


def test_decode_pool_gives_new_clips_to_threads_in_turn_and_keeps_them_there() -> None:
    from lerobot_shards.loader.decoding.decoders import DecodePool

    class NoCache:
        def drop(self, key: str) -> None: ...

        def close(self) -> None: ...

    pool = DecodePool(2, NoCache)  # type: ignore[arg-type]
    owners = [pool._route(key) for key in ("ep0/front", "ep0/wrist", "ep1/front", "ep1/wrist")]
    assert owners == [0, 1, 0, 1]
    assert pool._route("ep0/wrist") == 1  # a clip stays with its thread (decoders are per thread)
    pool.drop("ep0/wrist")
    assert pool._route("ep2/front") == 0 and pool._route("ep0/wrist") == 1
    pool.close()


@pytest.mark.parametrize("which", [0, 1])
def test_reading_episodes_never_imports_pandas(pair, which: int) -> None:
    """pyarrow's to_numpy imports pandas: 0.25 s and ~40 MB in every worker, seconds when workers
    start together; the loader reads its columns from the Arrow buffers instead."""
    script = (
        "import sys, torch\n"
        "from lerobot_shards.loader import EpisodePoolDataset\n"
        f"ds = EpisodePoolDataset({str(pair[which])!r}, episodes_per_shard=2, episode_pool_size=2,\n"
        "    delta_timestamps={'action': [0.0, 1 / 30]}, image_dtype=torch.uint8)\n"
        "n = sum(1 for _ in ds)\n"
        "assert n > 0 and 'pandas' not in sys.modules, (n, [m for m in sys.modules if 'pandas' in m][:3])\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=HANG_GUARD_S)


@pytest.mark.parametrize("through", ["loop", "feeder", "thread"])
def test_a_loop_left_early_exits_quietly(pair, through: str) -> None:
    """A script that takes one batch and exits leaves its iterator open: the reader thread (and the
    feeder's, or the user's own daemon thread iterating) still running, the generator closed while
    the interpreter tears modules down. It exits 0 with nothing on stderr: no "Exception ignored"
    traceback, no "cannot schedule new futures" from a consuming thread, and no abort ("terminate
    called without an active exception": a daemon thread halted inside a parquet read or a
    decoder's destructor, which happened in 1 of 6 runs, 2 of 5 through the feeder)."""
    loader = "DataLoader(ds, batch_size=2)"
    take = {
        "loop": f"it = iter({loader})\nbatch = next(it)\n",
        "feeder": f"it = iter(DeviceFeeder({loader}, device='cpu'))\nbatch = next(it)\n",
        "thread": (
            "import threading\n"
            "got = threading.Event()\n"
            "def consume():\n"
            f"    for batch in {loader}:\n"
            "        got.set()\n"
            "threading.Thread(target=consume, daemon=True).start()\n"
            f"assert got.wait({HANG_GUARD_S})\n"
        ),
    }[through]
    script = (
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "from lerobot_shards.loader import DeviceFeeder, EpisodePoolDataset\n"
        f"ds = EpisodePoolDataset({str(pair[1])!r}, episode_pool_size=2, image_dtype=torch.uint8)\n" + take
    )
    for _ in range(2):  # the abort depends on where the thread is at exit
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert done.returncode == 0 and not done.stderr.strip(), (done.returncode, done.stderr[-2000:])


def test_automatic_decode_threads_without_an_affinity_mask(monkeypatch) -> None:
    """macOS and Windows have no os.sched_getaffinity: the CPU count decides."""
    from lerobot_shards.loader.decoding.decoders import auto_decode_threads

    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert auto_decode_threads("cpu") == 3
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert auto_decode_threads("cpu") == 8 and auto_decode_threads("cuda:0") == 0


def test_ranks_on_one_node_share_its_cores(monkeypatch) -> None:
    """A rank sizes its decode threads by its share of its launcher's cores (LOCAL_WORLD_SIZE ranks
    split them), never by more than its own mask: torchrun on a whole node, torchrun inside a
    partial allocation (the ranks inherit one mask), a rank pinned to cores of its own, NUMA
    binding (ranks split a node's cores). A DataLoader worker counts its rank's share."""
    from lerobot_shards import cpus
    from lerobot_shards.cpus import cores_per_rank
    from lerobot_shards.loader.decoding.decoders import auto_decode_threads

    masks: dict[str, set[int]] = {}

    def affinity(pid: int) -> set[int]:
        return masks["rank" if pid in (0, os.getpid()) else "launcher"]

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", affinity)
    monkeypatch.setattr(cpus, "_launcher_cpus", lambda pid: len(masks["launcher"]))

    def share(rank: set[int], launcher: set[int], local_world_size: str | None) -> int:
        masks.update(rank=rank, launcher=launcher)
        if local_world_size is None:
            monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)
        return cores_per_rank()

    node, allocation = set(range(64)), set(range(16, 48))
    assert share(node, node, None) == 64 and auto_decode_threads("cpu") == 8  # one process
    assert share(node, node, "8") == 8 and auto_decode_threads("cpu") == 8  # torchrun, whole node
    assert share(node, node, "128") == 1
    assert share(allocation, allocation, "4") == 8  # torchrun in a 32-core allocation: not 32 each
    assert share({20, 21, 22}, allocation, "4") == 3  # srun --cpu-bind: a mask of its own
    assert share({20, 21, 22}, node, None) == 3  # taskset for one process
    assert share(set(range(32)), node, "8") == 8  # NUMA binding: 4 ranks split a node's 32 cores
    assert share(node, node, "not a number") == 64
    monkeypatch.setattr(cpus, "_launcher_cpus", lambda pid: None)  # the launcher's mask unreadable
    assert share(allocation, node, "4") == 32 and share(node, node, "4") == 16

    monkeypatch.setattr(cpus, "_launcher_cpus", lambda pid: len(masks["launcher"]))
    assert share(node, {0, 1}, None) == 64  # one process started from a shell kept on 2 cores
    assert share(node, {0, 1}, "4") == 16  # a launcher kept off the ranks' cores: the node split
    assert share({20, 21, 22}, {0}, "4") == 3

    # a DataLoader worker takes its rank's count (the dataset counts it where it is built)
    monkeypatch.setattr(
        "lerobot_shards.loader.decoding.decoders.get_worker_info", lambda: SimpleNamespace(num_workers=2)
    )
    assert auto_decode_threads("cpu", 8) == 4 and auto_decode_threads("cpu", 40) == 8


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_workers_decode_on_their_ranks_share_counted_where_the_dataset_was_built(pair, monkeypatch, context) -> None:
    """The rank's count travels with the dataset: a forkserver worker, whose parent is the fork
    server, cannot count it itself."""
    monkeypatch.setattr("lerobot_shards.loader.dataset.cores_per_rank", lambda: 6)
    ds = EpisodePoolDataset(str(pair[1]), seed=13, episode_pool_size=2)
    batches = list(DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=context))
    assert batches and ds.stats()["total"]["decode_threads"] == 2 * 3  # 6 // 2 workers, summed


def test_launcher_cpus_reads_the_parent_process() -> None:
    """The real /proc read: a launcher narrowed to one CPU starts a rank that widens its own mask
    again; the rank reads its launcher's one CPU, and the launcher reads this process's mask."""
    from lerobot_shards.cpus import _launcher_cpus

    assert _launcher_cpus(os.getpid()) == len(os.sched_getaffinity(os.getppid()))
    cpus = sorted(os.sched_getaffinity(0))
    rank = (
        f"import os; os.sched_setaffinity(0, {cpus}); from lerobot_shards.cpus import _launcher_cpus; "
        "print(_launcher_cpus(os.getpid()), len(os.sched_getaffinity(0)))"
    )
    launcher = (
        "import os, subprocess, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from lerobot_shards.cpus import _launcher_cpus; print(_launcher_cpus(os.getpid()), flush=True); "
        f"subprocess.run([sys.executable, '-c', {rank!r}], check=True)"
    )
    out = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, check=True).stdout.split()
    assert [int(x) for x in out] == [len(os.sched_getaffinity(0)), 1, len(os.sched_getaffinity(0))]


def test_next_shard_starts_only_after_the_entered_shards_first_read(pair, monkeypatch) -> None:
    """Its bytes would otherwise share the link with the ones the first batch waits for."""
    events: list[tuple[str, int]] = []
    open_reader = ShardSource._open_reader

    def recording(self, shard, after=()):
        reader = open_reader(self, shard, after)
        events.append(("open", shard))
        read = reader.read

        def recorded_read(start, end):
            data = read(start, end)
            events.append(("read", shard))
            return data

        reader.read = recorded_read
        return reader

    monkeypatch.setattr(ShardSource, "_open_reader", recording)
    source = ShardSource(str(pair[1]))
    first, second = source.info.shards[:2]
    source.prefetch(second.index)  # as the reader does on entering a shard: names the next one first
    source.read_episode(first.index, first.episodes[0])
    source._readers[second.index].result()  # the prefetch was started
    assert events == [("open", first.index), ("read", first.index), ("open", second.index)]
    source.close()


def test_parsed_sidecars_of_shards_left_behind_are_not_kept(synth_factory, tmp_path: Path) -> None:
    """Every shard's parsed sidecar (frame tables, ~235 B per frame and camera) stayed until the
    source closed: a worker's whole epoch of them."""
    from lerobot_shards.loader.read.sources import open_source

    out = tmp_path / "conv"
    convert_dataset(
        synth_factory(num_episodes=6, length_range=(4, 6)), out, ConvertOptions(episodes_per_shard=1), progress=False
    )
    source = open_source(str(out))
    try:
        for shard in range(6):
            source.read_episode(shard, shard)
            assert set(source._sidecars) <= {shard, shard + 1}, shard  # the current and the one read ahead
        source.read_episode(0, 0)  # a shard read again (a later pass) fetches its sidecar again
    finally:
        source.close()
