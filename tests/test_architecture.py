"""The shape of the code that docs/architecture.md draws: sizing/ as stages that import only the stages below
them, evidence a layer above the estimate, no import circle anywhere, no module over 600 lines, and sizing/ free
of torch, streamlit, plotly and measure."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sizing", "app", "measure")
MAX_LINES = 600

# Each sub-package of sizing/ and the stages it may import (the top-level foundation modules are below all).
STAGES = ("config", "cache", "profiles", "engines", "capacity", "planners", "evidence")
FOUNDATION = {"sizing", "sizing.errors", "sizing.units", "sizing.hashing", "sizing.inputs", "sizing.efficiency"}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules a module imports, at the top or inside a function alike."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [stem] + [f"{stem}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def _stage(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "sizing" or module in FOUNDATION:
        return None
    return parts[1]


def test_no_import_circle():
    graph = _graph()
    # a package's __init__ re-exports its modules: an edge into a package is an edge into what it re-exports
    state, circles = {}, []

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(trail[trail.index(nxt):] + [nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not circles, f"import circles: {circles[:5]}"


def test_sizing_stages_import_only_the_stages_below_them():
    order = {s: i for i, s in enumerate(STAGES)}
    wrong = []
    for module, targets in _graph().items():
        stage = _stage(module)
        if stage is None:
            continue
        for target in targets:
            below = _stage(target)
            if target.split(".")[0] != "sizing":
                wrong.append(f"{module} imports {target}")
            elif below is not None and order[below] > order[stage]:
                wrong.append(f"{module} ({stage}) imports {target} ({below})")
    assert not wrong, "\n".join(wrong)


def test_the_estimate_never_imports_the_evidence():
    graph = _graph()
    reached, todo = set(), ["sizing.capacity.estimate"]
    while todo:
        node = todo.pop()
        if node not in reached:
            reached.add(node)
            todo.extend(graph.get(node, ()))
    assert not {m for m in reached if m.startswith(("sizing.evidence", "sizing.planners"))}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_over_600_lines(package):
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / package).rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, long


def test_sizing_imports_no_torch_streamlit_plotly_or_measure():
    heavy = ("torch", "streamlit", "plotly", "measure", "app", "triton", "numpy")
    wrong = []
    for path in (ROOT / "sizing").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            wrong += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in heavy]
    assert not wrong, wrong
