"""Every door, round 4: integers of thousands of digits, YAML tags and keys that are not text, measurement reports
of the wrong kind, terminal escapes in what an error quotes, and text tables under a spreadsheet's name. Each is
answered or refused in one line naming the field (exit 2), with nothing written. The doors added last (watch
--plan, the per-release format table, ?release=, check-log's standard input, Hugging Face ids) get the same
fuzzing as the old ones."""

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cli import main
from conftest import ROOT
from sizing.errors import UNSAFE, KvsizeError

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CONFIG = json.loads((ROOT / "tests" / "fixtures" / "configs" / "Llama-3.1-8B.json").read_text())
WORKLOAD = (ROOT / "examples" / "workload.yaml").read_text()
KERNELS = json.loads((ROOT / "measure" / "reports" / "h200-decode-kernels.json").read_text())
DECODE = json.loads((ROOT / "measure" / "reports" / "h200-alloc-decode.json").read_text())
PLAN = ["plan", "--workload", str(ROOT / "examples" / "workload.yaml"), "--model", "llama-3.1-8b", "--gpus", "h200",
        "--tp", "1", "--formats", "auto"]
LONG = "9" * 5000  # past Python's 4,300-digit limit on int(str) and json.loads


def refused(capsys, argv, *needles):
    """main(argv) exits 2 with one line on stderr that holds every needle, and no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsize: error:") and err.count("\n") == 1, err[:300]
    assert "Traceback" not in err and "internal error" not in err
    for needle in needles:
        assert needle in err, (needle, err[:300])
    return err


def one_line(error: KvsizeError) -> str:
    text = str(error)
    assert text and "\n" not in text and not UNSAFE.search(text), text[:200]
    return text


# 1. integers of thousands of digits -------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "vocab_size", "max_position_embeddings"])
def test_a_config_integer_of_thousands_of_digits_is_refused_by_its_field(tmp_path, capsys, field):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG).replace(f'"{field}": {CONFIG[field]}', f'"{field}": {LONG}'))
    refused(capsys, ["estimate", "--model", str(path), "--gpu", "h200"], f"'{field}'", "5,000 digits")


def test_a_long_integer_inside_a_nested_config_is_named_by_its_path(tmp_path, capsys):
    path = tmp_path / "config.json"
    config = {**CONFIG, "text_config": {"head_dim": 1}}
    path.write_text(json.dumps(config).replace('"head_dim": 1', f'"head_dim": -{LONG}'))
    refused(capsys, ["estimate", "--model", str(path), "--gpu", "h200"], "'text_config.head_dim'")


@pytest.mark.parametrize("option", ["--efficiency-report", "--quality-report"])
def test_a_report_integer_of_thousands_of_digits_is_refused_by_its_field(tmp_path, capsys, option):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(DECODE).replace('"batch": 1,', f'"batch": {LONG},', 1))
    refused(capsys, [*PLAN, option, str(path)], option, "'decode[0].batch'", "5,000 digits")


@pytest.mark.parametrize("flag, value, needle", [
    ("--max-model-len", LONG, "--max-model-len must be a whole number of at most 20 digits"),
    ("--max-num-seqs", LONG + "k", "--max-num-seqs must be a whole number of at most 20 digits"),
    ("--kv-cache-memory-bytes", "9" * 30, "at most 20 digits"),
    ("--gpu-memory-utilization", LONG, "--gpu-memory-utilization must be a fraction"),
    ("--compilation-config", '{"cudagraph_capture_sizes": [' + LONG + "]}", "'cudagraph_capture_sizes[0]'"),
    ("--limit-mm-per-prompt", '{"image": ' + LONG + "}", "'image'"),
])
def test_a_vllm_serve_line_with_thousands_of_digits_is_refused_by_its_flag(capsys, flag, value, needle):
    err = refused(capsys, ["estimate", "--gpu", "h200", "--model", "llama-3.1-8b", "--", "vllm", "serve",
                           "meta-llama/Llama-3.1-8B", flag, value], needle)
    assert len(err) < 1000  # the value is quoted cut, not whole


VLLM_FLAGS = ["--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--block-size", "-tp",
              "--pipeline-parallel-size", "--gpu-memory-utilization", "--kv-cache-memory-bytes", "--kv-cache-dtype",
              "--dtype", "--quantization", "--compilation-config", "--limit-mm-per-prompt", "--limit-mm-per-prompt.image",
              "--cc.cudagraph_mode", "--cc.max_cudagraph_capture_size", "--enforce-eager", "--cpu-offload-gb",
              "--speculative-config", "--hf-overrides", "--num-gpu-blocks-override", "--max-cudagraph-capture-size"]
VLLM_VALUES = st.one_of(st.sampled_from([LONG, LONG + "k", "-" + LONG, "1e400", "-1", "nan", "0", "32K", "1.5k",
                                         "\x1b[2J", "a\u202eb", '{"a": ' + LONG + "}", "[" * 3000, '{"image": -1}',
                                         '{"cudagraph_capture_sizes": [' + LONG + "]}", "9" * 21, "true"]),
                        st.text(max_size=10))


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(VLLM_FLAGS), VLLM_VALUES), min_size=1, max_size=4))
def test_a_vllm_serve_line_of_any_flags_and_values_is_read_or_refused_in_one_line(pairs):
    from sizing.engines.vllm_args import read_command

    argv = ["vllm", "serve", "meta-llama/Llama-3.1-8B"] + [w for flag, value in pairs for w in (flag, value)]
    try:
        settings_ = read_command(argv)
    except KvsizeError as e:
        assert len(one_line(e)) < 1400
    else:
        assert all(not isinstance(v, int) or v.bit_length() <= 64 for v in vars(settings_).get("fields", {}).values())


@SETTINGS
@given(digits=st.integers(min_value=101, max_value=6000), negative=st.booleans(),
       field=st.sampled_from(sorted(CONFIG)))
def test_any_config_field_of_any_long_integer_is_named(digits, negative, field):
    from sizing.config import parse_config_text

    text = json.dumps({**CONFIG, field: 0}).replace(f'"{field}": 0', f'"{field}": {"-" * negative}{"7" * digits}')
    with pytest.raises(KvsizeError) as e:
        parse_config_text(text)
    assert f"'{field}'" in one_line(e.value) and f"{digits:,} digits" in str(e.value)


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**120, max_value=10**120),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=30)


def _leaves(value, path=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    else:
        yield path, value


@settings(max_examples=200, deadline=None)
@given(JSON_VALUES, st.booleans())
def test_the_bounded_json_reader_keeps_every_value_in_bounds_and_names_the_first_out(value, finite):
    import math

    from sizing.errors import shown
    from sizing.inputs import MAX_JSON_DIGITS, json_path, load_json

    text = json.dumps(value, allow_nan=True)
    out = [(p, v) for p, v in _leaves(value) if (isinstance(v, int) and not isinstance(v, bool) and
                                                 len(str(abs(v))) > MAX_JSON_DIGITS)
           or (finite and isinstance(v, float) and not math.isfinite(v))]
    try:
        read = load_json(text, "--x", "a report", finite=finite)
    except KvsizeError as e:
        assert out and f"field {shown(json_path(out[0][0]))} " in one_line(e)
    else:
        assert not out and json.dumps(read, allow_nan=True) == text


def test_a_result_plan_or_table_of_a_long_integer_is_one_line(tmp_path, capsys):
    from sizing.engines.accepted_dtypes import parse_dtypes_table
    from sizing.evidence.bench import read_bench
    from sizing.planners.deployment import read_deployment

    with pytest.raises(KvsizeError, match="'completed'"):
        read_bench(f'{{"completed": {LONG}}}'.encode(), "r.json")
    with pytest.raises(KvsizeError, match="'deployment.num_blocks'"):
        read_deployment(f'{{"schema": "kvsize.plan/1", "deployment": {{"num_blocks": {LONG}}}}}', "plan.json")
    with pytest.raises(KvsizeError, match="'engines.vllm.checked'"):
        parse_dtypes_table(f'{{"source": "s", "engines": {{"vllm": {{"checked": {LONG}}}}}}}', "table.json")


# 2. YAML dates, timestamps, !!binary and !!set as names and values -----------------------------------------


@pytest.mark.parametrize("extra, needle", [
    ("5: 5", "the key '5' is a number"),
    ("~: 5", "the key '~' is null"),
    ("true: 5", "the key 'true' is true or false"),
    ("1.5: 5", "the key '1.5' is a number"),
    ("? [a, b]\n: 5", "the key is a list"),
    ("? {a: b}\n: 5", "the key is a mapping"),
    ("? !!binary aGVsbG8=\n: 5", "the YAML tag 'binary'"),
    ("? !!set {a}\n: 5", "the YAML tag 'set'"),
    ("? !!timestamp 2024-01-01\n: 5", "the YAML tag 'timestamp'"),
    ("2024-01-01: 5", "2024-01-01: unknown field"),  # a date-like key stays text: an unknown field, named
    ("2024-01-01 10:00:00: 5", "unknown field"),
])
def test_a_workload_key_that_is_not_a_field_name_is_refused(tmp_path, capsys, extra, needle):
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD + "\n" + extra + "\n")
    refused(capsys, [*PLAN[:2], str(path), *PLAN[3:]], needle)


@pytest.mark.parametrize("value, needle", [
    ("!!int 0x190", "'0x190' is not a value of the YAML tag 'int'"),
    ("!!int ''", "is not a value of the YAML tag 'int'"),
    ("!!float abc", "'abc' is not a value of the YAML tag 'float'"),
    ("!!bool maybe", "'maybe' is not a value of the YAML tag 'bool'"),
    ("!!map [a]", "not valid YAML for a workload"),
    ("!!int " + "9_" * 3000 + "9", "a number of more than 30 digits"),
    ("!!binary aGVsbG8=", "the YAML tag 'binary'"),
    ("!!set {a, b}", "the YAML tag 'set'"),
    ("!!timestamp 2024-01-01T10:00:00Z", "the YAML tag 'timestamp'"),
    ("2024-01-01", "peak_concurrency"),  # a date is text here: not a count
])
def test_a_workload_value_its_tag_cannot_build_is_one_line(tmp_path, capsys, value, needle):
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD.replace("peak_concurrency: 400", f"peak_concurrency: {value}"))
    refused(capsys, [*PLAN[:2], str(path), *PLAN[3:]], needle)


def test_dates_and_timestamps_as_names_stay_text(tmp_path):
    from sizing.planners.workload import parse_workload_text

    text = WORKLOAD.replace("name: chat + RAG mix", "name: 2024-01-01T10:00:00Z").replace("{name: chat,",
                                                                                        "{name: 2024-01-01,")
    workload = parse_workload_text(text)
    assert workload.name == "2024-01-01T10:00:00Z" and workload.buckets[0].name == "2024-01-01"


SCALARS = st.one_of(st.sampled_from(["2024-01-01", "2024-01-01 10:00:00", "10:30", "0x10", "0o7", "1_000", ".inf",
                                     "~", "yes", "aGVsbG8=", "{a, b}", "[1]", "''", LONG[:40], "-0"]),
                    st.text(max_size=12))
TAGS = st.sampled_from(["", "!!int ", "!!float ", "!!bool ", "!!str ", "!!null ", "!!binary ", "!!set ",
                        "!!timestamp ", "!!map ", "!!seq ", "!!omap ", "!!pairs ", "!!merge ", "!foo "])


@SETTINGS
@given(TAGS, SCALARS, st.sampled_from(["key", "value", "name"]))
def test_a_workload_of_any_tagged_scalar_anywhere_is_read_or_refused_in_one_line(tag, scalar, where):
    from sizing.planners.workload import parse_workload_text

    written = tag + json.dumps(scalar)
    text = {"key": WORKLOAD + f"\n? {written}\n: 5\n",
            "value": WORKLOAD.replace("peak_concurrency: 400", f"peak_concurrency: {written}"),
            "name": WORKLOAD.replace("name: chat + RAG mix", f"name: {written}")}[where]
    try:
        workload = parse_workload_text(text)
    except KvsizeError as e:
        one_line(e)
    else:
        assert isinstance(workload.name, str)


# 4. measurement reports given to --efficiency-report and --quality-report ----------------------------------


def _kernels(change):
    report = copy.deepcopy(KERNELS)
    change(report["decode_efficiency"])
    return report


def _decode(change):
    report = copy.deepcopy(DECODE)
    change(report["decode"][0])
    return report


@pytest.mark.parametrize("option, report, needles", [
    ("--efficiency-report", _kernels(lambda s: s["overhead_s"].update(bf16=-1.0)),
     ["decode_efficiency.overhead_s.bf16", "greater than or equal to 0"]),
    ("--efficiency-report", _kernels(lambda s: s["per_sequence_s"].update(bf16=float("nan"))),
     ["'decode_efficiency.per_sequence_s.bf16' is nan"]),
    ("--efficiency-report", _kernels(lambda s: s["kv"].update(bf16=float("inf"))), ["'decode_efficiency.kv.bf16' is inf"]),
    ("--efficiency-report", _kernels(lambda s: s["kv"].update(bf16=5.0)), ["decode_efficiency.kv.bf16", "(given 5.0)"]),
    ("--efficiency-report", _kernels(lambda s: s["kv"].update(bf16="0.9")), ["decode_efficiency.kv.bf16", "valid number"]),
    ("--efficiency-report", _kernels(lambda s: s.update(weights=True)), ["decode_efficiency.weights"]),
    ("--efficiency-report", _kernels(lambda s: s.update(fit_time_s=-3)), ["fit_time_s is -3"]),
    ("--efficiency-report", {**KERNELS, "device": ["x"]}, ["device: Input should be a valid dictionary"]),
    ("--quality-report", _decode(lambda p: p.update(attention_rel_error=float("nan"))),
     ["'decode[0].attention_rel_error' is nan"]),  # was shown as 0.0%
    ("--quality-report", _decode(lambda p: p.update(attention_rel_error=-0.5)), ["decode[0].attention_rel_error"]),
    ("--quality-report", _decode(lambda p: p.update(attention_rel_error="abc")), ["decode[0].attention_rel_error"]),
    ("--quality-report", _decode(lambda p: p.update(attention_rel_error=True)), ["decode[0].attention_rel_error"]),
    ("--quality-report", _decode(lambda p: p.update(format=["bf16"])), ["decode[0].format"]),
    ("--quality-report", _decode(lambda p: p.update(median_ms=-3)), ["decode[0]: median_ms is -3"]),
    ("--quality-report", {**DECODE, "decode": "abc"}, ["decode: Input should be a valid list"]),
    ("--quality-report", {**DECODE, "device": ["x"]}, ["device: Input should be a valid dictionary"]),
    ("--quality-report", [1, 2], ["not a measurement report"]),
])
def test_a_measurement_report_of_the_wrong_kind_is_refused_by_its_field(tmp_path, capsys, option, report, needles):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    out = tmp_path / "plan.json"
    refused(capsys, [*PLAN, option, str(path), "--out", str(out)], option, *needles)
    assert not out.exists() and not list(tmp_path.glob(".*.part"))


def test_the_committed_reports_are_still_read(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main([*PLAN, "--efficiency-report", str(ROOT / "measure" / "reports" / "h200-decode-kernels.json"),
                 "--quality-report", str(ROOT / "measure" / "reports" / "h200-alloc-decode.json"), "--out", str(out)]) == 0
    quality = {q["format"]: q for q in json.loads(out.read_text())["quality"]}
    assert quality["bf16"]["measured_attention_error"] == max(
        p["attention_rel_error"] for p in DECODE["decode"] if p["format"] == "bf16")


REPORT_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**6, max_value=10**6),
                          st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
                          st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=4), st.integers(),
                                                                               max_size=2))


@SETTINGS
@given(st.sampled_from(["format", "attention_rel_error", "median_ms", "batch", "wall_s"]), REPORT_LEAVES,
       st.sampled_from(["kv", "overhead_s", "per_sequence_s", "per_context_token_s", "weights",
                        "reference_bandwidth_gb_s", "fitted_on_batch_at_least", "extra_ms"]), REPORT_LEAVES)
def test_a_report_field_of_any_value_is_read_or_refused_in_one_line(point_key, point_value, section_key, section_value):
    from sizing.efficiency import efficiency_from_report, quality_section
    from sizing.planners.guidance import quality_notes

    report = _decode(lambda p: p.update({point_key: point_value}))
    try:
        notes = quality_notes(["bf16", "fp8"], "bf16", quality_section(report, "--quality-report r.json"), "r.json")
    except KvsizeError as e:
        one_line(e)
    else:
        errors = [n.measured_attention_error for n in notes if n.measured_attention_error is not None]
        assert all(isinstance(x, float) and x >= 0 for x in errors)
    report = _kernels(lambda s: s.update({section_key: section_value}))
    try:
        efficiency = efficiency_from_report(report, "--efficiency-report r.json")
    except KvsizeError as e:
        one_line(e)
    else:
        assert all(0 < v <= 1 for v in efficiency.kv.values())
        assert all(v >= 0 for terms in (efficiency.overhead_s, efficiency.per_sequence_s) for v in terms.values())


# 5. terminal escapes echoed inside error messages ------------------------------------------------------------

ESCAPES = ["\x1b[31mred\x1b[0m", "\x1b]0;title\x07", "\x9b2J", "a\u202eevil", "b\u2066x\u2069", "c\u2028d", "\r\x08x"]


@pytest.mark.parametrize("escape", ESCAPES)
def test_an_escape_in_an_option_is_quoted_escaped(capsys, escape):
    err = refused(capsys, ["estimate", "--model", "llama-3.1-8b", "--gpu", f"h200{escape}"], "unknown GPU")
    assert not UNSAFE.search(err.rstrip("\n"))


@pytest.mark.parametrize("escape", ESCAPES)
def test_an_escape_in_a_file_is_quoted_escaped(tmp_path, capsys, escape):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**CONFIG, "torch_dtype": f"float7{escape}"}))
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD + f"\n{json.dumps('x' + escape)}: 5\n")
    for argv in (["estimate", "--model", str(config), "--gpu", "h200"], [*PLAN[:2], str(workload), *PLAN[3:]]):
        err = refused(capsys, argv)
        assert not UNSAFE.search(err.rstrip("\n")) and ("\\x" in err or "\\u" in err)


@SETTINGS
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_any_error_text_is_one_safe_line_of_bounded_length(text):
    from sizing.errors import MAX_MESSAGE_CHARS, shown

    message = one_line(KvsizeError(f"field {text!s} given"))
    assert len(message) <= MAX_MESSAGE_CHARS + 60
    quoted = shown(text, 40)
    assert not UNSAFE.search(quoted) and len(quoted) <= 40 * 6 + 40


@pytest.mark.parametrize("argv", [
    ["estimate", "--model", "llama-3.1-8b", "--kivi-group", LONG],
    ["estimate", "--model", "llama-3.1-8b", "--max-model-len", LONG],
    [*PLAN, "--price", f"h200={LONG}"],
    ["sweep", "--models", "llama-3.1-8b", "--gpus", "h200", "--contexts", LONG, "--out", "never.csv"],
    ["watch", "x.txt", "--model", "llama-3.1-8b", "--count", LONG],
])
def test_a_value_of_thousands_of_characters_is_quoted_cut(capsys, argv):
    err = refused(capsys, argv, "(5,0")
    assert len(err) < 500 and "characters" in err


def test_a_long_value_is_cut_in_the_middle_keeping_what_to_change():
    message = str(KvsizeError("got " + "x" * 10_000 + "; give a number"))
    assert message.endswith("; give a number") and "characters left out" in message and len(message) < 1400


# 8. a table under a spreadsheet's name, and a spreadsheet where text belongs -------------------------------


@pytest.mark.parametrize("argv", [
    ["estimate", "--model", "llama-3.1-8b", "--gpu", "h200"],
    ["compare", "--model", "llama-3.1-8b", "--gpu", "h200"],
    ["estimate", "--model", "qwen3-8b", "--engine", "vllm@0.25.1", "--vs", "vllm@0.33.0"],
    ["estimate", "--model", "llama-3.1-8b", "--gpu", "h200", "--format", "csv"],
    ["compare", "--model", "llama-3.1-8b", "--gpu", "h200", "--format", "json"],
])
@pytest.mark.parametrize("name", ["out.xlsx", "out.XLSX", "out.ods"])
def test_text_is_never_written_under_a_spreadsheets_name(tmp_path, capsys, argv, name):
    out = tmp_path / name
    refused(capsys, [*argv, "--out", str(out)], "does not match --format")
    assert not out.exists() and not list(tmp_path.iterdir())


def _xlsx_bytes() -> bytes:
    from app.spreadsheet import xlsx_bytes

    return xlsx_bytes({"t": [{"name": "chat", "peak_concurrency": 4}]})


@pytest.mark.parametrize("content", [b"name,peak_concurrency\nchat,4\n", b"PK\x03\x04" + bytes(range(256)) * 8, None])
@pytest.mark.parametrize("door", ["--workload", "--model", "LOG", "--plan", "--efficiency-report", "RESULT"])
def test_an_xlsx_named_input_is_read_as_its_door_reads_or_refused_in_one_line(tmp_path, capsys, content, door):
    path = tmp_path / "input.xlsx"
    path.write_bytes(_xlsx_bytes() if content is None else content)
    metrics = str(ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.26-constructed.txt")
    argv = {"--workload": [*PLAN[:2], str(path), *PLAN[3:]],
            "--model": ["estimate", "--model", str(path), "--gpu", "h200"],
            "LOG": ["check-log", str(path), "--model", "llama-3.1-8b", "--gpu", "h200"],
            "--plan": ["watch", metrics, "--plan", str(path)],
            "--efficiency-report": [*PLAN, "--efficiency-report", str(path)],
            "RESULT": ["check-serve", str(path), "--model", "llama-3.1-8b", "--gpu", "h200"]}[door]
    refused(capsys, argv)


# new doors: watch --plan, the per-release table, ?release=, Hugging Face ids ---------------------------------


@SETTINGS
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                 st.sampled_from([b"[" * 5000, b'{"schema": "kvsize.plan/1", "deployment": ' + LONG.encode() + b"}",
                                  b"\xef\xbb\xbf{}", b'{"schema": NaN}', b"\x00" * 10])))
def test_a_plan_file_of_any_bytes_is_read_or_refused_in_one_line(data):
    from sizing.planners.deployment import read_deployment

    try:
        read_deployment(data, "--plan plan.json")
    except KvsizeError as e:
        one_line(e)


def _dtype_mutations():
    table = json.loads((ROOT / "profiles" / "engines" / "kv_cache_dtypes.json").read_text())
    paths = [("source",), ("engines",), ("engines", "vllm"), ("engines", "vllm", "checked"),
             ("engines", "vllm", "checked", 0), ("engines", "vllm", "values"), ("engines", "vllm", "values", 0),
             ("engines", "vllm", "values", 0, "since"), ("engines", "vllm", "values", 0, "value"),
             ("engines", "vllm", "option")]
    return table, paths


@SETTINGS
@given(st.sampled_from(_dtype_mutations()[1]), st.one_of(REPORT_LEAVES, st.just(LONG), st.just(float("nan"))))
def test_the_per_release_table_with_any_field_of_any_value_is_read_or_refused_in_one_line(path, value):
    from sizing.engines.accepted_dtypes import parse_dtypes_table

    table = copy.deepcopy(_dtype_mutations()[0])
    node = table
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    text = json.dumps(table).replace(json.dumps(LONG), LONG)  # the long digits as a number, not text
    try:
        parse_dtypes_table(text, "kv_cache_dtypes.json")
    except KvsizeError as e:
        one_line(e)


@SETTINGS
@given(st.one_of(st.text(max_size=40), st.sampled_from(["0.31", "v0.31", "0.31.0.0", "9" * 5000, "0." * 500,
                                                        "[x](y)", "0.31\x1b[2J", "-1", "0x1f"])))
def test_a_release_from_the_url_is_one_of_the_releases_or_given_back_unchanged(value):
    from app.ui import matching_release

    releases = ["newest started", "0.33.0", "0.31.0", "0.25.1"]
    found = matching_release(value, releases)
    assert found in releases or found == value


@SETTINGS
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=60))
def test_a_hugging_face_id_of_any_text_is_resolved_or_refused_in_one_line(name):
    from sizing.profiles import load_model

    try:
        load_model(f"org-that-is-not-there/{name}")
    except KvsizeError as e:
        one_line(e)


@pytest.mark.parametrize("spec, needle", [("meta-llama/" + "x" * 5000, "at most 4,096 characters"),
                                          ("org/x\x00y", "holds no NUL"),
                                          ("org/\x1b[2Jname", "unknown model")])
def test_a_hugging_face_id_that_cannot_be_one_is_named(spec, needle):
    from sizing.profiles import load_model

    with pytest.raises(KvsizeError) as e:
        load_model(spec)
    assert needle in one_line(e.value) and len(str(e.value)) < 1000
