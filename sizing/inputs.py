"""User files read as data: a size limit first, then UTF-8 text, with one-line errors."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import KvsizeError
from .units import MiB


def _too_big(where: str, size: int, limit: int, what: str) -> KvsizeError:
    return KvsizeError(f"{where} is {size:,} bytes; {what} must be at most {limit:,} bytes ({limit / MiB:g} MiB)")


# Every file this process read through read_limited, resolved (links followed): an output is never one of them
_READ: set[str] = set()


def inputs_read() -> frozenset[str]:
    """The resolved paths of the files read so far (the run's inputs)."""
    return frozenset(_READ)


def read_limited(path: Path, limit: int, option: str, what: str, stdin_ok: bool = False) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them: a device, a pipe or a folder is
    refused (naming `option`) before anything is read, and a file that grows past the limit while
    it is read is refused too (/dev/zero reports no size; a FIFO would block). With `stdin_ok`, `-` is
    standard input, read up to the same limit."""
    if stdin_ok and str(path) == "-":
        import sys

        data = sys.stdin.buffer.read(limit + 1)
        if len(data) > limit:
            raise _too_big(f"{option}: standard input", len(data), limit, what)
        return data
    try:
        info = path.stat()
    except OSError as e:
        raise KvsizeError(f"{option}: cannot read {path} ({e.strerror or e})") from None
    _READ.add(os.path.realpath(path))
    if not stat.S_ISREG(info.st_mode):
        raise KvsizeError(f"{option}: {path} is not a regular file; give {what}")
    if info.st_size > limit:
        raise _too_big(f"{option}: {path}", info.st_size, limit, what)
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise KvsizeError(f"{option}: cannot read {path} ({e.strerror or e})") from None
    if len(data) > limit:
        raise _too_big(f"{option}: {path}", len(data), limit, what)
    return data


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
