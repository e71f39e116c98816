"""One LeRobot baseline case: ``<lerobot python> run_lerobot.py CASE.json RESULT.json``.

Runs under the baseline's own interpreter (a LeRobot 0.4.4 venv, or LeRobot 0.6.1 inside a
Debian 13 root where the repository and data are mounted at the same paths), never ours:
LeRobot is not a dependency. It imports nothing from lerobot_shards, only ``harness.measure``
and ``harness.cases`` (standard library and torch), so both sides are timed by the same loop.

- ``map``: ``LeRobotDataset(repo_id, root=..., delta_timestamps=...)`` and a shuffled DataLoader
  with ``prefetch_factor`` (4, as LeRobot's training runs use);
- ``streaming``: ``StreamingLeRobotDataset`` on the same local root.

A uint8 case passes ``return_uint8=True`` where LeRobot has it (0.6: its training path); without
it (0.4) the case runs in float32 and says so in ``image_dtype_used``.
"""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.cases import camera_offsets, delta_timestamps  # noqa: E402
from harness.measure import drive, run_main  # noqa: E402


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("lerobot", "torch", "torchcodec")} | {"python": sys.version.split()[0]}


def _uint8(cls: type, case: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """``return_uint8=True`` for a uint8 case where LeRobot has it; else float32, said in the result."""
    if case["image_dtype"] != "uint8":
        return {}
    if "return_uint8" in inspect.signature(cls.__init__).parameters:
        return {"return_uint8": True}
    out.update(image_dtype_used="float32", note=f"{cls.__name__} of this LeRobot has no return_uint8: float32")
    return {}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader

    case = spec["case"]
    kind = case["kind"].rsplit(":", 1)[1]
    os.environ.setdefault("HF_HOME", spec["hf_home"])  # datasets' Arrow cache: in the results, not in ~
    root = spec["paths"]["raw-local"]
    delta = delta_timestamps(case["mode"], spec["fps"], spec["cameras"])
    out: dict[str, Any] = {"versions": _versions()}
    extra: dict[str, Any] = {"prefetch_factor": case["prefetch_factor"]} if case["workers"] else {}
    if kind == "map":
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        kwargs = _uint8(LeRobotDataset, case, out)
        dataset = LeRobotDataset("local/bench", root=root, delta_timestamps=delta, **kwargs)
        gen = torch.Generator().manual_seed(spec["seed"])
        loader = DataLoader(
            dataset, batch_size=case["batch_size"], shuffle=True, num_workers=case["workers"], generator=gen, **extra
        )
    elif kind == "streaming":
        from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset

        kwargs = _uint8(StreamingLeRobotDataset, case, out)
        dataset = StreamingLeRobotDataset("local/bench", root=root, delta_timestamps=delta, seed=spec["seed"], **kwargs)
        loader = DataLoader(dataset, batch_size=case["batch_size"], num_workers=case["workers"], **extra)
    else:
        raise ValueError(f"unknown LeRobot dataset kind {kind!r} (map or streaming)")
    frames_per_sample = len(camera_offsets(case["mode"])) * len(spec["cameras"])
    out.update(
        drive(
            loader,
            warmup_batches=spec["warmup_batches"],
            batches=spec["batches"],
            frames_per_sample=frames_per_sample,
            batch_len=lambda b: len(b["index"]),
            max_seconds=spec.get("max_seconds"),
        )
    )
    return out


if __name__ == "__main__":
    run_main(run)
