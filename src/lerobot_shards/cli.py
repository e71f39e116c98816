"""``lerobot-shards`` command line: one click group, one sub-command per job."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import click

from .convert.plan import DEFAULT_CRF, DEFAULT_GOP, FALLBACK_CODEC
from .format import CODECS, RESIZE_MODES
from .resize import DEFAULT_MODE
from .shard_plan import DEFAULT_SHARD_BYTES

log = logging.getLogger("lerobot_shards.cli")


class _Group(click.Group):
    """Every error ends as one line (where, what went wrong, what to do) and exit status 1;
    ``-vv`` logs the traceback first (credentials redacted), also of the checked errors a command
    turns into its one line itself."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except click.exceptions.ClickException as e:  # every message is redacted, whoever raised it
            from .redaction import redact

            if isinstance(e, click.UsageError):
                raise
            cause = e.__cause__ or e.__context__  # a checked error a command turned into one line
            if cause is not None and ctx.params.get("verbose", 0) >= 2:
                log.error("traceback", exc_info=(type(cause), cause, cause.__traceback__))
            raise click.ClickException(redact(e.message)) from None
        except (click.exceptions.Exit, click.exceptions.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            raise click.ClickException("interrupted; re-run the same command to resume") from None
        except Exception as e:
            from .redaction import explain

            if ctx.params.get("verbose", 0) >= 2:
                log.error("traceback", exc_info=True)
            locations = ctx.obj.get("locations", ()) if isinstance(ctx.obj, dict) else ()
            raise click.ClickException(explain(e, locations)) from None


@click.group(cls=_Group)
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug with tracebacks).")
@click.pass_context
def main(ctx: click.Context, verbose: int) -> None:
    """Repack LeRobot v3.0 datasets into episode-aligned tar shards and stream them."""
    from .redaction import RedactingFormatter, quiet_storage_loggers

    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler()
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    quiet_storage_loggers()  # -vv is our debug output, not botocore's request headers
    ctx.obj = {"locations": []}


def _locations(*urls: str | None) -> None:
    """Tell the error handler which paths this command works on (to name them in errors); their
    credentials (``http://user:token@host``) are registered as secrets, never printed."""
    from .redaction import without_credentials

    ctx = click.get_current_context()
    root = ctx.find_root()
    if isinstance(root.obj, dict):
        root.obj["locations"] = [without_credentials(u) for u in urls if u]


@main.command()
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--episodes", default=4, show_default=True, help="Number of episodes.")
@click.option(
    "--cameras",
    default="observation.images.front,observation.images.top",
    show_default=True,
    help="Comma-separated camera keys, or 0 for a dataset without video.",
)
@click.option("--height", default=64, show_default=True)
@click.option("--width", default=160, show_default=True)
@click.option("--fps", default=30, show_default=True, type=click.IntRange(min=1, max=1000))
@click.option("--codec", type=click.Choice(list(CODECS)), default="h264", show_default=True)
@click.option("--gop", default=2, show_default=True, help="Keyframe interval in frames.")
@click.option("--crf", default=30, show_default=True)
@click.option("--episodes-per-video-file", default=2, show_default=True)
@click.option("--episodes-per-data-file", default=2, show_default=True)
@click.option("--chunks-size", default=1000, show_default=True, help="Files per chunk directory.")
@click.option("--min-length", default=20, show_default=True, help="Shortest episode, in frames.")
@click.option("--max-length", default=40, show_default=True, help="Longest episode, in frames.")
@click.option(
    "--texture",
    type=click.Choice(["flat", "realistic"]),
    default="flat",
    show_default=True,
    help="realistic: shaking textured scene under the identity bands, the bitrate of real footage "
    "(~21 KB per 640x480 AV1 frame); flat compresses ~5x smaller.",
)
@click.option(
    "--to-timestamp-short-frames",
    default=0,
    show_default=True,
    help="Quirk: record each episode's video to_timestamp this many frames short of its rows.",
)
@click.option(
    "--timestamp-jitter",
    default=0.0,
    show_default=True,
    help="Quirk: move each row's timestamp by up to this many seconds (LeRobot tolerates 1e-4).",
)
@click.option("--codec-label", help="Quirk: video.codec written to info.json whatever the stream holds.")
@click.option("--bframes", default=0, show_default=True, help="Quirk: H.264 with this many B-frames (gop > bframes).")
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    help="Processes painting and encoding clips (default: the CPUs this process may use); same bytes for any count.",
)
def synth(
    out: str,
    episodes: int,
    cameras: str,
    height: int,
    width: int,
    fps: int,
    codec: str,
    gop: int,
    crf: int,
    episodes_per_video_file: int,
    episodes_per_data_file: int,
    chunks_size: int,
    min_length: int,
    max_length: int,
    texture: str,
    to_timestamp_short_frames: int,
    timestamp_jitter: float,
    codec_label: str | None,
    bframes: int,
    seed: int,
    workers: int | None,
) -> None:
    """Write a synthetic LeRobot v3.0 dataset to OUT whose frames paint their own identity."""
    import json
    from pathlib import Path

    from .cpus import usable_cpus
    from .synth import synth_dataset

    camera_keys = () if cameras.strip() == "0" else tuple(c.strip() for c in cameras.split(",") if c.strip())
    try:
        root = synth_dataset(
            out,
            num_episodes=episodes,
            cameras=camera_keys,
            height=height,
            width=width,
            fps=fps,
            codec=codec,
            gop=gop,
            crf=crf,
            episodes_per_video_file=episodes_per_video_file,
            episodes_per_data_file=episodes_per_data_file,
            chunks_size=chunks_size,
            length_range=(min_length, max_length),
            texture=texture,
            to_timestamp_short_frames=to_timestamp_short_frames,
            timestamp_jitter_s=timestamp_jitter,
            codec_label=codec_label,
            bframes=bframes,
            seed=seed,
            workers=workers or usable_cpus(),
        )
    except (ValueError, FileExistsError) as e:
        raise click.ClickException(str(e)) from e
    info = json.loads((Path(root) / "meta/info.json").read_text())
    files = [p for p in Path(root).rglob("*") if p.is_file()]
    click.echo(
        f"{root}: {info['total_episodes']} episodes, {info['total_frames']} frames, "
        f"{len(camera_keys)} cameras, {len(files)} files, {sum(p.stat().st_size for p in files)} bytes"
    )


def _storage_options(text: str | None, flag: str = "--storage-options") -> dict:
    import json

    from .redaction import register_secrets

    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON ({e})", param_hint=flag) from None
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint=flag)
    register_secrets(value)
    return value


def _remote(url: str, options: dict) -> dict:
    """Storage options apply to fsspec URLs only; local paths take none."""
    return options if "://" in url and not url.startswith("file://") else {}


_REVISION = click.option(
    "--revision",
    help="For a source given as a Hub dataset repo id (namespace/name): its branch, tag or commit "
    "(default: the codebase-version tag, as LeRobot picks it).",
)


def _hub_source(source: str, revision: str | None, options: dict) -> str:
    """SOURCE as given, or a Hub repo id as its pinned hf:// URL (``filesystems.resolve_source``)."""
    from .filesystems import resolve_source

    try:
        return resolve_source(source, revision, _remote("hf://", options))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--revision") from None


_STORAGE_OPTIONS = click.option(
    "--storage-options",
    metavar="JSON",
    help='fsspec options for remote URLs, e.g. \'{"client_kwargs": {"endpoint_url": "http://host:9000"}}\'.',
)


def _data_files_options(f: Any) -> Any:
    """--data-files-root URL and its own --data-files-storage-options (the source's never go to it)."""
    f = click.option(
        "--data-files-storage-options",
        metavar="JSON",
        help="fsspec options for --data-files-root (the source's --storage-options are not sent there).",
    )(f)
    return click.option(
        "--data-files-root",
        metavar="URL",
        help="Where the source's data/ and videos/ files (parquet, mp4) are, when not beside its meta/: a "
        "bucket mirror (s3://...), hf://buckets/..., a local folder.",
    )(f)


def _data_files(root: str | None, options: str | None) -> Any:
    """The data files root as one StorageLocation (None without --data-files-root)."""
    if root is None:
        if options:
            raise click.BadParameter("given without --data-files-root", param_hint="--data-files-storage-options")
        return None
    from .storage import StorageLocation

    given = _storage_options(options, "--data-files-storage-options")
    return StorageLocation(root, _remote(root, given))


@main.command()
@click.argument("source")
@click.argument("dest")
@click.option(
    "--shard-size",
    metavar="SIZE",
    help=f"Target shard size, e.g. 256MB or 1GB.  [default: {DEFAULT_SHARD_BYTES // 2**20}MB]",
)
@click.option(
    "--episodes-per-shard",
    type=click.IntRange(min=1),
    help="About N episodes per shard instead (a last group under N/2 joins the shard before it).",
)
@click.option(
    "--shuffle-episodes",
    "shuffle_seed",
    type=click.IntRange(min=0),
    metavar="SEED",
    help="Assign episodes to shards in a seeded random order instead of source order.",
)
@click.option(
    "--reencode",
    type=click.Choice(list(CODECS)),
    help="Re-encode every clip (no B-frames, no scene-cut keyframes); default: stream copy.",
)
@click.option(
    "--gop",
    type=click.IntRange(min=1),
    default=DEFAULT_GOP,
    show_default=True,
    help="Keyframe interval of re-encoded clips (2: ~1.5 decoded frames per random access).",
)
@click.option(
    "--crf",
    type=click.IntRange(min=0, max=63),
    help=f"Quality of re-encoded clips.  [default: {', '.join(f'{c} {q}' for c, q in DEFAULT_CRF.items())}]",
)
@click.option(
    "--resize",
    "resize",
    multiple=True,
    metavar="[CAMERA=]WxH",
    help="Store frames at the training size, e.g. 224x224 (every camera) or observation.images.top=96x96 "
    f"(repeatable; a camera's own entry wins). Resized cameras are re-encoded (--reencode codec, else {FALLBACK_CODEC}).",
)
@click.option(
    "--resize-mode",
    type=click.Choice(list(RESIZE_MODES)),
    default=DEFAULT_MODE,
    show_default=True,
    help="pad: keep the aspect and letterbox (pi0-style); crop: centre-crop to the aspect; stretch: ignore it.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Processes, each building whole shards (memory: about one episode's clips each).",
)
@click.option(
    "--num-tasks",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Split the plan over this many tasks (e.g. a SLURM array).",
)
@click.option(
    "--task-index",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="This task's index: it converts shards i with i % num_tasks == task_index.",
)
@click.option("--finalize", is_flag=True, help="Convert nothing; write the manifest from all shards' sidecars.")
@click.option("--skip-bad-episodes", is_flag=True, help="Leave out episodes that fail, recording why in the manifest.")
@click.option(
    "--check-decode",
    is_flag=True,
    help="Decode every frame of stream-copied clips with strict error detection (slower; by default only "
    "each clip's first and last GOP).",
)
@click.option("--overwrite", is_flag=True, help="Replace a destination that holds foreign or other-settings output.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
@_REVISION
@_STORAGE_OPTIONS
@_data_files_options
def convert(
    source: str,
    dest: str,
    shard_size: str | None,
    episodes_per_shard: int | None,
    shuffle_seed: int | None,
    reencode: str | None,
    gop: int,
    crf: int | None,
    resize: tuple[str, ...],
    resize_mode: str,
    workers: int,
    num_tasks: int,
    task_index: int,
    finalize: bool,
    skip_bad_episodes: bool,
    check_decode: bool,
    overwrite: bool,
    progress: bool,
    revision: str | None,
    storage_options: str | None,
    data_files_root: str | None,
    data_files_storage_options: str | None,
) -> None:
    """Repack the LeRobot v3.0 dataset SOURCE (a path, an fsspec URL or a Hub dataset repo id) into episode-aligned tar shards at DEST (path or fsspec URL).

    Re-running the same command resumes: complete shards whose checksums match are kept.
    """
    from .convert.plan import ConvertOptions, parse_size
    from .convert.run import ConvertError, convert_dataset
    from .format import FormatError
    from .lerobot_v3 import SourceError
    from .resize import parse_resize

    _locations(source, dest)
    try:
        sizes = parse_resize(resize)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--resize") from None
    options = _storage_options(storage_options)
    data_files = _data_files(data_files_root, data_files_storage_options)
    source = _hub_source(source, revision, options)
    try:
        convert_options = ConvertOptions(
            shard_bytes=None if shard_size is None else parse_size(shard_size),
            episodes_per_shard=episodes_per_shard,
            shuffle_seed=shuffle_seed,
            reencode=reencode,
            gop=gop,
            crf=crf,
            resize=sizes,
            resize_mode=resize_mode,
        )
    except ValueError as e:  # e.g. both a shard size and an episode count
        raise click.UsageError(str(e)) from None
    try:
        manifest = convert_dataset(
            source,
            dest,
            convert_options,
            workers=workers,
            num_tasks=num_tasks,
            task_index=task_index,
            finalize_only=finalize,
            skip_bad_episodes=skip_bad_episodes,
            check_decode=check_decode,
            overwrite=overwrite,
            source_options=_remote(source, options),
            dest_options=_remote(dest, options),
            data_files_root=data_files,
            progress=progress,
        )
    except (ConvertError, SourceError, FormatError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if manifest is None:
        click.echo(f"task {task_index}/{num_tasks} done; the manifest waits for the other tasks")
        return
    reencoded = len(manifest.video.get("fallback_reencoded_episodes", []))
    click.echo(
        f"{dest}: {len(manifest.shards)} shards, {manifest.total_episodes} episodes, {manifest.total_frames} frames, "
        f"{manifest.total_bytes / 1e6:.1f} MB; {len(manifest.skipped_episodes)} episodes skipped, "
        f"{reencoded} re-encoded off a keyframe"
    )


@main.command()
@click.argument("out")
@click.option("--source", help="The LeRobot dataset OUT was converted from: check coverage and compare frames.")
@click.option(
    "--decode-check",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="N",
    help="Decode every frame of every clip in order with strict error detection (compared one by one with "
    "--source for stream-copied clips), plus N random frames per episode and camera through the loader's "
    "decoder (compared with --source). 0: no decoding.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the frames --decode-check picks.")
@click.option(
    "--legacy-format",
    is_flag=True,
    help="A dataset of format 1 or 2 (no digests of its metadata) passes if its shards do; without it, its "
    "format is reported as a problem (an edit may have lowered the version).",
)
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
@_REVISION
@_STORAGE_OPTIONS
@_data_files_options
def verify(
    out: str,
    source: str | None,
    decode_check: int,
    seed: int,
    legacy_format: bool,
    progress: bool,
    revision: str | None,
    storage_options: str | None,
    data_files_root: str | None,
    data_files_storage_options: str | None,
) -> None:
    """Check a converted dataset: checksums, member offsets, frame counts, episode coverage, decoded frames."""
    from .convert.verify import verify_dataset

    _locations(source, out)
    options = _storage_options(storage_options)
    data_files = _data_files(data_files_root, data_files_storage_options)
    if data_files is not None and not source:
        raise click.BadParameter("applies to --source", param_hint="--data-files-root")
    source = _hub_source(source, revision, options) if source else None
    try:
        report = verify_dataset(
            out,
            source,
            decode_check,
            seed=seed,
            storage_options=_remote(out, options),
            source_options=_remote(source, options) if source else None,
            progress=progress,
            legacy_format=legacy_format,
            data_files_root=data_files,
        )
    except FileNotFoundError as e:  # no such path: one line, no report of a dataset that is not there
        raise click.ClickException(str(e)) from None
    click.echo(str(report))
    if not report.ok:
        raise SystemExit(1)


@main.command()
@click.argument("out", type=click.Path(exists=True, file_okay=False))
@click.argument("url")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Shards sent at once (threads; memory about 50-100 MB each).",
)
@click.option("--overwrite", is_flag=True, help="Replace a destination that holds foreign or other-settings output.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar.")
@_STORAGE_OPTIONS
def upload(out: str, url: str, workers: int, overwrite: bool, progress: bool, storage_options: str | None) -> None:
    """Upload the finished conversion OUT to URL (e.g. s3://bucket/prefix): parallel, resumable, manifest last.

    Each shard's sha256 is checked against its sidecar before it is sent; shards already at URL
    (same size and sidecar) are skipped, so re-running after a kill sends only what is missing.
    A Hub dataset repo (hf://datasets/<namespace>/<name>[@<branch>], or a repo id) takes it through
    the Hub's commit API, the token from HF_TOKEN or the stored login (docs/hub.md).
    """
    from .convert.upload import UploadError, upload_dataset
    from .exceptions import ConvertError
    from .filesystems import hub_repo_id
    from .format import FormatError

    if url.startswith("hf://datasets/") or hub_repo_id(url) is not None:
        _upload_to_hub(out, url, overwrite=overwrite, progress=progress, storage_options=storage_options)
        return
    _locations(out, url)
    options = _storage_options(storage_options)
    try:
        summary = upload_dataset(
            out, url, workers=workers, storage_options=_remote(url, options), overwrite=overwrite, progress=progress
        )
    except (UploadError, ConvertError, FormatError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"{url}: {summary}")


def _upload_to_hub(out: str, url: str, *, overwrite: bool, progress: bool, storage_options: str | None) -> None:
    from .convert.upload import UploadError
    from .exceptions import ConvertError
    from .format import FormatError
    from .integrations.hub_upload import hub_destination, upload_to_hub

    if storage_options:
        raise click.BadParameter(
            "a Hub upload takes its token from HF_TOKEN or `hf auth login`, not from storage options",
            param_hint="--storage-options",
        )
    if not progress:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    try:
        destination = hub_destination(url)
        assert destination is not None
        summary = upload_to_hub(out, *destination, overwrite=overwrite)
    except (UploadError, ConvertError, FormatError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"{url}: {summary}")


@main.command("inspect")
@click.argument("path")
@_REVISION
@_STORAGE_OPTIONS
@_data_files_options
def inspect_cmd(
    path: str,
    revision: str | None,
    storage_options: str | None,
    data_files_root: str | None,
    data_files_storage_options: str | None,
) -> None:
    """Summarise PATH, a LeRobot v3.0 dataset or a converted one: episodes, frames, cameras, codecs, shards.

    A mixture file (.yaml, .yml, .json): its sources, shares, samples per epoch and shared keys.
    """
    from .convert.inspect import inspect_mixture, inspect_path
    from .format import FormatError
    from .lerobot_v3 import SourceError
    from .loader.mix.spec import is_mixture_file

    _locations(path)
    options = _storage_options(storage_options)
    data_files = _data_files(data_files_root, data_files_storage_options)
    try:
        if data_files is not None and is_mixture_file(path):
            raise ValueError(f"{path}: a mixture file gives each source's data_files_root itself")
        if not is_mixture_file(path):
            path = _hub_source(path, revision, options)
        if is_mixture_file(path):
            click.echo(inspect_mixture(path, storage_options=options))
        else:
            click.echo(inspect_path(path, storage_options=_remote(path, options), data_files_root=data_files))
    except (SourceError, FormatError, ValueError) as e:
        raise click.ClickException(str(e)) from None


@main.command()
@click.option(
    "--out",
    default="out/demo",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Folder for the default dataset, its conversion and nothing else.",
)
@click.option("--batches", default=30, show_default=True, type=click.IntRange(min=1), help="Batches to stream.")
@click.option(
    "--workers",
    default=2,
    show_default=True,
    type=click.IntRange(min=0),
    help="Conversion processes and DataLoader workers.",
)
def demo(out: str, batches: int, workers: int) -> None:
    """The main job on the built-in default dataset: synthesize, convert, stream, report throughput."""
    from .demo import format_result, run_demo

    click.echo(format_result(run_demo(out, batches=batches, num_workers=workers)))


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def train(args: tuple[str, ...]) -> None:
    """LeRobot's lerobot-train with its own arguments, reading a converted or raw v3.0 dataset
    (--dataset.root, local or URL) with this loader (needs LeRobot 0.6; docs/lerobot.md)."""
    from .integrations.train_process import tune

    tune()  # before torch loads: OpenMP reads its wait policy then
    from .integrations.lerobot_train import LeRobotUnavailable
    from .integrations.lerobot_train import train as lerobot_train

    try:
        lerobot_train(list(args))
    except LeRobotUnavailable as e:
        raise click.ClickException(str(e)) from None


def run() -> None:
    """Console entry point: run ``main``, then exit without interpreter teardown.

    A native library's thread still alive at teardown can abort a process whose command already
    succeeded ("terminate called without an active exception", SIGABRT, seen in about 1 of 24
    ``verify`` runs). By the time ``main`` returns the command's work is done and its files are
    closed, so output is flushed and the process exits with the command's status directly, once
    multiprocessing's finalizers have run.
    """
    try:
        main()
        code = 0
    except SystemExit as e:  # click always ends this way in standalone mode
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    # os._exit also skips multiprocessing's exit handler, which unlinks the named semaphores of
    # queues still alive: a DataLoader iterator the training loop still held (LeRobot's does) would
    # leave them to the resource tracker, which warns of "leaked semaphore objects" (spawn).
    import multiprocessing.util

    try:  # what its atexit hook runs first; nothing there may change the command's status
        getattr(multiprocessing.util, "_run_finalizers", lambda _: None)(0)
    except BaseException:  # noqa: BLE001, S110  (an interrupt while exiting: exit as decided)
        pass
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
