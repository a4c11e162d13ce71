"""measure/llamacpp/cuda.py without a GPU: the CUDA loads' log lines, in llama.cpp's own format for the CUDA backend,
read into the buffers kvsize predicts (CUDA0 model, KV and compute buffers, the CPU_Mapped model buffer, the CUDA_Host
output and compute buffers); `run` driven end to end by a stand-in interpreter that prints such a log; the check
passing a report that agrees with kvsize and failing one that does not; the child asking llama.cpp for every layer
on the GPU; and the predictions file written before any load ran."""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
import sys

import pytest

from conftest import ROOT
from measure.llamacpp import buffers, child, cuda, full
from measure.llamacpp.logparse import parse

# The format strings these lines come from, in the llama.cpp that llama-cpp-python 0.3.36 vendors:
#   ggml/src/ggml-cuda/ggml-cuda.cu:267  "%s: found %d " GGML_CUDA_NAME " devices (Total VRAM: %zu MiB):\n"
#   ggml/src/ggml-cuda/ggml-cuda.cu:339  "  Device %d: %s, compute capability %d.%d, VMM: %s, VRAM: %zu MiB\n"
#   src/llama.cpp:306                    "%s: using device %s (%s) (%s) - %zu MiB free\n"
#   src/llama-model.cpp:1916-1924        "%s: offloading output layer to GPU\n", "%s: offloading %d repeating layers
#                                        to GPU\n", "%s: offloaded %d/%d layers to GPU\n"
#   src/llama-model.cpp:1930             "%s: %12s model buffer size = %8.2f MiB\n"
#   src/llama-context.cpp:381            "%s: %10s  output buffer size = %8.2f MiB\n"
#   src/llama-kv-cache.cpp:291           "%s: %10s KV buffer size = %8.2f MiB\n"
#   src/llama-context.cpp:740            "%s: %10s compute buffer size = %8.2f MiB\n" (in sched_reserve)
#   src/llama-context.cpp:496            "%s: %10s compute buffer size is %8.4f MiB, matches expectation of %8.4f MiB\n"
# with the buffer types' names from ggml-cuda.cu: GGML_CUDA_NAME + device ("CUDA0", line 948) and
# GGML_CUDA_NAME "_Host" (line 1258); the CPU's mapped buffer is "CPU_Mapped".
SAMPLE = """\
ggml_cuda_init: found 1 CUDA devices (Total VRAM: 143156 MiB):
  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes, VRAM: 143156 MiB
llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H200) (0000:00:05.0) - 142574 MiB free
llama_model_loader: loaded meta data with 16 key-value pairs and 147 tensors from {gguf} (version GGUF V3 (latest))
print_info: arch                  = llama
print_info: n_layer               = 16
load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
load_tensors: offloading output layer to GPU
load_tensors: offloading 15 repeating layers to GPU
load_tensors: offloaded 17/17 layers to GPU
load_tensors:   CPU_Mapped model buffer size =   266.16 MiB
load_tensors:        CUDA0 model buffer size =  1252.41 MiB
llama_context: constructing llama_context
llama_context: n_seq_max             = 1
llama_context: n_ctx                 = 16384
llama_context: n_ctx_seq             = 16384
llama_context: n_batch               = 2048
llama_context: n_ubatch              = 512
llama_context: flash_attn            = enabled
llama_context: kv_unified            = true
llama_context:  CUDA_Host  output buffer size =     0.49 MiB
llama_kv_cache:      CUDA0 KV buffer size =   512.00 MiB
llama_kv_cache: size =  512.00 MiB ( 16384 cells,  16 layers,  1/1 seqs), K (f16):  256.00 MiB, V (f16):  256.00 MiB
llama_context: enumerating backends
llama_context: backend_ptrs.size() = 2
sched_reserve:      CUDA0 compute buffer size =   256.50 MiB
sched_reserve:  CUDA_Host compute buffer size =    40.02 MiB
sched_reserve: graph nodes  = 567
~llama_context:      CUDA0 compute buffer size is 256.5020 MiB, matches expectation of 256.5020 MiB
~llama_context:  CUDA_Host compute buffer size is  40.0156 MiB, matches expectation of  40.0156 MiB
"""


def _mib(n: float) -> str:
    return f"{n:.2f}"


def cuda_log(load: cuda.CudaLoad, compute_scale: float = 1.005) -> str:
    """The log llama.cpp prints for the load where it agrees with kvsize (the CUDA0 compute buffer `compute_scale`
    times kvsize's model), in the format strings above."""
    s = load.settings()
    f = cuda.kvsize_figures(s)
    layers = json.loads(cuda.config_path(load.config).read_text())["num_hidden_layers"] + 1  # and the output layer
    lines = [
        "ggml_cuda_init: found 1 CUDA devices (Total VRAM: 143156 MiB):",
        "  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes, VRAM: 143156 MiB",
        "llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H200) (0000:00:05.0) - 142574 MiB free",
        "llama_model_loader: loaded meta data with 16 key-value pairs and 147 tensors from {gguf} (version GGUF V3 "
        "(latest))",
        "load_tensors: loading model tensors, this can take a while... (load_mode = mmap)",
        "load_tensors: offloading output layer to GPU",
        f"load_tensors: offloading {layers - 2} repeating layers to GPU",
        f"load_tensors: offloaded {layers}/{layers} layers to GPU",
        *(f"load_tensors: {dev:>12} model buffer size = {_mib(n / 2**20):>8} MiB"
          for dev, n in sorted(f["model"].items(), key=lambda kv: kv[0] != "CPU_Mapped")),
        f"llama_context: n_ctx                 = {f['n_ctx']}",
        f"llama_context: {'CUDA_Host':>10}  output buffer size = {_mib(f['output']['CUDA_Host'] / 2**20):>8} MiB",
        f"llama_kv_cache: {'CUDA0':>10} KV buffer size = {_mib(f['KV']['CUDA0'] / 2**20):>8} MiB",
        *f["kv_log_lines"],
        f"sched_reserve: {'CUDA0':>10} compute buffer size = "
        f"{_mib(f['compute']['CUDA0'] * compute_scale / 2**20):>8} MiB",
        f"sched_reserve: {'CUDA_Host':>10} compute buffer size = {_mib(40.02):>8} MiB",
    ]
    return "\n".join(lines) + "\n"


def test_the_cuda_lines_are_read_into_buffers_by_device():
    figures = parse(SAMPLE.splitlines())
    assert [(b["source"], b["device"], b["kind"], b["mib"]) for b in figures["buffers"]] == [
        ("load_tensors", "CPU_Mapped", "model", "266.16"), ("load_tensors", "CUDA0", "model", "1252.41"),
        ("llama_context", "CUDA_Host", "output", "0.49"), ("llama_kv_cache", "CUDA0", "KV", "512.00"),
        ("sched_reserve", "CUDA0", "compute", "256.50"), ("sched_reserve", "CUDA_Host", "compute", "40.02")]
    assert figures["caches"][0]["cells"] == 16384 and figures["context"]["kv_unified"] == "true"
    assert cuda.offloaded(SAMPLE.splitlines()) == (17, 17)


def test_the_log_generator_writes_llama_cpps_format():
    # the generated log of the first load, line for line as the sample (the compute figures aside)
    generated = cuda_log(cuda.CUDA_LOADS[0], compute_scale=256.50 / 254.50).splitlines()
    for line in generated:
        if "n_ctx " not in line:
            assert line in SAMPLE.splitlines(), line


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A report made by `run` itself, driven by a stand-in interpreter: it answers the versions query, writes a
    placeholder GGUF for gguf_writer, and prints each load's log (cuda_log) as the child would."""
    tmp = tmp_path_factory.mktemp("cuda")
    logs = tmp / "logs.json"
    logs.write_text(json.dumps({load.id: cuda_log(load) for load in cuda.CUDA_LOADS}))
    fake = tmp / "python"
    fake.write_text(f"""#!{sys.executable}
import json, pathlib, sys
args = sys.argv[1:]
if args[0] == "-c":
    print(json.dumps({{"llama_cpp_python": "0.3.36", "gguf": "0.19.0", "system_info": "CUDA : ARCHS = 900 |",
                      "gpu_offload": True}}))
elif args[1] == "measure.llamacpp.gguf_writer":
    pathlib.Path(args[3]).write_bytes(b"GGUF" + bytes(60))
else:
    s = json.loads(args[3])
    sys.stderr.write(json.loads(pathlib.Path({str(logs)!r}).read_text())[s["id"]].replace("{{gguf}}", args[2]))
    print(json.dumps({{"model_loaded": True, "context_made": True, "gpu_offload": True,
                      "cuda_memory": {{"after_context": {{"free_bytes": 1, "total_bytes": 2}}}}}}))
""")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out, log = tmp / "out" / "llamacpp-cuda-buffers.json", tmp / "out" / "loads.log"
    assert cuda.run(str(fake), tmp / "work", out, log, None) == 0
    assert not list((tmp / "work").glob("*.gguf"))  # each GGUF deleted after its load
    assert log.read_text().count("=====") == len(cuda.CUDA_LOADS)
    return json.loads(out.read_text())


def test_run_keeps_the_cuda_lines_and_names_the_device(report):
    assert report["device"] == {"name": "NVIDIA H200", "kind": "cuda", "llama_device": "CUDA0"}
    assert [r["load"] for r in report["loads"]] == [load.settings() for load in cuda.CUDA_LOADS]
    row = report["loads"][0]
    assert row["lines"][:2] == SAMPLE.splitlines()[:2]  # the devices ggml found, kept as evidence
    assert not any("{gguf}" in line or "/work/" in line for line in row["lines"])  # the file by its name only
    assert buffers.printed(row["figures"], "compute") == {"CUDA0": buffers.printed(row["figures"], "compute")["CUDA0"],
                                                          "CUDA_Host": "40.02"}
    assert row["cuda_memory"] == {"after_context": {"free_bytes": 1, "total_bytes": 2}}


def test_a_report_that_agrees_with_kvsize_passes(report, tmp_path, capsys):
    assert cuda.problems(report) == []
    assert buffers.problems(report) == []  # kvsize validate's entry, by the device kind
    from measure.validate import validate_files

    path = tmp_path / "llamacpp-cuda-buffers.json"
    path.write_text(json.dumps(report))
    assert validate_files([str(path)]) == 0
    assert "3 full-size llama.cpp loads' buffers agree (NVIDIA H200)" in capsys.readouterr().out


def _tampered(report, i: int, old: str, new: str) -> dict:
    out = copy.deepcopy(report)
    row = out["loads"][i]
    j = next(j for j, line in enumerate(row["lines"]) if old in line)
    row["lines"][j] = row["lines"][j].replace(old, new)
    row["figures"] = parse(row["lines"])
    return out


def test_a_report_that_disagrees_fails_naming_the_load(report, tmp_path, capsys):
    load = report["loads"][1]["load"]["id"]
    model = next(line for line in report["loads"][1]["lines"] if "CUDA0 model buffer size" in line)
    mib = model.split("=")[1].split()[0]
    bad = _tampered(report, 1, f"= {mib:>8}", f"= {float(mib) + 0.01:>8.2f}")
    assert cuda.problems(bad) == [f"{load}: model buffers: llama.cpp {{'CPU_Mapped': '137.94', 'CUDA0': "
                                  f"'{float(mib) + 0.01:.2f}'}}, kvsize {{'CUDA0': '{mib}', 'CPU_Mapped': '137.94'}}"]
    compute = next(line for line in report["loads"][0]["lines"] if "CUDA0 compute buffer size =" in line)
    over = _tampered(report, 0, compute.split("=")[1].strip(), "300.00 MiB")
    assert "outside the stated band" in cuda.problems(over)[0]
    partial = _tampered(report, 2, "offloaded 37/37", "offloaded 30/37")
    assert cuda.problems(partial) == [f"{report['loads'][2]['load']['id']}: not every layer was offloaded "
                                      "(llama.cpp: (30, 37))"]
    edited = copy.deepcopy(report)
    edited["loads"][0]["figures"]["buffers"][0]["mib"] = "1.00"
    assert "its figures are not what llama.cpp printed" in cuda.problems(edited)[0]
    missing = copy.deepcopy(report)
    del missing["loads"][2]
    assert "are not the planned CUDA loads" in cuda.problems(missing)[0]
    from measure.validate import validate_files

    path = tmp_path / "llamacpp-cuda-buffers.json"
    path.write_text(json.dumps(over))
    assert validate_files([str(path)]) == 1
    assert report["loads"][0]["load"]["id"] in capsys.readouterr().err


def test_the_cuda_check_holds_the_compute_buffer_to_the_cpu_loads_band():
    assert cuda.COMPUTE_BAND == buffers.FULL_COMPUTE_BAND
    assert cuda.printed(parse(SAMPLE.splitlines()), "compute") == {"CUDA0": "256.50", "CUDA_Host": "40.02"}


def test_check_passes_without_a_cuda_report_and_fails_a_bad_one(report, tmp_path, monkeypatch):
    monkeypatch.setattr(cuda, "REPORT", tmp_path / "absent.json")
    assert full.main(["check"]) == 0  # the CPU report, and no CUDA report: CI has no GPU
    assert cuda.main(["check", str(tmp_path / "absent.json")]) == 0
    bad = tmp_path / "llamacpp-cuda-buffers.json"
    bad.write_text(json.dumps(_tampered(report, 0, "offloaded 17/17", "offloaded 0/17")))
    monkeypatch.setattr(cuda, "REPORT", bad)
    assert full.main(["check"]) == 1
    assert cuda.main(["check", str(bad)]) == 1


def test_the_child_asks_for_every_layer_on_the_gpu(monkeypatch):
    import types

    seen = {}

    class Params(types.SimpleNamespace):
        # the model params' loading fields as 0.3.36's ctypes struct declares them (the child reads _fields_)
        _fields_ = [("n_gpu_layers", None), ("load_mode", None)]

    fake = types.ModuleType("llama_cpp")
    fake.llama_backend_init = lambda: None
    fake.llama_model_default_params = lambda: Params(n_gpu_layers=-1, load_mode=-1)
    fake.llama_model_load_from_file = lambda path, p: seen.setdefault("model", p) and 1
    fake.llama_context_default_params = lambda: Params()
    fake.llama_init_from_model = lambda model, p: seen.setdefault("context", p) and 1
    fake.llama_free = fake.llama_model_free = lambda x: None
    fake.llama_supports_gpu_offload = lambda: True
    fake.LLAMA_FLASH_ATTN_TYPE_ENABLED, fake.LLAMA_FLASH_ATTN_TYPE_DISABLED = 1, 0
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    monkeypatch.setattr(child, "cuda_memory", lambda: {"free_bytes": 5, "total_bytes": 9})
    out = child.load("m.gguf", cuda.CUDA_LOADS[2].settings())
    assert seen["model"].n_gpu_layers == -1 and seen["model"].load_mode == child.LOAD_MODE["auto"] == -1
    c = seen["context"]
    assert (c.n_ctx, c.n_seq_max, c.kv_unified, c.flash_attn_type, c.type_k, c.type_v, c.n_ubatch) == \
        (32768, 4, True, 1, child.GGML_TYPE["q8_0"], child.GGML_TYPE["q8_0"], 512)
    assert out["gpu_offload"] and set(out["cuda_memory"]) == {"before_load", "after_model", "after_context"}
    # a CPU load is asked for none, as before
    seen.clear()
    cpu = child.load("m.gguf", {**full.asdict(full.FULL_LOADS[0]), "swa_full": False})
    assert seen["model"].n_gpu_layers == 0 and "cuda_memory" not in cpu


def test_the_gpu_side_needs_nothing_of_kvsizes_dependencies():
    # the GPU machine's python3 has no pydantic: `run`, the child and gguf_writer must not import sizing
    code = ("import sys; sys.modules['pydantic'] = None; import measure.llamacpp.cuda, measure.llamacpp.full, "
            "measure.llamacpp.child, measure.llamacpp.gguf_writer; "
            "assert not [m for m in sys.modules if m.startswith(('sizing', 'app'))], sorted(sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_loads_are_kvsizes_serve_command():
    from sizing.engines.llamacpp import serve_log_lines
    from sizing.profiles import load_model

    for load in cuda.CUDA_LOADS:
        s = load.settings()
        # -c max_model_len x concurrency, -np concurrency, -kvu, -fa on; every layer offloaded, the file mapped
        assert (s["n_ctx"], s["n_seq_max"], s["kv_unified"], s["flash_attn"], s["n_gpu_layers"], s["load_mode"]) == \
            (load.max_model_len * load.concurrency, load.concurrency, True, True, -1, "auto")
        _, shape = load_model(str(cuda.config_path(load.config)))
        fmt = {"f16": "fp16", "q8_0": "q8_0"}[load.cache_type]
        assert list(serve_log_lines(shape, load.max_model_len, load.concurrency, fmt, fmt)) == \
            cuda.kvsize_figures(s)["kv_log_lines"]


def test_the_predictions_were_written_for_the_planned_loads():
    p = json.loads(cuda.PREDICTIONS.read_text())
    assert p["schema"] == buffers.SCHEMA + "-predictions" and p["gpu"] == "h200"
    assert [r["load"] for r in p["loads"]] == [load.settings() for load in cuda.CUDA_LOADS]
    assert any("CUDA_Host compute buffer" in line for line in p["not_predicted"])
    from sizing.engines.llamacpp_weights import mib_printed

    for r in p["loads"]:
        q = r["prediction"]
        assert q["kvsize_command"].startswith("kvsize estimate --model tests/fixtures/") and "--engine llamacpp" in \
            q["kvsize_command"]
        assert q["printed_mib"] == {
            "load_tensors: CUDA0 model buffer size": mib_printed(q["bytes"]["model"]["CUDA0"]),
            "load_tensors: CPU_Mapped model buffer size": mib_printed(q["bytes"]["model"]["CPU_Mapped"]),
            "llama_kv_cache: CUDA0 KV buffer size": mib_printed(q["bytes"]["KV"]["CUDA0"]),
            "llama_context: CUDA_Host output buffer size": mib_printed(q["bytes"]["output"]["CUDA_Host"]),
            "sched_reserve: CUDA0 compute buffer size": mib_printed(q["bytes"]["compute"]["CUDA0"])}
        assert q["exact"] == ["model", "KV", "output"] and q["model_of"] == ["compute"]


def test_the_committed_cuda_report_agrees_and_names_its_device_from_its_own_lines():
    # The report the three loads wrote on an H200 (measure/reports/llamacpp-cuda-buffers.json); that build printed
    # ggml_cuda_init's "Device 0: ..." line and no "using device" line, so the device comes from the former.
    report = json.loads(cuda.REPORT.read_text())
    assert cuda.problems(report) == []
    assert not any(cuda.USING_DEVICE.search(line) for row in report["loads"] for line in row["lines"])
    assert report["device"] == {"name": "NVIDIA H200", "kind": "cuda", "llama_device": "CUDA0"}
    relabelled = {**report, "device": {"name": "NVIDIA H100 80GB HBM3", "kind": "cuda", "llama_device": "CUDA0"}}
    assert "is not the one its loads' lines name" in cuda.problems(relabelled)[0]


def test_the_accuracy_page_shows_each_cuda_buffer_as_predicted_before_the_loads_ran():
    from measure.llamacpp.accuracy import cuda_section

    rows = [line for line in cuda_section() if line.startswith("| ") and "/" in line.split("|")[1]]
    assert [r.split("|")[1].strip() for r in rows] == [load.id for load in cuda.CUDA_LOADS]
    assert not any("(kvsize" in r for r in rows)  # a buffer kvsize predicted otherwise would be shown beside it
    assert all(0 <= float(r.split("|")[-2]) < 16 for r in rows)  # beyond the printed buffers: a few MiB each


def test_the_validation_tab_plots_every_cuda_buffer_against_kvsize():
    from app.views.validation import report_points

    df = report_points(json.loads(cuda.REPORT.read_text()))
    kinds = {"model buffer (MiB)": 6, "KV buffer (MiB)": 3, "output buffer (MiB)": 3, "compute buffer (MiB)": 3}
    assert df["kind"].value_counts().to_dict() == kinds
    assert (df["predicted"] == df["measured"]).all()
