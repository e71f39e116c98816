"""The keys of a mixture's samples: renamed, zero-filled where a source lacks them, padded, and their stats.

Sources that disagree on cameras and vectors still give samples of one shape (so batches stack):

- **Renaming.** Each source's ``key_map`` (``{shared: source_key}``) renames its keys; a
  renamed key's ``<key>_is_pad`` window flags follow it.
- **Missing keys.** A shared key a source lacks comes as zeros of the shared shape (a window:
  ``(T, ...)`` zeros with ``<key>_is_pad`` all True), and every sample of the mixture carries
  ``<key>_is_missing`` (a bool tensor, True where this sample's source lacks the key) for each
  key some source lacks.
- **Padded vectors.** A 1-D feature with different sizes in different sources is padded with
  zeros at the end to the largest size, and every sample carries ``<key>_mask`` (bool, the
  padded size): True on the dimensions the sample's source has (all False where it lacks the key).
- **Frames** of different sizes cannot stack: refused when the mixture is built, naming both
  sources and sizes (give ``resize=(height, width)``).
- Every sample carries ``dataset_index`` (an int64 tensor, the source's position in the mixture)
  and ``dataset_name``.

``mix_stats`` combines the sources' stats by their weights (see its docstring).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...depth import is_depth
from ...exceptions import LeRobotShardsError
from ...language import LANGUAGE_DTYPE
from ...lerobot_v3 import IMAGE_DTYPE, VIDEO_DTYPE
from ..meta import Stats

VISUAL = (VIDEO_DTYPE, IMAGE_DTYPE)
PAD_SUFFIX = "_is_pad"
MISSING_SUFFIX = "_is_missing"
MASK_SUFFIX = "_mask"


class MixtureError(LeRobotShardsError, ValueError):
    """A mixture whose sources cannot be read together; the message names the sources and keys."""


@dataclass(frozen=True)
class SourceKeys:
    """How one source's samples become the mixture's."""

    name: str
    rename: dict[str, str]  # the source's key -> the shared key (keys it leaves out keep their names)
    missing: tuple[str, ...]  # shared keys the source lacks
    sizes: dict[str, int]  # padded keys -> the source's own size

    def source_key(self, shared: str) -> str:
        """The source's name for a shared key."""
        return next((k for k, v in self.rename.items() if v == shared), shared)


def _emitted_shape(feature: Mapping[str, Any]) -> tuple[int, ...]:
    """The shape of one frame's value as samples hold it: CHW frames, scalars for shape [1]."""
    shape = tuple(int(n) for n in feature["shape"])
    if feature["dtype"] in VISUAL and len(shape) == 3 and shape[-1] in (1, 3, 4):  # LeRobot's (h, w, c)
        return (shape[2], shape[0], shape[1])
    return () if shape == (1,) else shape


@dataclass(frozen=True)
class MixtureLayout:
    """The shared keys of a mixture and each source's way to them."""

    features: dict[str, dict[str, Any]]  # shared features (LeRobot's schema; padded shapes)
    windows: dict[str, int]  # windowed shared keys -> frames per window
    flagged: tuple[str, ...]  # keys some source lacks: every sample has <key>_is_missing
    padded: dict[str, int]  # keys padded to this size: every sample has <key>_mask
    sources: tuple[SourceKeys, ...]
    image_dtype: torch.dtype

    def fill(self, key: str) -> Any:
        """The value of a key a source lacks: zeros of its shared shape and dtype (windows: (T, ...))."""
        ft = self.features[key]
        if ft["dtype"] == "string":
            return ""
        if ft["dtype"] == LANGUAGE_DTYPE:  # no annotation rows (and the key's _is_missing flag)
            return []
        dtype = self.image_dtype if ft["dtype"] in VISUAL else getattr(torch, str(ft["dtype"]), torch.float32)
        dtype = torch.float32 if is_depth(ft) else dtype  # depth maps are float32 (dequantized) in any image_dtype
        lead = (self.windows[key],) if key in self.windows else ()
        return torch.zeros(lead + _emitted_shape(ft), dtype=dtype)

    def sample(self, d: int, item: Mapping[str, Any]) -> dict[str, Any]:
        """Source ``d``'s sample under the shared keys (see the module)."""
        src = self.sources[d]
        out: dict[str, Any] = {}
        for key, value in item.items():
            base = (
                key[: -len(PAD_SUFFIX)] if key.endswith(PAD_SUFFIX) and key[: -len(PAD_SUFFIX)] in src.rename else None
            )
            out[src.rename[base] + PAD_SUFFIX if base is not None else src.rename.get(key, key)] = value
        for key, size in self.padded.items():
            if key in src.missing:
                continue
            own = src.sizes[key]
            lead = (self.windows[key],) if key in self.windows else ()
            value = torch.as_tensor(out[key]).reshape(*lead, own)
            out[key] = torch.nn.functional.pad(value, (0, size - own)) if own < size else value
            out[key + MASK_SUFFIX] = torch.arange(size) < own
        for key in src.missing:
            out[key] = self.fill(key)
            if key in self.windows:
                out[key + PAD_SUFFIX] = torch.ones(self.windows[key], dtype=torch.bool)
            if key in self.padded:
                out[key + MASK_SUFFIX] = torch.zeros(self.padded[key], dtype=torch.bool)
        for key in self.flagged:
            out[key + MISSING_SUFFIX] = torch.tensor(key in src.missing)
        out["dataset_index"] = torch.tensor(d, dtype=torch.int64)
        out["dataset_name"] = src.name
        return out


def build_layout(
    names: Sequence[str],
    features: Sequence[Mapping[str, Mapping[str, Any]]],
    key_maps: Sequence[Mapping[str, str]],
    windows: Mapping[str, int],
    image_dtype: torch.dtype,
    left_out: Sequence[Collection[str]] = (),
) -> MixtureLayout:
    """The shared keys of sources with these (resized) ``features`` and key maps; ``MixtureError`` naming
    the sources when a key map names a key a source lacks or two sources' values cannot be stacked.
    ``left_out[d]``: source d's keys its samples do not hold (cameras not chosen), which its key map
    may name but the layout leaves out."""
    renames: list[dict[str, str]] = []
    owners: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    dropped = [*left_out, *[()] * (len(names) - len(left_out))]
    kept = [{k: v for k, v in fts.items() if k not in out} for fts, out in zip(features, dropped)]
    for d, (name, fts, key_map) in enumerate(zip(names, kept, key_maps)):
        unknown = sorted(set(key_map.values()) - set(features[d]))
        if unknown:
            raise MixtureError(
                f"mixture source {name!r}: key_map names {unknown}, which it lacks (it has {sorted(features[d])})"
            )
        rename = {source: shared for shared, source in key_map.items()}
        seen: dict[str, str] = {}
        for key, ft in fts.items():
            shared = rename.get(key, key)
            if shared in seen:
                raise MixtureError(
                    f"mixture source {name!r}: key_map renames {seen[shared] if shared != seen[shared] else key!r} "
                    f"to {shared!r}, which the source already has; rename that key too"
                )
            seen[shared] = key
            owners.setdefault(shared, []).append((d, ft))
        renames.append(rename)
    unknown = sorted(set(windows) - set(owners))
    if unknown:
        raise MixtureError(
            f"delta_timestamps has keys {unknown} that no mixture source has (shared keys: {sorted(owners)})"
        )
    shared_features: dict[str, dict[str, Any]] = {}
    padded: dict[str, int] = {}
    for key, entries in owners.items():
        (d0, ft0), *rest = entries
        for d, ft in rest:
            kinds = ["depth" if is_depth(f) else "visual" if f["dtype"] in VISUAL else f["dtype"] for f in (ft0, ft)]
            if kinds[0] != kinds[1]:
                raise MixtureError(
                    f"{key!r} is {_kind(ft0)} in mixture source {names[d0]!r} but {_kind(ft)} in {names[d]!r}"
                )
        shapes = [tuple(ft["shape"]) for _, ft in entries]
        if len(set(shapes)) > 1:
            d, other = next((d, tuple(ft["shape"])) for d, ft in entries if tuple(ft["shape"]) != shapes[0])
            if ft0["dtype"] in VISUAL:
                raise MixtureError(
                    f"frames of {key!r} are {shapes[0]} in mixture source {names[d0]!r} but {other} in "
                    f"{names[d]!r}: batches cannot be stacked; give resize=(height, width) to decode every "
                    f"source at one size"
                )
            if any(len(s) != 1 for s in shapes):
                raise MixtureError(
                    f"{key!r} has shapes {sorted(set(shapes))} across the mixture's sources ({names[d0]!r}, "
                    f"{names[d]!r}): only 1-D vectors can be padded to one size"
                )
            padded[key] = max(s[0] for s in shapes)
        shared_features[key] = {**ft0, "shape": (padded[key],) if key in padded else tuple(ft0["shape"])}
    sources = []
    for d, name in enumerate(names):
        have = {renames[d].get(k, k): ft for k, ft in kept[d].items()}
        sizes = {k: int(have[k]["shape"][0]) for k in padded if k in have}
        sources.append(SourceKeys(name, renames[d], tuple(k for k in owners if k not in have), sizes))
    flagged = tuple(k for k in owners if any(k in s.missing for s in sources))
    return MixtureLayout(shared_features, dict(windows), flagged, padded, tuple(sources), image_dtype)


def rename_stats(stats: Mapping[str, Mapping[str, np.ndarray]], rename: Mapping[str, str]) -> Stats:
    """A source's stats under the shared keys."""
    return {rename.get(k, k): dict(v) for k, v in stats.items()}


def mix_stats(per_source: Sequence[Mapping[str, Mapping[str, np.ndarray]]], weights: Sequence[float]) -> Stats:
    """The mixture's stats: each feature's sources' stats combined by their weights.

    With w_i each source's share of the epoch (renormalized over the sources that have the
    feature, and per dimension over those that have the dimension for padded vectors):
    ``mean = sum_i w_i mean_i``; ``std**2 = sum_i w_i (std_i**2 + (mean_i - mean)**2)`` (the law of
    total variance); ``min``/``max`` elementwise over the sources; ``count = sum_i count_i``; a
    quantile ``q`` as ``sum_i w_i q_i`` (an approximation, as LeRobot's aggregation of quantiles).
    """
    out: Stats = {}
    for key in sorted({k for s in per_source for k in s}):
        have = [(float(w), s[key]) for w, s in zip(weights, per_source) if key in s and "mean" in s[key]]
        if not have:
            continue
        if sum(w for w, _ in have) <= 0:
            have = [(1.0, st) for _, st in have]
        out[key] = _mix_feature(have)
    return out


def _mix_feature(items: Sequence[tuple[float, Mapping[str, np.ndarray]]]) -> dict[str, np.ndarray]:
    shapes = {np.shape(st["mean"]) for _, st in items}
    target = max(shapes, key=lambda s: int(np.prod(s)))

    def padded(a: Any, fill: float) -> np.ndarray:
        a = np.asarray(a, dtype=np.float64)
        if a.shape == target:
            return a
        if a.ndim == 1 and len(target) == 1:
            return np.concatenate([a, np.full(target[0] - a.shape[0], fill)])
        return np.broadcast_to(a, target).astype(np.float64)

    present = np.stack([~np.isnan(padded(st["mean"], np.nan)) for _, st in items])
    w = present * np.asarray([w for w, _ in items], dtype=np.float64).reshape(-1, *([1] * len(target)))
    w = w / np.where(w.sum(axis=0) > 0, w.sum(axis=0), 1.0)

    def weighted(name: str) -> np.ndarray:
        return (w * np.stack([np.nan_to_num(padded(st[name], 0.0)) for _, st in items])).sum(axis=0)

    mean = weighted("mean")
    second = sum(
        w[i] * (np.nan_to_num(padded(st["std"], 0.0)) ** 2 + (np.nan_to_num(padded(st["mean"], 0.0)) - mean) ** 2)
        for i, (_, st) in enumerate(items)
    )
    out = {
        "mean": mean,
        "std": np.sqrt(second),
        "min": np.min(
            np.stack([np.where(present[i], padded(st["min"], np.inf), np.inf) for i, (_, st) in enumerate(items)]),
            axis=0,
        ),
        "max": np.max(
            np.stack([np.where(present[i], padded(st["max"], -np.inf), -np.inf) for i, (_, st) in enumerate(items)]),
            axis=0,
        ),
    }
    if all("count" in st for _, st in items):
        out["count"] = np.sum([np.asarray(st["count"]).reshape(-1)[:1] for _, st in items], axis=0)
    for q in (k for k in items[0][1] if k.startswith("q") and k[1:].isdigit()):
        if all(q in st for _, st in items):
            out[q] = weighted(q)
    return out


def _kind(feature: Mapping[str, Any]) -> str:
    """A feature's dtype as a mixture error names it (a depth camera's: "depth video")."""
    return f"depth {feature['dtype']}" if is_depth(feature) else str(feature["dtype"])
