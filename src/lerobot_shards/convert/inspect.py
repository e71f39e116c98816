"""A summary table of a LeRobot v3.0 source or a converted dataset, from metadata alone."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import language
from ..format import MANIFEST_NAME, SHARDS_DIR, FormatError, FrameTransform, Manifest
from ..lerobot_v3 import LeRobotV3Source, SourceError
from ..redaction import without_credentials
from ..safe_io import read_sidecar
from ..shard_plan import DEFAULT_SHARD_BYTES, plan_shards
from ..storage import StorageLocation
from .destination import LEROBOT_INFO, Destination


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain aligned columns: numbers right, text left."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(isinstance(r[i], (int, float)) for r in rows) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric)).rstrip() for r in cells
    )


def _mb(n: int) -> float:
    return round(n / 1e6, 1)


def _episode_ranges(episodes: Sequence[int]) -> str:
    """``0-3,7`` for 0,1,2,3,7: a shard's episode list stays one short cell."""
    runs: list[list[int]] = []
    for e in episodes:
        if runs and e == runs[-1][1] + 1:
            runs[-1][1] = e
        else:
            runs.append([e, e])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def inspect_source(source: LeRobotV3Source) -> str:
    """A LeRobot dataset in a few lines: sizes, files, cameras and codecs, and the shards it would make."""
    sizes = source.episode_sizes()
    files = {e.data_path for e in source.episodes}
    videos = {v.path for e in source.episodes for v in e.videos.values()}
    lines = [
        f"LeRobot {source.info['codebase_version']} dataset {source.url}",
        f"  episodes {len(source.episodes)}, frames {source.total_frames}, fps {source.fps:g}, "
        f"tasks {len(source.tasks)}, robot {source.info.get('robot_type')}",
        f"  data files {len(files)} ({_mb(sum(source.file_size(p) for p in files))} MB), video files {len(videos)} "
        f"({_mb(sum(source.file_size(p) for p in videos))} MB)"
        + ("" if source.data_files is None else f" at {without_credentials(source.data_url)}"),
        f"  shards at the default {DEFAULT_SHARD_BYTES // 2**20} MB: {len(plan_shards(sizes))}",
        *language.describe(source.features),
        "",
    ]
    rows = []
    for cam in source.camera_keys:
        info = source.features[cam].get("info", {})
        rows.append(
            [
                cam,
                info.get("video.codec", "?"),
                f"{info.get('video.width')}x{info.get('video.height')}",
                info.get("video.pix_fmt", "?"),
                _mb(sum(source.file_size(p) for p in {e.videos[cam].path for e in source.episodes})),
            ]
        )
    if rows:
        lines.append(table(["camera", "codec", "size", "pix_fmt", "MB"], rows))
    return "\n".join(lines)


def _resized_from(t: FrameTransform | None) -> str:
    """``640x480 pad (scaled 224x168 at +0+28)``: the source size and what was done, or ``-``."""
    if t is None:
        return "-"
    (sh, sw), (ch, cw), (h, w) = t.source, t.crop[2:], t.scaled
    crop = f", crop {cw}x{ch}+{t.crop[1]}+{t.crop[0]}" if (ch, cw) != t.source else ""
    pad = f", pad at +{t.pad[1]}+{t.pad[0]}" if (h, w) != t.size else ""
    return f"{sw}x{sh} {t.mode} ({t.filter} to {w}x{h}{crop}{pad})"


def inspect_converted(dest: Destination) -> str:
    """A converted dataset in a few lines, from its manifest alone: totals, video settings, shard sizes."""
    manifest = Manifest.from_json(
        dest.read_bytes(MANIFEST_NAME), where=dest.path(MANIFEST_NAME), legacy=True
    )  # shown, not used
    video = manifest.video
    lines = [
        f"lerobot-shards dataset {dest.url} (format {manifest.format_version}, converter "
        f"{manifest.converter.get('version', '?')})",
        f"  episodes {manifest.total_episodes}, frames {manifest.total_frames}, fps {manifest.fps:g}, "
        f"tasks {len(manifest.tasks)}, shards {len(manifest.shards)}, {_mb(manifest.total_bytes)} MB",
        f"  video: {video.get('mode')}"
        + (
            f", {len(video.get('fallback_reencoded_episodes', []))} episodes re-encoded ({video.get('codec')}, "
            f"gop {video.get('gop')}, crf {video.get('crf')})"
            if video.get("mode") == "copy"
            else f" to {video.get('codec')}, gop {video.get('gop')}, crf {video.get('crf')}"
        )
        + f"; {len(manifest.skipped_episodes)} episodes skipped",
    ]
    if video.get("resize"):
        sizes = ", ".join(f"{'all' if c == '*' else c} {w}x{h}" for c, (h, w) in sorted(video["resize"].items()))
        lines.append(f"  resized ({video.get('resize_mode')}, re-encoded {video.get('codec')}): {sizes}")
    lines += [*language.describe(manifest.features), ""]
    if manifest.shards:
        record = manifest.shards[0]
        where = dest.path(posixpath.join(SHARDS_DIR, record.sidecar))
        try:  # checked against the manifest as the loader checks it: inspect shows nothing it would refuse
            first, _ = read_sidecar(
                dest.fs, where, record, manifest, root=dest.root if dest.is_local else None, where=where
            )
        except FileNotFoundError:
            raise FormatError(f"{where}: missing, though {MANIFEST_NAME} lists it; the dataset is incomplete") from None
        if first.episodes:
            rows = [
                [
                    cam,
                    c.codec,
                    f"{c.width}x{c.height}",
                    c.pix_fmt,
                    f"{c.fps:g}",
                    len(c.key_frame_indices()),
                    _resized_from(c.transform),
                ]
                for cam, c in sorted(first.episodes[0].clips.items())
            ]
            if rows:
                headers = ["camera", "codec", "size", "pix_fmt", "fps", "keyframes (1st episode)", "resized from"]
                lines += [table(headers, rows), ""]
    lines.append(
        table(
            ["shard", "episodes", "n", "frames", "MB", "sha256"],
            [
                [s.name, _episode_ranges(s.episodes), len(s.episodes), s.frames, _mb(s.bytes), s.sha256[:12]]
                for s in manifest.shards
            ],
        )
    )
    for ep, reason in sorted(manifest.skipped_episodes.items()):
        lines.append(f"skipped episode {ep}: {reason}")
    return "\n".join(lines)


def inspect_path(
    path: str | Path,
    *,
    storage_options: dict[str, Any] | None = None,
    data_files_root: StorageLocation | str | None = None,
) -> str:
    """Summary of ``path``: a converted dataset when it has a manifest, else a LeRobot source (its
    data files at ``data_files_root`` when given: ``LeRobotV3Source``'s ``data_files``)."""
    dest = Destination(str(path), storage_options=storage_options)
    if dest.exists(MANIFEST_NAME):
        if data_files_root is not None:
            raise ValueError(f"{path}: a converted dataset holds its own files; --data-files-root is for a raw one")
        return inspect_converted(dest)
    if dest.exists(LEROBOT_INFO):
        return inspect_source(LeRobotV3Source(str(path), storage_options=storage_options, data_files=data_files_root))
    raise SourceError(f"{path}: neither a converted dataset ({MANIFEST_NAME}) nor a LeRobot dataset (meta/info.json)")


def inspect_mixture(path: str | Path, *, storage_options: dict[str, Any] | None = None) -> str:
    """Summary of a mixture file: its sources, their shares and samples per epoch, and the shared keys
    some sources lack or pad (from metadata alone: each source's manifest or tables)."""
    from ..loader.mix.dataset import MixtureDataset
    from ..redaction import without_credentials

    ds = MixtureDataset(path, storage_options=storage_options or None)
    rows = []
    for spec, src, count in zip(ds.mixture.sources, ds.sources, ds.counts.values()):
        share = next(
            f"{k} {getattr(spec, k):g}" for k in ("weight", "repeat", "choose") if getattr(spec, k) is not None
        )
        rows.append(
            [
                str(spec.name),
                without_credentials(spec.source),
                share,
                src.num_episodes,
                src.num_frames,
                round(float(src.fps), 3),
                count,
                f"{count / max(1, ds.samples_per_epoch):.1%}",
            ]
        )
    headers = ["source", "location", "share", "episodes", "frames", "fps", "samples/epoch", "of epoch"]
    lines = [
        f"Mixture {path}: sources {len(rows)}, samples per epoch {ds.samples_per_epoch}, frames {ds.num_frames}",
        table(headers, rows),
    ]
    layout = ds.layout
    for key in layout.flagged:
        lacking = [s.name for s in layout.sources if key in s.missing]
        lines.append(f"{key}: missing in {', '.join(lacking)} (zeros, {key}_is_missing)")
    for key, size in layout.padded.items():
        sizes = ", ".join(f"{s.name} {s.sizes[key]}" for s in layout.sources if key in s.sizes)
        lines.append(f"{key}: padded to {size} ({sizes}; {key}_mask)")
    return "\n".join(lines)
