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


if __name__ == "__main__":
    main()
