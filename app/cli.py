"""The `kvsize` command line. Heavy imports stay inside the commands that need them; each command is a
module of app.commands with add_parser(sub) and run(args)."""

from __future__ import annotations

import argparse
import os
import sys

from sizing.errors import KvsizeError, escaped, shown

from app.commands import (check_log, check_serve, compare, estimate, listings, measure, plan, sweep, tiers, validate,
                          verify, watch)
from app.output import _csv_text  # noqa: F401 - importable from app.cli, as before

INTERNAL_ERROR = 3  # exit status of an exception kvsize did not turn into a one-line error (0 done, 1 a check
# or target not met, 2 bad input or usage)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        # No abbreviations: `plan --format json` must not be read as `--formats json`.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # one line, exit 2
        raise KvsizeError(message)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvsize")
    except PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvsize", description="KV cache capacity planner for LLM serving.")
    parser.add_argument("--traceback", action="store_true", help="show the full error on failure")
    parser.add_argument("--version", action="version", version=f"kvsize {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    estimate.add_parser(sub)
    compare.add_parser(sub)
    sweep.add_parser(sub)
    listings.add_parser(sub)
    plan.add_parser(sub)
    tiers.add_parser(sub)
    measure.add_parser(sub)
    check_log.add_parser(sub)
    check_serve.add_parser(sub)
    verify.add_parser(sub)
    watch.add_parser(sub)
    validate.add_parser(sub)
    return parser


class _Terminated(BaseException):
    """SIGTERM, raised where the program is so that half-written files are removed on the way out."""


def _on_sigterm(signum, frame):
    raise _Terminated


def _raised_while_ending(error: BaseException, kind: type) -> bool:
    """Whether `error` was raised while a `kind` (SIGTERM, Ctrl-C) was unwinding: it is in its context chain."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, kind):
            return True
        seen.add(id(error))
        error = error.__context__
    return False


def _refuse_out_onto_an_input(args) -> None:
    """--out is checked against every file the command line names, before anything runs (the readers check
    it again against what they read, config.json inside a model folder included)."""
    from pathlib import Path

    from app.output import _check_out

    named = []
    for key, value in vars(args).items():
        if key == "out" or callable(value):
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, str) and len(item) < 4096:
                named.append(item)
                named.append(str(Path(item) / "config.json"))
    outs = args.out if isinstance(args.out, (list, tuple)) else [args.out]
    for out in outs:
        if isinstance(out, str):
            _check_out(Path(out), tuple(named))
    if isinstance(args.out, str):  # one file of text: its name says which (measure and verify write a JSON report)
        from app.output import _check_kind

        fmt = getattr(args, "format", None) or ("json" if args.command in ("measure", "verify") else None)
        if fmt in ("table", "csv", "json"):
            _check_kind(args.out, fmt)


# Characters kvsize's own text uses, as ASCII for a stream that cannot encode them (LANG=C, PYTHONIOENCODING=ascii);
# anything else such a stream cannot encode is written as its escape
_ASCII = str.maketrans({"×": "x", "—": "-", "–": "-", "−": "-", "≤": "<=", "≥": ">=", "±": "+/-", "…": "...",
                        "→": "->", "←": "<-", "≈": "~", "’": "'", "‘": "'", "“": '"', "”": '"', "·": ".", "µ": "u",
                        "²": "^2", "³": "^3", "√": "sqrt", "Δ": "delta", "≠": "!=", "•": "*", "✓": "ok", "✗": "x",
                        "\u00a0": " ", "\u202f": " ", "\u2009": " "})


class _TerminalSafe:
    """A text stream that shows control characters from untrusted input as escapes instead of obeying them
    (tabs, line breaks and the carriage return of the progress bar pass), and degrades to ASCII where the
    stream's encoding cannot write a character, instead of failing."""

    def __init__(self, stream) -> None:
        self._stream = stream
        encoding = (getattr(stream, "encoding", None) or "utf-8").lower().replace("_", "-")
        self._encoding = None if encoding in ("utf-8", "utf8") else encoding

    def write(self, text: str) -> int:
        text = escaped(text, keep="\t\n\r")
        if self._encoding is not None:
            try:
                text.encode(self._encoding)
            except (UnicodeEncodeError, LookupError):
                text = text.translate(_ASCII)
                try:
                    text = text.encode(self._encoding, "backslashreplace").decode(self._encoding)
                except LookupError:
                    text = text.encode("ascii", "backslashreplace").decode("ascii")
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _TerminalSafe(out), _TerminalSafe(err)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = out, err


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    show_traceback = "--traceback" in argv
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        # a closed terminal (SIGHUP) ends a run as SIGTERM does: half-written files removed on the way out
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is not None:
                signal.signal(sig, _on_sigterm)
    from app.provenance import reset

    reset()  # the caveats a file of this run carries are this run's
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "out", None):
            _refuse_out_onto_an_input(args)
        return args.run(args)
    except KeyboardInterrupt:
        print("kvsize: interrupted; nothing was written", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (kvsize formats | head): stop quietly, as other command-line tools do
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except _Terminated:
        print("kvsize: terminated; nothing was written", file=sys.stderr)
        return 143
    except KvsizeError as e:
        if show_traceback:
            raise
        print(f"kvsize: error: {e}", file=sys.stderr)
        return 2
    except (OSError, ImportError) as e:
        if show_traceback:
            raise
        named = getattr(e, "filename", None) is not None and getattr(e, "strerror", None)
        print(f"kvsize: error: {KvsizeError(f'{e.strerror}: {shown(str(e.filename), 120)}' if named else e)}",
              file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - an escaped exception is a kvsize bug, never a silent success
        if _raised_while_ending(e, _Terminated):
            # a library's clean-up (a zip file closed half-written) raised on the way out of SIGTERM
            print("kvsize: terminated; nothing was written", file=sys.stderr)
            return 143
        if _raised_while_ending(e, KeyboardInterrupt):
            print("kvsize: interrupted; nothing was written", file=sys.stderr)
            return 130
        if show_traceback:
            raise
        print(f"kvsize: internal error: {type(e).__name__}: {KvsizeError(str(e)[:200])} (a bug in kvsize: please "
              "report it with the command line; --traceback shows where)", file=sys.stderr)
        return INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
