"""LeRobot ``delta_timestamps`` windows: seconds to frame offsets, and clamped, padded indices.

Matches LeRobotDataset: a delta must sit on the frame grid within ``tolerance_s``, its offset is
round(delta * fps), and a query past an episode edge repeats the edge frame and is flagged pad.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Mapping, Sequence

import numpy as np


def delta_frame_offsets(
    delta_timestamps: Mapping[str, Sequence[float]],
    fps: float,
    tolerance_s: float = 1e-4,
    known_keys: Collection[str] | None = None,
) -> dict[str, np.ndarray]:
    """Validated int64 frame offsets per key; ValueError on an off-grid delta or unknown key."""
    if isinstance(tolerance_s, bool) or not isinstance(tolerance_s, numbers.Real) or not 0 <= tolerance_s < math.inf:
        # NaN would accept any delta (every comparison false) and round it to a frame silently
        raise ValueError(f"tolerance_s must be a finite number of seconds >= 0, got {tolerance_s!r}")
    if not fps > 0:
        raise ValueError(f"fps must be positive, got {fps}")
    if known_keys is not None:
        unknown = sorted(set(delta_timestamps) - set(known_keys))
        if unknown:
            raise ValueError(f"delta_timestamps has unknown keys {unknown}; valid keys: {sorted(known_keys)}")
    offsets: dict[str, np.ndarray] = {}
    for key, deltas in delta_timestamps.items():
        if isinstance(deltas, (str, bytes)) or not hasattr(deltas, "__len__") or np.ndim(deltas) != 1:
            raise ValueError(
                f"delta_timestamps[{key!r}] = {deltas!r} is not a list of seconds; write [{deltas!r}] for one delta"
            )
        if len(deltas) == 0:
            raise ValueError(f"delta_timestamps[{key!r}] is empty; give at least one delta")
        steps: list[int] = []
        for given in deltas:
            try:  # "0" or True is a typo, not seconds: float() would take them
                if isinstance(given, (str, bytes, bool, np.bool_)):
                    raise TypeError
                d = float(given)
            except (TypeError, ValueError):
                raise ValueError(f"delta_timestamps[{key!r}] has {given!r}, which is not a number of seconds") from None
            if not math.isfinite(d):
                raise ValueError(f"delta_timestamps[{key!r}] has a non-finite delta {d}")
            nearest = round(d * fps)
            if abs(d * fps - nearest) / fps > tolerance_s:
                raise ValueError(
                    f"delta_timestamps[{key!r}] has {d} s, which is not a whole number of "
                    f"frames at fps={fps} (tolerance_s={tolerance_s}); "
                    f"nearest valid delta: {nearest / fps}"
                )
            steps.append(nearest)
        offsets[key] = np.asarray(steps, dtype=np.int64)
    return offsets


def window_indices(frame: int | np.ndarray, length: int, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Frame indices ``frame + offsets`` clamped into the episode, and is_pad where clamped.

    Scalar ``frame`` gives shape (T,); an array of N frames gives (N, T).
    """
    if length < 1:
        raise ValueError(f"episode length must be at least 1, got {length}")
    frames = np.asarray(frame, dtype=np.int64)
    if frames.ndim > 1:
        raise ValueError(f"frame must be a scalar or 1-D array, got shape {frames.shape}")
    if np.any((frames < 0) | (frames >= length)):
        raise ValueError(f"frame indices must be in [0, {length}), got {frame}")
    wanted = frames[..., None] + np.asarray(offsets, dtype=np.int64)
    indices = np.clip(wanted, 0, length - 1)
    return indices, indices != wanted
