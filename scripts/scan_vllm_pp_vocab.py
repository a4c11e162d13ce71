"""Read, from a vLLM source tree, which text-generation architectures build their vocabulary tensors on every
pipeline stage, and write profiles/engines/vllm-pp-vocab.json.

usage: python scripts/scan_vllm_pp_vocab.py VLLM_PACKAGE_DIR VERSION > profiles/engines/vllm-pp-vocab.json
VLLM_PACKAGE_DIR is an installed or unpacked `vllm/` folder. Most of vLLM's model classes build the input
embedding only on the first pipeline rank and the lm_head only on the last (else a PPMissingLayer); some build
either one unconditionally, so that every stage holds it (Qwen3-MoE, Mixtral: both). Each `__init__` assignment to
the model's embedding or to the causal-LM class's lm_head is read with the `if` tests around it; an assignment of a
real tensor under no test naming the pipeline group puts that tensor on every stage. Only architectures that
differ from the first-and-last default are written.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

EMBEDDINGS = ("embed_tokens", "wte", "word_embeddings", "embed_in", "tok_embeddings", "embedding")
PIPELINE_TESTS = ("pp_group", "is_first_rank", "is_last_rank", "pp_rank", "pp_size")


def _assignments(init: ast.FunctionDef, attrs) -> list[tuple[list[str], str, str]]:
    """(the `if` tests around it, the attribute, the assigned expression) for each `self.ATTR = ...`."""
    found: list[tuple[list[str], str, str]] = []

    def visit(statement: ast.stmt, tests: list[str]) -> None:
        if isinstance(statement, ast.If):
            test = ast.unparse(statement.test)
            for s in statement.body:
                visit(s, tests + [test])
            for s in statement.orelse:
                visit(s, tests + [f"not ({test})"])
            return
        if isinstance(statement, ast.Assign):
            for target in statement.targets:
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id == "self" and target.attr in attrs):
                    found.append((tests, target.attr, ast.unparse(statement.value)))
        for child in ast.iter_child_nodes(statement):
            if isinstance(child, ast.stmt):
                visit(child, tests)

    for statement in init.body:
        visit(statement, [])
    return found


def _every_stage(assignments) -> bool:
    """A real tensor assigned under no test that names the pipeline group."""
    return any(not value.startswith(("PPMissingLayer", "self.lm_head.tie_weights"))
               and not any(word in test for test in tests for word in PIPELINE_TESTS)
               for tests, _, value in assignments)


def _classes(models: Path) -> dict[str, tuple[ast.ClassDef, str]]:
    out: dict[str, tuple[ast.ClassDef, str]] = {}
    for path in sorted(models.glob("*.py")):
        try:
            tree = ast.parse(path.read_text())
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                out.setdefault(f"{path.stem}.{node.name}", (node, path.stem))
    return out


def _init(cls: ast.ClassDef) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)


def _inner_model(init: ast.FunctionDef) -> str | None:
    """The class name of `self.model = X(...)` in a causal-LM class's __init__."""
    for _, _, value in _assignments(init, ("model",)):
        name = value.split("(", 1)[0]
        if name.isidentifier():
            return name
    return None


def _find(classes, module: str, name: str):
    if f"{module}.{name}" in classes:
        return classes[f"{module}.{name}"][0]
    return next((cls for key, (cls, _) in classes.items() if key.endswith(f".{name}")), None)


def scan(package: Path) -> dict[str, dict[str, bool]]:
    models = package / "model_executor" / "models"
    registry = ast.parse((models / "registry.py").read_text())
    table = next(node.value for node in registry.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "_TEXT_GENERATION_MODELS" for t in node.targets))
    classes = _classes(models)
    out: dict[str, dict[str, bool]] = {}
    for key, value in zip(table.keys, table.values):
        architecture, (module, name) = ast.literal_eval(key), ast.literal_eval(value)
        causal = _find(classes, module, name)
        init = _init(causal) if causal else None
        if init is None:
            continue
        head = _every_stage(_assignments(init, ("lm_head",)))
        inner = _inner_model(init)
        inner_cls = _find(classes, module, inner) if inner else None
        inner_init = _init(inner_cls) if inner_cls else None
        embedding = _every_stage(_assignments(inner_init, EMBEDDINGS)) if inner_init else False
        if head or embedding:
            out[architecture] = {"embedding_every_stage": embedding, "lm_head_every_stage": head}
    return out


def main(argv: list[str]) -> int:
    package, version = Path(argv[1]), argv[2]
    json.dump({"source": f"vLLM {version}, model_executor/models (scripts/scan_vllm_pp_vocab.py)",
               "architectures": scan(package)}, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
