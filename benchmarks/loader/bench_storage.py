#!/usr/bin/env python
"""Object-storage benchmark: the loader from a bucket without cache, with a cold and a warm node
cache, against local disk, and a raw LeRobot dataset from the same bucket with and without
prefetch-on-admit.

A real S3-protocol server (moto_server) runs on 127.0.0.1 behind a small shaping proxy that adds
``--latency-ms`` to every request and caps the bandwidth of all responses together at ``--mbps``
(a stand-in for a remote bucket). For each case: time to the first batch, samples/s over one
epoch, bytes fetched from storage per sample, cache hits/misses. Figures are ratios within one
run: the machine may be shared.

    .venv/bin/python benchmarks/loader/bench_storage.py                 # writes results/storage.{json,md}
    .venv/bin/python benchmarks/loader/bench_storage.py --episodes 8 --tag quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import fsspec
from torch.utils.data import DataLoader

from lerobot_shards.convert.plan import ConvertOptions
from lerobot_shards.convert.run import convert_dataset
from lerobot_shards.loader import EpisodePoolDataset
from lerobot_shards.synth import synth_dataset

HERE = Path(__file__).resolve().parent
CAMS = ("observation.images.front", "observation.images.top")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ShapingProxy(threading.Thread):
    """TCP proxy: each client send (a request) waits ``latency_s``; responses share ``rate`` bytes/s."""

    def __init__(self, upstream_port: int, latency_s: float, rate: float) -> None:
        super().__init__(daemon=True)
        self.port, self.upstream, self.latency, self.rate = free_port(), upstream_port, latency_s, rate
        self._free_at = 0.0  # when the shared link is next idle
        self._ready = threading.Event()

    async def _pump(self, reader, writer, shaped: bool) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await reader.read(1 << 16):
                if shaped:  # responses: the shared bandwidth cap
                    self._free_at = max(self._free_at, loop.time()) + len(data) / self.rate
                    await asyncio.sleep(self._free_at - loop.time())
                else:  # requests: the round trip
                    await asyncio.sleep(self.latency)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _client(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        await asyncio.gather(self._pump(reader, up_writer, False), self._pump(up_reader, writer, True))

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._client, "127.0.0.1", self.port)
        self._ready.set()
        async with server:
            await server.serve_forever()

    def run(self) -> None:
        asyncio.run(self._serve())

    def wait_ready(self) -> None:
        self._ready.wait(10)


def start_moto(port: int) -> subprocess.Popen:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
    exe = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, env=env)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}", timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("moto_server did not start")


def options(port: int) -> dict[str, Any]:
    return {"key": "bench", "secret": "bench", "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}


def run_case(source: str, args: argparse.Namespace, **kwargs: Any) -> dict[str, Any]:
    dt = 1 / 30
    ds = EpisodePoolDataset(
        source,
        delta_timestamps={CAMS[0]: [-dt, 0.0], CAMS[1]: [-dt, 0.0], "action": [i * dt for i in range(50)]},
        episode_pool_size=args.pool_size,
        seed=0,
        episodes_per_shard=args.episodes_per_shard,
        **kwargs,
    )
    start = time.perf_counter()
    first = None
    samples = 0
    for batch in DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers):
        if first is None:
            first = time.perf_counter() - start
        samples += len(batch["index"])
    total = ds.stats()["total"]
    seconds = time.perf_counter() - start
    return {
        "first_batch_s": round(first or 0.0, 3),
        "samples_per_s": round(samples / seconds, 1),
        "samples": samples,
        "storage_bytes_per_sample": round(total["storage_bytes"] / max(1, samples)),
        "cache_hits": int(total["cache_hits"]),
        "cache_misses": int(total["cache_misses"]),
        "cache_evictions": int(total["cache_evictions"]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=24)
    p.add_argument("--episodes-per-shard", type=int, default=2)
    p.add_argument("--texture", default="realistic", choices=("flat", "realistic"))
    p.add_argument("--latency-ms", type=float, default=30.0)
    p.add_argument("--mbps", type=float, default=100.0, help="MB/s, all responses together")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--pool-size", type=int, default=4)
    p.add_argument("--tag", default="storage")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    raw = synth_dataset(
        work / "raw", num_episodes=args.episodes, cameras=CAMS, codec="av1", texture=args.texture, seed=1
    )
    convert_dataset(raw, work / "converted", ConvertOptions(episodes_per_shard=args.episodes_per_shard), progress=False)
    moto_port = free_port()
    moto = start_moto(moto_port)
    try:
        fs = fsspec.filesystem("s3", **options(moto_port))
        fs.makedirs("bench-storage", exist_ok=True)
        fs.put(str(work / "converted") + "/", "s3://bench-storage/converted", recursive=True)
        fs.put(str(raw) + "/", "s3://bench-storage/raw", recursive=True)
        proxy = ShapingProxy(moto_port, args.latency_ms / 1000, args.mbps * 1e6)
        proxy.start()
        proxy.wait_ready()
        remote = options(proxy.port)
        cache = str(work / "cache")
        cases = {
            "converted local": (str(work / "converted"), {}),
            "converted s3, no cache": ("s3://bench-storage/converted", {"storage_options": remote}),
            "converted s3, cold cache": (
                "s3://bench-storage/converted",
                {"storage_options": remote, "cache_dir": cache},
            ),
            "converted s3, warm cache": (
                "s3://bench-storage/converted",
                {"storage_options": remote, "cache_dir": cache},
            ),
            "raw local": (str(raw), {}),
            "raw s3, no cache": ("s3://bench-storage/raw", {"storage_options": remote}),
            "raw s3, prefetch-on-admit": (
                "s3://bench-storage/raw",
                {"storage_options": remote, "cache_dir": cache + "-raw"},
            ),
        }
        results = {}
        for name, (source, kwargs) in cases.items():
            results[name] = run_case(source, args, **kwargs)
            print(f"{name:28s} {json.dumps(results[name])}", flush=True)
    finally:
        moto.kill()
    report = {
        "conditions": {
            **vars(args),
            "dataset_mb": round(sum(f.stat().st_size for f in raw.rglob("*") if f.is_file()) / 1e6, 1),
        },
        "note": "ratios within one run are meaningful; absolute figures depend on the machine's load",
        "results": results,
    }
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / f"{args.tag}.json").write_text(json.dumps(report, indent=2))
    lines = [
        f"# Loader from object storage ({args.latency_ms:g} ms/request, {args.mbps:g} MB/s, {args.workers} workers, "
        f"batch {args.batch_size}, {report['conditions']['dataset_mb']} MB raw)",
        "",
        "| case | first batch s | samples/s | storage bytes/sample | hits | misses | evictions |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['first_batch_s']} | {r['samples_per_s']} | {r['storage_bytes_per_sample']} | "
            f"{r['cache_hits']} | {r['cache_misses']} | {r['cache_evictions']} |"
        )
    (out / f"{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
