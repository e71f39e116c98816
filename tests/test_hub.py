"""Sources on the Hugging Face Hub, read from a loopback server speaking its HTTP API (``hub_server``)
with the real ``huggingface_hub`` client: repo ids and revisions resolved as LeRobot does, the same
samples as the local copy, bounded and retried requests, tokens that are never shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import HUB_CAMS
from hub_server import VALID_TOKEN, HubServer
from lerobot_shards.filesystems import hub_repo_id, resolve_source, url_to_fs
from lerobot_shards.integrations.hub import HubAuthError, HubListingError, HubNotFound, HubUnavailable, safe_version
from lerobot_shards.lerobot_v3 import LeRobotV3Source
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.synth import read_identity, synth_dataset

CAMS = HUB_CAMS
FAST = {"timeout": 0.5, "deadline": 3.0}  # a paused server is given up on in seconds


def _stream(source: str, num_workers: int = 0, **kwargs) -> list[dict]:
    ds = EpisodePoolDataset(source, seed=3, episode_pool_size=2, episodes_per_shard=2, **kwargs)
    return list(DataLoader(ds, batch_size=4, num_workers=num_workers))


def _assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], torch.Tensor):
                assert torch.equal(x[key], y[key]), key
            else:
                assert x[key] == y[key], key


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lerobot_shards.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


# -- telling repo ids from paths, resolving revisions --------------------------------------------


def test_a_repo_id_is_told_apart_from_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert hub_repo_id("lerobot/pusht") == "lerobot/pusht"
    assert hub_repo_id("me/so101_v2.1-test") == "me/so101_v2.1-test"
    (tmp_path / "out").mkdir()
    assert hub_repo_id("out/demo") is None  # a mistyped path beside its folder is a path
    (tmp_path / "lerobot/pusht").mkdir(parents=True)  # a local folder of that name wins
    for not_a_repo in ("lerobot/pusht", "./a/b", "/a/b", "a/b/c", "s3://a/b", "hf://datasets/a/b", "a--b/c", "a/..b"):
        assert hub_repo_id(not_a_repo) is None, not_a_repo
    assert resolve_source("lerobot/pusht") == "lerobot/pusht"
    with pytest.raises(ValueError, match="revision"):
        resolve_source("lerobot/pusht", revision="main")  # a local folder has no revision


@pytest.mark.parametrize(
    ("refs", "target", "picked"),
    [
        (["main", "v2.1", "v3.0"], "v3.0", "v3.0"),  # exact
        (["main", "v3.0", "v3.1"], "v3.0", "v3.0"),
        (["main", "v2.1", "3.0"], "v3.0", "3.0"),  # parsed as a version, as packaging does
        (["v3.0"], "v3.2", "v3.0"),  # the newest compatible one: same major, minor not above
        (["v3.0", "v3.1", "v2.1"], "v3.2", "v3.1"),
    ],
)
def test_the_codebase_version_is_picked_as_lerobot_does(refs: list[str], target: str, picked: str) -> None:
    assert safe_version("me/ds", dict.fromkeys(refs, "sha"), target) == picked


@pytest.mark.parametrize(
    ("refs", "why"), [(["main"], "no version tag"), (["main", "v2.1"], "has v2.1"), (["v3.1", "v4.0"], "has v3.1")]
)
def test_no_compatible_version_is_refused_naming_what_the_repo_has(refs: list[str], why: str) -> None:
    with pytest.raises(HubNotFound, match=why):
        safe_version("me/ds", dict.fromkeys(refs, "sha"), "v3.0")


def test_repo_id_and_revision_resolve_to_the_tagged_commit(hub: HubServer, raw: Path, fixture_root: Path) -> None:
    old = hub.add_dataset("me/ds", fixture_root, branches=(), tags=("v2.1",))
    tagged = hub.add_dataset("me/ds", raw, branches=(), tags=("v3.0",))
    main = hub.add_dataset("me/ds", fixture_root, branches=("main",), tags=())
    assert len({old, tagged, main}) == 2  # the same folder is the same commit
    assert resolve_source("me/ds") == f"hf://datasets/me/ds@{tagged}"  # LeRobot's default: the v3.0 tag
    assert resolve_source("me/ds", "main") == f"hf://datasets/me/ds@{main}"
    assert resolve_source("me/ds", "v2.1") == f"hf://datasets/me/ds@{old}"  # an exact version as asked
    assert resolve_source("me/ds", tagged[:40]) == f"hf://datasets/me/ds@{tagged}"
    assert EpisodePoolDataset("me/ds", revision="main").source_url == f"hf://datasets/me/ds@{main}"
    with pytest.raises(HubNotFound, match="no such revision"):
        resolve_source("me/ds", "nope")
    with pytest.raises(HubNotFound, match="no local folder 'me/other'"):
        resolve_source("me/other")


# -- the same samples as the local copy -----------------------------------------------------------


def test_raw_streaming_from_the_hub_gives_the_local_samples(hub: HubServer, raw: Path, tmp_path: Path) -> None:
    hub.add_dataset("me/ds", raw)
    window = {CAMS[0]: [-1 / 30, 0.0, 1 / 30]}
    local = _stream(str(raw), delta_timestamps=window)
    _assert_same(local, _stream("me/ds", delta_timestamps=window))
    for batch in local:
        for i, (ep, frame) in enumerate(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist())):
            assert read_identity(batch[CAMS[1]][i]) == (ep, frame)
    # DataLoader workers and the prefetch-on-admit cache: the same samples, every mp4 downloaded once
    hub.clear_log()
    cached = _stream("me/ds", num_workers=2, delta_timestamps=window, cache_dir=str(tmp_path / "cache"))
    _assert_same(_stream(str(raw), num_workers=2, delta_timestamps=window), cached)
    mp4s = [p for _, p, _ in hub.requests("GET", ".mp4")]
    assert mp4s and len(mp4s) == len(set(mp4s))
    assert not hub.requests("GET", "/tree/")  # the listing of the first open, inherited by forked workers


def test_start_up_requests_are_the_same_with_workers_and_the_tree_is_listed_once(hub: HubServer, raw: Path) -> None:
    from lerobot_shards.integrations import hub as hub_module

    hub.page_size = 3
    hub.add_dataset("me/ds", raw)
    metadata = []
    for workers in (0, 2):  # each a new job: nothing known in this process yet
        hub_module._listings.clear()
        hub_module._found.clear()
        hub_module.HubFileSystem.clear_instance_cache()
        hub.clear_log()
        _stream("me/ds", num_workers=workers)
        pages = [p for _, p, _ in hub.requests("GET", "/tree/")]
        assert len(pages) == len(set(pages)) == -(-len(list(raw.rglob("*"))) // 3)  # each page once
        metadata.append(sorted(p for _, p, _ in hub.requests() if "/resolve/" not in p or "/meta/" in p))
    assert metadata[0] == metadata[1]  # forked workers resolve, list and read metadata nothing again


def _rel(request_path: str) -> str:
    """The file a ``/resolve/<revision>/<path>`` request asked for, relative to the repo."""
    return request_path.split("/resolve/", 1)[1].split("/", 1)[1]


def test_metadata_is_fetched_at_once_and_each_mp4_byte_once_per_reader(hub: HubServer, raw: Path) -> None:
    """The first batch waits on round trips: the metadata files go out together after the listing,
    an episode's frames are cut out of each camera's mp4 when the episode is read,
    and an mp4's blocks are kept while it is open (FFmpeg reads its start, its index at the end, then
    seeks back: a single read-ahead range fetched the same bytes at every turn)."""
    hub.add_dataset("me/ds", raw)
    _assert_same(_stream(str(raw)), _stream("me/ds"))
    meta = [p for _, p, _ in hub.requests("GET", "/resolve/") if "/meta/" in p]
    assert len(meta) == len(set(meta)) == len(list((raw / "meta").rglob("*.*")))
    mp4s = [p for _, p, _ in hub.requests("GET", ".mp4")]
    episodes = Counter(v.path for e in LeRobotV3Source(str(raw)).episodes for v in e.videos.values())
    assert {_rel(p) for p in mp4s} == set(episodes)
    for name in set(mp4s):  # its header read, its sample tables (one block each: the files are small), then
        # its episodes' bytes: the first read takes the rest of the file, another only when an episode before it is next
        rel = _rel(name)
        assert 3 <= mp4s.count(name) <= 2 + episodes[rel], (name, mp4s.count(name))
    fs, path = url_to_fs(resolve_source("me/ds"))
    rel = "videos/observation.images.front/chunk-000/file-000.mp4"
    hub.clear_log()
    with fs.open(f"{path}/{rel}", block_size=4096) as f:  # FFmpeg's pattern: start, end, start again
        got = [f.read(100), f.seek(-100, 2) and f.read(100), f.seek(10) and f.read(100), f.seek(-50, 2) and f.read(50)]
    data = (raw / rel).read_bytes()
    assert got == [data[:100], data[-100:], data[10:110], data[-50:]]
    assert len(hub.requests("GET", ".mp4")) == 2  # the first block and the last


def test_a_mixture_file_takes_a_repo_id(hub: HubServer, raw: Path, tmp_path: Path) -> None:
    from lerobot_shards.loader.mix.spec import load_mixture

    sha = hub.add_dataset("me/ds", raw)
    (tmp_path / "local").symlink_to(raw)
    file = tmp_path / "mix.yaml"
    file.write_text("sources:\n  - {source: me/ds, weight: 1}\n  - {source: local, weight: 1}\n")
    assert [s.source for s in load_mixture(file).sources] == ["me/ds", str(tmp_path / "local")]
    shown = _cli("inspect", str(file))
    assert shown.returncode == 0 and f"hf://datasets/me/ds@{sha}" not in shown.stderr, shown.stderr
    assert "me/ds" in shown.stdout


def test_an_hf_url_reads_as_written(hub: HubServer, raw: Path) -> None:
    hub.add_dataset("me/ds", raw)
    assert resolve_source("hf://datasets/me/ds") == "hf://datasets/me/ds"
    src = LeRobotV3Source("hf://datasets/me/ds@main")
    assert [e.episode_index for e in src.episodes] == [0, 1, 2, 3]
    fs, path = url_to_fs("hf://datasets/me/ds")
    data = fs.cat_file(f"{path}/data/chunk-000/file-000.parquet", start=2, end=9)
    assert data == (raw / "data/chunk-000/file-000.parquet").read_bytes()[2:9]
    assert [s for _, _, s in hub.requests("GET", "data/chunk-000/file-000.parquet")] == [206]  # one ranged GET
    assert fs.cat_file(f"{path}/meta/info.json", start=2, end=9) == (raw / "meta/info.json").read_bytes()[2:9]


@pytest.mark.slow
def test_convert_inspect_and_verify_take_a_repo_id(hub: HubServer, fixture_root: Path, tmp_path: Path) -> None:
    sha = hub.add_dataset("lerobot/so101", fixture_root)
    out = str(tmp_path / "out")
    done = _cli("convert", "lerobot/so101", out, "--episodes-per-shard", "2", "--no-progress")
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert f"lerobot/so101@{sha}" in json.dumps(manifest)  # the pinned commit is what was converted
    shown = _cli("inspect", "lerobot/so101", "--revision", "v3.0")
    assert shown.returncode == 0 and f"lerobot/so101@{sha}\n  episodes 4, frames 1492" in shown.stdout, shown
    checked = _cli("verify", out, "--source", "lerobot/so101", "--no-progress")
    assert checked.returncode == 0, checked.stdout + checked.stderr


# -- a private repo, a wrong token, a paused or failing Hub ---------------------------------------


def test_a_private_repo_needs_the_token(
    hub: HubServer, raw: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hub.add_dataset("me/private", raw, private=True)
    with pytest.raises(HubNotFound, match="private.*no token was given"):
        resolve_source("me/private")
    monkeypatch.setenv("HF_TOKEN", VALID_TOKEN)
    _assert_same(_stream(str(raw)), _stream("me/private"))
    done = _cli("-vv", "convert", "me/private", str(tmp_path / "out"), "--episodes-per-shard", "2", "--no-progress")
    assert done.returncode == 0, done.stderr
    written = b"".join(p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert VALID_TOKEN.encode() not in written and VALID_TOKEN not in done.stdout + done.stderr
    token_file = Path(os.environ["HF_HOME"]) / "token"  # the stored login (hf auth login) works too
    token_file.write_text(VALID_TOKEN)
    monkeypatch.delenv("HF_TOKEN")
    assert resolve_source("me/private").startswith("hf://datasets/me/private@")


def test_a_wrong_token_is_an_authentication_error_that_does_not_show_it(
    hub: HubServer, raw: Path, tmp_path: Path
) -> None:
    hub.add_dataset("me/private", raw, private=True)
    wrong = "hf_wrongwrongwrongwrongwrong0123"
    done = _cli("inspect", "me/private", env={"HF_TOKEN": wrong})
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "authentication error" in lines[0] and "HF_TOKEN" in lines[0], done.stderr
    assert wrong not in done.stderr + done.stdout
    (Path(os.environ["HF_HOME"]) / "token").write_text(wrong)
    with pytest.raises(HubAuthError, match="stored login") as e:
        resolve_source("me/private")
    assert wrong not in str(e.value)


def test_a_paused_hub_is_one_line_within_the_deadline(hub: HubServer, raw: Path) -> None:
    hub.add_dataset("me/ds", raw)
    hub.pause()
    done = _cli("inspect", "me/ds", "--storage-options", json.dumps(FAST))
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert "Hugging Face Hub did not serve it within 3 s" in lines[0] and "endpoint_url" not in lines[0]
    assert hub.url.split("//")[1] not in done.stderr


def test_a_hub_pausing_mid_read_names_the_file(hub: HubServer, raw: Path) -> None:
    hub.add_dataset("me/ds", raw)
    url = resolve_source("me/ds")
    # opened on the running server with the default timeouts (FAST's 0.5 s, under load, took the
    # running server for a paused one); the read, on the paused server, with FAST's
    src, (fast, _) = LeRobotV3Source(url), url_to_fs(url, **FAST)
    hub.pause()
    with pytest.raises(HubUnavailable, match=r"hf://datasets/me/ds@\w+/data/chunk-000/file-000.parquet: the Hugging"):
        fast.cat_file(src._abs("data/chunk-000/file-000.parquet"))


def test_offline_mode_asks_the_hub_nothing(hub: HubServer, raw: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add_dataset("me/ds", raw)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnavailable, match="me/ds: HF_HUB_OFFLINE is set"):
        resolve_source("me/ds")
    assert not hub.requests()


def test_rate_limits_and_server_errors_are_retried(hub: HubServer, raw: Path) -> None:
    hub.add_dataset("me/ds", raw)
    hub.fail(429, path_contains="/refs", retry_after=1)
    hub.fail(500, times=2, path_contains="/revision/")
    hub.fail(503, path_contains="/tree/")
    hub.fail(502, times=2, path_contains="/resolve/")
    started = time.monotonic()
    url = resolve_source("me/ds")
    assert time.monotonic() - started >= 1.0  # Retry-After was waited out
    _assert_same(_stream(str(raw)), _stream(url))
    statuses = [s for _, _, s in hub.requests()]
    assert statuses.count(429) == 1 and statuses.count(500) == 2 and statuses.count(502) == 2
    hub.fail(500, times=1000, path_contains="/refs")
    with pytest.raises(HubUnavailable, match="last: HTTP 500"):
        resolve_source("me/other", storage_options=FAST)


LIES = {  # what a Hub (or a proxy before it) may put in a tree listing, and the error's words
    "negative size": (lambda e: e.update(size=-5), r"gives data/chunk-000/file-000.parquet the size -5, not a whole"),
    "size as text": (lambda e: e.update(size="abc"), r"the size 'abc', not a whole number >= 0"),
    "no size": (lambda e: e.pop("size"), r"the size None, not a whole number >= 0"),
    "fractional size": (lambda e: e.update(size=e["size"] + 0.5), r"the size \d+\.5, not a whole number"),
    "a path up and out": (
        lambda e: e.update(path="../../other/" + e["path"]),
        r"names a path outside it \(path = '\.\./\.\./other/.*': part '\.\.' is a directory reference",
    ),
    "an absolute path": (lambda e: e.update(path="/etc/" + e["path"]), r"names a path outside it .* absolute path"),
    "no path": (lambda e: e.update(path=None), r"names a path outside it \(path = None is not a relative path"),
    "an mp4 half its size": (
        lambda e: e.update(size=e["size"] // 2) if e["path"].endswith(".mp4") else None,
        r"/videos/.*\.mp4: the Hub's tree listing gives \d+ bytes, its answer \d+; retry",
    ),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_tree_listing_that_lies_is_one_line_naming_the_repo_and_entry(
    hub: HubServer, raw: Path, monkeypatch: pytest.MonkeyPatch, lie: str
) -> None:
    """Sizes that are no sizes were a bare KeyError or ValueError, or "not a readable mp4" (the
    listing's size clipped the reads); paths outside the repo entered the file system's listing."""
    import hub_server

    edit, message = LIES[lie]
    entry = hub_server._File.entry

    def lying(self, rel: str) -> dict:
        out = entry(self, rel)
        edit(out)
        return out

    monkeypatch.setattr(hub_server._File, "entry", lying)
    hub.add_dataset("me/ds", raw)
    with pytest.raises(HubListingError, match=message) as raised:
        _stream("hf://datasets/me/ds")
    assert "\n" not in str(raised.value) and "me/ds" in str(raised.value)


@pytest.mark.parametrize("bframes", [0, 2])
def test_a_raw_mp4_on_the_hub_is_indexed_from_its_tables_not_scanned(
    hub: HubServer, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, bframes: int
) -> None:
    """torchcodec's exact seek mode demuxes a whole file before its first frame: a raw camera file
    read from the Hub is indexed from its moov instead, so decoding an episode reads the file's start,
    its tables and that episode's frames. A file whose tables are not read so (B-frames) is scanned as
    before. Either way the frames are those the local file's exact scan gives."""
    from lerobot_shards.loader.decoding import decoders
    from lerobot_shards.loader.read.sources import ClipRef
    from lerobot_shards.storage import StorageLocation

    raw = synth_dataset(
        tmp_path_factory.mktemp("seek") / "raw",
        num_episodes=4,
        cameras=CAMS[:1],
        episodes_per_video_file=4,
        length_range=(30, 30),
        texture="realistic",
        height=240,
        width=320,
        gop=4,
        bframes=bframes,
        seed=1,
    )
    hub.add_dataset("me/ds", raw)
    monkeypatch.setattr(decoders, "REMOTE_BLOCK_BYTES", 4096)  # the file is many blocks
    url, rel = resolve_source("me/ds"), f"videos/{CAMS[0]}/chunk-000/file-000.mp4"
    hub.clear_log()
    remote = decoders.DecoderCache(1, None, StorageLocation(url))
    frames = remote.frames(ClipRef("hub", None, f"{url}/{rel}", 30, None), [0, 1, 5])  # episode 1's
    remote.close()
    assert [read_identity(f) for f in frames] == [(1, 0), (1, 1), (1, 5)]
    local = decoders.DecoderCache(1)
    assert torch.equal(frames, local.frames(ClipRef("local", None, str(raw / rel), 30, None), [0, 1, 5]))
    local.close()
    size = (raw / rel).stat().st_size
    if bframes:
        assert hub.bytes_served(rel) >= size
    else:
        assert hub.bytes_served(rel) < size / 2, (hub.bytes_served(rel), size)


def test_a_cache_dir_another_user_could_fill_is_refused_for_raw_mp4s(hub: HubServer, raw: Path, tmp_path: Path) -> None:
    """A raw dataset's mp4 in ``cache_dir`` is checked against the xxh3 recorded there at download:
    whoever else may write the directory could plant an mp4 of other frames and its record. So, as
    for the frame cache, a directory another user made or every user may write is one line naming it
    (a converted dataset's shards are checked against its manifest: its cache_dir is not refused)."""
    from lerobot_shards.loader.read.shard_cache import CacheDirError

    hub.add_dataset("me/ds", raw)
    everyones = tmp_path / "everyones"
    everyones.mkdir()
    everyones.chmod(0o777)
    with pytest.raises(CacheDirError, match=rf"cache_dir {everyones}: every user may write it \(mode 777\)"):
        _stream("me/ds", cache_dir=str(everyones))
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 4242, -1)
        with pytest.raises(CacheDirError, match=rf"cache_dir {theirs}: made by another user \(uid 4242\)"):
            _stream("me/ds", cache_dir=str(theirs))


@pytest.mark.parametrize("bframes", [0, 2])
def test_a_raw_episode_is_cut_out_of_its_remote_mp4_from_the_keyframe_before_it(
    hub: HubServer, tmp_path_factory: pytest.TempPathFactory, bframes: int
) -> None:
    """Without a cache, a raw episode's frames are fetched when it is read, as a clip cut from the
    keyframe at or before its first frame: the frames are the whole file's, also from mid-GOP. The
    read takes a window of the file, from which the next episode is cut without a request. A file
    whose frames are not in decode order (B-frames) is not cut: it is decoded from storage, and
    the samples are the local copy's either way."""
    from lerobot_shards.loader.decoding.decoders import DecoderCache
    from lerobot_shards.loader.read.sources import ClipRef, RawSource

    raw = synth_dataset(
        tmp_path_factory.mktemp("cut") / "raw",
        num_episodes=2,
        cameras=CAMS[:1],
        episodes_per_video_file=2,
        length_range=(20, 20),
        gop=4,
        bframes=bframes,
        seed=2,
    )
    hub.add_dataset("me/cut", raw)
    rel = f"videos/{CAMS[0]}/chunk-000/file-000.mp4"
    source = RawSource(resolve_source("me/cut"))
    hub.clear_log()
    cut = source._cut(rel, 25, 10, "here")  # episode 1's frames 5..14: frame 25 is no keyframe (gop 4)
    if bframes:
        assert cut is None
        _assert_same(_stream(str(raw)), _stream("me/cut"))
    else:
        assert cut is not None and cut[1] == 1  # the clip starts at keyframe 24
        assert len(hub.requests("GET", rel)) == 2  # the sample tables (one block), then a window of the file
        decoders = DecoderCache(1)
        for (data, at, mappings), first in ((cut, 25), (source._cut(rel, 35, 5, "here"), 35)):
            frames = decoders.frames(ClipRef(f"cut{first}", data, None, at, mappings), range(5))
            assert [read_identity(f) for f in frames] == [(1, i) for i in range(first - 20, first - 15)]
            whole = decoders.frames(ClipRef("local", None, str(raw / rel), first, None), range(5))
            assert torch.equal(frames, whole)
        assert len(hub.requests("GET", rel)) == 2  # frames 35..39 came from the window
        decoders.close()
    source.close()
