"""Training from a bucket (real S3-protocol server, real DataLoader workers): the node cache end to end."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from torch.utils.data import DataLoader

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.format import DIGEST_FIELD, FormatError, Manifest, manifest_digest
from lerobot_shards.loader import EpisodePoolDataset, ReadOptions
from lerobot_shards.loader.read.shard_cache import scan
from lerobot_shards.synth import read_identity, synth_dataset
from waits import HANG_GUARD_S, until, waiting_in

CAM = "observation.images.front"
WINDOW = {CAM: [-1 / 30, 0.0], "action": [0.0, 1 / 30]}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    """A raw dataset of 8 short episodes and its conversion into 8 one-episode shards."""
    base = tmp_path_factory.mktemp("storage")
    raw = synth_dataset(
        base / "raw", num_episodes=8, cameras=(CAM,), length_range=(6, 10), episodes_per_video_file=2, seed=3
    )
    convert_dataset(raw, base / "converted", ConvertOptions(episodes_per_shard=1), progress=False)
    return raw, base / "converted"


def _upload(s3_server, local: Path, bucket: str, *, packed: bool = True) -> str:
    """``local`` in its own bucket; without ``packed``, as an earlier conversion (no sidecar pack: the
    loader reads each shard's sidecar file, in the background for the shards read ahead)."""
    fs = fsspec.filesystem("s3", **s3_server.storage_options)
    fs.makedirs(bucket, exist_ok=True)
    fs.put(str(local) + "/", f"s3://{bucket}/ds", recursive=True)
    if not packed:
        manifest = json.loads(fs.cat_file(f"{bucket}/ds/manifest.json"))
        fs.rm(f"{bucket}/ds/{manifest.pop('sidecar_pack')['name']}")
        manifest[DIGEST_FIELD] = manifest_digest(manifest)
        fs.pipe_file(f"{bucket}/ds/manifest.json", json.dumps(manifest).encode())
    return f"s3://{bucket}/ds"


def _dataset(url: Path | str, **kwargs) -> EpisodePoolDataset:
    kwargs.setdefault("episodes_per_shard", 2)
    return EpisodePoolDataset(str(url), seed=5, episode_pool_size=2, delta_timestamps=WINDOW, **kwargs)


def _epoch(ds: EpisodePoolDataset, epoch: int = 0) -> list[dict]:
    ds.set_epoch(epoch)
    return list(DataLoader(ds, batch_size=4, num_workers=2))


def _assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k], k


def _assert_identity(batches: list[dict]) -> None:
    for batch in batches:
        for i, (ep, frame) in enumerate(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist())):
            assert read_identity(batch[CAM][i, 1]) == (ep, frame)


class SizeWatcher(threading.Thread):
    """Sums the sizes of the files in a cache directory, over and over, and keeps the largest sum."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root, self.largest, self.samples = str(root), 0, 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            if os.path.isdir(self.root):
                self.largest = max(self.largest, sum(e.size for e in scan(self.root, probe=False)))
                self.samples += 1
            self._stop_event.wait(0.002)

    def __enter__(self) -> SizeWatcher:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop_event.set()
        self.join()


def test_bucket_yields_the_local_samples_with_and_without_cache(data, s3_server, tmp_path: Path) -> None:
    _, converted = data
    url = _upload(s3_server, converted, "storage-same")
    opts = s3_server.storage_options
    local = _epoch(_dataset(converted))
    uncached_ds = _dataset(url, storage_options=opts)
    uncached = _epoch(uncached_ds)
    cached_ds = _dataset(url, storage_options=opts, cache_dir=str(tmp_path / "cache"))
    cached = _epoch(cached_ds)
    _assert_same(local, uncached)
    _assert_same(local, cached)
    _assert_identity(cached)
    tars = sum(s.bytes for s in Manifest.from_json((converted / "manifest.json").read_text()).shards)
    plain, with_cache = uncached_ds.stats()["total"], cached_ds.stats()["total"]
    assert plain["storage_bytes"] == tars and plain["cache_misses"] == 0  # each shard byte fetched once
    assert with_cache["cache_misses"] == 8 and with_cache["storage_bytes"] == tars
    assert "127.0.0.1" not in json.dumps(cached_ds.stats()) and "testing" not in json.dumps(cached_ds.stats())


def test_cache_stays_under_its_cap_over_two_epochs(data, s3_server, tmp_path: Path) -> None:
    _, converted = data
    url = _upload(s3_server, converted, "storage-cap")
    manifest = Manifest.from_json((converted / "manifest.json").read_text())
    cap = manifest.total_bytes // 4
    cache = tmp_path / "cache"
    ds = _dataset(url, storage_options=s3_server.storage_options, cache_dir=str(cache), cache_max_bytes=cap)
    local = _dataset(converted)
    evictions = hits = 0
    with SizeWatcher(cache) as watcher:
        for epoch in range(2):
            _assert_same(_epoch(local, epoch), _epoch(ds, epoch))
            total = ds.stats()["total"]
            assert 0 < total["cache_bytes_peak"] <= cap
            evictions += total["cache_evictions"]
            hits += total["cache_hits"]
    assert watcher.samples > 10 and 0 < watcher.largest <= cap
    assert evictions > 0
    assert sum(e.size for e in scan(str(cache))) <= cap
    assert not any(e.in_use for e in scan(str(cache)))  # every lease released at the end of the epoch


def _rank(url: str, cache: str, rank: int, opts: dict, results) -> None:
    """One rank of a 2-rank job (a forked process: it shares nothing with its peer but the cache dir)."""
    ds = EpisodePoolDataset(
        url,
        seed=5,
        episode_pool_size=2,
        rank=rank,
        world_size=2,
        storage_options=opts,
        cache_dir=cache,
        cameras=[],
        equal_samples_per_rank=False,
    )
    out = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        batches = DataLoader(ds, batch_size=4)
        frames = [(int(e), int(f)) for b in batches for e, f in zip(b["episode_index"], b["frame_index"])]
        out.append({"frames": frames, "stats": ds.stats()["total"]})
    results.put((rank, out))


def test_two_ranks_sharing_a_cache_download_each_shard_once(data, s3_server, tmp_path: Path) -> None:
    _, converted = data
    url = _upload(s3_server, converted, "storage-ranks")
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    args = (url, str(tmp_path / "cache"))
    procs = [ctx.Process(target=_rank, args=(*args, r, s3_server.storage_options, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = [out for _, out in sorted(queue.get(timeout=HANG_GUARD_S) for _ in procs)]
    for p in procs:
        p.join(timeout=HANG_GUARD_S)
    assert [p.exitcode for p in procs] == [0, 0]
    manifest = Manifest.from_json((converted / "manifest.json").read_text())
    everything = sorted(
        (e, f) for s in manifest.shards for e, n in zip(s.episodes, s.episode_lengths) for f in range(n)
    )
    for epoch in range(2):  # the ranks together cover the dataset exactly once per epoch
        assert sorted(f for r in results for f in r[epoch]["frames"]) == everything
    stats = [r[epoch]["stats"] for r in results for epoch in range(2)]
    assert sum(s["cache_misses"] for s in stats) == len(manifest.shards)  # one download per shard per node
    assert sum(s["cache_hits"] for s in stats) == len(manifest.shards)  # the second epoch reads the cache
    assert sum(s["storage_bytes"] for s in stats) == manifest.total_bytes


def test_a_truncated_cached_shard_is_fetched_again(data, s3_server, tmp_path: Path) -> None:
    _, converted = data
    url = _upload(s3_server, converted, "storage-truncated")
    cache = tmp_path / "cache"
    ds = _dataset(url, storage_options=s3_server.storage_options, cache_dir=str(cache))
    first = _epoch(ds)
    tars = sorted(cache.rglob("shard-*.tar"))
    assert len(tars) == 8
    with open(tars[3], "r+b") as f:
        f.truncate(tars[3].stat().st_size // 2)
    again = _epoch(ds)
    _assert_same(first, again)
    _assert_identity(again)
    assert ds.stats()["total"]["cache_misses"] == 1 and ds.stats()["total"]["cache_hits"] == 7


def test_raw_from_a_bucket_prefetches_mp4s_into_a_bounded_cache(data, s3_server, tmp_path: Path) -> None:
    raw, _ = data
    url = _upload(s3_server, raw, "storage-raw")
    videos = sorted((raw / "videos").rglob("*.mp4"))
    cap = sum(v.stat().st_size for v in videos) // 2
    cache = tmp_path / "cache"
    local = _epoch(_dataset(raw))
    ds = _dataset(url, storage_options=s3_server.storage_options, cache_dir=str(cache), cache_max_bytes=cap)
    with SizeWatcher(cache) as watcher:
        remote = _epoch(ds)
    _assert_same(local, remote)
    _assert_identity(remote)
    total = ds.stats()["total"]
    assert total["cache_misses"] >= len(videos) // 2 and total["storage_bytes"] > 0
    assert total["cache_bytes_peak"] <= cap and watcher.largest <= cap
    assert not any(e.in_use for e in scan(str(cache)))  # released when their episodes left the pool


def test_raw_from_a_bucket_without_a_cache_decodes_straight_from_storage(data, s3_server) -> None:
    """No cache_dir: the mp4s are read through a bounded block cache, frames still exact."""
    raw, _ = data
    url = _upload(s3_server, raw, "storage-raw-direct")
    local = _epoch(_dataset(raw))
    remote = _epoch(_dataset(url, storage_options=s3_server.storage_options))
    _assert_same(local, remote)
    _assert_identity(remote)


@pytest.mark.parametrize("kind", ["converted", "raw"])
def test_the_source_metadata_is_fetched_once_not_per_worker_or_epoch(s3_server, data, kind: str) -> None:
    """The dataset reads the manifest (or a raw dataset's info.json) once; its workers, in every
    epoch, and iterators in the main process reuse it instead of fetching it again."""
    raw, converted = data
    bucket = f"metadata-once-{kind}"
    url = _upload(s3_server, converted if kind == "converted" else raw, bucket)
    key = f"{bucket}/ds/" + ("manifest.json" if kind == "converted" else "meta/info.json")
    assert s3_server.requests("GET", key) == 0
    ds = EpisodePoolDataset(url, storage_options=s3_server.storage_options, cameras=[], episode_pool_size=2)
    assert s3_server.requests("GET", key) == 1
    frames = 0
    for epoch, workers in ((0, 2), (1, 2), (2, 0)):
        ds.set_epoch(epoch)
        frames += sum(len(b["index"]) for b in DataLoader(ds, batch_size=4, num_workers=workers))
    assert frames == 3 * sum(n for s in ds.shards for n in s.lengths)  # the epochs did read the shards
    assert s3_server.requests("GET", key) == 1


def test_open_source_gives_every_caller_the_remote_timeouts(s3_server, data) -> None:
    """Callers outside the dataset (the benchmark, the GPU check) get the loader's bounded remote reads."""
    from lerobot_shards.loader.read.remote import CONNECT_TIMEOUT_S, READ_TIMEOUT_S
    from lerobot_shards.loader.read.sources import open_source

    url = _upload(s3_server, data[1], "timeouts-everywhere")
    source = open_source(url, ReadOptions(storage_options=s3_server.storage_options))
    try:
        config = source.fs.config_kwargs  # type: ignore[attr-defined]
        assert (config["connect_timeout"], config["read_timeout"]) == (CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
    finally:
        source.close()


def _read_ahead(url: str, s3_server, ahead: tuple[int, ...] = (1,)) -> Any:
    """The converted source at ``url`` having entered shard 0 with ``ahead`` named next (as the reader
    names them), once their sidecars and first bytes have landed (waited on through the source's
    own futures)."""
    from lerobot_shards.loader.read.sources import ShardSource, open_source

    source = open_source(url, ReadOptions(storage_options=s3_server.storage_options))
    assert isinstance(source, ShardSource)
    for shard in ahead:
        source.prefetch(shard)
    assert read_identity(_frame(source.read_episode(0, 0), 0)) == (0, 0)
    for shard in ahead:
        source._sidecar_fetches[shard].exception()  # fetched ahead (or its failure, kept for the read)
        source._readers[shard].result()._parts[0].result()  # type: ignore[attr-defined]  # its first chunk
    return source


def _frame(episode: Any, frame: int) -> torch.Tensor:
    from lerobot_shards.loader.decoding.decoders import DecoderCache

    cache = DecoderCache(1)
    try:
        return cache.frames(episode.clips[CAM], [frame])[0]
    finally:
        cache.close()


def test_the_next_shards_sidecar_and_bytes_are_read_ahead(data, s3_server) -> None:
    """Entering a shard names the next one: its sidecar is fetched at once, its bytes once the entered
    shard's first episode is served, so the reader finds both in hand when it gets there (here they
    are deleted from the bucket before that read), each once, and the frames are the ones asked for."""
    _, converted = data
    url = _upload(s3_server, converted, "storage-ahead", packed=False)
    source = _read_ahead(url, s3_server)
    try:
        fs = s3_server.filesystem()
        keys = [f"storage-ahead/ds/shards/{name}" for name in ("shard-000001.tar", "shard-000001.idx.json")]
        fs.rm(keys)
        episode = source.read_episode(1, 1)
        assert [read_identity(_frame(episode, f)) for f in (0, episode.length - 1)] == [(1, 0), (1, episode.length - 1)]
        assert [s3_server.requests("GET", key) for key in keys] == [1, 1]
    finally:
        source.close()


def test_a_damaged_sidecar_read_ahead_fails_the_read_of_its_shard(data, s3_server) -> None:
    """A sidecar fetched in the background is checked against the manifest's sha256 all the same: the
    error comes when its shard is read, naming the sidecar; the shard before it reads normally."""
    _, converted = data
    url = _upload(s3_server, converted, "storage-ahead-bad", packed=False)
    key = "storage-ahead-bad/ds/shards/shard-000001.idx.json"
    fs = s3_server.filesystem()
    damaged = bytearray(fs.cat_file(key))
    damaged[len(damaged) // 2] ^= 0x01  # one flipped bit, same size
    fs.pipe_file(key, bytes(damaged))
    source = _read_ahead(url, s3_server)
    try:
        with pytest.raises(FormatError, match=r"shards/shard-000001\.idx\.json: does not match the sha256"):
            source.read_episode(1, 1)
    finally:
        source.close()


def test_small_shards_are_read_ahead_several_at_a_time(data, s3_server) -> None:
    """Shards far smaller than a ranged request: every shard the reader names within the read-ahead
    budget is fetched once the current shard's first episode is served, not one round trip per
    shard as the reader reaches it; here they are all gone from the bucket before they are read."""
    _, converted = data
    url = _upload(s3_server, converted, "storage-ahead-many", packed=False)
    source = _read_ahead(url, s3_server, ahead=(1, 2, 3))
    try:
        names = [f"shard-00000{i}.{kind}" for i in (1, 2, 3) for kind in ("tar", "idx.json")]
        s3_server.filesystem().rm([f"storage-ahead-many/ds/shards/{name}" for name in names])
        for shard in (1, 2, 3):
            episode = source.read_episode(shard, shard)
            assert read_identity(_frame(episode, episode.length - 1)) == (shard, episode.length - 1)
    finally:
        source.close()


def test_a_shard_read_ahead_waits_for_the_chunks_requested_of_the_current_one(data, s3_server, monkeypatch) -> None:
    """On a capped link bytes read ahead share the bandwidth with those the reader needs next (the
    pool's second episode, before the first batch): the shard named ahead is requested only once
    every chunk requested of the shard being read has landed. Here a read-ahead chunk of shard 0 is
    held back; shard 1's first request follows its landing, and serves the right frames."""
    from lerobot_shards.loader.read import sources

    _, converted = data
    url = _upload(s3_server, converted, "storage-ahead-gate")
    chunk = 1024
    monkeypatch.setattr(sources, "CHUNK_BYTES", chunk)  # shard 0's episode spans chunks, its tar's end more
    events: list[tuple[str, str, int]] = []
    shard1_requested, release = threading.Event(), threading.Event()
    source = sources.open_source(url, ReadOptions(storage_options=s3_server.storage_options))
    assert isinstance(source, sources.ShardSource)
    _, end = source.sidecar(0).episodes[0].span()
    held = -(-end // chunk) * chunk  # the first chunk past episode 0: requested by read-ahead only
    assert held < source._records[0].bytes
    real = sources.ranged

    def ranged(fs: Any, path: str, where: str) -> Any:
        fetch, name = real(fs, path, where), os.path.basename(path)

        def recorded(start: int, stop: int) -> bytes:
            events.append(("start", name, start))
            if name == "shard-000001.tar":
                shard1_requested.set()
            if (name, start) == ("shard-000000.tar", held):
                assert release.wait(HANG_GUARD_S)
            data = fetch(start, stop)
            events.append(("end", name, start))
            return data

        return recorded

    monkeypatch.setattr(sources, "ranged", ranged)
    try:
        source.prefetch(1)
        episode = source.read_episode(0, 0)
        assert read_identity(_frame(episode, 0)) == (0, 0)
        # shard 1's opener waits for the held chunk (an ungated one would have asked at once)
        until(lambda: any(waiting_in(t.ident, "settled") for t in threading.enumerate()), "shard 1's opener waiting")
        assert not shard1_requested.is_set()
        release.set()
        episode = source.read_episode(1, 1)
        assert read_identity(_frame(episode, episode.length - 1)) == (1, episode.length - 1)
    finally:
        release.set()
        source.close()
    first_of_shard1 = events.index(("start", "shard-000001.tar", 0))
    assert events.index(("end", "shard-000000.tar", held)) < first_of_shard1
