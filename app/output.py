"""Output shared by several commands: files written whole or not at all, CSV, the estimate table."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from sizing.errors import KvsizeError
from sizing.units import GiB


# names that promise a file of another kind than text: a reader (Excel, pandas) would fail on text written under them
DATA_SUFFIXES = (".xlsx", ".xlsm", ".xls", ".ods", ".csv", ".tsv", ".json", ".jsonl", ".parquet", ".html", ".png",
                 ".pdf")


def _check_kind(out: str, fmt: str) -> None:
    """An --out of one file whose name says what it holds: `fmt` (table, csv or json) text is never written under a
    .xlsx, .csv or .json name of another kind."""
    suffix = Path(out).suffix.lower()
    expected = {"json": ".json", "csv": ".csv", "table": ".txt"}[fmt]
    other_kind = suffix in DATA_SUFFIXES and suffix != expected  # a text table under a spreadsheet's name
    if other_kind or (fmt != "table" and suffix not in (expected, "")):
        raise KvsizeError(f"--out {Path(out).name!r} does not match --format {fmt} (it writes {expected} text); "
                          f"name the file {Path(out).stem}{expected} or choose another --format")


def _emit(text: str, out: str | None, fmt: str = "table") -> None:
    """Standard output, or a file written whole (a temporary file renamed into place) whose name says what it holds
    (_check_kind)."""
    if out is not None:
        _check_kind(out, fmt)
    if out is None:
        sys.stdout.write(text)
        return
    _atomic_write(Path(out), text.encode())


def _checked_outs(paths: list[str], inputs: list[str | None] = ()) -> list[Path]:
    """Repeatable --out files: each a .csv, .xlsx or .json that can be written and is no input of the
    run, or none is written."""
    outs = [Path(o) for o in paths]
    _not_inputs(outs, list(inputs))
    for out in outs:
        if out.suffix.lower() not in (".csv", ".xlsx", ".json"):
            raise KvsizeError(f"--out must end in .csv, .xlsx or .json, got {out.name!r}")
        _check_out(out)
    return outs


def _not_inputs(outs: list[Path], inputs: list[str | None]) -> None:
    """An output never overwrites a file the same run reads."""
    for out in outs:
        for given in filter(None, inputs):
            try:
                same = Path(given).resolve() == out.resolve()
            except OSError:
                same = False
            if same:
                raise KvsizeError(f"--out {out} is the input file {given}; write the output elsewhere")


def _check_out(path: Path, inputs: tuple[str, ...] = ()) -> Path:
    """The --out path, refused before anything is computed or written when it cannot be written: a folder, a
    device, a FIFO or a socket (kvsize writes regular files only), or one of the run's inputs (`inputs`, and
    every file read so far), through a link too."""
    import stat as stat_module

    from sizing.inputs import inputs_read

    path = path.resolve()
    if path.is_dir():
        raise KvsizeError(f"--out: {path} is a folder; give a file name such as {path / 'out.csv'}")
    if path.exists() and not stat_module.S_ISREG(path.stat().st_mode):
        raise KvsizeError(f"--out: {path} is not a regular file (a device, FIFO or socket); kvsize writes only "
                          "regular files: give a file name")
    real = os.path.realpath(path)
    named = {os.path.realpath(p) for p in inputs if p and p != "-" and os.path.exists(p)}
    if real in named | inputs_read():
        raise KvsizeError(f"--out: {path} is one of this run's inputs; give another file name (kvsize never "
                          "writes over what it reads)")
    if not path.parent.is_dir():
        raise KvsizeError(f"--out: folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise KvsizeError(f"--out: folder {path.parent} is not writable")
    return path


def _atomic_write(path: Path, data: bytes) -> None:
    _write_all([(path, data)])


def _write_all(files: list[tuple[Path, bytes]]) -> None:
    """Every output written whole or none at all: each to a temporary file beside its target, and only
    when all are written are they renamed into place (a failure removes the temporary files)."""
    staged: list[tuple[str, Path, Path]] = []
    try:
        for given, data in files:
            path = _check_out(given)
            try:
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:100]}.", suffix=".part")
            except OSError as e:
                raise KvsizeError(f"--out {given}: cannot write there ({e.strerror or e})") from None
            staged.append((tmp, path, given))
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                umask = os.umask(0)
                os.umask(umask)
                mode = path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~umask  # a replaced file keeps its mode
                os.chmod(tmp, mode)
            except OSError as e:
                raise KvsizeError(f"--out {given}: cannot write there ({e.strerror or e})") from None
        for tmp, path, given in staged:
            try:
                os.replace(tmp, path)
            except OSError as e:
                raise KvsizeError(f"--out {given}: cannot write there ({e.strerror or e})") from None
    finally:
        for tmp, _, _ in staged:
            Path(tmp).unlink(missing_ok=True)


def _write_by_kind(outs: list[Path], csv: Callable[[], str], as_json: Callable[[], str],
                   xlsx: Callable[[], bytes]) -> None:
    """Each --out in the form its suffix names (.csv, .json, else .xlsx, which _checked_outs allows), each made only
    when asked for, all written whole or none at all."""
    made = {".csv": lambda: csv().encode(), ".json": lambda: as_json().encode()}
    _write_all([(out, made.get(out.suffix.lower(), xlsx)()) for out in outs])


def _label(message: str) -> str:
    """'note' for good news (a release started and predicted within 1%), 'warning' for anything else."""
    from sizing.engines.started import is_good_news

    return "note" if is_good_news(message) else "warning"


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f} GiB"


def _csv_text(rows: list[dict]) -> str:
    import csv
    import io

    buf = io.StringIO()
    columns = list(rows[0])
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([row.get(c) for c in columns] for row in rows)
    return buf.getvalue()


def _flat(record: dict) -> dict:
    flat = {k: v for k, v in record.items() if k not in ("breakdown", "warnings", "recommended_format")}
    flat.update({f"breakdown_{k}": v for k, v in record["breakdown"].items()})
    if "recommended_format" in record:
        best = record["recommended_format"] or {}
        flat["recommended_format"] = best.get("format", "")
        flat["recommended_format_max_concurrency"] = best.get("max_concurrency", "")
    flat["warnings"] = " | ".join(record["warnings"])
    return flat


def render_table(record: dict) -> str:
    b = record["breakdown"]
    lines = [
        f"model {record['model']} on {record['gpu']} ({record['engine_rules']}), TP {record['tensor_parallel_size']} "
        f"PP {record['pipeline_parallel_size']}, KV {record['k_cache_dtype']}/{record['v_cache_dtype']}, "
        f"weights {record['weights_dtype']}",
        f"  KV bytes per token         {record['kv_bytes_per_token']:>16,} B  (payload "
        f"{record['kv_payload_bytes_per_token']:,} + metadata {record['kv_metadata_bytes_per_token']:,}; "
        f"{record['kv_layers']} KV layers × {record['kv_heads_per_gpu']} KV heads per GPU)",
        f"  KV bytes per sequence      {record['kv_bytes_per_sequence']:>16,} B  at {record['max_model_len']:,} tokens "
        f"({_gib(record['kv_bytes_per_sequence'])}; engine reserves {_gib(record['kv_reserved_bytes_per_sequence'])})",
        f"  KV budget                  {record['kv_budget_bytes']:>16,} B  ({_gib(record['kv_budget_bytes'])} = "
        f"{record['budget_formula']})",
        f"  blocks                     {record['num_blocks']:>16,}    of {record['block_size']} tokens, "
        f"{record['block_bytes']:,} B each",
        f"  max tokens in cache        {record['max_tokens']:>16,}",
        f"  max concurrency            {record['max_concurrency']:>16,}    at {record['max_model_len']:,} tokens "
        f"({record['max_concurrency_ratio']:.2f}x)",
        f"  max context                {record['max_context_at_concurrency']:>16,}    tokens at "
        f"{record['concurrency']} concurrent requests",
        "  memory per GPU (GiB = 2^30 bytes):",
    ]
    for key, value in b.items():
        lines.append(f"    {key.removesuffix('_bytes'):<24}{value:>18,} B  {_gib(value):>14}")
    if record.get("tensor_parallel_notes"):
        lines.append(f"  per GPU at TP {record['tensor_parallel_size']}:")
        lines.extend(f"    {note}" for note in record["tensor_parallel_notes"])
    if record["engine_log_lines"]:
        lines.append(f"  {record['engine']} will print:")
        lines.extend(f"    {line}" for line in record["engine_log_lines"])
    lines.append(f"  {record['fit_message']}")
    best = record.get("recommended_format")
    if best is not None:
        here = "" if best["format"] == record["k_cache_dtype"] else f"; this estimate sized {record['k_cache_dtype']}"
        lines.append(f"  recommended format here: {best['format']} ({best['max_concurrency']:,} requests at this "
                     f"length; near-lossless and run by the engine on this GPU{here}; kvsize compare lists every "
                     "format)")
    elif "recommended_format" in record:
        lines.append("  recommended format here: none (no near-lossless format the engine runs on this GPU fits; "
                     "kvsize compare lists every format)")
    lines.extend(f"  {_label(w)}: {w}" for w in record["warnings"])
    return "\n".join(lines) + "\n"


class _Progress:
    """A bar on stderr with the time left, extrapolated from the rate so far."""

    width = 30

    def __init__(self) -> None:
        import time

        self._clock = time.monotonic
        self._start = self._clock()

    def __call__(self, done: int, total: int) -> None:
        filled = self.width * done // max(1, total)
        elapsed = self._clock() - self._start
        left = elapsed * (total - done) / done if done else 0.0
        end = "\n" if done == total else ""
        print(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done:,}/{total:,} scenarios, "
              f"{left:.1f} s left ", end=end, file=sys.stderr)
