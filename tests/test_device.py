"""Which GPU a rank decodes on (pure resolution rules) and the clear errors around CUDA decoding."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from lerobot_shards.loader import DecodeOptions, EpisodePoolDataset
from lerobot_shards.loader.decoding.decoders import DecoderCache, fallback_message
from lerobot_shards.loader.read.sources import ClipRef
from lerobot_shards.loader.transport.device import rank_device, resolve_device
from lerobot_shards.synth import synth_dataset


@pytest.mark.parametrize(
    ("requested", "local_rank", "current", "expected"),
    [
        ("cpu", "3", None, "cpu"),
        ("cuda", "3", None, "cuda:3"),  # torchrun's LOCAL_RANK: each rank its own GPU
        ("cuda", None, None, "cuda:0"),
        ("cuda", "", 2, "cuda:2"),  # no launcher: CUDA's current device
        ("cuda:1", "3", None, "cuda:1"),  # explicit wins
        (torch.device("cuda", 2), None, None, "cuda:2"),
    ],
)
def test_resolve_device(requested, local_rank, current, expected) -> None:
    assert resolve_device(requested, local_rank=local_rank, device_count=4, current=current) == expected


def test_resolve_device_clear_errors() -> None:
    with pytest.raises(
        ValueError, match=r"device='cuda' \(LOCAL_RANK=5\) asks for GPU 5 but this machine has 4 \(0..3\)"
    ):
        resolve_device("cuda", local_rank="5", device_count=4)
    with pytest.raises(ValueError, match=r"device='cuda:4' asks for GPU 4 but this machine has 4"):
        resolve_device("cuda:4", local_rank=None, device_count=4)
    with pytest.raises(ValueError, match=r"LOCAL_RANK='x' is not a GPU index"):
        resolve_device("cuda", local_rank="x", device_count=4)
    with pytest.raises(ValueError, match=r"video_decode_device='cuda' but torch sees no CUDA device"):
        resolve_device("cuda", local_rank="0", device_count=0, what="video_decode_device")
    for bad in ("gpu", "cuda:x", "cuda:-1"):
        with pytest.raises(ValueError, match=r"must be 'cpu' or 'cuda' \(or 'cuda:N'\)"):
            resolve_device(bad, local_rank=None, device_count=4)


def test_rank_device_reads_this_process() -> None:
    assert rank_device("cpu", env={"LOCAL_RANK": "7"}) == "cpu"
    if torch.cuda.device_count() == 0:
        with pytest.raises(ValueError, match="torch sees no CUDA device"):
            rank_device("cuda", env={"LOCAL_RANK": "0"})


def test_dataset_options_fail_clearly(tmp_path: Path) -> None:
    root = synth_dataset(tmp_path / "ds", num_episodes=1, cameras=(), length_range=(3, 3))
    with pytest.raises(ValueError, match=r"cuda_decode_backend must be one of \('nvdec', 'ffmpeg'\), got 'beta2'"):
        EpisodePoolDataset(str(root), cuda_decode_backend="beta2")
    ds = EpisodePoolDataset(str(root), cuda_decode_backend="ffmpeg", strict_cuda_decode=True)
    assert (ds.video_decode_device, ds.cuda_decode_backend, ds.strict_cuda_decode) == ("cpu", "ffmpeg", True)
    assert set(ds.feature_stats["observation.state"]) >= {"mean", "std"}


@dataclass
class _Meta:
    codec: str


class _FallenBack:
    """What torchcodec reports for a clip NVDEC cannot decode (no GPU here to make a real one)."""

    metadata = _Meta("av1")
    cpu_fallback = "[CUDA] Fallback status: Falling back due to: Video not supported"


def test_nvdec_fallback_warns_once_or_refuses_when_strict(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # DecodeOptions accept cuda:1 (no GPU here)
    clip = ClipRef("s3://b/ds#e000001.cam", b"", None, 0, None)
    message = fallback_message("s3://b/ds#e000001.cam", "cuda:1", "av1", "Video not supported")
    assert "cuda:1 cannot decode this av1 stream on NVDEC" in message and "--reencode h264" in message
    strict = DecoderCache(1, DecodeOptions(video_decode_device="cuda:1", strict_cuda_decode=True))
    with pytest.raises(
        RuntimeError, match=r"e000001.cam: cuda:1 cannot decode this av1 stream.*strict_cuda_decode=True"
    ):
        strict._check_fallback(_FallenBack(), clip)
    lenient = DecoderCache(1, DecodeOptions(video_decode_device="cuda:1"))
    with pytest.warns(RuntimeWarning, match="cannot decode this av1 stream.*decoding it on the CPU instead") as record:
        for _ in range(3):
            lenient._check_fallback(_FallenBack(), clip)
    assert len(record) == 1  # one warning per process, not one per clip
