"""What a reply far over the cap costs the client's memory, measured as a user would see it: the
client alone in a child process (its peak RSS before and after the request) and the replica a
plain `http.server` in another process that really sends what it declares. A
client that read a 300 MB reply before refusing it grew by hundreds of MB (the reply, then the
bytes it was joined into); one that checks the declared length first and reads a piece at a
time grows by a few MB whatever is sent.

The replica answers by the first path segment of its base URL (`http://127.0.0.1:PORT/MODE/v1`):
  ok        a normal verdict
  declared  200 with Content-Length 300 MB, a valid verdict padded with spaces, all of it sent
  chunked   300 MB without a length (Transfer-Encoding: chunked)
  gzip      Content-Encoding gzip: 100 MB of verdict and spaces in about 100 KB
  deflate   the same as zlib's deflate
  values    a reply within the 4 MiB cap, a verdict beside 1.4 million empty lists: parsed, 100 MB
and the same on GET .../models (the list the client asks for when it is given no model name).
`GET /stats` says how many bytes each mode sent and whether its client hung up first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reasonrl_fast.genrm.client import MAX_REPLY_BYTES

pytestmark = pytest.mark.proc  # a server process and a client process on loopback

ROOT = Path(__file__).parents[2]
BIG = 300 << 20
SLACK = 32 << 20  # the interpreter's own noise over a request: buffers, the loop, the allocator

SERVER = r"""
import http.server, json, socketserver, sys, threading, zlib

BIG, INFLATED, BLOCK = 300 << 20, 100 << 20, 1 << 20
VERDICT = json.dumps({"object": "list", "data": [{"id": "m"}],
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "\\boxed{-1}"}}]}).encode()
stats, lock = {}, threading.Lock()

def bomb(wbits):
    # A verdict and INFLATED bytes of spaces, compressed: about a thousandth of that on the wire.
    z = zlib.compressobj(9, zlib.DEFLATED, wbits)
    block = b" " * BLOCK
    return z.compress(VERDICT) + b"".join(z.compress(block) for _ in range(INFLATED // BLOCK)) + z.flush()

BOMBS = {"gzip": bomb(16 + zlib.MAX_WBITS), "deflate": bomb(zlib.MAX_WBITS)}
VALUES = VERDICT[:-1] + b', "pad": [' + b",".join([b"[]"] * ((4 << 20) // 3 - 1000)) + b"]}"

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/stats":
            with lock:
                body = json.dumps(stats).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.answer()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.answer()

    def answer(self):
        mode = self.path.strip("/").split("/")[0]
        sent, ended = 0, "sent"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        try:
            if mode == "ok":
                self.send_header("Content-Length", str(len(VERDICT)))
                self.end_headers()
                self.wfile.write(VERDICT)
                return
            if mode == "declared":
                self.send_header("Content-Length", str(BIG))
                self.end_headers()
                self.wfile.write(VERDICT)
                sent = len(VERDICT)
                block = b" " * BLOCK
                while sent < BIG:
                    piece = block[:BIG - sent]
                    self.wfile.write(piece)
                    sent += len(piece)
            elif mode == "chunked":
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunk = b"%x\r\n%s\r\n" % (BLOCK, b" " * BLOCK)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(VERDICT), VERDICT))
                while sent < BIG:
                    self.wfile.write(chunk)
                    sent += BLOCK
                self.wfile.write(b"0\r\n\r\n")
            else:
                body = VALUES if mode == "values" else BOMBS[mode]
                if mode != "values":
                    self.send_header("Content-Encoding", mode)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                sent = len(body)
        except OSError:  # the client refused the reply and hung up: what a client should do
            ended = "closed"
            self.close_connection = True
        with lock:
            stats[mode + ("/models" if self.command == "GET" else "")] = {"sent": sent, "ended": ended}

class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

server = Server(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""

# The client alone: one normal request first (so that what any request costs, the loop, the
# session, its first connection, is in the baseline), then its peak RSS before and after the one
# under test. The peak is VmHWM, the high-water mark of this process's own memory: ru_maxrss would
# be the same number in a process started from a small one, but a child keeps its parent's peak
# as the floor of its ru_maxrss across exec (pytest with torch imported: hundreds of MB), under
# which a client's growth would hide.
CLIENT = r"""
import json, re, sys
from reasonrl_fast.genrm.client import GenRMClient

def peak():
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) * 1024

def ask(address, model):
    with GenRMClient([address], model=model, template="compact", max_retries=0, timeout_s=30) as c:
        return c.judge([("11+22=", "33", ["3", "3"])])[0]

port, mode, model = sys.argv[1], sys.argv[2], sys.argv[3]
ok = ask(f"http://127.0.0.1:{port}/ok/v1", "m")
base = peak()
verdict = ask(f"http://127.0.0.1:{port}/{mode}/v1", model)
print(json.dumps({"ok": [ok.step, ok.error], "step": verdict.step, "error": verdict.error,
                  "grown": peak() - base}), flush=True)
"""


@pytest.fixture(scope="module")
def replica():
    """(port, stats()) of the plain http.server replica, killed when the module's tests end."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = proc.stdout.readline().strip()
        assert port, "the replica did not start"

        def stats() -> dict:
            import urllib.request
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as r:
                return json.loads(r.read())

        yield port, stats
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()


def ask_in_child(port: str, mode: str, model: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CLIENT, port, mode, model], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("call", ["chat", "models"])
@pytest.mark.parametrize("mode", ["declared", "chunked", "gzip", "deflate", "values"])
def test_a_reply_over_the_cap_costs_at_most_the_cap(replica, mode, call):
    """Each reply is refused as 'reply over N bytes' (for the model list: 'model list: reply over
    N bytes'), or, within the cap, as 'reply: too many JSON values' before it is parsed; the
    client's peak RSS grows by at most max_reply_bytes + 32 MB; and the client hangs up: the
    replica's writing of a 300 MB reply ends on a closed connection far short of it."""
    port, stats = replica
    r = ask_in_child(port, mode, "m" if call == "chat" else "")
    why = "reply: too many JSON values" if mode == "values" else f"reply over {MAX_REPLY_BYTES} bytes"
    assert r["ok"] == [-1, ""], r  # the replica and the client work at all
    assert (r["step"], r["error"]) == (None, why if call == "chat" else f"model list: {why}"), r
    assert r["grown"] <= MAX_REPLY_BYTES + SLACK, f"{mode} {call}: the peak RSS grew by {r['grown'] >> 20} MB"
    if mode in ("declared", "chunked"):
        key = mode + ("/models" if call == "models" else "")
        deadline = time.monotonic() + 10  # the replica's thread notices the hang-up on its next write
        while key not in stats() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = stats()[key]
        assert seen["ended"] == "closed" and seen["sent"] < BIG // 10, seen
