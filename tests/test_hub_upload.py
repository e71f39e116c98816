"""``lerobot-shards upload`` to a Hub dataset repo, against the loopback Hub server (``hub_server``) with
the real ``huggingface_hub`` client on its plain LFS route: the uploaded repo gives the local
samples, a re-run sends no shard again, a run stopped between commits resumes with what is
missing, and no reader ever sees a manifest naming a shard the repo lacks."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch.utils.data import DataLoader

from hub_server import VALID_TOKEN, HubServer
from lerobot_shards.cli import main
from lerobot_shards.convert import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.convert.upload import UploadError
from lerobot_shards.integrations.hub_upload import hub_destination, upload_to_hub
from lerobot_shards.loader import EpisodePoolDataset


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, synth_factory: Callable[..., Path]) -> Path:
    out = tmp_path_factory.mktemp("hub_upload") / "out"
    convert_dataset(synth_factory(), out, ConvertOptions(episodes_per_shard=1), progress=False)
    return out


@pytest.fixture
def writable(hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> HubServer:
    """The server with a token that may write, the client on the plain LFS route: with ``hf_xet``
    installed ``huggingface_hub`` sends bytes by Xet whatever the server offers
    (``_commit_api._upload_files`` asks ``is_xet_available()`` only), a protocol this server lacks."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setenv("HF_TOKEN", VALID_TOKEN)
    return hub


def _samples(source: str) -> list[dict]:
    return list(DataLoader(EpisodePoolDataset(source, seed=3, episode_pool_size=2), batch_size=4))


def _puts(hub: HubServer) -> list[str]:
    return [path for _, path, status in hub.requests("PUT") if status == 200]


def test_an_upload_gives_the_local_samples_and_a_rerun_sends_nothing(writable: HubServer, converted: Path) -> None:
    shards = len(json.loads((converted / "manifest.json").read_text())["shards"])
    summary = upload_to_hub(converted, "me/pusht_shards")
    assert summary.uploaded_files == 2 * shards + 1 and len(_puts(writable)) == shards  # each tar once, by LFS
    local, remote = _samples(str(converted)), _samples("hf://datasets/me/pusht_shards")
    assert len(local) == len(remote) and local
    for x, y in zip(local, remote):
        assert x.keys() == y.keys()
        for key in x:
            assert torch.equal(x[key], y[key]) if isinstance(x[key], torch.Tensor) else x[key] == y[key], key
    writable.clear_log()
    again = upload_to_hub(converted, "me/pusht_shards")
    assert again.uploaded_files == 0 and again.skipped_files == 2 * shards + 1
    assert writable.requests("PUT") == [] and writable.requests("POST", "/commit/") == []


def test_a_stopped_upload_resumes_with_the_missing_shards_and_the_manifest_comes_last(
    writable: HubServer, converted: Path
) -> None:
    names = [s["name"] for s in json.loads((converted / "manifest.json").read_text())["shards"]]
    assert len(names) >= 3

    def stop_after_two(sent: list[str]) -> None:
        files = {f"shards/{n}" for n in sent}
        assert files <= set(_tree(writable, "me/resumed"))
        assert "manifest.json" not in _tree(writable, "me/resumed")  # no reader sees a partial dataset
        if len(_puts(writable)) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        upload_to_hub(converted, "me/resumed", commit_bytes=1, on_commit=stop_after_two)
    writable.clear_log()
    summary = upload_to_hub(converted, "me/resumed")
    assert summary.skipped_files == 4 and summary.uploaded_files == 2 * (len(names) - 2) + 1
    assert len(_puts(writable)) == len(names) - 2  # only the tars not yet there
    assert _samples("hf://datasets/me/resumed")


def _tree(hub: HubServer, repo_id: str) -> set[str]:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.url, token=VALID_TOKEN)
    return {e.path for e in api.list_repo_tree(repo_id, repo_type="dataset", recursive=True)}


def test_the_command_takes_a_repo_id_and_refuses_another_conversion(
    writable: HubServer, converted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["upload", str(converted), "me/by_id", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "me/by_id: uploaded" in result.output and VALID_TOKEN not in result.output
    assert hub_destination("hf://datasets/me/by_id@dev") == ("me/by_id", "dev")
    with pytest.raises(UploadError, match=r"a Hub upload goes to a whole dataset repo"):
        hub_destination("hf://datasets/me/by_id/sub")
    copy = Path(shutil.copytree(converted, tmp_path / "copy"))
    record = json.loads((copy / "convert.json").read_text())
    (copy / "convert.json").write_text(json.dumps({**record, "shuffle_seed": 99}, indent=1, sort_keys=True))
    with pytest.raises(UploadError, match=r"holds a conversion with other settings; pass --overwrite"):
        upload_to_hub(copy, "me/by_id")


def test_a_refused_token_is_named_by_where_it_came_from_never_shown(
    writable: HubServer, converted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_wrong_token_never_shown")
    with pytest.raises(UploadError) as e:
        upload_to_hub(converted, "me/denied")
    assert "refused the token from HF_TOKEN" in str(e.value) and "hf_wrong" not in str(e.value)


@pytest.mark.parametrize("when", ["at the start", "between commits"])
def test_a_paused_hub_ends_an_upload_in_one_line_naming_what_was_sent(
    writable: HubServer, converted: Path, when: str
) -> None:
    """A Hub that stops answering (the connection open, no answer) ends the upload after one request's
    ``timeout`` of silence, in one line naming what was being sent; the upload resumes once it answers."""
    names = [s["name"] for s in json.loads((converted / "manifest.json").read_text())["shards"]]

    def pause_after_one(sent: list[str]) -> None:
        writable.pause()

    if when == "at the start":
        writable.pause()
    try:
        with pytest.raises(UploadError) as failure:
            upload_to_hub(converted, "me/paused", commit_bytes=1, on_commit=pause_after_one, timeout=0.5)
    finally:
        writable.resume()
    text = str(failure.value)
    sent = "" if when == "at the start" else f"/shards/{names[1]}"
    assert text.startswith(f"hf://datasets/me/paused@main{sent}: the Hugging Face Hub did not take it (no answer "), (
        text
    )
    assert "\n" not in text and "run the upload again" in text
    assert upload_to_hub(converted, "me/paused").uploaded_files >= 1  # resumed
    assert _samples("hf://datasets/me/paused")


def test_a_failing_hub_ends_an_upload_in_one_line_naming_what_was_sent(writable: HubServer, converted: Path) -> None:
    """A commit the Hub refuses (HTTP 500) ends the upload in one line naming the shard it held."""
    names = [s["name"] for s in json.loads((converted / "manifest.json").read_text())["shards"]]

    def fail_the_next_commit(sent: list[str]) -> None:
        if sent == [names[0]]:
            writable.fail(500, path_contains="/commit/")

    with pytest.raises(UploadError) as failure:
        upload_to_hub(converted, "me/failing", commit_bytes=1, on_commit=fail_the_next_commit, timeout=5)
    text = str(failure.value)
    assert text.startswith(f"hf://datasets/me/failing@main/shards/{names[1]}: the Hub answered HTTP 500"), text
    assert "\n" not in text
