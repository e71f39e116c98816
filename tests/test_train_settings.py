"""``lerobot-shards train``'s own settings: arguments, environment defaults, what a checkpoint records
(never a secret) and what a resume restores. The command itself runs in tests/lerobot/test_train.py."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from lerobot_shards.integrations.train_settings import (
    STATE_MAX_BYTES,
    TrainSettings,
    read_data_state,
    resolve,
    split_args,
    usage,
)

SECRET = "never-stored-9f3c"
OPTIONS = {"key": "AKIDEXAMPLE", "secret": SECRET, "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}


def test_our_arguments_are_taken_out_of_lerobots() -> None:
    given, rest = split_args(
        ["--policy.type=act", "--shards.episode_pool_size=4", "--shards.cache_dir", "/tmp/c", "--steps=3"]
    )
    assert given == {"episode_pool_size": "4", "cache_dir": "/tmp/c"}
    assert rest == ["--policy.type=act", "--steps=3"]
    with pytest.raises(ValueError, match=r"unknown --shards.pool_size; known: storage_options, cache_dir, "):
        split_args(["--shards.pool_size=4"])
    with pytest.raises(ValueError, match=r"--shards.cache_dir needs a value"):
        split_args(["--shards.cache_dir"])
    with pytest.raises(ValueError, match=r"--shards.cache_dir given twice"):
        split_args(["--shards.cache_dir=/a", "--shards.cache_dir=/b"])
    assert all(f"--shards.{f.name}" in usage() for f in dataclasses.fields(TrainSettings))


def test_every_setting_reads_its_type_and_refuses_a_bad_value_naming_it() -> None:
    s = resolve(
        {
            "storage_options": json.dumps(OPTIONS),
            "cache_dir": "/tmp/c",
            "episode_pool_size": "4",
            "equal_samples_per_rank": "false",
            "slab_layout": "contiguous",
            "sample_log": "/tmp/log",
        },
        None,
        {},
    )
    assert s == TrainSettings(OPTIONS, "/tmp/c", 4, False, "contiguous", "/tmp/log")
    assert resolve({"equal_samples_per_rank": "null", "cache_dir": "none"}, None, {}) == TrainSettings()
    bad = {
        "episode_pool_size": ("0", r"--shards.episode_pool_size \(or \$LEROBOT_SHARDS_EPISODE_POOL_SIZE\) must be a"),
        "storage_options": ("[1]", r"--shards.storage_options .* must be a JSON object"),
        "data_files_storage_options": ("[1]", r"--shards.data_files_storage_options .* must be a JSON object"),
        "equal_samples_per_rank": ("yes", r"--shards.equal_samples_per_rank must be true or false, got 'yes'"),
        "slab_layout": ("nchw", r"--shards.slab_layout .* must be 'sample' or 'contiguous', got 'nchw'"),
        "frame_cache": (" ", r"--shards.frame_cache .* must be 'auto', 'off' or a directory, got ''"),
        "partition": ("rack", r"--shards.partition .* must be 'auto' or 'global' or 'node', got 'rack'"),
        "frame_cache_pixels": ("nv12", r"--shards.frame_cache_pixels .* must be 'yuv420p' or 'rgb', got 'nv12'"),
    }
    assert sorted(bad) == sorted(f.name for f in dataclasses.fields(TrainSettings) if f.type != "str | None")
    for name, (text, message) in bad.items():
        with pytest.raises(ValueError, match=message):
            resolve({name: text}, None, {})
    with pytest.raises(ValueError, match=r"LEROBOT_SHARDS_STORAGE_OPTIONS is not JSON"):
        resolve({}, None, {"LEROBOT_SHARDS_STORAGE_OPTIONS": "notjson"})


def test_the_command_line_then_the_checkpoint_then_the_environment() -> None:
    env = {"LEROBOT_SHARDS_EPISODE_POOL_SIZE": "2", "LEROBOT_SHARDS_CACHE_DIR": "/env/cache"}
    assert resolve({}, None, env) == TrainSettings(cache_dir="/env/cache", episode_pool_size=2)
    first = resolve({"episode_pool_size": "4"}, None, env)
    recorded = json.loads(json.dumps(first.recorded()))  # as a checkpoint holds it
    other_shell = {
        "LEROBOT_SHARDS_EPISODE_POOL_SIZE": "8",
        "LEROBOT_SHARDS_CACHE_DIR": "/other",
        "LEROBOT_SHARDS_SAMPLE_LOG": "/log",
    }
    resumed = resolve({}, recorded, other_shell)
    assert (resumed.episode_pool_size, resumed.cache_dir) == (4, "/env/cache")  # the checkpoint's
    assert resumed.sample_log == "/log"  # where this process writes its audit trail: never recorded
    assert resolve({"episode_pool_size": "3"}, recorded, other_shell).episode_pool_size == 3  # given wins


def test_storage_secrets_are_never_recorded_and_a_resume_takes_them_from_its_shell() -> None:
    first = resolve({"storage_options": json.dumps(OPTIONS)}, None, {})
    text = json.dumps(first.recorded())
    assert SECRET not in text and "AKIDEXAMPLE" not in text
    assert json.loads(text)["storage_options"] == {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}
    shell = {"LEROBOT_SHARDS_STORAGE_OPTIONS": json.dumps({"secret": "s2", "key": "k2", "anon": True})}
    resumed = resolve({}, json.loads(text), shell)
    assert resumed.storage_options == {
        "key": "k2",
        "secret": "s2",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
    }
    assert resolve({}, json.loads(text), {}).storage_options == {
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}
    }


def test_a_data_files_root_is_recorded_with_its_options_less_their_secrets_and_restored() -> None:
    given, rest = split_args(
        [
            "--dataset.repo_id=lerobot/pusht",
            "--shards.data_files_root=s3://mirror/pusht",
            f"--shards.data_files_storage_options={json.dumps(OPTIONS)}",
        ]
    )
    assert rest == ["--dataset.repo_id=lerobot/pusht"]
    first = resolve(given, None, {})
    assert (first.data_files_root, first.data_files_storage_options) == ("s3://mirror/pusht", OPTIONS)
    text = json.dumps(first.recorded())
    assert SECRET not in text and "AKIDEXAMPLE" not in text
    recorded = json.loads(text)
    assert recorded["data_files_root"] == "s3://mirror/pusht"
    shell = {
        "LEROBOT_SHARDS_DATA_FILES_ROOT": "/elsewhere",  # another shell's: the checkpoint's wins
        "LEROBOT_SHARDS_DATA_FILES_STORAGE_OPTIONS": json.dumps({"secret": "s2", "key": "k2"}),
    }
    resumed = resolve({}, recorded, shell)
    assert resumed.data_files_root == "s3://mirror/pusht"
    assert resumed.data_files_storage_options == {**OPTIONS, "key": "k2", "secret": "s2"}
    assert resumed.storage_options is None  # the metadata's options are not the data files'
    assert resolve({"data_files_root": "/given"}, recorded, shell).data_files_root == "/given"
    with pytest.raises(ValueError, match=r"--shards.data_files_storage_options given without data_files_root"):
        resolve({"data_files_storage_options": "{}"}, None, {})
    with pytest.raises(ValueError, match=r"--shards.data_files_storage_options .* must be a JSON object"):
        resolve({"data_files_root": "/d", "data_files_storage_options": "[1]"}, None, {})


def test_a_checkpoints_settings_are_checked_naming_its_file_and_hold_no_secret() -> None:
    """A checkpoint's settings edited by hand: a bad value was blamed on --shards.NAME (which the user
    never gave), and a secret put there was used; it is dropped (a resume takes secrets from its shell)."""
    where = "/run/checkpoints/000010/training_state/lerobot_shards_data.json"
    for name, value in [
        ("episode_pool_size", -3),
        ("episode_pool_size", True),
        ("cache_dir", ["/etc"]),
        ("equal_samples_per_rank", 1),
        ("partition", "rack"),
        ("storage_options", "secret-in-a-string"),
    ]:
        with pytest.raises(ValueError, match=rf"^lerobot-shards train: {where}: settings\.{name} must be ") as raised:
            resolve({}, {name: value}, {}, recorded_in=where)
        assert "secret-in-a-string" not in str(raised.value) and f"give --shards.{name} to override" in str(
            raised.value
        )
    with pytest.raises(ValueError, match=rf"{where}: settings is not a JSON object"):
        resolve({}, ["x"], {}, recorded_in=where)  # type: ignore[arg-type]
    planted = {"storage_options": {"secret": SECRET, "client_kwargs": {"region_name": "x"}}}
    resumed = resolve({}, planted, {"LEROBOT_SHARDS_STORAGE_OPTIONS": json.dumps({"key": "k2"})}, recorded_in=where)
    assert resumed.storage_options == {"key": "k2", "client_kwargs": {"region_name": "x"}}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"epoch": 1, "settings": {"cache_dir"', r"not JSON \(JSONDecodeError"),
        (b"[1, 2]", "not a JSON object"),
        (b" " * (STATE_MAX_BYTES + 1), r"more than the 1048576 a metadata file may have"),
        ("fifo", "not a regular file"),
    ],
)
def test_a_damaged_data_state_is_one_line_naming_it(tmp_path, content, message: str) -> None:
    """It was read with Path.read_text and json.loads: a truncated one was a bare JSONDecodeError, a
    list an AttributeError, a FIFO (not is_file()) a resume that silently started the data over."""
    path = tmp_path / "lerobot_shards_data.json"
    assert read_data_state(str(path)) == (None, None)  # none: a checkpoint of LeRobot's own dataset
    if content == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as raised:
        read_data_state(str(path))
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)
    path.unlink()
    path.write_text(json.dumps({"epoch": 2, "settings": {"cache_dir": "/c"}}))
    assert read_data_state(str(path)) == ({"epoch": 2}, {"cache_dir": "/c"})


def test_a_data_files_root_url_is_recorded_without_its_credentials() -> None:
    """A URL's password (``https://user:token@host/...``) was written to every checkpoint as given;
    it is recorded without its user and password, and a resume whose shell gives the same URL with
    them takes the shell's (another URL in the shell: the checkpoint's, without them)."""
    given = {"data_files_root": f"https://me:{SECRET}@mirror.example/pusht"}
    recorded = json.loads(json.dumps(resolve(given, None, {}).recorded()))
    assert SECRET not in json.dumps(recorded) and recorded["data_files_root"] == "https://mirror.example/pusht"
    shell = {"LEROBOT_SHARDS_DATA_FILES_ROOT": f"https://me:{SECRET}@mirror.example/pusht"}
    assert resolve({}, recorded, shell).data_files_root == shell["LEROBOT_SHARDS_DATA_FILES_ROOT"]
    other = {"LEROBOT_SHARDS_DATA_FILES_ROOT": f"https://me:{SECRET}@elsewhere.example/pusht"}
    assert resolve({}, recorded, other).data_files_root == "https://mirror.example/pusht"
    planted = {**recorded, "data_files_root": f"https://me:{SECRET}@mirror.example/pusht"}
    assert resolve({}, planted, {}).data_files_root == "https://mirror.example/pusht"  # put there by hand: dropped
