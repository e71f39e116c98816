"""Summarize a benchmark results directory: ``python benchmarks/summarize.py RESULTS_DIR``.

Writes ``summary.md`` (the table and the targets, met or missed and what bound them),
``summary.csv`` and the charts ``throughput.png`` and ``wait.png`` next to the JSONs, and prints
the markdown. ``bench.py`` runs it at the end; run it again after adding cases to a directory.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.report import summarize  # noqa: E402

__all__ = ["summarize"]

if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: summarize.py RESULTS_DIR")
    print(summarize(Path(sys.argv[1])))
