"""``python tests/held_convert.py HOLD_DIR CLI-ARGS...``: the CLI with every shard but shard 0 held.

Fault tests kill or pause a conversion "mid-run". Waiting for the first sidecar and hoping the run
is still going is a race on a loaded machine (the rest can finish first). Here shard 0 is written
as usual, and every other shard waits, before it writes anything, until ``HOLD_DIR/release``
exists: a test that sees shard 0's sidecar knows the run is mid-conversion with every worker busy
until it releases it (``convert_helpers.held_cli``/``release``). The patch is made when this file
runs as a script, and again in each spawned converter worker (which imports it as
``__mp_main__``); importing it does nothing. Test code only: the library has no such hook.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

HOLD_ENV = "LEROBOT_SHARDS_TEST_HOLD_DIR"
RELEASE = "release"


def _hold_all_but_shard_zero(hold: Path) -> None:
    import lerobot_shards.convert.run as run

    build_shard = run.build_shard

    def held(source, shard, *args, **kwargs):  # type: ignore[no-untyped-def]
        while shard.index != 0 and not (hold / RELEASE).exists():
            time.sleep(0.01)  # a condition the test sets, not a guess at timing
        return build_shard(source, shard, *args, **kwargs)

    run.build_shard = held


if __name__ == "__main__":
    os.environ[HOLD_ENV] = sys.argv.pop(1)  # spawned workers find it in their environment
if __name__ in ("__main__", "__mp_main__"):
    _hold_all_but_shard_zero(Path(os.environ[HOLD_ENV]))
if __name__ == "__main__":
    from lerobot_shards import cli

    cli.run()
