"""XLSX export shared by the CLI and the web app: frozen bold header, number and money formats."""

from __future__ import annotations

import io
import math


def _is_money(name: str) -> bool:
    return "usd" in name or name.startswith("price ")


def xlsx_bytes(sheets: dict[str, list[dict]]) -> bytes:
    """One worksheet per entry. Columns whose name has `usd` are dollars; in an (item, value, note)
    sheet such as a plan's summary, a value is dollars when its item names usd or a price."""
    import xlsxwriter

    buf = io.BytesIO()
    book = xlsxwriter.Workbook(buf, {"in_memory": True})
    bold = book.add_format({"bold": True, "bg_color": "#DDEBF7", "border": 1})
    formats = {
        "integer": book.add_format({"num_format": "#,##0"}),
        "decimal": book.add_format({"num_format": "#,##0.000"}),
        "usd": book.add_format({"num_format": "$#,##0.00"}),
        "usd_fine": book.add_format({"num_format": "$#,##0.0000"}),  # per million tokens: cents matter
        "wrap": book.add_format({"text_wrap": True, "valign": "top"}),
    }
    for title, rows in sheets.items():
        sheet = book.add_worksheet(title[:31])
        if not rows:
            continue
        columns = list(rows[0])
        by_item = columns[:2] == ["item", "value"]
        for c, name in enumerate(columns):
            sheet.write(0, c, name, bold)
            values = [r.get(name) for r in rows]
            numeric = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
            # An (item, value) sheet's values are of many kinds: Excel's General shows each as written.
            column_format = None if by_item and name == "value" else _number_format(name, numeric)
            width = 60 if by_item and name in ("value", "note") else max(12, min(48, len(name) + 2))
            sheet.set_column(c, c, width, formats[column_format] if column_format else None)
            for r, (row, value) in enumerate(zip(rows, values), start=1):
                if value is None or (isinstance(value, float) and math.isnan(value)):
                    continue  # an empty cell: a figure that does not apply (a candidate that does not fit)
                if isinstance(value, float) and math.isinf(value):
                    value = "inf"
                if isinstance(value, (list, tuple)):
                    value = "; ".join(str(v) for v in value)
                if not isinstance(value, (int, float, str, bool)):
                    value = str(value)
                cell = None
                if (by_item and name == "value" and isinstance(value, (int, float)) and not isinstance(value, bool)
                        and _is_money(str(row.get("item", "")))):
                    cell = formats[_number_format(str(row.get("item", "")), [value])]
                elif isinstance(value, str) and len(value) > 60:
                    cell = formats["wrap"]
                sheet.write(r, c, value, cell) if cell else sheet.write(r, c, value)
        sheet.freeze_panes(1, 0)
        sheet.autofilter(0, 0, len(rows), len(columns) - 1)
    book.close()
    return buf.getvalue()


def _number_format(name: str, numeric: list) -> str | None:
    if not numeric:
        return None
    if _is_money(name):
        return "usd_fine" if "per_million" in name or "per million" in name else "usd"
    return "decimal" if any(isinstance(v, float) for v in numeric) else "integer"
