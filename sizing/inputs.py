"""User files read as data: a size limit first, then UTF-8 text, with one-line errors."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

from .errors import KvsizeError, shown
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

        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:
            raise KvsizeError(f"{option}: - reads standard input, and this run has none; give {what} as a file")
        try:
            interactive = stream.isatty()
        except (OSError, ValueError):
            interactive = False
        if interactive:
            raise KvsizeError(f"{option}: - reads standard input, which is a terminal here; pipe {what} in "
                              "(kvsize check-log - < vllm.log) or give it as a file")
        try:
            data = stream.read(limit + 1)
        except (OSError, ValueError) as e:
            raise KvsizeError(f"{option}: cannot read standard input ({e})") from None
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


MAX_JSON_DIGITS = 100  # no figure kvsize reads is written with more digits; Python refuses past 4,300 anyway
MAX_JSON_DEPTH = 64  # the files kvsize reads nest a few levels; deeper ones are refused before anything walks them


class NotJson(KvsizeError):
    """Text that does not parse as JSON (a reader may say what it expected in its own words); `detail` is where."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class _LongNumber:
    """An integer written with more than MAX_JSON_DIGITS digits, kept as its length until its field is named."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _bounded_int(text: str):
    digits = len(text.lstrip("-"))
    return _LongNumber(digits) if digits > MAX_JSON_DIGITS else int(text)


def json_path(path: tuple) -> str:
    """A field's place in a JSON document as an error names it: decode[0].attention_rel_error."""
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out or "(the top level)"


def _too_deep(where: str, what: str) -> str:
    return f"{where} nests arrays or objects too deeply (more than {MAX_JSON_DEPTH} levels); expected {what}"


def _is_bad(leaf, finite: bool) -> bool:
    return isinstance(leaf, _LongNumber) or (finite and isinstance(leaf, float) and not math.isfinite(leaf))


def _maybe_not_finite(children, kinds: set) -> bool:
    """Whether the numbers may hold a NaN or an infinity: their sum, taken in C, is finite otherwise (a sum that
    overflows says maybe; the walk that names the field then finds none and lets it pass)."""
    if kinds <= {int, float, bool}:
        return not math.isfinite(sum(children))
    return any(c - c != 0 for c in children if type(c) is float)  # c - c is NaN for an infinity or a NaN


def _first_bad(value, finite: bool) -> tuple[tuple, object] | None:
    """The path and the leaf of the first number out of bounds (or the path where the nesting passes
    MAX_JSON_DEPTH, with None), else None. One pass over the containers, in memory of the nesting's depth times its
    width; the paths are followed only once there is something to name."""
    if _is_bad(value, finite):
        return (), value
    if not isinstance(value, (dict, list)):
        return None
    stack, found = [(value, 0)], False
    while stack and not found:
        node, depth = stack.pop()
        children = node.values() if type(node) is dict else node
        kinds = set(map(type, children))  # a list of a million numbers is looked at in C, not number by number
        inner = [c for c in children if type(c) is dict or type(c) is list] if kinds & {dict, list} else []
        found = (depth + 1 >= MAX_JSON_DEPTH and bool(inner)) or _LongNumber in kinds or (
            finite and float in kinds and _maybe_not_finite(children, kinds))
        stack.extend((c, depth + 1) for c in inner)
    if not found:
        return None
    # the second walk names it: depth first, in the document's order
    def items(node):
        return iter(node.items()) if isinstance(node, dict) else enumerate(node)

    walk = [((), items(value))]
    while walk:
        path, pending = walk[-1]
        for key, child in pending:
            if _is_bad(child, finite):
                return (*path, key), child
            if isinstance(child, (dict, list)):
                if len(path) + 1 >= MAX_JSON_DEPTH:
                    return (*path, key), None
                walk.append(((*path, key), items(child)))
                break
        else:
            walk.pop()
    return None


def load_json(data: bytes | str, where: str, what: str, limit: int = 64 * 1024 * 1024, finite: bool = False):
    """JSON text as data, bounded: at most `limit` bytes of UTF-8, nested at most MAX_JSON_DEPTH levels, integers of
    at most MAX_JSON_DIGITS digits (and with `finite`, no NaN or Infinity); what breaks a bound is refused in one
    line naming its field (`where`: the option or file, `what`: what was expected there)."""
    text = limited_text(data, limit, where, what)
    try:
        value = json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as e:
        detail = f"{e.msg} at line {e.lineno}, column {e.colno}"
        raise NotJson(f"{where} is not valid JSON ({detail}); expected {what}", detail) from None
    except RecursionError:
        raise KvsizeError(_too_deep(where, what)) from None
    bad = _first_bad(value, finite)
    if bad is not None:
        path, node = bad
        if node is None:
            raise KvsizeError(_too_deep(where, what))
        if isinstance(node, _LongNumber):
            raise KvsizeError(f"{where}: field {shown(json_path(path))} is a number too long ({node.digits:,} "
                              f"digits); {what} writes none longer than {MAX_JSON_DIGITS}")
        raise KvsizeError(f"{where}: field {shown(json_path(path))} is {node}; {what} holds finite numbers only")
    return value
