"""Copy what the GPU machine's serving runs wrote (the res/ folder of go.sh's res.tgz) into measure/serving/.

Per batch: env.txt (nvidia-smi, vLLM and torch versions; a server run on another machine than the batch's first keeps
its own); per server: server.cmd, server.log, metrics.tsv; per point: the bench result, gzipped (<point>.json.gz),
and <point>.meta.json; where the server ran with the step trace, its engine core's steps as steps.tsv.gz. A bench
result over 1,000,000 bytes is trimmed: its generated_texts (the random words the dummy weights produced) are dropped, and the file says so under "kvsize_trimmed"; the per-request TTFT and ITL lists
are kept as they were written unless the result is still over measure.serving's RAW_LIMIT gzipped, when they are
rounded to the microsecond (and the file says so). The folder the kit ran from on the machine is written as
measure/serving (its models/) or as the kit's own name (its generated tokenizers/).

usage: python scripts/ingest_serving.py RES_DIR [BATCH ...]   (only the batches named; default: every batch found)
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure.serving import RAW_LIMIT, read_bounded  # noqa: E402
from measure.steps import TRACE_UNPACKED_LIMIT  # noqa: E402
SERVING = ROOT / "measure" / "serving"
TRIM_ABOVE = 1_000_000
MICROSECOND_LISTS = ("ttfts", "itls", "latencies", "start_times", "queue_times")
# the kit ran from a copy of the repository wherever the machine put it: any absolute folder ending in .serve-kit/
KIT_ON_MACHINE = re.compile(r"/[^\s\"']*/\.serve-kit/")
RES_ON_MACHINE = "/tmp/res/"


def clean(text: str) -> str:
    text = re.sub(KIT_ON_MACHINE.pattern + "models/", "measure/serving/models/", text)
    return KIT_ON_MACHINE.sub("serve-kit/", text).replace(RES_ON_MACHINE, "")


def copy_text(src: Path, dst: Path) -> None:
    dst.write_text(clean(src.read_text(errors="replace")))


def copy_bench(src: Path, dst: Path) -> None:
    """The bench result gzipped (the repository's working tree stays small; the bytes inside are vllm bench serve's
    own), with the kit's folder on the machine renamed, and trimmed where it is over TRIM_ABOVE bytes."""
    raw = src.read_text()
    if len(raw) > TRIM_ABOVE or KIT_ON_MACHINE.search(raw):
        data = json.loads(raw)
        for key in ("model_id", "tokenizer_id"):
            if isinstance(data.get(key), str):
                data[key] = clean(data[key])
        if len(raw) > TRIM_ABOVE:
            data.pop("generated_texts", None)
            data["kvsize_trimmed"] = ("generated_texts (the random words the dummy weights produced) dropped: the "
                                      "file was over 1,000,000 bytes; every other field as vllm bench serve wrote it")
        raw = json.dumps(data)
    if len(gzip.compress(raw.encode(), mtime=0)) > RAW_LIMIT:
        # an open loop of a small model at 120 requests/s writes over a million inter-token times; a microsecond
        # is 1/1,000 of the smallest ITL measured, so the percentiles do not move
        data = json.loads(raw)
        for key in MICROSECOND_LISTS:
            if isinstance(data.get(key), list):
                data[key] = _to_microseconds(data[key])
        data["kvsize_trimmed"] = (data.get("kvsize_trimmed", "") + "; " if data.get("kvsize_trimmed") else "") + (
            f"{', '.join(MICROSECOND_LISTS)} rounded to the microsecond: the file was over {RAW_LIMIT:,} bytes gzipped")
        raw = json.dumps(data)
    write_gzip(dst.with_name(dst.name + ".gz"), raw)


def write_gzip(dst: Path, text: str) -> None:
    """`text` gzipped with no name or time in its header, so that the same bytes come out of the same input."""
    with open(dst, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
        gz.write(text.encode())


def copy_steps(src: Path, dst: Path) -> None:
    """The engine core's per-step lines (measure/step_trace.py), from every engine core process of the server,
    ordered by time and gzipped as one file."""
    files = sorted(src.glob("steps-*.tsv")) if src.is_dir() else []
    if not files:
        return
    lines = [line for f in files for line in read_bounded(f, TRACE_UNPACKED_LIMIT).decode().splitlines() if line]
    lines.sort(key=lambda line: float(line.split("\t")[1]))
    write_gzip(dst, "\n".join(lines) + "\n")


def _to_microseconds(values):
    return [_to_microseconds(v) if isinstance(v, list) else round(v, 6) if isinstance(v, float) else v
            for v in values]


def ingest(res: Path, batches: list[str]) -> None:
    plan = json.loads((SERVING / "plan.json").read_text())
    for batch in batches or plan["batches"]:
        src = res / batch
        if not src.is_dir():
            continue
        out = SERVING / batch
        out.mkdir(parents=True, exist_ok=True)
        # a batch may run over several machines (its servers in two calls): the batch keeps the first machine's
        # env.txt, and a server run on another keeps its own beside its results
        if not (out / "env.txt").exists():
            shutil.copyfile(res / "env.txt", out / "env.txt")
        elsewhere = (out / "env.txt").read_bytes() != (res / "env.txt").read_bytes()
        for server in sorted(p for p in src.iterdir() if p.is_dir()):
            dst = out / server.name
            dst.mkdir(exist_ok=True)
            if elsewhere:
                shutil.copyfile(res / "env.txt", dst / "env.txt")
            for name in ("server.cmd", "server.log", "metrics.tsv"):
                if (server / name).exists():
                    copy_text(server / name, dst / name)
            for f in sorted(server.glob("*.json")):
                if f.name.endswith(".meta.json"):
                    copy_text(f, dst / f.name)
                else:
                    copy_bench(f, dst / f.name)
            for f in sorted(server.glob("*.error.txt")):
                copy_text(f, dst / f.name)
            copy_steps(server / "steps", dst / "steps.tsv.gz")
        print(f"{batch}: {sum(1 for _ in out.glob('*/*.meta.json'))} points copied")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__.split("usage:")[1].strip(), file=sys.stderr)
        sys.exit(2)
    ingest(Path(sys.argv[1]), sys.argv[2:])
