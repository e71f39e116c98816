"""torchcodec's YUV 4:2:0 -> RGB conversion, repeated bit for bit on frames kept as YUV.

A decoded-frame cache entry may hold frames as the decoder gives them (8-bit YUV 4:2:0, 12 bits a
pixel) instead of RGB (24): half the bytes to write on a cold epoch and to keep in the page cache
(``frame_cache``). Its reads then convert each frame as torchcodec 0.13's CPU decoder does when no
resize is asked and the width is a multiple of 32 (``CpuDeviceInterface::getColorConversionLibrary``
picks swscale then): one ``sws_scale`` at the same size into RGB24, flags 0, the frame's colour
space's coefficients (``sws_getCoefficients``) and swscale's default ranges (``createSwsContext``).
It is called here through ctypes on the very libswscale torchcodec loaded (found in this process's
memory map), so the same code, the same CPU paths and the same tables give the same bytes; tests
compare them with torchcodec's frames. ctypes releases the GIL for the call: decode threads
convert in parallel. ~0.12 ms per 480p frame on the 2-core machine (a plain copy of its RGB bytes:
~0.1).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from importlib import metadata

import numpy as np

YUV420P = 0  # AVPixelFormat values, stable across FFmpeg 4-8
RGB24 = 2
# torchcodec versions whose CPU conversion this repeats (SwScale.cpp: a colour conversion at the
# same size, flags 0, then any resize in RGB): 0.11-0.13, what pyproject.toml allows. Another
# version's frames are cached as RGB until its conversion has been read and tested.
TORCHCODEC_VERSIONS = ("0.11.", "0.12.", "0.13.")
# AVColorSpace values for which sws_getCoefficients has a table (others fall to its default, as
# torchcodec's frames then do): read from the frame, kept in the entry's header.
MAX_COLORSPACE = 17


@functools.cache
def library() -> ctypes.CDLL | None:
    """The libswscale torchcodec decodes with, loaded in this process, or None (then entries keep
    RGB): a torchcodec whose conversion is not known here (``TORCHCODEC_VERSIONS``), or none found."""
    from ...torch_pair import VideoDecoder  # noqa: F401  loads torchcodec's FFmpeg libraries

    if not metadata.version("torchcodec").startswith(TORCHCODEC_VERSIONS):
        return None

    path = None
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                name = line.rsplit(None, 1)[-1] if line.count(" ") >= 5 else ""
                if "/libswscale.so" in name:
                    path = name
                    break
    except OSError:  # no /proc (not Linux): entries keep RGB
        return None
    if path is None:
        return None
    lib = ctypes.CDLL(path)  # the same handle: dlopen of a path already loaded
    lib.sws_getContext.restype = ctypes.c_void_p
    lib.sws_getContext.argtypes = [ctypes.c_int] * 7 + [ctypes.c_void_p] * 3
    lib.sws_getCoefficients.restype = ctypes.POINTER(ctypes.c_int)
    lib.sws_getCoefficients.argtypes = [ctypes.c_int]
    lib.sws_getColorspaceDetails.argtypes = [ctypes.c_void_p] + [ctypes.c_void_p] * 7
    pointer, number = ctypes.c_void_p, ctypes.c_int
    lib.sws_setColorspaceDetails.argtypes = [pointer, pointer, number, pointer, number, number, number, number]
    lib.sws_scale.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 2 + [ctypes.c_void_p] * 2
    lib.sws_freeContext.argtypes = [ctypes.c_void_p]
    return lib


class _Context:
    """One SwsContext as torchcodec's ``createSwsContext`` makes it for a colour conversion."""

    def __init__(self, lib: ctypes.CDLL, height: int, width: int, colorspace: int) -> None:
        self.lib = lib
        self.ptr = lib.sws_getContext(width, height, YUV420P, width, height, RGB24, 0, None, None, None)
        if not self.ptr:
            raise RuntimeError("sws_getContext returned NULL")
        inv, table = ctypes.POINTER(ctypes.c_int)(), ctypes.POINTER(ctypes.c_int)()
        src_range, dst_range, brightness, contrast, saturation = (ctypes.c_int() for _ in range(5))
        details = (inv, src_range, table, dst_range, brightness, contrast, saturation)
        if lib.sws_getColorspaceDetails(self.ptr, *(ctypes.byref(x) for x in details)) == -1:
            raise RuntimeError("sws_getColorspaceDetails returned -1")
        coefficients = lib.sws_getCoefficients(colorspace)
        if (
            lib.sws_setColorspaceDetails(
                self.ptr,
                coefficients,
                src_range.value,
                coefficients,
                dst_range.value,
                brightness.value,
                contrast.value,
                saturation.value,
            )
            == -1
        ):
            raise RuntimeError("sws_setColorspaceDetails returned -1")
        self.height, self.width = height, width
        w, h = width, height
        self.offsets = (0, w * h, w * h + (w // 2) * (h // 2))
        self.strides = (ctypes.c_int * 4)(w, w // 2, w // 2, 0)
        self.dst_strides = (ctypes.c_int * 4)(3 * w, 0, 0, 0)

    def convert(self, src: np.ndarray, dst: np.ndarray) -> None:
        base = src.ctypes.data
        planes = (ctypes.c_void_p * 4)(*(base + o for o in self.offsets), None)
        out = (ctypes.c_void_p * 4)(dst.ctypes.data, None, None, None)
        rows = self.lib.sws_scale(self.ptr, planes, self.strides, 0, self.height, out, self.dst_strides)
        if rows != self.height:
            raise RuntimeError(f"sws_scale converted {rows} of {self.height} rows")

    def __del__(self) -> None:
        if getattr(self, "ptr", None):
            self.lib.sws_freeContext(self.ptr)
            self.ptr = None


_local = threading.local()  # an SwsContext is one thread's: (height, width, colorspace) -> _Context


def frame_bytes(height: int, width: int) -> int:
    """Bytes of one YUV 4:2:0 frame as entries keep it: the Y plane, then U, then V, unpadded."""
    return height * width + 2 * (height // 2) * (width // 2)


def convertible(height: int, width: int) -> bool:
    """torchcodec converts frames of this size with swscale (not its filtergraph), and 4:2:0 planes
    of it have whole chroma rows and columns: a YUV entry can serve them."""
    return width % 32 == 0 and height % 2 == 0 and library() is not None


def to_rgb(src: np.ndarray, dst: np.ndarray, height: int, width: int, colorspace: int) -> None:
    """Convert one frame's YUV 4:2:0 bytes ``src`` (``frame_bytes``, contiguous) into RGB24 ``dst``
    (height x width x 3 bytes, contiguous), as torchcodec does."""
    lib = library()
    assert lib is not None and src.flags.c_contiguous and dst.flags.c_contiguous
    contexts = getattr(_local, "contexts", None)
    if contexts is None:
        contexts = _local.contexts = {}
    context = contexts.get((height, width, colorspace))
    if context is None:
        context = contexts[(height, width, colorspace)] = _Context(lib, height, width, colorspace)
    context.convert(src, dst)


def scratch(nbytes: int) -> np.ndarray:
    """This thread's reused buffer of at least ``nbytes`` (the frames a read converts: one 480p
    frame's planes stay in the core's cache between the read, its checksum and its conversion)."""
    buf = getattr(_local, "scratch", None)
    if buf is None or buf.size < nbytes:
        buf = _local.scratch = np.empty(nbytes, np.uint8)
    return buf[:nbytes]
