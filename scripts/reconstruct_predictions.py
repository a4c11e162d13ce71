"""Rebuild what kvsize would have predicted for each batch of vLLM starts committed before predictions were
committed ahead of a batch: the code of the commit before the batch, run on the batch's own starts.

usage: python scripts/reconstruct_predictions.py
For each commit that added starts to tests/fixtures/vllm-starts/manifest.jsonl and has no predictions file,
the parent commit is checked out into a temporary worktree and its own `sizing.evidence.starts.check_start` predicts
the batch's starts (their configs and logs read from this checkout). The result goes to
tests/fixtures/vllm-starts/predictions/reconstructed-<commit>.jsonl, each line naming the code (`code`) and
marked `reconstructed`. A batch whose parent cannot predict a start (no such code yet, or a start its schema
refuses) keeps the reason instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "vllm-starts"
PREDICTIONS = CORPUS / "predictions"
MANIFEST = "tests/fixtures/vllm-starts/manifest.jsonl"

# Run inside the parent's worktree: its code predicts the rows given on stdin, reading configs and logs from
# this checkout's corpus.
CHILD = r"""
import json, sys
from pathlib import Path
try:
    from sizing.evidence.starts import Start, check_start
except ImportError:  # a commit from before sizing/ was split into stages
    from sizing.starts import Start, check_start
corpus = Path(sys.argv[1])
for line in sys.stdin:
    row = json.loads(line)
    out = {"id": row["id"], "release": row["release"]}
    try:
        fields = set(Start.model_fields)
        start = Start.model_validate({k: v for k, v in row.items() if k in fields})
        check = check_start(start, corpus)
        tokens = check.term("kv_tokens")
        budget = check.term("kv_budget")
        out.update(kv_tokens=int(tokens.predicted) if tokens else None,
                   kv_budget_gib=budget.predicted if budget else None, model_runner=check.runner)
    except Exception as e:
        out["refused"] = (type(e).__name__ + ": " + str(e))[:300]
    print(json.dumps(out))
"""


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def batches() -> list[tuple[str, list[dict]]]:
    """(commit, the starts it added), oldest first."""
    out = []
    for commit in reversed(git("log", "--format=%H", "--", MANIFEST).split()):
        after = {json.loads(x)["id"]: json.loads(x) for x in git("show", f"{commit}:{MANIFEST}").splitlines() if x}
        try:
            before = {json.loads(x)["id"] for x in git("show", f"{commit}^:{MANIFEST}").splitlines() if x}
        except subprocess.CalledProcessError:
            before = set()
        added = [row for sid, row in after.items() if sid not in before and row.get("status") == "sized"]
        if added:
            out.append((commit, added))
    return out


def main() -> int:
    committed = {json.loads(x)["id"] for p in PREDICTIONS.glob("*.jsonl") if not p.name.startswith("reconstructed-")
                 for x in p.read_text().splitlines() if x}
    current = {json.loads(x)["id"]: json.loads(x) for x in (CORPUS / "manifest.jsonl").read_text().splitlines() if x}
    for commit, added in batches():
        rows = [current[r["id"]] for r in added if r["id"] in current and r["id"] not in committed]
        if not rows:
            continue
        parent = git("rev-parse", f"{commit}^").strip()
        with tempfile.TemporaryDirectory(prefix="kvsize-parent-") as tmp:
            git("worktree", "add", "--detach", tmp, parent)
            try:
                has_code = (Path(tmp) / "sizing" / "starts.py").exists()
                if has_code:
                    done = subprocess.run([sys.executable, "-c", CHILD, str(CORPUS)], cwd=tmp, text=True,
                                          input="".join(json.dumps(r) + "\n" for r in rows), capture_output=True,
                                          env={"PYTHONPATH": tmp, "PATH": "/usr/bin:/bin"}, timeout=1800)
                    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
                    if not lines:
                        lines = [{"id": r["id"], "release": r["release"],
                                  "refused": "the parent's code did not run: " + done.stderr.strip()[-200:]}
                                 for r in rows]
                else:
                    lines = [{"id": r["id"], "release": r["release"],
                              "refused": "no code to predict a start with before this batch (sizing/starts.py)"}
                             for r in rows]
            finally:
                git("worktree", "remove", "--force", tmp)
        path = PREDICTIONS / f"reconstructed-{commit[:10]}.jsonl"
        tmp_path = path.with_suffix(".jsonl.part")
        tmp_path.write_text("".join(json.dumps({"batch": path.stem, "code": parent, "reconstructed": True,
                                                "engine": "vllm", **line}, sort_keys=True) + "\n" for line in lines))
        tmp_path.replace(path)
        print(f"{path.name}: {sum('kv_tokens' in x and x['kv_tokens'] is not None for x in lines)} of {len(lines)} "
              "predicted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
