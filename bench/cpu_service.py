"""A small HTTP service that does CPU work per request, and its own load on loopback: the
high-priority service of bench/elastic_service.py, run in each of its pods as
`python -c <this file>` (the job image's Python, the standard library only).

Each GET /work hashes for WORK_MS of CPU time and answers with the number of rounds; a
load generator in the same pod asks without pause, so the pod uses all the CPU its
limit gives it: a service that really uses what it requests, as a busy web tier does.
GET /stats answers the requests served so far (JSON).
"""

import hashlib
import json
import os
import signal
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = 8080
WORK_MS = 20
served = 0


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        global served
        if self.path == "/stats":
            body = json.dumps({"served": served}).encode()
        else:
            rounds, digest = 0, b"x"
            deadline = time.process_time() + WORK_MS / 1000
            while time.process_time() < deadline:
                for _ in range(200):
                    digest = hashlib.sha256(digest).digest()
                rounds += 200
            served += 1
            body = str(rounds).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:  # one line per request would be the pod's log
        pass


def load() -> None:
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/work", timeout=10) as r:
                r.read()
        except OSError:  # (the server not up yet)
            time.sleep(0.1)


if __name__ == "__main__":
    # PID 1 of its container, where SIGTERM has no default action: without this a pod
    # scaled away would hold its CPU for the whole grace period.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    for _ in range(2):
        threading.Thread(target=load, daemon=True).start()
    server.serve_forever()
