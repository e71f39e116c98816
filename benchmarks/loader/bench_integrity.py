"""What verifying bytes costs the loader: hash throughput, and episode reads with and without checks.

1. Candidate hashes on one core over a 4 MiB buffer (the per-member checksum was picked by this).
2. ``ShardSource.read_episode`` over every episode of a converted dataset, format 2 (member
   checksums checked on each read) against the same shards described as format 1 (no checks):
   best of ``--repeats`` passes each, alternating, so both sides run under the same load.

Run: ``.venv/bin/python benchmarks/loader/bench_integrity.py [--dataset RAW] [--repeats 5]``.
Writes ``results/integrity.json`` and ``results/integrity.md``. Figures from a shared machine
are only meaningful as ratios inside one run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
import zlib
from pathlib import Path

import xxhash

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.format import MANIFEST_NAME, SHARDS_DIR
from lerobot_shards.loader.read.integrity import check_episode_bytes
from lerobot_shards.loader.read.sources import ShardSource

HERE = Path(__file__).resolve().parent
DEFAULT_DATASET = "/work/shared/fixtures/so101_record_test"
BUFFER = 4 * 1024 * 1024

HASHES = {
    "xxh3_128 (xxhash)": lambda b: xxhash.xxh3_128_digest(b),
    "crc32 (zlib)": lambda b: zlib.crc32(b),
    "sha256 (hashlib/OpenSSL)": lambda b: hashlib.sha256(b).digest(),
    "blake2b (hashlib)": lambda b: hashlib.blake2b(b).digest(),
}


def hash_rates(repeats: int) -> dict[str, float]:
    """GB/s per hash, best of ``repeats`` x 10 calls on a 4 MiB buffer."""
    data = os.urandom(BUFFER)
    out = {}
    for name, fn in HASHES.items():
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(10):
                fn(data)
            best = min(best, (time.perf_counter() - start) / 10)
        out[name] = BUFFER / best / 1e9
    return out


def as_format_1(src: Path, dst: Path) -> None:
    """A copy whose JSON says format 1: the same tars, no member checksums to check."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / MANIFEST_NAME).read_text())
    manifest["format_version"] = 1
    (dst / MANIFEST_NAME).write_text(json.dumps(manifest))
    for path in (dst / SHARDS_DIR).glob("*.idx.json"):
        side = json.loads(path.read_text())
        side["format_version"] = 1
        for e in side["episodes"]:
            for m in e["members"]:
                m.pop("xxh3_128", None)
        path.write_text(json.dumps(side))


def read_all(url: Path) -> tuple[float, int, int]:
    """Seconds to read every episode once (warm page cache), bytes read, episodes."""
    src = ShardSource(str(url))
    episodes = [(s.index, e) for s in src.info.shards for e in s.episodes]
    for shard, _ in episodes:
        src.sidecar(shard)  # parsing sidecars is not what is measured
    start = time.perf_counter()
    nbytes = sum(src.read_episode(shard, e).nbytes for shard, e in episodes)
    seconds = time.perf_counter() - start
    src.close()
    return seconds, nbytes, len(episodes)


def check_alone(url: Path, repeats: int) -> float:
    """Milliseconds per MB of episode for ``check_episode_bytes`` alone (best of ``repeats`` x 20 calls)."""
    src = ShardSource(str(url))
    best = float("inf")
    for s in src.info.shards:
        sidecar = src.sidecar(s.index)
        for entry in sidecar.episodes:
            start, end = entry.span()
            with open(url / SHARDS_DIR / sidecar.shard, "rb") as f:
                f.seek(start)
                blob = f.read(end - start)
            for _ in range(repeats):
                t = time.perf_counter()
                for _ in range(20):
                    check_episode_bytes(entry, blob, start, "bench")
                best = min(best, (time.perf_counter() - t) / 20 / (end - start))
    src.close()
    return best * 1e3 * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=DEFAULT_DATASET)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rates = hash_rates(args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        v2 = Path(tmp) / "v2"
        convert_dataset(args.dataset, v2, ConvertOptions(episodes_per_shard=1), progress=False)
        v1 = Path(tmp) / "v1"
        as_format_1(v2, v1)
        read_all(v2)  # warm the page cache
        best = {"format 2 (checked)": float("inf"), "format 1 (unchecked)": float("inf")}
        for _ in range(args.repeats):
            for label, url in (("format 2 (checked)", v2), ("format 1 (unchecked)", v1)):
                seconds, nbytes, n = read_all(url)
                best[label] = min(best[label], seconds)
        check_ms_per_mb = check_alone(v2, args.repeats)
    checked, unchecked = best["format 2 (checked)"], best["format 1 (unchecked)"]
    result = {
        "dataset": args.dataset,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared; ratios only)",
        "hash_gb_per_s_4MiB": {k: round(v, 2) for k, v in rates.items()},
        "episodes": n,
        "episode_bytes_mb": round(nbytes / 1e6, 1),
        "read_all_seconds": {k: round(v, 4) for k, v in best.items()},
        "checked_over_unchecked": round(checked / unchecked, 3),
        "check_ms_per_episode": round((checked - unchecked) / n * 1e3, 3),
        "check_episode_bytes_ms_per_mb": round(check_ms_per_mb, 4),
        "xxh3_ms_per_episode_from_rate": round(nbytes / n / (rates["xxh3_128 (xxhash)"] * 1e9) * 1e3, 4),
    }
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results/integrity.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# Integrity checks: cost",
        "",
        f"Dataset {args.dataset}, {n} episodes, {result['episode_bytes_mb']} MB of episode bytes; {result['machine']}.",
        "",
        "| hash (one core, 4 MiB buffer) | GB/s |",
        "|---|---|",
        *[f"| {k} | {v:.2f} |" for k, v in rates.items()],
        "",
        "| read_episode over all episodes (warm cache, best of " + str(args.repeats) + ") | seconds |",
        "|---|---|",
        *[f"| {k} | {v:.4f} |" for k, v in best.items()],
        "",
        f"Checked / unchecked: {result['checked_over_unchecked']}x ({result['check_ms_per_episode']} ms per episode; "
        "the difference is within the noise of a shared machine).",
        f"check_episode_bytes alone: {result['check_episode_bytes_ms_per_mb']} ms per MB of episode "
        f"({result['xxh3_ms_per_episode_from_rate']} ms per episode from the xxh3 rate).",
    ]
    (HERE / "results/integrity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
