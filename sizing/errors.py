"""One error type for every bad input, so front ends can print one line and exit 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class KvsizeError(ValueError):
    """A problem with the user's input or plan, phrased for the user: always one line (a value quoted
    from the input with line breaks in it keeps them escaped)."""

    def __init__(self, message: object = "", *args: object) -> None:
        text = str(message)
        if "\n" in text or "\r" in text:
            text = text.replace("\r", "\\r").replace("\n", "\\n")
        super().__init__(text, *args)


def unknown(kind: str, name: str, choices: Iterable[str], option: str | None = None) -> KvsizeError:
    """An error for an unknown name that lists the closest known names."""
    choices = sorted(choices)
    lowered = [c.lower() for c in choices]
    # names the typed one is part of first (int4 -> int4_per_token_head, lmdeploy_int4), then look-alikes
    typed = name.lower().strip()
    holding = [c for c in lowered if typed and typed in c and c != typed]
    holding.sort(key=lambda c: (not c.startswith(typed), len(c)))
    close = list(dict.fromkeys([*holding, *difflib.get_close_matches(typed, lowered, n=4, cutoff=0.4)]))[:4]
    by_lower = {c.lower(): c for c in choices}
    hint = f"; did you mean {', '.join(by_lower[c] for c in close)}?" if close else ""
    where = f" ({option})" if option else ""
    listing = ", ".join(choices) if len(choices) <= 12 else ", ".join(choices[:12]) + ", …"
    return KvsizeError(f"unknown {kind} {name!r}{where}{hint} Known: {listing}")
