"""What a mixture of datasets is: its sources, their weights, subsets and key maps, and its file.

A ``Mixture`` names several sources (converted or raw datasets, local or remote, each with its
own storage options and episode subset) and how much of an epoch each gets, in MosaicML
Streaming's three ways: ``weight`` (a proportion of ``samples_per_epoch``), ``repeat`` (passes
over the source per epoch, fractional allowed) or ``choose`` (samples per epoch). Everything here
is frozen and checked when built, one line naming the source and field; ``load_mixture`` reads a
YAML or JSON mixture file and names the file and key of anything it refuses. ``source_counts``
turns a mixture and its sources' frame counts into each source's samples per epoch (pure).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import posixpath
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import fsspec
import yaml

from ...exceptions import LeRobotShardsError
from ...filesystems import hub_repo_id
from ...format import FormatError
from ...safe_io import read_small
from ...storage import StorageLocation
from ..options import check_episodes, plain_numbers
from ..plan.order import digest


class MixtureFileError(LeRobotShardsError, ValueError):
    """A mixture file that cannot be read or holds an unknown key or bad value; the message names both."""


# Bounds on what a mixture may ask for, so that a typo (or a hostile file) fails in one line naming the
# field instead of in numpy's allocator: an epoch's schedule holds a few bytes per sample.
MAX_SAMPLES_PER_EPOCH = 1 << 31  # 2.1e9 samples: 20x a 100M-frame dataset
MAX_MIXTURE_BYTES = 16 * 1024 * 1024
MAX_MIXTURE_VALUES = 10_000_000  # values in the parsed file, YAML aliases expanded (an alias bomb's billions)
MAX_MIXTURE_DEPTH = 32  # nesting of lists and mappings (storage_options need a few levels)


def _number(name: str, value: Any, *, integer: bool = False, high: float = math.inf) -> None:
    kind = numbers.Integral if integer else numbers.Real
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative {'int' if integer else 'number'}, got {value!r}")
    if float(value) > high:
        raise ValueError(f"{name} = {float(value):.6g} is more than {high:.0f}, the most samples an epoch may have")


@dataclass(frozen=True)
class MixtureSource:
    """One dataset of a mixture and its share of each epoch.

    ``key_map`` renames the source's keys to the mixture's shared names, ``{shared: source_key}``
    (cameras, vectors, any feature; their ``_is_pad`` flags follow); keys it does not name keep
    their names. Exactly one of ``weight``, ``repeat`` and ``choose`` says how many samples of an
    epoch come from this source (``source_counts``).
    """

    source: str  # a converted dataset or raw LeRobot v3.0 dataset: path or URL (s3://...)
    name: str | None = None  # default: the source's last path component
    weight: float | None = None  # proportion of the weighted share of samples_per_epoch
    repeat: float | None = None  # passes over the source's (chosen) frames per epoch
    choose: int | None = None  # samples per epoch
    episodes: Sequence[int] | None = None  # subset of episode indices (default all)
    storage_options: Mapping[str, Any] | None = None  # fsspec options of this source (over the mixture's)
    # A raw source's data files (parquet, mp4) when not beside its metadata (ReadOptions.data_files_root):
    # a URL or path, a StorageLocation, or in a file {url: ..., storage_options: {...}} (its own options).
    data_files_root: StorageLocation | str | Mapping[str, Any] | None = None
    key_map: Mapping[str, str] = field(default_factory=dict)  # {shared name: the source's key}

    def __post_init__(self) -> None:
        plain_numbers(self)
        if not isinstance(self.source, (str, os.PathLike)) or not str(self.source):
            raise ValueError(f"source must be a path or URL, got {self.source!r}")
        object.__setattr__(self, "source", os.fspath(self.source))
        name = self.name if self.name is not None else posixpath.basename(str(self.source).rstrip("/"))
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "name", name)
        where = f"mixture source {name!r}"
        given = [k for k in ("weight", "repeat", "choose") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"{where}: give exactly one of weight, repeat, choose (got {given or 'none'})")
        _number(f"{where}: weight", self.weight)
        _number(f"{where}: repeat", self.repeat, high=MAX_SAMPLES_PER_EPOCH)
        _number(f"{where}: choose", self.choose, integer=True, high=MAX_SAMPLES_PER_EPOCH)
        object.__setattr__(self, "episodes", check_episodes(f"{where}: episodes", self.episodes))
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise ValueError(f"{where}: storage_options must be a dict, got {type(self.storage_options).__name__}")
        object.__setattr__(self, "data_files_root", _data_files_root(where, self.data_files_root))
        if not isinstance(self.key_map, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and k and v for k, v in self.key_map.items()
        ):
            raise ValueError(
                f"{where}: key_map must map shared names to the source's keys (strings), got {self.key_map!r}"
            )
        if len(set(self.key_map.values())) != len(self.key_map):
            raise ValueError(f"{where}: key_map maps one source key to two shared names: {dict(self.key_map)}")
        object.__setattr__(self, "key_map", dict(self.key_map))

    def identity(self) -> dict[str, Any]:
        """What fixes this source's part of the order (not its location or storage options)."""
        return {
            "name": self.name,
            "weight": self.weight,
            "repeat": self.repeat,
            "choose": self.choose,
            "episodes": None if self.episodes is None else list(self.episodes),
            "key_map": dict(sorted(self.key_map.items())),
        }


def _data_files_root(where: str, root: Any) -> StorageLocation | None:
    """A source's ``data_files_root`` as one ``StorageLocation`` (a mapping: its url and its own options)."""
    if root is None or isinstance(root, StorageLocation):
        return root
    if isinstance(root, Mapping):
        extra = sorted(set(root) - {"url", "storage_options"})
        url, options = root.get("url"), root.get("storage_options")
        if extra or not isinstance(url, str) or not url or not (options is None or isinstance(options, Mapping)):
            raise ValueError(
                f"{where}: data_files_root as a mapping holds url (a string) and storage_options (a dict), got "
                f"{sorted(root)}"
            )
        return StorageLocation(url, options)
    if isinstance(root, (str, os.PathLike)) and os.fspath(root):
        return StorageLocation(root)
    raise ValueError(f"{where}: data_files_root must be a URL or path, got {type(root).__name__}")


@dataclass(frozen=True)
class Mixture:
    """Sources and the epoch length: ``samples_per_epoch`` (None: see ``source_counts``)."""

    sources: Sequence[MixtureSource]
    samples_per_epoch: int | None = None

    def __post_init__(self) -> None:
        plain_numbers(self)
        if isinstance(self.sources, (str, bytes)) or not isinstance(self.sources, Sequence) or not self.sources:
            raise ValueError(f"a mixture needs a non-empty list of sources, got {self.sources!r}")
        for s in self.sources:
            if not isinstance(s, MixtureSource):
                raise ValueError(f"mixture sources must be MixtureSource, got {type(s).__name__}")
        object.__setattr__(self, "sources", tuple(self.sources))
        names = [s.name for s in self.sources]
        twice = sorted({n for n in names if names.count(n) > 1 and n is not None})
        if twice:
            raise ValueError(f"mixture source names must be unique; give name= to tell apart: {twice}")
        _number("samples_per_epoch", self.samples_per_epoch, integer=True, high=MAX_SAMPLES_PER_EPOCH)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(str(s.name) for s in self.sources)

    def digest(self, counts: Sequence[int], plan_digests: Sequence[str]) -> str:
        """The mixture's identity: sources, shares, subsets, key maps, epoch length and each source's plan."""
        return digest(
            {
                "sources": [s.identity() for s in self.sources],
                "samples_per_epoch": self.samples_per_epoch,
                "counts": list(counts),
                "plans": list(plan_digests),
            }
        )


def source_counts(mixture: Mixture, frames: Sequence[int]) -> tuple[int, ...]:
    """Samples per epoch of each source, given each source's (chosen) frames. Pure.

    ``choose`` gives its count, ``repeat`` r gives round(r x frames); the weighted sources share
    what is left of ``samples_per_epoch`` by their weights (largest remainder: the counts add up
    exactly). ``samples_per_epoch`` defaults to those fixed counts plus the weighted sources'
    frames, so weights proportional to the sources' sizes read each of them once per epoch.
    """
    fixed = [
        s.choose if s.choose is not None else (round(s.repeat * n) if s.repeat is not None else None)
        for s, n in zip(mixture.sources, frames)
    ]
    for s, n, c in zip(mixture.sources, frames, fixed):
        if s.repeat is not None and c is not None and c > MAX_SAMPLES_PER_EPOCH:
            raise ValueError(
                f"mixture source {s.name!r}: repeat = {s.repeat:.6g} x its {n} frames = {c:.3g} samples per epoch, "
                f"more than the {MAX_SAMPLES_PER_EPOCH} an epoch may have"
            )
    if sum(c for c in fixed if c is not None) > MAX_SAMPLES_PER_EPOCH:
        raise ValueError(
            f"the repeat/choose sources take {sum(c for c in fixed if c is not None)} samples per epoch together, "
            f"more than the {MAX_SAMPLES_PER_EPOCH} an epoch may have"
        )
    weighted = [i for i, c in enumerate(fixed) if c is None]
    total_fixed = sum(c for c in fixed if c is not None)
    total = mixture.samples_per_epoch
    if total is None:
        total = total_fixed + sum(frames[i] for i in weighted)
    if total < total_fixed or (not weighted and total != total_fixed):
        raise ValueError(
            f"samples_per_epoch={total} but the repeat/choose sources alone take {total_fixed} samples per epoch"
            + ("" if weighted else " (with no weighted source they must be equal; drop samples_per_epoch)")
        )
    counts = [0 if c is None else int(c) for c in fixed]
    weights = [float(mixture.sources[i].weight or 0.0) for i in weighted]
    if not math.isfinite(sum(weights)):  # huge weights (1e308 twice) overflow: only proportions count
        top = max(weights)
        weights = [w / top for w in weights]
    if weighted and sum(weights) <= 0 and total > total_fixed:
        raise ValueError("the weighted mixture sources' weights add up to 0")
    if weighted and sum(weights) > 0:
        share = total - total_fixed
        quotas = [share * w / sum(weights) for w in weights]
        floors = [math.floor(q) for q in quotas]
        by_remainder = sorted(range(len(weighted)), key=lambda j: (-(quotas[j] - floors[j]), j))
        for j in by_remainder[: share - sum(floors)]:
            floors[j] += 1
        for i, n in zip(weighted, floors):
            counts[i] = n
    return tuple(counts)


# -- the mixture file -------------------------------------------------------------------------------

_SOURCE_KEYS = {f.name for f in fields(MixtureSource)}
_TOP_KEYS = {"sources", "samples_per_epoch"}


def load_mixture(path: str | os.PathLike[str]) -> Mixture:
    """A mixture from a YAML or JSON file (``.json``: JSON; anything else: YAML, which reads JSON too).

    Top-level keys: ``sources`` (a list of ``MixtureSource`` fields) and ``samples_per_epoch``.
    A local source path that is not absolute is relative to the file's folder; a Hub dataset repo id
    (``lerobot/pusht``, no such folder there) stays one. Anything refused
    raises ``MixtureFileError`` in one line naming the file and the key.
    """
    file = Path(path)
    kind = "JSON" if file.suffix == ".json" else "YAML"
    try:  # a FIFO or device is refused before it is opened, a huge file before it is read
        text = read_small(fsspec.filesystem("file"), str(file), MAX_MIXTURE_BYTES, where=str(file))
    except FormatError as e:
        raise MixtureFileError(f"{e}; a mixture file is a regular YAML or JSON file") from None
    except OSError as e:
        raise MixtureFileError(f"{file}: cannot read the mixture file ({e.strerror or e})") from None
    try:
        raw = json.loads(text, object_pairs_hook=_unique_keys) if kind == "JSON" else yaml.load(text, _UniqueKeyLoader)
    except _DuplicateKey as e:
        raise MixtureFileError(f"{file}: key {e.key!r} is given twice{e.at}; keep one") from None
    except RecursionError:
        raise MixtureFileError(f"{file}: nested too deeply to be a mixture file") from None
    except (ValueError, yaml.YAMLError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MixtureFileError(f"{file}: not valid {kind}: {first}") from None
    _check_size(file, raw)
    if not isinstance(raw, Mapping):
        raise MixtureFileError(f"{file}: a mixture file holds a mapping with 'sources', got {type(raw).__name__}")
    _check_keys(file, "", raw, _TOP_KEYS)
    entries = raw.get("sources")
    if not isinstance(entries, list) or not entries:
        raise MixtureFileError(f"{file}: 'sources' must be a non-empty list of sources")
    sources = []
    for i, entry in enumerate(entries):
        where = f"sources[{i}]"
        if not isinstance(entry, Mapping):
            raise MixtureFileError(f"{file}: {where} must be a mapping with 'source', got {type(entry).__name__}")
        _check_keys(file, f"{where}.", entry, _SOURCE_KEYS)
        if "source" not in entry:
            raise MixtureFileError(f"{file}: {where} lacks 'source' (a dataset path or URL)")
        values = dict(entry)
        location = values["source"]
        if isinstance(location, str) and "://" not in location and not os.path.isabs(location):
            if hub_repo_id(location, file.parent) is None:  # a Hub repo id stays one (filesystems' rule)
                values["source"] = os.path.normpath(file.parent / location)
        root = values.get("data_files_root")
        url = root.get("url") if isinstance(root, Mapping) else root
        if isinstance(url, str) and url and "://" not in url and not os.path.isabs(url):  # beside the file
            url = os.path.normpath(file.parent / url)
            values["data_files_root"] = {**root, "url": url} if isinstance(root, Mapping) else url
        try:
            sources.append(MixtureSource(**values))
        except ValueError as e:
            raise MixtureFileError(f"{file}: {where}: {e}") from None
    try:
        return Mixture(sources, raw.get("samples_per_epoch"))
    except ValueError as e:
        raise MixtureFileError(f"{file}: {e}") from None


class _DuplicateKey(LeRobotShardsError):
    """A key given twice in one mapping of a mixture file (turned into ``MixtureFileError`` naming the file)."""

    def __init__(self, key: object, at: str = "") -> None:
        super().__init__(key)
        self.key, self.at = key, at


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, unless it gives one key twice (``json`` would keep the last silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load``, but a mapping that gives one key twice is refused (PyYAML keeps the last).
    A merge (``<<: *defaults``) may still be overridden by the mapping's own keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # a list as a key: refused later as an unknown key
            if key in seen:
                raise _DuplicateKey(key, f" (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _check_size(file: Path, raw: Any) -> None:
    """Refuse a parsed file deeper than ``MAX_MIXTURE_DEPTH`` or holding more than ``MAX_MIXTURE_VALUES``
    values once YAML aliases are expanded: later steps (the secrets' registry, copies of storage
    options, the digest) walk every value, and an alias bomb's few lines expand to billions."""
    stack, count = [(raw, 0)], 0
    while stack:
        value, depth = stack.pop()
        if depth > MAX_MIXTURE_DEPTH:
            raise MixtureFileError(f"{file}: nested more than {MAX_MIXTURE_DEPTH} levels deep; not a mixture file")
        children = value.values() if isinstance(value, Mapping) else value if isinstance(value, list) else ()
        count += len(children) + 1
        if count > MAX_MIXTURE_VALUES:
            raise MixtureFileError(
                f"{file}: holds more than {MAX_MIXTURE_VALUES} values (YAML aliases expanded); not a mixture file"
            )
        stack.extend((child, depth + 1) for child in children if isinstance(child, (Mapping, list)))


def _check_keys(file: Path, where: str, entry: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(str(k) for k in entry if k not in known)
    if unknown:
        raise MixtureFileError(f"{file}: unknown key {where}{unknown[0]!s} (known: {', '.join(sorted(known))})")


def is_mixture_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a mixture file (by its extension) rather than a dataset."""
    name = os.path.basename(str(path).rstrip("/"))  # a dataset's manifest.json, not a mix_manifest.json
    return name.lower().endswith((".yaml", ".yml", ".json")) and name != "manifest.json"
