"""How close kvsize came on the real starts, per release and architecture family: what
`profiles/engines/started.json` holds (written by `benchmarks/vllm_starts.py --write`, recomputed by a test) and
every answer's evidence line reads through sizing.engines.started."""

from __future__ import annotations

import statistics

from ..config.family import family
from ..engines.releases import version_key
from . import sglang_starts
from .starts import CORPUS, _config_model, accuracy_rows, load_corpus


def compute_started() -> dict:
    """started.json's content from the corpora of real starts (what `benchmarks/vllm_starts.py --write`
    writes and a test recomputes)."""
    def row(ids: set, gpus: set, errors: list[float], ok: int, predictions: int, most: int, stages: int = 1) -> dict:
        return {"starts": len(ids), "predictions": predictions, "within_1pct": ok,
                "median_abs_token_error": round(statistics.median(abs(e) for e in errors), 6),
                "worst_token_error": round(max(errors, key=abs), 6), "gpus": sorted(gpus),
                "max_gpus_per_start": most, "max_pipeline_stages": stages}

    def vllm_rows(rows) -> dict:
        errors = [r.kv_tokens_error for r in rows if r.kv_tokens_error is not None]
        ok = sum(1 for r in rows if all(abs(e) < 0.01 for e in (r.kv_budget_error, r.kv_tokens_error) if e is not None))
        return row({r.id for r in rows}, {r.gpu for r in rows}, errors, ok, len(rows),
                   max(used[r.id] for r in rows), max(stages[r.id] for r in rows))

    vllm_starts = load_corpus()
    used = {s.id: max(1, s.gpus_used) for s in vllm_starts}
    stages = {s.id: int(s.args.get("pipeline_parallel_size", 1)) for s in vllm_starts}
    all_rows = accuracy_rows(vllm_starts)
    vllm = {v: vllm_rows([r for r in all_rows if r.release == v]) for v in {r.release for r in all_rows}}
    vllm_families = {f: vllm_rows([r for r in all_rows if r.family == f]) for f in {r.family for r in all_rows}}
    vllm_archs = sorted({a for s in vllm_starts if s.status == "sized"
                         for a in _config_model(str(CORPUS / s.config))[1].architectures})

    def sglang_rows(rows) -> dict:
        errors = [c.tokens_error for c in rows]
        ok = sum(1 for e in errors if -0.01 < e <= 0.005)
        return row({c.start.id for c in rows}, {c.start.gpu for c in rows}, errors, ok, len(rows),
                   max(max(1, c.start.gpus_used) for c in rows))

    checks, shapes = [], {}
    for s in sglang_starts.load_corpus():
        if s.status == "sized":
            shapes[s.id] = sglang_starts._config_model(str(sglang_starts.CORPUS / s.config))[1]
            checks += [sglang_starts.check_start(s), sglang_starts.check_start_log(s)]
    sglang = {v: sglang_rows([c for c in checks if c.start.version == v]) for v in {c.start.version for c in checks}}
    sglang_families = {f: sglang_rows([c for c in checks if family(shapes[c.start.id]) == f])
                       for f in {family(sh) for sh in shapes.values()}}
    sglang_archs = sorted({a for sh in shapes.values() for a in sh.architectures})
    return {"source": "written by benchmarks/vllm_starts.py --write from tests/fixtures/vllm-starts and "
                      "tests/fixtures/sglang-starts (SGLang: within 1% and at most 0.5% above)",
            "vllm": dict(sorted(vllm.items(), key=lambda kv: version_key(kv[0]))),
            "sglang": dict(sorted(sglang.items(), key=lambda kv: version_key(kv[0]))),
            "architectures": {"vllm": vllm_archs, "sglang": sglang_archs},
            "families": {"vllm": dict(sorted(vllm_families.items())), "sglang": dict(sorted(sglang_families.items()))}}
