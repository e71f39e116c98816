"""Requests per rank do not grow with its DataLoader workers: counted at the real S3-protocol server.

A rank reads the manifest and the sidecar pack once (its workers inherit both, parsed and checked)
and no consumer fetches a sidecar file; more workers split the rank's shards further, reading
only their episodes' bytes. A conversion without the pack (an earlier format 3 one) is read
through the sidecar files, each by the consumer holding its shard, with the same samples.
"""

from __future__ import annotations

import itertools
import re
import shutil
import threading
from collections import Counter

import fsspec
import pytest
from torch.utils.data import DataLoader

from convert_helpers import unpack
from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.synth import read_identity, synth_dataset

CAM = "observation.images.front"
POOL, AHEAD = 2, 1  # episodes resident in a consumer's pool, read ahead of it
METADATA = r"manifest\.json|sidecars\.pack|shards/[^ ?\"]+\.idx\.json"
_marks = iter(range(1 << 30))
_marks_lock = threading.Lock()


@pytest.fixture(scope="module")
def bucket(tmp_path_factory, s3_server) -> dict[str, str]:
    """8 short episodes in 8 one-episode shards, with the sidecar pack (``ds``) and without (``files``)."""
    base = tmp_path_factory.mktemp("startup")
    raw = synth_dataset(
        base / "raw", num_episodes=8, cameras=(CAM,), length_range=(4, 6), episodes_per_video_file=4, seed=9
    )
    convert_dataset(raw, base / "converted", ConvertOptions(episodes_per_shard=1), progress=False)
    shutil.copytree(base / "converted", base / "files")
    unpack(base / "files")
    fs = fsspec.filesystem("s3", **s3_server.storage_options)
    fs.makedirs("startup", exist_ok=True)
    fs.put(str(base / "converted") + "/", "s3://startup/ds", recursive=True)
    fs.put(str(base / "files") + "/", "s3://startup/files", recursive=True)
    return {"ds": "s3://startup/ds", "files": "s3://startup/files"}


def _log_mark(s3_server) -> int:
    """Where the server's log stands once every request answered so far is in it: a request of its
    own, sent after them, is waited for in the log (the server writes a line once it has answered)."""
    with _marks_lock:
        key = f"startup/mark-{next(_marks)}"
    fs = s3_server.filesystem()
    fs.exists(f"s3://{key}")
    while not s3_server.requests("HEAD", key):
        threading.Event().wait(0.01)
    return len(s3_server.log.read_text(errors="replace"))


def _requests(log: str, prefix: str) -> Counter:
    """The requests of a server log slice for ``prefix``, by (method, what): metadata objects by name,
    a shard's bytes as ``data``."""
    out: Counter = Counter()
    for method, path in re.findall(rf'"(?:\x1b\[[\d;]*m)*(GET|HEAD) /startup/{prefix}/([^ ?"]+)', log):
        out[(method, path if re.fullmatch(METADATA, path) else "data")] += 1
    return out


def _dataset(s3_server, url: str, rank: int = 0, world_size: int = 1, **options) -> EpisodePoolDataset:
    return EpisodePoolDataset(
        url,
        storage_options=s3_server.storage_options,
        cameras=[CAM],
        rank=rank,
        world_size=world_size,
        equal_samples_per_rank=False,
        seed=1,
        **options,
    )


def _rank_gets(s3_server, url: str, rank: int, world_size: int, workers: int) -> Counter:
    """A rank's metadata GETs over a whole epoch with ``workers`` DataLoader workers."""
    start = _log_mark(s3_server)
    ds = _dataset(s3_server, url, rank, world_size)
    assert sum(len(b["index"]) for b in DataLoader(ds, batch_size=4, num_workers=workers))
    log = s3_server.log.read_text(errors="replace")[start : _log_mark(s3_server)]
    return Counter({what: n for (method, what), n in _requests(log, url.rsplit("/", 1)[1]).items() if method == "GET"})


@pytest.mark.parametrize("world_size", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_metadata_requests_per_rank_are_the_same_with_0_1_2_workers(s3_server, bucket, world_size) -> None:
    """Over a whole epoch a rank GETs the manifest and the pack once, whatever its workers, and no
    sidecar file; without the pack, every sidecar file once over all ranks, none twice."""
    per_workers = {}
    for workers in (0, 1, 2):
        ranks = [_rank_gets(s3_server, bucket["ds"], r, world_size, workers) for r in range(world_size)]
        for gets in ranks:
            assert gets.keys() - {"data"} == {"manifest.json", "sidecars.pack"}, (workers, gets)
            assert gets["manifest.json"] == gets["sidecars.pack"] == 1, (workers, gets)
        per_workers[workers] = [g["manifest.json"] + g["sidecars.pack"] for g in ranks]
        files = [_rank_gets(s3_server, bucket["files"], r, world_size, workers) for r in range(world_size)]
        for gets in files:
            assert gets["manifest.json"] == 1 and "sidecars.pack" not in gets, (workers, gets)
            assert all(n == 1 for what, n in gets.items() if what != "data"), (workers, gets)  # nothing twice
        assert len(sum(files, Counter()).keys() - {"data", "manifest.json"}) == 8  # every sidecar once
    assert per_workers[0] == per_workers[1] == per_workers[2]


def _first_batches(s3_server, url: str, workers: int) -> tuple[Counter, list]:
    """The requests of a rank from opening the dataset to every worker's first batch, and the epoch's
    samples (episode, frame and the frame's painted identity) from the same loader. Each consumer's
    shard reads by then are checked against what the loader documents (docs/object-storage.md):
    the episodes its reader handed over for the batches the DataLoader asked of it (2 prefetched and
    1 asked after its first, per worker; 1 without workers) and for the samples its decode thread
    works ahead on (3), its read-ahead queue (``AHEAD``), the
    episode its reader holds until the queue has room, and the shards of the next ``AHEAD`` episodes
    fetched in the background."""
    start = _log_mark(s3_server)
    ds = _dataset(s3_server, url, episode_pool_size=POOL, prefetch_episodes=AHEAD, decode_threads=1)
    batches = iter(DataLoader(ds, batch_size=4, num_workers=workers))
    got = [next(batches) for _ in range(max(1, workers))]  # round robin: batch i comes from worker i
    log = s3_server.log.read_text(errors="replace")[start : _log_mark(s3_server)]
    requests = _requests(log, url.rsplit("/", 1)[1])
    read = Counter(int(n) for n in re.findall(rf"GET /startup/{url.rsplit('/', 1)[1]}/[^ ?\"]*shard-(\d+)\.tar", log))
    assert all(n == 1 for n in read.values()), read  # no shard's bytes read twice (each is under a chunk)
    for worker in range(max(1, workers)):
        start_ = ds.epoch_order.start(0, None, worker, workers)
        emitted = itertools.islice(start_.sampler, (3 if workers else 1) * 4 + 2 * 1 + 1)  # + decoded ahead
        handed = max(e.position for e in emitted) + 1  # the reader hands episodes over in list order
        mine = sum(1 for shard, _ in start_.plan.episodes if shard in read)
        assert mine <= min(len(start_.plan.episodes), handed + 2 * AHEAD + 1), (workers, worker, mine, handed)
    got += list(batches)
    samples = [
        (int(e), int(f), read_identity(img))
        for b in got
        for e, f, img in zip(b["episode_index"], b["frame_index"], b[CAM])
    ]
    return requests, samples


def test_requests_before_the_first_batch_do_not_grow_with_workers(s3_server, bucket) -> None:
    """From a fresh open to every worker's first batch a rank sends the same metadata requests with
    0, 1 and 2 workers (the manifest's HEAD and GET, the pack's GET); what grows is the episodes'
    bytes, each worker reading its own first episodes: those of its pool, its read-ahead and what its
    first batches use up, one ranged GET each. The samples equal those read through the sidecar files."""
    metadata = {}
    for workers in (0, 1, 2):
        requests, samples = _first_batches(s3_server, bucket["ds"], workers)
        metadata[workers] = {k: n for k, n in requests.items() if k[1] != "data"}
        assert samples == _first_batches(s3_server, bucket["files"], workers)[1]
        frames = [(e, f) for e, f, _ in samples]
        assert sorted(frames) == sorted(set(frames)) and all(ident == (e, f) for e, f, ident in samples)
    assert (
        metadata[0]
        == metadata[1]
        == metadata[2]
        == {
            ("HEAD", "manifest.json"): 1,
            ("GET", "manifest.json"): 1,
            ("GET", "sidecars.pack"): 1,
        }
    )
