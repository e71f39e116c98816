"""``lerobot-shards train``'s decoded-frame cache and partition choices, on real directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from lerobot_shards.integrations.frame_cache_choice import (
    DEFAULT_NAME,
    HEADROOM,
    choose_frame_cache,
    choose_partition,
    free_bytes,
    held_bytes,
)
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.synth import read_identity, synth_dataset


@pytest.fixture
def tmpdir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    return tmp_path


def test_auto_turns_it_on_in_tmpdir_when_the_frames_fit(tmpdir_env: Path) -> None:
    choice = choose_frame_cache("auto", 10 << 20)
    assert choice.directory == str(tmpdir_env / f"{DEFAULT_NAME}-{os.geteuid()}")  # the user's own
    assert choice.max_bytes is not None and choice.max_bytes >= int((10 << 20) * HEADROOM)
    assert "on in" in choice.line() and f"{DEFAULT_NAME}-{os.geteuid()}, at most" in choice.line()
    assert "--shards.frame_cache=off" in choice.line()


def test_auto_leaves_it_off_saying_why_when_they_do_not_fit(tmpdir_env: Path) -> None:
    choice = choose_frame_cache("auto", 4 * free_bytes(str(tmpdir_env)))
    assert choice.directory is None and choice.max_bytes is None
    assert "cache off (the decoded frames need" in choice.line()
    assert "give --shards.frame_cache=DIR on a larger local disk" in choice.line()


def test_a_cache_already_there_counts_as_room(tmp_path: Path) -> None:
    """A re-run reuses the entries it left: their bytes are room for this run's frames."""
    held = tmp_path / DEFAULT_NAME / "frames"
    held.mkdir(parents=True)
    (held / "entry").write_bytes(b"x" * (3 << 20))
    (held / "other").write_bytes(b"x" * (1 << 20))
    assert held_bytes(str(tmp_path / DEFAULT_NAME)) == 4 << 20
    assert held_bytes(str(tmp_path / "absent")) == 0


def test_off_and_a_given_directory(tmp_path: Path) -> None:
    assert choose_frame_cache("off", 1).directory is None
    assert "cache off (turned off;" in choose_frame_cache("off", 1).line()
    given = choose_frame_cache(str(tmp_path / "mine"), 4 * free_bytes(str(tmp_path)))
    assert given.directory == str(tmp_path / "mine")  # on, bounded by its room: LRU evicts the rest
    assert given.max_bytes is not None and 0 < given.max_bytes < 4 * free_bytes(str(tmp_path))


def test_partition_is_node_sticky_unless_a_mixture_a_checkpoint_or_the_setting_says_otherwise() -> None:
    assert choose_partition("auto", False, None) == ("node", "each node's caches hit from the second epoch")
    assert choose_partition("auto", True, None) == ("global", "a mixture has no node partition yet")
    assert choose_partition("auto", False, {"nodes": 1}) == ("global", "the checkpoint's")
    assert choose_partition("auto", False, {"nodes": 2}) == ("node", "the checkpoint's")
    assert choose_partition("auto", False, {"epoch": 0}) == ("global", "the checkpoint's")  # saved before nodes
    assert choose_partition("global", False, None) == ("global", "given")


def test_the_chosen_cache_is_set_on_an_open_dataset_and_serves_the_frames_asked_for(tmp_path: Path) -> None:
    """``lerobot-shards train``'s way: open the dataset, size the cache by ``decoded_bytes``, set it;
    the frames then come through the cache, and are the frames asked for."""
    cam = "observation.images.front"
    root = synth_dataset(tmp_path / "ds", num_episodes=3, cameras=(cam,), height=64, width=96, length_range=(9, 12))
    ds = EpisodePoolDataset(str(root), resize=(32, 48), image_dtype=torch.uint8, decode_threads=0)
    frames = sum(n for s in ds.shards for n in s.lengths)
    assert ds.decoded_bytes == frames * 32 * 48 * 3
    choice = choose_frame_cache(str(tmp_path / "frames"), ds.decoded_bytes)
    assert choice.directory is not None
    ds.set_frame_cache(choice.directory, choice.max_bytes)
    assert (ds.decode.frame_cache_dir, ds.decode.frame_cache_bytes) == (choice.directory, choice.max_bytes)
    for epoch, fills in ((0, 3), (1, 0)):  # each episode filled once, then read back
        ds.set_epoch(epoch)
        seen = [(int(s["episode_index"]), int(s["frame_index"]), read_identity(s[cam])) for s in ds]
        assert all(identity == (e, f) for e, f, identity in seen) and len(seen) == frames
        assert ds.stats()["total"]["frame_cache_fills"] == fills
    assert ds.stats()["total"]["frame_cache_misses"] == 0 and ds.stats()["total"]["frame_cache_hits"] > 0
    ds.set_frame_cache(None)
    assert ds.decode.frame_cache_dir is None


def _as_another_user(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a directory another user's needs root")
    os.chown(path, os.geteuid() + 4242, -1)


def test_a_directory_another_user_made_or_everyone_writes_is_refused(small_synth: Path, tmp_path: Path) -> None:
    """Anyone who may write the cache can plant well-formed entries of wrong frames (the checksums
    are the directory's own): /tmp/lerobot-shards-frames, made by whoever ran first on a shared node,
    was the default of every user."""
    from lerobot_shards.loader.read.shard_cache import CacheDirError

    theirs, everyones = tmp_path / "theirs", tmp_path / "everyones"
    theirs.mkdir()
    everyones.mkdir()
    everyones.chmod(0o777)
    _as_another_user(theirs)
    with pytest.raises(CacheDirError, match=rf"frame_cache_dir {theirs}: made by another user \(uid \d+\), who"):
        EpisodePoolDataset(str(small_synth), frame_cache_dir=str(theirs))
    with pytest.raises(CacheDirError, match=rf"frame_cache_dir {everyones}: every user may write it \(mode 777\)"):
        EpisodePoolDataset(str(small_synth), frame_cache_dir=str(everyones))
    link = tmp_path / "link"
    link.symlink_to(theirs)
    with pytest.raises(CacheDirError, match="made by another user"):
        EpisodePoolDataset(str(small_synth), frame_cache_dir=str(link))
    assert not list(theirs.iterdir()) and not list(everyones.iterdir())  # nothing made there first
    # a folder above it that every user may write (no sticky bit): they could swap the cache for theirs
    with pytest.raises(
        CacheDirError, match=rf"frame_cache_dir {everyones / 'mine'}: every user may write {everyones} "
    ):
        EpisodePoolDataset(str(small_synth), frame_cache_dir=str(everyones / "mine"))
    assert not list(everyones.iterdir())
    everyones.chmod(0o1777)  # as /tmp: each user's entries are theirs alone
    EpisodePoolDataset(str(small_synth), frame_cache_dir=str(everyones / "mine"))


def test_auto_leaves_it_off_when_its_directory_is_another_users(tmpdir_env: Path) -> None:
    (tmpdir_env / f"{DEFAULT_NAME}-{os.geteuid()}").mkdir()
    _as_another_user(tmpdir_env / f"{DEFAULT_NAME}-{os.geteuid()}")
    choice = choose_frame_cache("auto", 10 << 20)
    assert choice.directory is None and "made by another user" in choice.line() and "cache off" in choice.line()
