"""A small fault-injecting HTTP proxy for the endpoint tests: it forwards every request to a
real server, except those its script says to break. A script is a list of faults taken one
per completion POST in arrival order (None: forward); GETs and other POSTs (a tokenize route)
are forwarded, except to the paths in `missing`, which answer 404 as a server without them,
and to the paths in `on` ({path: fault}), which answer that fault every time.

Faults: ("status", 503) answers that status with an error body; ("status", 429, seconds) adds
Retry-After; "malformed" answers 200 with a body that is not JSON; "drop" closes the
connection without an answer; ("delay", seconds) waits, then forwards; ("rewrite", f)
forwards and answers f(the server's JSON answer) instead (a server that answers what no
server should); ("trickle", seconds) answers one byte every `seconds`; ("slow-headers",
seconds) the same in a header, before any body; ("huge", n) answers n
bytes (a body that never ends, as far as a client can tell); ("gzip", n) answers n zero bytes
gzip-compressed (a few KiB on the wire); ("redirect", url) answers 307 to `url`; "echo-auth"
forwards and answers the server's answer with the request's Authorization header in its
text, its model name and a `server` header (a server that leaks the key it was sent).
"""

from __future__ import annotations

import gzip
import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class FaultProxy:
    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.script: list = []
        self.missing: set[str] = set()
        self.on: dict[str, object] = {}
        self.posts = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                path = self.path.split("?", 1)[0]
                self._answer_with(proxy.on.get(path), None)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                path = self.path.split("?", 1)[0]
                if path in proxy.missing:
                    fault = ("status", 404)
                elif path in proxy.on:
                    fault = proxy.on[path]
                elif not path.endswith("/completions"):
                    fault = None
                else:
                    with proxy.lock:
                        fault = proxy.script.pop(0) if proxy.script else None
                        proxy.posts += 1
                self._answer_with(fault, body)

            def _answer_with(self, fault, body):
                kind = fault if isinstance(fault, str) or fault is None else fault[0]
                if kind == "status":
                    payload = b'{"error": {"message": "injected fault"}}'
                    self.send_response(fault[1])
                    if len(fault) > 2:
                        self.send_header("Retry-After", str(fault[2]))
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                elif kind == "malformed":
                    payload = b'{"choices": [ this is not json'
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                elif kind == "rewrite":
                    payload = json.dumps(fault[1](json.loads(self._upstream(body)[1]))).encode()
                    self._answer(200, payload)
                elif kind == "echo-auth":
                    answer = json.loads(self._upstream(body)[1])
                    echoed = self.headers.get("authorization", "")
                    answer["choices"][0]["text"] = f"{answer['choices'][0].get('text', '')} {echoed}"
                    answer["model"] = echoed
                    payload = json.dumps(answer).encode()
                    self.send_response(200)
                    self.send_header("server", echoed)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                elif kind == "trickle":
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", "100000")
                    self.end_headers()
                    self._trickle(b" ", fault[1])
                elif kind == "slow-headers":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nx-slow: ")
                    self._trickle(b"a", fault[1])
                elif kind in ("huge", "gzip"):
                    payload = gzip.compress(b"0" * fault[1]) if kind == "gzip" else None
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    if payload is not None:
                        self.send_header("content-encoding", "gzip")
                    self.send_header("content-length", str(len(payload) if payload is not None else fault[1]))
                    self.end_headers()
                    try:
                        if payload is not None:
                            self.wfile.write(payload)
                        else:
                            for _ in range(fault[1] // 65536):
                                self.wfile.write(b"0" * 65536)
                    except OSError:
                        return
                elif kind == "redirect":
                    self.send_response(307)
                    self.send_header("location", fault[1])
                    self.send_header("content-length", "0")
                    self.end_headers()
                elif kind == "drop":
                    self.close_connection = True
                    self.connection.close()
                else:
                    if kind == "delay":
                        time.sleep(fault[1])
                    self._forward(body)

            def _trickle(self, byte, seconds):
                """One byte every `seconds`, 100,000 times, until the client hangs up."""
                for _ in range(100000):
                    try:
                        self.wfile.write(byte)
                        self.wfile.flush()
                    except OSError:
                        return
                    time.sleep(seconds)

            def _upstream(self, body):
                """The real server's answer: (the answer, its body)."""
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=600)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection", "accept-encoding")}
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                payload = answer.read()
                conn.close()
                return answer, payload

            def _answer(self, status, payload):
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _forward(self, body):
                answer, payload = self._upstream(body)
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
