"""Which device a rank decodes on and feeds: its own GPU, never cuda:0 for every rank.

``resolve_device`` is pure (the environment and GPU count are arguments) so that the rules are
tested without a GPU; ``rank_device`` applies them to this process. The result is always an
explicit ``"cuda:N"`` (or ``"cpu"``), resolved in the parent, so that DataLoader workers, which
start with CUDA's current device at 0, decode on the rank's GPU too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch


def resolve_device(
    requested: str | torch.device,
    *,
    local_rank: str | None,
    device_count: int,
    current: int | None = None,
    what: str = "device",
) -> str:
    """``"cpu"`` or an explicit ``"cuda:N"`` for ``requested`` (``"cpu"``, ``"cuda"`` or ``"cuda:N"``).

    ``"cuda"`` means this rank's GPU: ``LOCAL_RANK`` (set by torchrun, Accelerate and srun
    launchers) when given, else CUDA's current device when known, else 0.
    """
    name = str(requested)
    if name == "cpu":
        return "cpu"
    kind, _, index = name.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ValueError(f"{what} must be 'cpu' or 'cuda' (or 'cuda:N'), got {name!r}")
    if device_count < 1:
        raise ValueError(f"{what}={name!r} but torch sees no CUDA device")
    if index:
        n, why = int(index), ""
    elif local_rank not in (None, ""):
        if not str(local_rank).isdigit():
            raise ValueError(f"{what}={name!r}: LOCAL_RANK={local_rank!r} is not a GPU index")
        n, why = int(local_rank), f" (LOCAL_RANK={local_rank})"
    else:
        n, why = (current or 0), " (the current CUDA device)"
    if n >= device_count:
        raise ValueError(
            f"{what}={name!r}{why} asks for GPU {n} but this machine has {device_count} (0..{device_count - 1})"
        )
    return f"cuda:{n}"


def rank_device(requested: str | torch.device, *, what: str = "device", env: Mapping[str, str] | None = None) -> str:
    """``resolve_device`` for this process: ``LOCAL_RANK`` from the environment, torch's GPU count.

    Does not initialise CUDA (safe before DataLoader workers fork).
    """
    env = os.environ if env is None else env
    if str(requested) == "cpu":
        return "cpu"
    current = torch.cuda.current_device() if torch.cuda.is_initialized() else None
    return resolve_device(
        requested, local_rank=env.get("LOCAL_RANK"), device_count=torch.cuda.device_count(), current=current, what=what
    )
