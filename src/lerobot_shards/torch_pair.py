"""torch and torchcodec must come as a pair: torchcodec 0.N is built against torch 2.N.

torchcodec declares no dependency on torch, so pip installs whatever pair it finds, and a
mismatched one fails deep inside torchcodec's library loading with a message about a missing
symbol or library. This module checks the pair when it is imported and only then imports
torchcodec's decoders: the package takes ``VideoDecoder`` from here, never from torchcodec
directly. pyproject.toml keeps both to the tested range, so a fresh install resolves to the
newest tested pair.
"""

from __future__ import annotations

import json
import re
from importlib import metadata

TESTED = {11: "LeRobot 0.6.1's environment", 13: "constraints.txt"}  # torch 2.N with torchcodec 0.N
NEWEST = max(TESTED)


def _minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string such as ``2.13.0+cpu``; None when it has no such prefix."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_torch_pair(torch_version: str | None = None, torchcodec_version: str | None = None) -> None:
    """Raise ``ImportError`` in one line when torch and torchcodec are not a pair (torchcodec 0.N
    with torch 2.N). The versions default to the installed distributions'; where either has no
    package metadata (a source build, a vendored copy) nothing is checked."""
    try:
        torch_version = torch_version or metadata.version("torch")
        torchcodec_version = torchcodec_version or metadata.version("torchcodec")
    except metadata.PackageNotFoundError:
        return
    t, c = _minor(torch_version), _minor(torchcodec_version)
    if t is None or c is None or (t[0] == 2 and c == (0, t[1])):
        return
    tested = " and ".join(f"torch 2.{n} with torchcodec 0.{n} ({where})" for n, where in sorted(TESTED.items()))
    fixes = [f"pip install 'torchcodec==0.{t[1]}.*'"] if t[0] == 2 and t[1] in TESTED else []
    fixes.append(f"pip install 'torch==2.{NEWEST}.*' 'torchcodec==0.{NEWEST}.*'")
    raise ImportError(
        f"torch {torch_version} with torchcodec {torchcodec_version}: torchcodec must match torch "
        f"(0.N with 2.N; tested: {tested}); fix: {', or '.join(fixes)}"
    )


check_torch_pair()  # before torchcodec loads: a mismatched pair is named here, not by a missing symbol in it
from torchcodec.decoders import VideoDecoder, set_cuda_backend  # noqa: E402  (after the check, on purpose)


def decoder_versions() -> str:
    """torchcodec's version and the FFmpeg libraries it decodes with: what decides a clip's decoded
    bits besides the clip (part of a decoded-frame cache entry's key, ``loader.decoding.frame_cache``)."""
    from torchcodec._core import get_ffmpeg_library_versions

    return f"torchcodec {metadata.version('torchcodec')}; {json.dumps(get_ffmpeg_library_versions(), sort_keys=True)}"


__all__ = ["VideoDecoder", "check_torch_pair", "decoder_versions", "set_cuda_backend"]
