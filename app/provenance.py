"""What a written table rests on, carried inside the file (issue 50, item 7): the kvsize version, when it was
written, each engine release as resolved, each GPU's price date (flagged when older than six months) and every
caveat the run printed on stderr.

An XLSX gets a "provenance" sheet of (item, value, note) rows. A CSV gets provenance_* columns, the same on every
row, so that `pandas.read_csv` (and any spreadsheet) reads the table as before with nothing above its header.
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone

PRICE_STALE_MONTHS = 6

# every warning and note this run printed (kvsize: KIND: ...), in order; cleared at the start of each run
_printed: list[str] = []


def reset() -> None:
    _printed.clear()


def say(kind: str, message: str) -> None:
    """Print `kvsize: KIND: message` on stderr, and keep it for the provenance of any file this run writes."""
    print(f"kvsize: {kind}: {message}", file=sys.stderr)
    _printed.append(f"{kind}: {message}")


def printed() -> list[str]:
    return list(dict.fromkeys(_printed))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvsize")
    except PackageNotFoundError:
        from sizing import __version__

        return __version__


def _months_old(price_date: str, today) -> int:
    year, month = (int(p) for p in price_date.split("-")[:2])
    return (today.year - year) * 12 + today.month - month


def provenance_rows(engines: list[str], gpus: list[str], now: datetime | None = None) -> list[dict]:
    """(item, value, note) rows: what the file's figures rest on, and every caveat printed while making them."""
    from sizing.engines import get_engine
    from sizing.engines.started import parallel_evidence, release_evidence
    from sizing.planners.deployment import pinned_engine
    from sizing.profiles import gpu_profile

    now = now or datetime.now(timezone.utc)
    rows = [dict(item="kvsize version", value=_version(), note=""),
            dict(item="written", value=now.strftime("%Y-%m-%dT%H:%M:%SZ"), note="UTC")]
    for spec in dict.fromkeys(e.strip() for e in engines):
        engine = get_engine(spec)
        evidence = release_evidence(engine.name, engine.version)
        notes = [engine.label]
        if evidence is not None:
            notes.append(evidence.sentence())
        parallel = parallel_evidence(engine.name, engine.version) if engine.release is not None else None
        if parallel is not None:
            notes.append(parallel.summary(engine.name))
        if engine.release is not None and engine.release.unconfirmed:
            notes.append(f"{engine.release.name} rules: {engine.release.unconfirmed}")
        started = "" if evidence is None else " (started)" if evidence.started else " (never started)"
        rows.append(dict(item=f"engine release ({spec})", value=pinned_engine(engine) + started,
                         note="; ".join(notes)))
    for gpu in dict.fromkeys(gpus):
        g = gpu_profile(gpu)
        age = _months_old(g.price_date, now)
        stale = (f"OLDER THAN {PRICE_STALE_MONTHS} MONTHS ({age} months): check today's price"
                 if age > PRICE_STALE_MONTHS else f"{age} months old")
        rows.append(dict(item=f"price date ({gpu})", value=g.price_date,
                         note=f"of the bundled ${g.price_usd_per_hour:g}/GPU-h (a --price given overrides it), "
                              f"{stale}; {g.price_source}"))
    rows += [dict(item="caveat", value=line, note="printed on stderr by this run") for line in printed()]
    return rows


def with_provenance_columns(rows: list[dict], provenance: list[dict]) -> list[dict]:
    """The CSV's rows with provenance_* columns appended, the same on every row."""
    def joined(prefix: str, note: bool = False) -> str:
        return " | ".join(f"{r['value']}" + (f" ({r['note']})" if note and r["note"] else "")
                          for r in provenance if r["item"].startswith(prefix))

    columns = {
        "provenance_kvsize_version": joined("kvsize version"),
        "provenance_written_utc": joined("written"),
        "provenance_engine_release": joined("engine release"),
        "provenance_price_date": " | ".join(f"{r['item'].removeprefix('price date (').removesuffix(')')} "
                                            f"{r['value']}" + (f" (older than {PRICE_STALE_MONTHS} months)"
                                                               if "OLDER THAN" in r["note"] else "")
                                            for r in provenance if r["item"].startswith("price date")),
        "provenance_caveats": joined("caveat") or "none printed",  # never blank: pandas would read NaN
    }
    return [{**row, **columns} for row in rows]
