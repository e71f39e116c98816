"""``lerobot-shards train``'s own settings: ``--shards.NAME=VALUE`` arguments beside LeRobot's.

Each setting is one field of ``TrainSettings``, with its comment and its check; its type says how
its text is read (``int``, ``bool``, a path, a JSON object, a ``Literal`` choice; ``null`` is
None). Each defaults to the environment variable ``LEROBOT_SHARDS_<NAME>`` (the settings' only
source before they were arguments), and every checkpoint records them beside the data position
(``training_state/lerobot_shards_data.json``, key ``settings``). A resume (``--resume=true``)
takes the checkpoint's, so another shell's environment cannot change the run; an argument given
on the resuming command line still wins, as LeRobot's own arguments win over its saved config.

Storage options (the dataset's and its data files root's) are recorded without their secrets
(``redaction.split_secrets``: keys, tokens, passwords): a resume takes those from its own arguments
or environment, the rest from the checkpoint. Fields marked ``recorded=False`` (where this process
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

from ..redaction import split_secrets

PREFIX = "--shards."
ENV_PREFIX = "LEROBOT_SHARDS_"
SlabLayout = Literal["sample", "contiguous"]
TrainPartition = Literal["auto", "global", "node"]
# The settings holding fsspec options: recorded without their secrets, which a resume takes from its shell.
OPTION_FIELDS = ("storage_options", "data_files_storage_options")


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
    # "auto": node-sticky, each node reading its own part every epoch (a mixture: "global"; a resume:
    # the checkpoint's); "global" for a run that must resume on another node count.
    partition: TrainPartition = "auto"
    # Where a raw dataset's data files (data/, videos/: parquet, mp4) are when not beside its meta/:
    # a bucket mirror (s3://...), hf://buckets/..., a local folder (ReadOptions.data_files_root).
    data_files_root: str | None = None
    # fsspec options for data_files_root, a JSON object (storage_options, the metadata's, never go there).
    data_files_storage_options: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in OPTION_FIELDS:
            if getattr(self, name) is not None and not isinstance(getattr(self, name), dict):
                raise ValueError(_bad(name, "a JSON object of fsspec options", getattr(self, name)))
        if self.data_files_storage_options is not None and self.data_files_root is None:
            raise ValueError(f"lerobot-shards train: {PREFIX}data_files_storage_options given without data_files_root")
        for name in ("cache_dir", "sample_log", "data_files_root"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ValueError(_bad(name, "a path", getattr(self, name)))
        pool = self.episode_pool_size
        if isinstance(pool, bool) or not isinstance(pool, int) or pool < 1:
            raise ValueError(_bad("episode_pool_size", "a whole number >= 1", pool))
        if self.equal_samples_per_rank not in (None, True, False):
            raise ValueError(_bad("equal_samples_per_rank", "true, false or null", self.equal_samples_per_rank))
        if self.slab_layout not in typing.get_args(SlabLayout):
            raise ValueError(_bad("slab_layout", " or ".join(map(repr, typing.get_args(SlabLayout))), self.slab_layout))
        if not isinstance(self.frame_cache, str) or not self.frame_cache.strip():
            raise ValueError(_bad("frame_cache", "'auto', 'off' or a directory", self.frame_cache))
        if self.partition not in typing.get_args(TrainPartition):
            raise ValueError(_bad("partition", " or ".join(map(repr, typing.get_args(TrainPartition))), self.partition))

    def recorded(self) -> dict[str, Any]:
        """What a checkpoint keeps: every recorded field, the storage options without their secrets."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("recorded", True)}
        for name in OPTION_FIELDS:
            if getattr(self, name) is not None:
                out[name] = split_secrets(getattr(self, name))[0]
        return out


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
    given: Mapping[str, str], recorded: Mapping[str, Any] | None, environ: Mapping[str, str] = os.environ
) -> TrainSettings:
    """The settings: the command line's, then a resumed checkpoint's (``recorded``), then the
    environment's, then the defaults. A recorded storage option gets its secrets from the command
    line's or the environment's options, which the checkpoint never holds."""
    env = from_environment(environ)
    values: dict[str, Any] = {n: parse(n, t, f"{ENV_PREFIX}{n.upper()}") for n, t in env.items()}
    fields = {f.name: f for f in dataclasses.fields(TrainSettings)}
    for name, value in (recorded or {}).items():
        if name in fields and fields[name].metadata.get("recorded", True):
            values[name] = value
    values.update({n: parse(n, t, f"{PREFIX}{n}") for n, t in given.items()})
    for name in OPTION_FIELDS:
        kept = (recorded or {}).get(name)
        if name not in given and isinstance(kept, Mapping):
            current = parse(name, env[name], "") if name in env else None
            values[name] = _merged(kept, split_secrets(current)[1] if isinstance(current, dict) else {})
    return TrainSettings(**values)


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
