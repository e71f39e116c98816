"""Reading the tar headers in front of one member, as untrusted bytes: the member's real name and size.

The converter writes tars in PAX format (``convert/tar_sink.py``): a name that is not ASCII, or
longer than the ustar header's 100 bytes, goes into a PAX extended header (type ``x``) before
the member's ustar header, and the ustar name field only holds a stand-in (``?`` for each
non-ASCII character, the first 100 bytes of a long name). The member's name is the PAX ``path``
record when there is one, as every tar reader takes it; comparing the ustar field alone refuses
every non-ASCII name and lets a PAX header name another member unnoticed.

The loader reads these bytes straight from a ranged read (no ``tarfile`` stream to parse them),
and ``verify`` runs the same parser over the same bytes, so what ``verify`` accepts the loader
accepts. Only what the converter writes is accepted: at most one PAX header, then the ustar
header of a regular file; anything else (a GNU long name, a global header, a record that does
not parse, a PAX header that does not end where the member's header starts) is an error.
"""

from __future__ import annotations

import tarfile
from typing import Final

from .exceptions import LeRobotShardsError

BLOCK: Final = tarfile.BLOCKSIZE
UTF8_CHARSET: Final = b"ISO-IR 10646 2000 UTF-8"  # the PAX hdrcharset value meaning "names are UTF-8"
MAX_LENGTH_DIGITS: Final = 20  # a PAX record's length field; longer is no length this parser believes


class TarHeaderError(LeRobotShardsError, ValueError):
    """The tar headers in front of a member are damaged, or not the kind the converter writes."""


def header_start(member_end: int) -> int:
    """Where the next member's headers start: ``member_end`` (the previous member's last data byte
    + 1) padded to a whole 512-byte block, as tar writes it."""
    return -(-member_end // BLOCK) * BLOCK


def member_header(headers: bytes | memoryview) -> tuple[str, int]:
    """(name, size) of the member whose data follows ``headers``: exactly that member's headers,
    an optional PAX header with its records, then its ustar header. Raises ``TarHeaderError``."""
    if len(headers) < BLOCK or len(headers) % BLOCK:
        raise TarHeaderError(f"{len(headers)} bytes of tar headers in front of it, not whole 512-byte blocks")
    ustar = _header_block(headers[-BLOCK:], "its ustar header")
    if ustar.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        raise TarHeaderError(f"its tar header is of type {ustar.type!r}, not a regular file")
    records = _pax_header(headers[:-BLOCK]) if len(headers) > BLOCK else {}
    return _pax_name(records, ustar.name), _pax_size(records, ustar.size)


def _header_block(block: bytes | memoryview, what: str) -> tarfile.TarInfo:
    """One 512-byte tar header, its checksum checked (``tarfile`` parses the fields)."""
    try:
        return tarfile.TarInfo.frombuf(bytes(block), "utf-8", "surrogateescape")
    except tarfile.HeaderError as e:
        raise TarHeaderError(f"{what} is not a tar header ({e})") from None


def _pax_header(blocks: bytes | memoryview) -> dict[str, bytes]:
    """The records of the PAX extended header that fills ``blocks`` exactly (header and data)."""
    pax = _header_block(blocks[:BLOCK], "the header in front of its ustar header")
    if pax.type != tarfile.XHDTYPE:
        raise TarHeaderError(f"the header in front of its ustar header is of type {pax.type!r}, not a PAX header")
    data_blocks = len(blocks) // BLOCK - 1
    if not 0 <= pax.size <= data_blocks * BLOCK or header_start(pax.size) != data_blocks * BLOCK:
        raise TarHeaderError(
            f"its PAX header says {pax.size} bytes of records, but {data_blocks * BLOCK} bytes lie between "
            "it and the ustar header"
        )
    return _pax_records(bytes(blocks[BLOCK : BLOCK + pax.size]))


def _pax_records(data: bytes) -> dict[str, bytes]:
    """PAX records ``"<length> <keyword>=<value>\\n"``, every byte accounted for; a later record
    overrides an earlier one, as tar readers apply them."""
    records: dict[str, bytes] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos, pos + MAX_LENGTH_DIGITS + 1)
        digits = data[pos:space] if space > pos else b""
        end = pos + int(digits) if digits.isdigit() else -1
        equals = data.find(b"=", space + 1, end)
        if not space + 1 < equals < end <= len(data) or data[end - 1 : end] != b"\n":
            raise TarHeaderError(f"its PAX header's record at byte {pos} of {len(data)} does not parse")
        try:
            records[data[space + 1 : equals].decode("utf-8")] = data[equals + 1 : end - 1]
        except UnicodeDecodeError:
            raise TarHeaderError(f"its PAX header's record at byte {pos} has a keyword that is not UTF-8") from None
        pos = end
    return records


def _pax_name(records: dict[str, bytes], ustar_name: str) -> str:
    """The member's name: the PAX ``path`` record (UTF-8) when present, else the ustar name field."""
    charset = records.get("hdrcharset", UTF8_CHARSET)
    if charset != UTF8_CHARSET:
        raise TarHeaderError(f"its PAX header says names are in {charset!r}, not UTF-8")
    if "path" not in records:
        return ustar_name
    try:
        return records["path"].decode("utf-8")
    except UnicodeDecodeError:
        raise TarHeaderError(f"its PAX path record {records['path']!r} is not UTF-8") from None


def _pax_size(records: dict[str, bytes], ustar_size: int) -> int:
    """The member's size: the PAX ``size`` record (decimal) when present, else the ustar size field."""
    if "size" not in records:
        return ustar_size
    if not records["size"].isdigit():
        raise TarHeaderError(f"its PAX size record {records['size']!r} is not a size")
    return int(records["size"])
