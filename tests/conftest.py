import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Without an NVIDIA GPU the Triton kernels run in Triton's interpreter (numpy on the CPU); it
# must be chosen before the kernels are defined.
if not Path("/dev/nvidia0").exists():
    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")


def serve_scrapes(scrapes: list[bytes]):
    """A local HTTP server on 127.0.0.1 (a free port) answering each GET of /metrics with the next scrape,
    as a Prometheus endpoint does; the caller shuts it down."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = scrapes.pop(0) if scrapes else b""
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
