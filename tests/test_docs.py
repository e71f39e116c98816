"""README.md and docs/*.md: every Python block runs, every local link resolves, README stays short.

The convention (README, "Documentation"): each ```python block runs on its own, in a fresh
namespace, from a working directory that holds ``out/demo/source`` (a LeRobot v3.0 dataset) and
``out/demo/converted`` (its conversion), made as ``make demo`` makes them but smaller (6 short
episodes), so an example a user copies after ``make demo`` is the example tested here. A ```yaml
block whose first line is ``# NAME`` is written to ``NAME`` there before its page's Python blocks
run. The endpoint ``http://minio:9000`` in a block stands for the suite's local S3 server (its
credentials in ``AWS_*``), which has a bucket ``my-bucket``. A block that starts spawned processes
(``convert_dataset``: its workers import the main script) runs as a script of its own in a
subprocess, as a user's copy would, so a missing ``__main__`` guard fails here. A block preceded by
``<!-- not-run: reason -->`` is skipped: keep those rare, and say why.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from lerobot_shards.demo import build_demo_data
from waits import HANG_GUARD_S

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 350
NOT_RUN = re.compile(r"<!--\s*not-run:\s*\S.*-->")
FILE_HEADER = re.compile(r"#\s*([\w.-]+\.(?:ya?ml|json))\s*$")
LINK = re.compile(r"\]\(([^)\s]+)\)")
EXAMPLE_ENDPOINT, EXAMPLE_BUCKET = "http://minio:9000", "my-bucket"
SPAWNING = ("convert_dataset(",)  # calls whose worker processes are spawned (they import the main script)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    skip_reason: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a markdown page, with the not-run mark of the line before each."""
    out: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = lines[i].strip()
        if not fence.startswith("```"):
            i += 1
            continue
        start, lang = i, fence[3:].strip()
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            i += 1
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        mark = NOT_RUN.search(before)
        out.append(
            Block(page, start + 1, lang, "\n".join(lines[start + 1 : i]) + "\n", mark.group(0) if mark else None)
        )
        i += 1
    return out


PYTHON_BLOCKS = [b for page in PAGES for b in blocks(page) if b.lang == "python"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ``out/demo`` as ``make demo`` leaves it (smaller), shared by the blocks."""
    work = tmp_path_factory.mktemp("docs")
    build_demo_data(work / "out/demo", episodes=6, length_range=(20, 40), num_workers=1, progress=False)
    return work


def test_every_page_has_blocks_and_the_readme_has_python() -> None:
    assert any(b.page.name == "README.md" for b in PYTHON_BLOCKS)
    skipped = [b.where for b in PYTHON_BLOCKS if b.skip_reason]
    assert len(skipped) <= len(PYTHON_BLOCKS) // 4, f"too many not-run blocks: {skipped}"


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda b: b.where)
def test_python_block_runs(
    block: Block, workdir: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if block.skip_reason:
        pytest.skip(block.skip_reason)
    monkeypatch.chdir(workdir)
    code = block.code
    if EXAMPLE_ENDPOINT in code:  # the page's bucket is the suite's S3 server
        server = request.getfixturevalue("s3_server")
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        fs = server.filesystem()
        if not fs.exists(EXAMPLE_BUCKET):
            fs.mkdir(EXAMPLE_BUCKET)
        code = code.replace(EXAMPLE_ENDPOINT, server.endpoint_url)
    for other in blocks(block.page):  # the page's files (mix.yaml, ...) as its text shows them
        header = FILE_HEADER.match(other.code.splitlines()[0]) if other.lang in ("yaml", "json") else None
        if header:
            (workdir / header.group(1)).write_text(other.code)
    if any(call in code for call in SPAWNING):
        script = workdir / f"{block.page.stem}_{block.line}.py"
        script.write_text(code)
        result = subprocess.run(
            [sys.executable, script.name], cwd=workdir, capture_output=True, text=True, timeout=HANG_GUARD_S
        )
        assert result.returncode == 0, f"{block.where} as a script:\n{result.stderr[-3000:]}"
        return
    exec(compile(code, block.where, "exec"), {"__name__": "__main__"})


def test_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_local_links_resolve(page: Path) -> None:
    """A link to a file of this repository (docs page, benchmark summary, chart) names one that exists."""
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links to missing files: {broken}"
