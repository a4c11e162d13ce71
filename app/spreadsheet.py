"""XLSX export shared by the CLI and the web app: frozen bold header, number formats."""

from __future__ import annotations

import io
import math


def xlsx_bytes(sheets: dict[str, list[dict]]) -> bytes:
    import xlsxwriter

    buf = io.BytesIO()
    book = xlsxwriter.Workbook(buf, {"in_memory": True})
    bold = book.add_format({"bold": True, "bg_color": "#DDEBF7", "border": 1})
    integer = book.add_format({"num_format": "#,##0"})
    decimal = book.add_format({"num_format": "#,##0.000"})
    for title, rows in sheets.items():
        sheet = book.add_worksheet(title[:31])
        if not rows:
            continue
        columns = list(rows[0])
        for c, name in enumerate(columns):
            sheet.write(0, c, name, bold)
            values = [r.get(name) for r in rows]
            numeric = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
            fmt = decimal if any(isinstance(v, float) for v in numeric) else integer if numeric else None
            sheet.set_column(c, c, max(12, min(48, len(name) + 2)), fmt)
            for r, value in enumerate(values, start=1):
                if value is None or (isinstance(value, float) and math.isnan(value)):
                    continue  # an empty cell: a figure that does not apply (a candidate that does not fit)
                if isinstance(value, float) and math.isinf(value):
                    value = "inf"
                sheet.write(r, c, value if isinstance(value, (int, float, str, bool)) else str(value))
        sheet.freeze_panes(1, 0)
        sheet.autofilter(0, 0, len(rows), len(columns) - 1)
    book.close()
    return buf.getvalue()
