"""Every door, round 4, where time, encodings and the page are involved: a C locale or an ASCII-only terminal, a
server that trickles its answer, an engine log built to make a parser quadratic, check-log's standard input, and
URL parameters shown in the app's banners. Waits are bounded and never fixed sleeps."""

import io
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cli import main
from conftest import ROOT
from sizing.errors import UNSAFE, KvsizeError

LOG = ROOT / "tests" / "fixtures" / "vllm-starts" / "logs" / "h200-0.22.1-llama-2-7b.log"
CONFIG = ROOT / "tests" / "fixtures" / "vllm-starts" / "configs" / "llama-2-7b.json"

# 3. a C locale, an ASCII-only standard output ---------------------------------------------------------------

ASCII_ENV = {"LC_ALL": "C", "LANG": "C", "PYTHONIOENCODING": "ascii", "PYTHONUTF8": "0"}


def _run_ascii(argv: list[str], env_extra: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONUTF8", "PYTHONIOENCODING"))}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "app.cli", *argv], cwd=ROOT, env=env, capture_output=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def non_ascii_inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("non-ascii")
    workload = folder / "w.yaml"
    text = (ROOT / "examples" / "workload.yaml").read_text(encoding="utf-8")
    workload.write_text(text.replace("name: chat + RAG mix", "name: chat ü RAG — mix ≤ 8K"), encoding="utf-8")
    log = folder / "start.log"
    log.write_text("ünïcödé — starting\n" + LOG.read_text(encoding="utf-8"), encoding="utf-8")
    return workload, log


@pytest.mark.parametrize("utf8_mode", ["0", "1"])
@pytest.mark.parametrize("case", ["estimate", "plan", "check-log", "unknown-gpu"])
def test_a_c_locale_and_an_ascii_terminal_degrade_not_crash(non_ascii_inputs, case, utf8_mode):
    workload, log = non_ascii_inputs
    argv, code = {
        "estimate": (["estimate", "--model", "llama-3.1-8b", "--gpu", "h200"], 0),  # prints ×, − and ≤
        "plan": (["plan", "--workload", str(workload), "--model", "llama-3.1-8b", "--gpus", "h200", "--tp", "1",
                  "--formats", "auto"], 0),
        "check-log": (["check-log", str(log), "--model", str(CONFIG), "--gpu", "h200"], 0),  # prints ±
        "unknown-gpu": (["estimate", "--model", "llama-3.1-8b", "--gpu", "h200ü"], 2),
    }[case]
    done = _run_ascii(argv, {**ASCII_ENV, "PYTHONUTF8": utf8_mode})
    out, err = done.stdout.decode("ascii"), done.stderr.decode("ascii")  # every byte is ASCII
    assert done.returncode == code, err[-500:]
    assert "Traceback" not in err and "internal error" not in err
    if code == 0:
        assert out.strip()
    if case == "plan":
        assert "chat \\xfc RAG - mix <= 8K" in out  # the name degraded, not dropped
    if case == "unknown-gpu":
        # without UTF-8 mode the C locale hands Python the argument's bytes undecoded (\udcc3\udcbc): escaped too
        assert err.count("\n") == 1 and ("unknown GPU 'h200\\xfc'" in err or "unknown GPU 'h200\\udcc3\\udcbc'" in err)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200), st.sampled_from(["ascii", "latin-1", "cp1252", "utf-8"]))
def test_any_text_reaches_any_terminal_as_what_it_can_show(text, encoding):
    from app.cli import _TerminalSafe

    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding=encoding, errors="strict", newline="")
    _TerminalSafe(stream).write(text)
    stream.flush()
    shown = raw.getvalue().decode(encoding)  # written without an error in the stream's own encoding
    assert not UNSAFE.search(shown.replace("\t", "").replace("\n", "").replace("\r", ""))
    if all(" " <= c <= "~" or c in "\t\n\r" for c in text):
        assert shown == text  # plain text passes as it is


# 6. watch on a server that trickles ------------------------------------------------------------------------


class _TricklingServer:
    """A TCP server on 127.0.0.1 that answers each connection with `head` one byte every `gap` seconds, then
    keeps trickling `tail` bytes until stopped: an answer that never ends on its own."""

    def __init__(self, head: bytes, tail: bytes = b"a", gap: float = 0.2) -> None:
        self.stop = threading.Event()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.listener.settimeout(0.2)
        self.head, self.tail, self.gap = head, tail, gap
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/metrics"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            try:
                conn.recv(65536)
                sent = 0
                while not self.stop.wait(self.gap):
                    byte = self.head[sent:sent + 1] or self.tail
                    conn.sendall(byte)
                    sent += 1
            except OSError:
                pass
            finally:
                conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.listener.close()


@pytest.mark.parametrize("head, tail", [
    (b"", b"H"),  # the status line, a byte at a time, never ending
    (b"HTTP/1.1 200 OK\r\n", b"X"),  # a header that never ends
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n", b"v"),  # a body that never ends
])
def test_a_trickling_server_is_cut_off_at_the_scrape_deadline(head, tail):
    from app.commands.watch import _http_scrape

    server = _TricklingServer(head, tail, gap=0.05)
    try:
        start = time.monotonic()
        with pytest.raises(KvsizeError, match="the scrape took over 1 s"):
            _http_scrape(server.url, 1 << 20, deadline_s=1.0)
        # a socket timeout per read would wait as long as the server keeps sending (forever here)
        assert time.monotonic() - start < 15
    finally:
        server.close()


@pytest.fixture(scope="module")
def closed_port():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now: a connection is refused at once
    return port


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=60), st.sampled_from(["http", "https", "HTTP"]))
def test_a_metrics_url_of_any_path_is_refused_in_one_line(closed_port, path, scheme):
    from app.commands.watch import _http_scrape

    start = time.monotonic()
    with pytest.raises(KvsizeError) as e:
        _http_scrape(f"{scheme}://127.0.0.1:{closed_port}/{path}", 1 << 20, deadline_s=5.0)
    assert "\n" not in str(e.value) and not UNSAFE.search(str(e.value))
    assert time.monotonic() - start < 30


def test_watch_refuses_a_trickling_server_in_one_line(monkeypatch, capsys):
    import functools

    from app.commands import watch

    monkeypatch.setattr(watch, "_http_scrape", functools.partial(watch._http_scrape, deadline_s=1.0))
    server = _TricklingServer(b"HTTP/1.1 200 OK\r\n", b"X", gap=0.05)
    try:
        assert main(["watch", server.url, "--model", str(CONFIG), "--gpu", "h200"]) == 2
    finally:
        server.close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the scrape took over 1 s" in err and "127.0.0.1" in err


# 7. an engine log built to make a parser quadratic ---------------------------------------------------------


@pytest.mark.parametrize("line", [
    "non-default args: {" * 3420,  # 65 KB of unclosed dicts, each a place a regular expression would restart
    "INFO non-default args: {" + "'a': 1, " * 8100,  # one unclosed dict per line
])
def test_a_65_mb_log_of_unclosed_dicts_is_read_in_bounded_time(line):
    from sizing.evidence.logs import read_log

    text = "\n".join([line] * 1000) + "\nAvailable KV cache memory: 10.00 GiB\nGPU KV cache size: 1,000 tokens\n"
    assert len(text) > 64_000_000
    start = time.monotonic()
    run = read_log(text)
    assert time.monotonic() - start < 60  # it took minutes; a few seconds on a 2-core machine now
    assert run.figures["max_tokens"] == 1000 and "max_model_len" not in run.settings


@pytest.mark.parametrize("marker, tail", [
    ("LLM engine (v1.2.3", "Available KV cache memory: 10.00 GiB"),  # a version never closed
    ("with config: model='", "Available KV cache memory: 10.00 GiB"),  # a quote never closed
    ("MemorySnapshot(", "Available KV cache memory: 10.00 GiB"),  # a figure never reached
    ("Load weight end. ", "max_total_num_tokens=1000"),
    ("KV Cache is allocated. ", "max_total_num_tokens=1000"),
])
def test_a_log_of_any_marker_repeated_is_read_in_bounded_time(marker, tail):
    # 20 MB: minutes for the patterns that crossed lines or tried every repeat (90 s for 650 kB of the first)
    from sizing.evidence.logs import read_log

    text = "\n".join([marker * (65000 // len(marker))] * 300) + "\n" + tail + "\n"
    start = time.monotonic()
    try:
        read_log(text)
    except KvsizeError as e:
        assert "\n" not in str(e)
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("text, expected", [
    ("non-default args: {'x\nnon-default args: {'max_model_len': 4096}\n", 4096),  # the first closed one is read
    ("non-default args: x non-default args: {'max_model_len': 2048}\n", 2048),  # a later one on the same line
    ("non-default args: {" * 100 + "\nnon-default args: {'max_model_len': 1024, 'x': {'y': 1}}\n", 1024),
])
def test_the_logged_dict_is_still_found_where_it_is(text, expected):
    from sizing.evidence.logs import read_log

    run = read_log(text + "Available KV cache memory: 10.00 GiB\n")
    assert run.settings["max_model_len"] == expected


# check-log's standard input ----------------------------------------------------------------------------------


class _Stdin:
    def __init__(self, data: bytes | None, tty: bool = False) -> None:
        self.buffer = None if data is None else io.BytesIO(data)
        if self.buffer is not None:
            self.buffer.isatty = lambda: tty


def test_check_log_reads_a_log_from_standard_input(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", _Stdin(LOG.read_bytes()))
    assert main(["check-log", "-", "--model", str(CONFIG), "--gpu", "h200"]) == 0
    assert "kv_budget_bytes" in capsys.readouterr().out


@pytest.mark.parametrize("stdin, needle", [(_Stdin(None), "this run has none"),
                                           (_Stdin(b"", tty=True), "is a terminal here")])
def test_check_log_without_a_piped_log_says_so_at_once(monkeypatch, capsys, stdin, needle):
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(["check-log", "-", "--model", str(CONFIG), "--gpu", "h200"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=300),
                 st.lists(st.sampled_from([b"Available KV cache memory: ", b"GPU KV cache size: ", b"9" * 5000,
                                           b"non-default args: {", b"}", b"\x1b[2J", b"\xff\xfe", b"\n",
                                           "ü\u202e".encode(), b"max_total_num_tokens="]), max_size=12).map(b"".join)))
def test_standard_input_of_any_bytes_is_answered_or_refused_in_one_line(monkeypatch, capsys, data):
    monkeypatch.setattr(sys, "stdin", _Stdin(data))
    code = main(["check-log", "-", "--model", str(CONFIG), "--gpu", "h200"])
    out, err = capsys.readouterr()
    assert code in (0, 2) and "Traceback" not in err and "internal error" not in err
    if code == 2:
        assert err.count("\n") == 1 and not UNSAFE.search(err.rstrip("\n"))


# 9. URL parameters shown in the app's banners ----------------------------------------------------------------


@pytest.mark.parametrize("key, value", [("tp", "[click](http://example.invalid)"), ("util", "![x](http://e.invalid/i)"),
                                        ("release", "[r](http://example.invalid) **bold**"),
                                        ("ctx", "<b>1</b>\u202e`code`")])
def test_a_url_parameter_is_never_rendered_as_markdown_in_a_banner(key, value):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=120)
    at.query_params[key] = value
    at.run()
    assert not at.exception
    shown = " ".join(str(w.value) for w in at.warning)
    assert shown, "the parameter that is not usable is named"
    for live in ("](http", "**bold", "<b>", "`code`", "\u202e"):
        assert live not in shown, (live, shown)
