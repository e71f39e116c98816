"""``lerobot-shards`` command line: one click group, one sub-command per job."""

from __future__ import annotations

import logging

import click


@click.group()
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def main(verbose: int) -> None:
    """Repack LeRobot v3.0 datasets into episode-aligned tar shards and stream them."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


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
@click.option("--fps", default=30, show_default=True)
@click.option("--codec", type=click.Choice(["h264", "hevc", "av1"]), default="h264", show_default=True)
@click.option("--gop", default=2, show_default=True, help="Keyframe interval in frames.")
@click.option("--crf", default=30, show_default=True)
@click.option("--episodes-per-video-file", default=2, show_default=True)
@click.option("--episodes-per-data-file", default=2, show_default=True)
@click.option("--chunks-size", default=1000, show_default=True, help="Files per chunk directory.")
@click.option("--min-length", default=20, show_default=True, help="Shortest episode, in frames.")
@click.option("--max-length", default=40, show_default=True, help="Longest episode, in frames.")
@click.option("--seed", default=0, show_default=True)
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
    seed: int,
) -> None:
    """Write a synthetic LeRobot v3.0 dataset to OUT whose frames paint their own identity."""
    import json
    from pathlib import Path

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
            seed=seed,
        )
    except (ValueError, FileExistsError) as e:
        raise click.ClickException(str(e)) from e
    info = json.loads((Path(root) / "meta/info.json").read_text())
    files = [p for p in Path(root).rglob("*") if p.is_file()]
    click.echo(
        f"{root}: {info['total_episodes']} episodes, {info['total_frames']} frames, "
        f"{len(camera_keys)} cameras, {len(files)} files, {sum(p.stat().st_size for p in files)} bytes"
    )


if __name__ == "__main__":
    main()
