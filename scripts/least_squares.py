"""Small least-squares helpers the serving fit uses (scripts/fit_serving_terms.py): relative-error normal equations
solved in pure Python, and the count (of programs an SM runs at once) whose fit leaves the least squared error."""

from __future__ import annotations


def solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a small dense system)."""
    n = len(b)
    m = [row[:] + [v] for row, v in zip(a, b)]
    for i in range(n):
        k = max(range(i, n), key=lambda r: abs(m[r][i]))
        m[i], m[k] = m[k], m[i]
        for r in range(i + 1, n):
            f = m[r][i] / m[i][i]
            m[r] = [x - f * y for x, y in zip(m[r], m[i])]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (m[i][n] - sum(m[i][j] * x[j] for j in range(i + 1, n))) / m[i][i]
    return x


def relative_least_squares(rows: list[dict], columns: list, fixed, weight=lambda r: 1) -> list[float]:
    """The coefficients of `columns` (each a function of a row) that best fit each row's measured seconds less
    `fixed(row)`, in relative error: the normal equations of the rows, each divided by its measurement (and its
    squared error counted `weight(row)` times)."""
    x = [[c(r) / r["measured"] for c in columns] for r in rows]
    y = [(r["measured"] - fixed(r)) / r["measured"] for r in rows]
    w = [weight(r) for r in rows]
    n = len(columns)
    return solve([[sum(k * row[i] * row[j] for row, k in zip(x, w)) for j in range(n)] for i in range(n)],
                 [sum(k * row[i] * v for row, v, k in zip(x, y, w)) for i in range(n)])


def best_count(rows_at, columns: list, fixed, counts) -> tuple[int, list[float]]:
    """Over `counts`, the one whose rows (`rows_at(count)`) a least-squares fit of `columns` over `fixed` leaves the
    least squared relative error, each row counted once a step; that count and its coefficients."""
    fits = {}
    for k in counts:
        rows = rows_at(k)
        beta = relative_least_squares(rows, columns, fixed, lambda r: r["steps"])
        fits[k] = (sum(r["steps"] * ((fixed(r) + sum(b * c(r) for b, c in zip(beta, columns))) / r["measured"] - 1)
                       ** 2 for r in rows), beta)
    k = min(fits, key=lambda k: fits[k][0])
    return k, fits[k][1]


def line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the ordinary least-squares line of `ys` on `xs`."""
    intercept, slope = solve([[len(xs), sum(xs)], [sum(xs), sum(x * x for x in xs)]],
                             [sum(ys), sum(x * y for x, y in zip(xs, ys))])
    return intercept, slope
