"""Outputs a procurement file can trust, and the words around them (issue 50, items 6-9)."""

import json

import pytest

from app.cli import main
from conftest import ROOT

METRICS = ROOT / "tests" / "fixtures" / "metrics"


def run(*argv):
    return main(list(argv))


def test_sweep_writes_every_out_it_is_given(tmp_path, capsys):
    # --out a.xlsx --out b.csv wrote only the CSV; each is written now, whole
    import openpyxl
    import pandas as pd

    xlsx, csv, js = tmp_path / "grid.xlsx", tmp_path / "grid.csv", tmp_path / "grid.json"
    assert run("sweep", "--models", "llama-3.1-8b", "--formats", "auto,q4_0", "--contexts", "8k,32k",
               "--out", str(xlsx), "--out", str(csv), "--out", str(js), "--no-progress") == 0
    err = capsys.readouterr().err
    assert all(f"to {p}" in err for p in (xlsx, csv, js))
    book = openpyxl.load_workbook(xlsx)
    assert "scenarios" in book.sheetnames and book["not sized"].max_row == 1 + 2
    rows = pd.read_csv(csv)
    assert len(rows) == 4 and len(json.loads(js.read_text())) == 4
    # q4_0 is not a vLLM format: its rows say "not sized", which pandas keeps (it read "n/a" as a blank)
    assert rows["status"].notna().all()
    assert sorted(rows["status"]) == ["fits", "fits", "not sized", "not sized"]


def test_sweep_writes_no_out_when_one_cannot_be_written(tmp_path):
    good, bad = tmp_path / "grid.csv", tmp_path / "grid.txt"
    assert run("sweep", "--models", "llama-3.1-8b", "--out", str(good), "--out", str(bad), "--no-progress") == 2
    assert list(tmp_path.iterdir()) == []


def test_an_estimate_that_does_not_fit_writes_its_json(tmp_path, capsys):
    # the JSON says fits: false (it wrote nothing before); the exit status is still a non-fit's
    argv = ["estimate", "--model", "llama-3.1-8b", "--gpu", "h200", "--engine", "vllm@0.26.0",
            "--gpu-memory-utilization", "0.1", "--max-model-len", "32k", "--format", "json"]
    assert run(*argv) == 2
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    assert record["fits"] is False and record["num_blocks"] == 0 and record["deployment"]["num_blocks"] == 0
    assert "kvsize: error: the model does not fit" in captured.err
    out = tmp_path / "estimate.json"
    assert run(*argv, "--out", str(out)) == 2
    assert json.loads(out.read_text())["fits"] is False
    # and such a JSON is a plan watch holds a server to: the server holds blocks the estimate found no room for
    capsys.readouterr()
    code = run("watch", str(METRICS / "vllm-0.26.0-h200-llama-3.1-8b-busy.txt"), "--plan", str(out),
               "--format", "json")
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["plan"]["num_blocks"] == 0
    blocks = next(f for f in report["figures"] if f["figure"] == "KV blocks")
    assert "inf" not in blocks["planned"] and "does not fit" in blocks["planned"]


def test_a_table_or_csv_estimate_that_does_not_fit_still_writes_nothing(tmp_path, capsys):
    out = tmp_path / "e.csv"
    assert run("estimate", "--model", "llama-3.1-8b", "--gpu", "h200", "--gpu-memory-utilization", "0.1",
               "--format", "csv", "--out", str(out)) == 2
    assert not out.exists() and capsys.readouterr().out == ""


def test_good_news_is_a_note_not_a_warning(capsys):
    assert run("estimate", "--model", "llama-3.1-8b", "--gpu", "h200", "--engine", "vllm@0.33.0",
               "--max-model-len", "32k", "--format", "json") == 0
    err = capsys.readouterr().err
    assert "kvsize: note: vllm 0.33.0 was started: " in err and "warning: vllm 0.33.0 was started" not in err
    assert run("estimate", "--model", "llama-3.1-8b", "--gpu", "h200", "--engine", "vllm@0.19.1",
               "--max-model-len", "32k") == 0
    out = capsys.readouterr().out
    assert "  warning: vllm 0.19.1 was never started" in out  # a real warning stays one


def test_good_news_in_a_sweep_is_a_note(tmp_path, capsys):
    assert run("sweep", "--models", "llama-3.1-8b", "--engines", "vllm@0.33.0,vllm@0.19.1", "--contexts", "8k",
               "--out", str(tmp_path / "g.csv"), "--no-progress") == 0
    err = capsys.readouterr().err
    assert "kvsize: note: vllm 0.33.0 was started" in err and "kvsize: warning: vllm 0.19.1 was never started" in err


@pytest.mark.parametrize("given, tokens", [("1M", 1_048_576), ("1m", 1_048_576), ("32k", 32_768), ("2M", 2_097_152)])
def test_max_model_len_takes_k_and_m_in_1024s(given, tokens):
    from app.options import _tokens

    assert _tokens(given) == tokens


def test_max_model_len_1m_is_accepted_and_help_says_what_the_suffixes_mean(capsys):
    # Llama-3.1-8B at 1M tokens on an H200: refused as past the model's own limit (max_position_embeddings
    # 131,072, no published rope-scaling recipe: issue 50, item 2), not as an unreadable length
    assert run("estimate", "--model", "llama-3.1-8b", "--gpu", "h200", "--max-model-len", "1M") == 2
    err = capsys.readouterr().err
    assert "--max-model-len 1,048,576 exceeds the model's max_position_embeddings 131,072" in err
    with pytest.raises(SystemExit):
        run("estimate", "--help")
    assert "m or M = 1,048,576" in " ".join(capsys.readouterr().out.split())


def test_check_log_ends_with_a_verdict(capsys):
    assert run("check-log", str(METRICS / "vllm-0.26.0-h200-llama-3.1-8b-serve.log"), "--gpu", "h200") == 0
    last = capsys.readouterr().out.rstrip("\n").splitlines()[-1]
    assert last == "  agrees within 1% (kv_budget_bytes and max_tokens)"


def test_check_log_verdict_names_what_disagrees():
    from app.commands.check_log import verdict

    rows = [dict(term="kv_budget_bytes", predicted=103, logged=100, difference_percent=3.0),
            dict(term="max_tokens", predicted=1000, logged=1001, difference_percent=-0.1)]
    assert verdict(rows) == "  DISAGREES beyond 1%: kv_budget_bytes +3.00%"
    assert verdict([dict(term="weights_bytes", predicted=1, logged=1, difference_percent=0.0)]).startswith(
        "  no verdict")


PROVENANCE = ["provenance_kvsize_version", "provenance_written_utc", "provenance_engine_release",
              "provenance_price_date", "provenance_caveats"]


def _read_csv(path):
    import pandas as pd

    return pd.read_csv(path)


def test_sweep_files_carry_their_provenance(tmp_path, capsys):
    # a sheet of its own in the XLSX; columns in the CSV that pandas reads as it reads the rest, nothing blank
    import openpyxl

    xlsx, csv = tmp_path / "g.xlsx", tmp_path / "g.csv"
    assert run("sweep", "--models", "llama-3.1-8b", "--engines", "vllm,vllm@0.19.1", "--contexts", "8k,32k",
               "--out", str(xlsx), "--out", str(csv), "--no-progress") == 0
    err = capsys.readouterr().err
    rows = _read_csv(csv)
    assert len(rows) == 4 and list(rows.columns[-5:]) == PROVENANCE
    assert rows[PROVENANCE].notna().all().all() and rows["max_tokens"].dtype.kind == "i"
    first = rows.iloc[0]
    assert first["provenance_kvsize_version"] and first["provenance_written_utc"].endswith("Z")
    assert "vllm@0.33.0" in first["provenance_engine_release"] and "vllm@0.19.1" in first["provenance_engine_release"]
    assert "h100-sxm 2025-10" in first["provenance_price_date"]
    assert "warning: vllm 0.19.1 was never started" in first["provenance_caveats"]
    assert "vllm 0.19.1 was never started" in err
    sheet = {r[0]: r for r in openpyxl.load_workbook(xlsx)["provenance"].iter_rows(values_only=True)}
    assert {"kvsize version", "written", "engine release (vllm)", "engine release (vllm@0.19.1)",
            "price date (h100-sxm)", "caveat"} <= set(sheet)
    release = sheet["engine release (vllm)"]
    assert release[1] == "vllm@0.33.0 (started)" and "was started" in release[2]


def test_a_stale_price_is_flagged():
    from datetime import datetime, timezone

    from app.provenance import provenance_rows

    rows = {r["item"]: r for r in provenance_rows(["vllm"], ["h200"], datetime(2031, 1, 1, tzinfo=timezone.utc))}
    assert "OLDER THAN 6 MONTHS" in rows["price date (h200)"]["note"]
    fresh = {r["item"]: r for r in provenance_rows(["vllm"], ["h200"], datetime(2025, 11, 1, tzinfo=timezone.utc))}
    assert "OLDER THAN" not in fresh["price date (h200)"]["note"]


@pytest.mark.parametrize("argv", [
    ["estimate", "--model", "llama-3.1-8b", "--gpu", "h200", "--engine", "vllm@0.19.1", "--format", "csv"],
    ["estimate", "--model", "llama-3.1-8b", "--gpu", "h200", "--engine", "vllm@0.19.1", "--vs", "vllm@0.33.0",
     "--format", "csv"],
    ["compare", "--model", "llama-3.1-8b", "--gpu", "h200", "--engine", "vllm@0.19.1", "--format", "csv"],
])
def test_estimate_and_compare_csv_carry_their_provenance(tmp_path, argv):
    out = tmp_path / "t.csv"
    assert run(*argv, "--out", str(out)) == 0
    rows = _read_csv(out)
    assert list(rows.columns[-5:]) == PROVENANCE and rows[PROVENANCE].notna().all().all()
    assert "vllm@0.19.1 (never started)" in rows.iloc[0]["provenance_engine_release"]
    if argv[0] == "estimate" and "--vs" not in argv:
        assert "vllm 0.19.1 was never started" in rows.iloc[0]["provenance_caveats"]


def test_plan_files_carry_their_provenance_and_its_text_names_the_release(tmp_path, capsys):
    import openpyxl

    xlsx, csv = tmp_path / "p.xlsx", tmp_path / "p.csv"
    assert run("plan", "--workload", str(ROOT / "examples" / "workload.yaml"), "--model", "llama-3.1-8b",
               "--gpus", "h100-sxm,h200", "--out", str(xlsx), "--out", str(csv)) == 0
    out = capsys.readouterr().out
    assert out.startswith("Fleet plan: Llama-3.1-8B on vllm (release vllm@0.33.0),")
    rows = _read_csv(csv)
    assert list(rows.columns[-5:]) == PROVENANCE
    assert "nvfp4 left out on h100-sxm" in rows.iloc[0]["provenance_caveats"]  # as the CLI printed it
    sheet = [r for r in openpyxl.load_workbook(xlsx)["provenance"].iter_rows(values_only=True)]
    assert any(r[0] == "caveat" and "nvfp4 left out on h200" in r[1] for r in sheet)


def test_a_run_carries_only_its_own_caveats(tmp_path):
    # the caveats kept for the files are this run's: a second run in the same process starts afresh
    assert run("estimate", "--model", "llama-3.1-8b", "--gpu", "h200", "--engine", "vllm@0.19.1",
               "--format", "json") == 0
    out = tmp_path / "t.csv"
    assert run("estimate", "--model", "llama-3.1-8b", "--gpu", "h200", "--engine", "vllm@0.33.0", "--format",
               "csv", "--out", str(out)) == 0
    assert "0.19.1" not in _read_csv(out).iloc[0]["provenance_caveats"]
