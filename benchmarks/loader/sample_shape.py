"""Key/type/dtype/shape summary of a sample, shared by the benchmark and the LeRobot baseline.

Imported by both interpreters (ours and the LeRobot venv), so it needs nothing but torch.
"""

from __future__ import annotations

from typing import Any


def describe(sample: dict[str, Any]) -> dict[str, Any]:
    import torch

    out = {}
    for k, v in sample.items():
        if isinstance(v, torch.Tensor):
            out[k] = {"type": "tensor", "dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
        else:
            out[k] = {"type": type(v).__name__}
    return out
