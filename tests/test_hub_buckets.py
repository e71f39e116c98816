"""Hugging Face storage buckets (``hf://buckets/<namespace>/<bucket>/...``) read from the loopback Hub
server with the real ``huggingface_hub`` client under our Hub file system: a dataset in a bucket,
or a dataset's data files there (``data_files_root``), gives the local samples; listings, rate
limits and server errors are bounded and retried as for dataset repos; a paused Hub is one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hub_server import VALID_TOKEN, HubServer
from lerobot_shards.filesystems import url_to_fs
from lerobot_shards.integrations.hub import HubNotFound
from test_hub import CAMS, FAST, _assert_same, _cli, _stream

WINDOW = {CAMS[1]: [-1 / 30, 0.0]}


def test_a_dataset_in_a_bucket_gives_the_local_samples_listed_once(hub: HubServer, raw: Path) -> None:
    hub.page_size = 4
    hub.add_bucket("me/store", raw, prefix="sets/ds")
    hub.add_bucket("me/store", raw, prefix="sets/other")  # beside it: not listed
    local = _stream(str(raw), delta_timestamps=WINDOW)
    _assert_same(local, _stream("hf://buckets/me/store/sets/ds", delta_timestamps=WINDOW))
    listings = [p for _, p, _ in hub.requests("GET", "/api/buckets/me/store/tree")]
    files = len([p for p in raw.rglob("*") if p.is_file()])
    assert len(listings) == len(set(listings)) == -(-files // 4)  # one recursive listing of sets/ds, each page once
    assert all("sets%2Fds" in p or "sets/ds" in p for p in listings)
    reads = hub.requests("GET", "/buckets/me/store/resolve/sets/ds/")
    assert reads and all(status in (200, 206) for _, _, status in reads)


def test_bucket_rate_limits_and_server_errors_are_retried(hub: HubServer, raw: Path) -> None:
    hub.add_bucket("me/store", raw, prefix="ds")
    hub.fail(429, path_contains="/api/buckets/me/store", retry_after=1)
    hub.fail(503, path_contains="/tree", times=2)
    hub.fail(500, path_contains="/resolve/ds/videos/", times=2)
    _assert_same(_stream(str(raw)), _stream("hf://buckets/me/store/ds"))
    statuses = [s for _, _, s in hub.requests()]
    assert statuses.count(429) == 1 and statuses.count(503) == 2 and statuses.count(500) == 2


def test_a_paused_hub_serving_a_bucket_is_one_line_within_the_deadline(hub: HubServer, raw: Path) -> None:
    hub.add_bucket("me/store", raw, prefix="ds")
    hub.pause()
    done = _cli("inspect", "hf://buckets/me/store/ds", "--storage-options", json.dumps(FAST))
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert "hf://buckets/me/store" in lines[0] and "did not serve it within 3 s" in lines[0], lines[0]


def test_a_private_bucket_needs_the_token_and_data_files_there_take_it(
    hub: HubServer, raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    meta = tmp_path / "meta_only"
    shutil.copytree(raw / "meta", meta / "meta")
    hub.add_dataset("me/ds", meta)
    hub.add_bucket("me/private", raw, prefix="mirror", private=True)
    with pytest.raises(HubNotFound, match="no such bucket on the Hub, or it is private"):
        url_to_fs("hf://buckets/me/private/mirror")[0].ls("buckets/me/private/mirror")
    monkeypatch.setenv("HF_TOKEN", VALID_TOKEN)
    got = _stream("me/ds", delta_timestamps=WINDOW, data_files_root="hf://buckets/me/private/mirror")
    _assert_same(_stream(str(raw), delta_timestamps=WINDOW), got)
    assert not [p for _, p, _ in hub.requests() if "/datasets/me/ds/resolve/" in p and "/meta/" not in p]
