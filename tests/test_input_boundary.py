"""One bounded reader for every input file, YAML read as plain data, outputs that name the path given:
each bad input is one line naming what was wrong, exit 2, nothing written."""

import os

import pytest

from app.cli import main
from conftest import ROOT

WORKLOAD = (ROOT / "examples" / "workload.yaml").read_text()


def test_devices_and_pipes_are_refused_before_reading(tmp_path, capsys):
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)  # reading it would block forever
    for path in ("/dev/zero", str(fifo), str(tmp_path)):
        assert main(["check-log", path, "--model", "llama-3.1-8b"]) == 2
        assert "is not a regular file" in capsys.readouterr().err


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path, capsys):
    rows = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi")]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(rows) + "\npeak_concurrency: 4\nbuckets: *i\n")
    assert main(["plan", "--workload", str(path), "--model", "llama-3.1-8b"]) == 2
    assert "YAML aliases" in capsys.readouterr().err


def test_yaml_values_stay_json_values(tmp_path, capsys):
    dated = tmp_path / "dated.yaml"
    dated.write_text(WORKLOAD.replace("name: chat + RAG mix", "name: 2024-01-01"))
    out = tmp_path / "plan.json"
    assert main(["plan", "--workload", str(dated), "--model", "llama-3.1-8b", "--gpus", "h100-sxm",
                 "--out", str(out)]) == 0
    assert '"name": "2024-01-01"' in out.read_text()  # a date-like name stays text
    for tag in ("!!binary aGVsbG8=", "!!set {a, b}", "!!timestamp 2024-01-01"):
        bad = tmp_path / "tagged.yaml"
        bad.write_text(WORKLOAD.replace("name: chat + RAG mix", f"name: {tag}"))
        assert main(["plan", "--workload", str(bad), "--model", "llama-3.1-8b"]) == 2
        assert "makes a value a workload cannot hold" in capsys.readouterr().err


def test_an_unwritable_out_names_the_path_given(capsys):
    assert main(["estimate", "--model", "llama-3.1-8b", "--out", "/proc/x.json"]) == 2
    err = capsys.readouterr().err
    assert "--out /proc/x.json" in err and ".part" not in err
