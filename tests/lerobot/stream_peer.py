"""LeRobot 0.6.1's ``StreamingLeRobotDataset`` on a Hub dataset repo, in a process of its own: every
sample it gives, by (episode_index, frame_index), saved with ``torch.save`` (or its error, when it fails).

A process of its own because ``huggingface_hub`` reads ``HF_ENDPOINT`` and the offline switch once, at
import, and tests/lerobot/env.sh turns offline mode on: the test starts this with the server's endpoint.

    python tests/lerobot/stream_peer.py REPO_ID OUT.pt
"""

from __future__ import annotations

import sys

import torch


def main(repo_id: str, out: str) -> None:
    from lerobot.datasets.streaming_dataset import StreamingLeRobotDataset

    samples: dict[tuple[int, int], dict[str, object]] = {}
    try:
        for item in StreamingLeRobotDataset(repo_id, seed=0, return_uint8=True):
            key = (int(item["episode_index"]), int(item["frame_index"]))
            samples[key] = dict(item)
    except Exception as e:  # the result, for the test to assert on (a camera spread over several mp4s)
        torch.save({"error": f"{type(e).__name__}: {e}", "samples": samples}, out)
        return
    torch.save({"error": None, "samples": samples}, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
