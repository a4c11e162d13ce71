"""User files read as data: a size limit first, then UTF-8 text, with one-line errors."""

from __future__ import annotations

from pathlib import Path

from .errors import KvsizeError
from .units import MiB


def _too_big(where: str, size: int, limit: int, what: str) -> KvsizeError:
    return KvsizeError(f"{where} is {size:,} bytes; {what} must be at most {limit:,} bytes ({limit / MiB:g} MiB)")


def read_limited(path: Path, limit: int, option: str, what: str) -> bytes:
    """The bytes of `path`, refused (naming `option`) before reading when over `limit`."""
    size = path.stat().st_size
    if size > limit:
        raise _too_big(f"{option}: {path}", size, limit, what)
    return path.read_bytes()


def limited_text(data: bytes | str, limit: int, where: str, what: str) -> str:
    """Uploaded or read bytes as text: at most `limit` bytes of UTF-8."""
    if isinstance(data, str):
        return data
    if len(data) > limit:
        raise _too_big(where, len(data), limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise KvsizeError(f"{where} is not UTF-8 text; expected {what}") from None
