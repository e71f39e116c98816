"""``lerobot-shards train``'s own settings: ``--shards.NAME=VALUE`` arguments beside LeRobot's.

Each setting is one field of ``TrainSettings``, with its comment and its check; its type says how
its text is read (``int``, ``bool``, a path, a JSON object, a ``Literal`` choice; ``null`` is
None). Each defaults to the environment variable ``LEROBOT_SHARDS_<NAME>`` (the settings' only
source before they were arguments), and every checkpoint records them beside the data position
(``training_state/lerobot_shards_data.json``, key ``settings``). A resume (``--resume=true``)
takes the checkpoint's, so another shell's environment cannot change the run; an argument given
on the resuming command line still wins, as LeRobot's own arguments win over its saved config.

Storage options (the dataset's and its data files root's) are recorded without their secrets
(``redaction.split_secrets``: keys, tokens, passwords), a data files root URL without the user and
password of its authority: a resume takes those from its own arguments or environment, the rest
from the checkpoint. Fields marked ``recorded=False`` (where this process
writes its audit trail) are never taken from a checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import fsspec

from ..redaction import split_secrets, without_credentials
from ..safe_io import read_small

PREFIX = "--shards."
SETTINGS_KEY = "settings"  # our settings in a checkpoint's data state, beside the data position
STATE_MAX_BYTES = 1 << 20  # a data state is a few hundred bytes: a larger file is not one
ENV_PREFIX = "LEROBOT_SHARDS_"
SlabLayout = Literal["sample", "contiguous"]
TrainPartition = Literal["auto", "global", "node"]
FramePixels = Literal["yuv420p", "rgb"]  # loader.options.FramePixels
# The settings holding fsspec options: recorded without their secrets, which a resume takes from its shell.
OPTION_FIELDS = ("storage_options", "data_files_storage_options")
# The settings holding a URL: recorded without the user and password of its authority (a resume takes
# the URL with them from its shell or command line where it is the same URL).
URL_FIELDS = ("data_files_root",)


@dataclass(frozen=True)
class TrainSettings:
    """What ``lerobot-shards train`` reads its data with, beyond ``lerobot-train``'s arguments."""

    # fsspec options of the dataset's storage, a JSON object (e.g. the S3 endpoint and keys).
    storage_options: dict[str, Any] | None = None
    # Local directory where remote shards (and a raw dataset's mp4s) are cached, shared on the node.
    cache_dir: str | None = None
    # Episodes resident per consumer (the loader's episode_pool_size).
    episode_pool_size: int = 16
    # Every rank the same number of batches; null: a resumed checkpoint's, else on with several ranks.
    equal_samples_per_rank: bool | None = None
    # Image batches from workers keep the decoded frames' channels-last memory ("sample"), or are
    # contiguous as default_collate's ("contiguous": a policy that .views them across channels).
    slab_layout: SlabLayout = "sample"
    # A directory where each rank appends the index of every batch it took (an audit trail).
    sample_log: str | None = field(default=None, metadata={"recorded": False})
    # The node-local decoded-frame cache: "auto" (on in $TMPDIR when the node's disk has room for
    # the decoded frames), "off", or a directory (on there, bounded by its room): frame_cache_choice.
    frame_cache: str = "auto"
    # How its entries keep frames: the decoder's YUV 4:2:0 where that converts back bit for bit (half
    # the bytes, a conversion at each read), or "rgb" always (DecodeOptions.frame_cache_pixels).
    frame_cache_pixels: FramePixels = "yuv420p"
    # "auto": node-sticky, each node reading its own part every epoch (a mixture: "global"; a resume:
    # the checkpoint's); "global" for a run that must resume on another node count.
    partition: TrainPartition = "auto"
    # Where a raw dataset's data files (data/, videos/: parquet, mp4) are when not beside its meta/:
    # a bucket mirror (s3://...), hf://buckets/..., a local folder (ReadOptions.data_files_root).
    data_files_root: str | None = None
    # fsspec options for data_files_root, a JSON object (storage_options, the metadata's, never go there).
    data_files_storage_options: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            allowed = _problem(f.name, getattr(self, f.name))
            if allowed is not None:
                raise ValueError(_bad(f.name, allowed, getattr(self, f.name)))
        if self.data_files_storage_options is not None and self.data_files_root is None:
            raise ValueError(f"lerobot-shards train: {PREFIX}data_files_storage_options given without data_files_root")

    def recorded(self) -> dict[str, Any]:
        """What a checkpoint keeps: every recorded field, the storage options without their secrets."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("recorded", True)}
        for name in OPTION_FIELDS:
            if getattr(self, name) is not None:
                out[name] = split_secrets(getattr(self, name))[0]
        for name in URL_FIELDS:
            if getattr(self, name) is not None:
                out[name] = without_credentials(getattr(self, name))
        return out


def _problem(name: str, value: Any) -> str | None:
    """What setting ``name`` must be, when ``value`` is not that; None when it is."""
    if name in OPTION_FIELDS:
        ok = value is None or isinstance(value, dict)
        return None if ok else "a JSON object of fsspec options"
    if name in ("cache_dir", "sample_log", "data_files_root"):
        return None if value is None or isinstance(value, str) else "a path"
    if name == "episode_pool_size":
        return None if not isinstance(value, bool) and isinstance(value, int) and value >= 1 else "a whole number >= 1"
    if name == "equal_samples_per_rank":
        return None if value is None or isinstance(value, bool) else "true, false or null"
    if name in ("slab_layout", "partition", "frame_cache_pixels"):
        kind = {"slab_layout": SlabLayout, "partition": TrainPartition, "frame_cache_pixels": FramePixels}[name]
        choices = typing.get_args(kind)
        return None if isinstance(value, str) and value in choices else " or ".join(map(repr, choices))
    if name == "frame_cache":
        return None if isinstance(value, str) and value.strip() else "'auto', 'off' or a directory"
    raise AssertionError(f"setting {name} has no check")


def _bad(name: str, allowed: str, value: Any) -> str:
    return f"lerobot-shards train: {PREFIX}{name} (or ${ENV_PREFIX}{name.upper()}) must be {allowed}, got {value!r}"


def _names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainSettings)]


def split_args(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """``(our settings as given: {name: text}, LeRobot's arguments)`` from the command line;
    ``--shards.NAME=VALUE`` or ``--shards.NAME VALUE``. An unknown name is refused, naming the known."""
    ours: dict[str, str] = {}
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        if not arg.startswith(PREFIX):
            rest.append(arg)
            continue
        name, eq, value = arg[len(PREFIX) :].partition("=")
        if name not in _names():
            raise ValueError(f"lerobot-shards train: unknown {PREFIX}{name}; known: {', '.join(_names())}")
        if not eq:
            value = next(args, None)  # type: ignore[assignment]
            if value is None:
                raise ValueError(f"lerobot-shards train: {PREFIX}{name} needs a value")
        if name in ours:
            raise ValueError(f"lerobot-shards train: {PREFIX}{name} given twice")
        ours[name] = value
    return ours, rest


def from_environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The settings set by ``LEROBOT_SHARDS_<NAME>`` variables (empty ones count as unset)."""
    out = {}
    for name in _names():
        text = environ.get(ENV_PREFIX + name.upper(), "")
        if text.strip():
            out[name] = text
    return out


def parse(name: str, text: str, where: str) -> Any:
    """``text`` read as setting ``name``'s type (``where`` names its origin in the error)."""
    kind = typing.get_type_hints(TrainSettings)[name]
    args = set(typing.get_args(kind))
    stripped = text.strip()
    if stripped.lower() in ("null", "none") and type(None) in args:
        return None
    if kind is int:
        if not stripped.isdigit():
            raise ValueError(f"lerobot-shards train: {where} must be a whole number, got {text!r}")
        return int(stripped)
    if bool in args:
        value = {"true": True, "1": True, "false": False, "0": False}.get(stripped.lower())
        if value is None:
            raise ValueError(f"lerobot-shards train: {where} must be true or false, got {text!r}")
        return value
    if any(typing.get_origin(a) is dict for a in args):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"lerobot-shards train: {where} is not JSON ({e}): give a JSON object") from None
    return stripped


def resolve(
    given: Mapping[str, str],
    recorded: Mapping[str, Any] | None,
    environ: Mapping[str, str] = os.environ,
    recorded_in: str = "the checkpoint",
) -> TrainSettings:
    """The settings: the command line's, then a resumed checkpoint's (``recorded``, read from
    ``recorded_in``), then the environment's, then the defaults. A recorded storage option gets its
    secrets from the command line's or the environment's options, never from the checkpoint, which
    ours never write there (one found there was put there by hand, and is dropped). A recorded value
    that is not its setting's kind is one error naming the checkpoint's file and the setting (not
    ``--shards.NAME``, which the user did not give)."""
    env = from_environment(environ)
    values: dict[str, Any] = {n: parse(n, t, f"{ENV_PREFIX}{n.upper()}") for n, t in env.items()}
    fields = {f.name: f for f in dataclasses.fields(TrainSettings)}
    if recorded is not None and not isinstance(recorded, Mapping):
        raise ValueError(f"lerobot-shards train: {recorded_in}: {SETTINGS_KEY} is not a JSON object")
    for name, value in (recorded or {}).items():
        if name in fields and fields[name].metadata.get("recorded", True):
            allowed = _problem(name, value)
            if allowed is not None:
                raise ValueError(
                    f"lerobot-shards train: {recorded_in}: {SETTINGS_KEY}.{name} must be {allowed}, got "
                    f"{type(value).__name__ if name in OPTION_FIELDS else repr(value)} "
                    f"(edited, or written by another version); give {PREFIX}{name} to override it"
                )
            values[name] = split_secrets(value)[0] if name in OPTION_FIELDS and value is not None else value
            if name in URL_FIELDS and isinstance(value, str):  # its credentials, never recorded: the shell's
                shell = env.get(name, "").strip()
                values[name] = (
                    shell if without_credentials(shell) == without_credentials(value) else without_credentials(value)
                )
    values.update({n: parse(n, t, f"{PREFIX}{n}") for n, t in given.items()})
    for name in OPTION_FIELDS:
        kept = (recorded or {}).get(name)
        if name not in given and isinstance(kept, Mapping):
            current = parse(name, env[name], "") if name in env else None
            values[name] = _merged(values[name], split_secrets(current)[1] if isinstance(current, dict) else {})
    return TrainSettings(**values)


def read_data_state(path: str) -> tuple[dict[str, Any] | None, Mapping[str, Any] | None]:
    """(the loader's resume state, our recorded settings) from a checkpoint's data state file
    (``lerobot_train.DATA_STATE_NAME``); (None, None) where the checkpoint has none (LeRobot's own
    dataset trained it). Anything else that is not a JSON object of bounded size (a FIFO, a symlink
    elsewhere, a truncated write, an edit) is one error naming the file: a resume never blocks on
    it, nor starts the data over silently."""
    try:
        data = read_small(fsspec.filesystem("file"), path, STATE_MAX_BYTES, where=path)
    except FileNotFoundError:
        return None, None
    try:
        state = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ValueError(
            f"lerobot-shards train: {path}: not JSON ({type(e).__name__}: {e}); the checkpoint is damaged"
        ) from None
    if not isinstance(state, dict):
        raise ValueError(f"lerobot-shards train: {path}: not a JSON object; the checkpoint is damaged")
    return state, state.pop(SETTINGS_KEY, None)


def _merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for name, value in extra.items():
        out[name] = (
            _merged(out[name], value) if isinstance(value, Mapping) and isinstance(out.get(name), Mapping) else value
        )
    return out


def usage() -> str:
    """Our settings as ``--help`` lists them before LeRobot's own arguments."""
    lines = [f"lerobot-shards train's own arguments (default: ${ENV_PREFIX}<NAME>; a resume keeps the checkpoint's):"]
    for f in dataclasses.fields(TrainSettings):
        lines.append(f"  {PREFIX}{f.name}  (${ENV_PREFIX}{f.name.upper()}, default {f.default!r})")
    return "\n".join(lines)
