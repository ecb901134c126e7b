#!/usr/bin/python3
"""stub_backend.py: a stand-in vLLM pod for pcrouter's integration tests.

Run: /usr/bin/python3 stub_backend.py --name pod-a --port 0 [--models m1,m2]
It prints `listening on 127.0.0.1:PORT` once bound, then serves HTTP/1.1 keep-alive on one
thread per connection (the router may open hundreds of upstream connections at once).

OpenAI endpoints
  POST /v1/completions, /v1/chat/completions  JSON answer, or SSE when "stream": true
  POST /v1/embeddings and any other POST /v1/... a JSON answer naming the pod
  GET  /v1/models                              {"object":"list","data":[{"id":...}]}
  GET  /health                                 200 (or what /stub/config set)
  GET  /metrics                                vllm:kv_cache_usage_perc, once /stub/config set
                                               "kv_usage" (404 before: a pod that hides it)
Every request's body and headers are in its log entry ("body", "hdrs") for checks of what a
pod received. Every /v1 answer carries `x-stub-pod`, `x-stub-body-bytes`, `x-stub-body-sha256` headers and,
in JSON answers, a "stub" object with the same facts ("pod", "body_bytes", "body_sha256",
"tag", "path"), so a test can check what reached the backend even if headers were dropped.

Per-request controls: a "stub" object in the JSON body (the router forwards bodies untouched),
or headers `x-stub-<key>` (underscores written as dashes). Keys:
  tag          any string, echoed back (ordering checks)
  delay_ms     wait before answering
  mode         "stall": never answer (until the peer closes or 120 s pass)
               "close": close the connection without answering
  close_reused true: "close" for a request on a connection that carried one before (a pooled
               connection the pod had closed), an answer on a new connection
  gate         name: a non-streaming answer waits until the gate is released; a stream sends
               its first event, then waits. Released by POST /stub/release {"gate": name}
               (a released gate stays open). Waiting watches the socket: a peer that closes
               counts as an aborted request.
  prefill_gate name: a stream sends its head, then waits until the gate is released before
               its first event (as vLLM does while it prefills)
  events       SSE events before [DONE] (default 4)
  interval_ms  pause between SSE events (a slow stream)
  status       answer with this HTTP status and an OpenAI-style error body
  abort_after  a stream closes its connection abruptly after this many events
  bytes        answer with a body of this many bytes (a 16-byte pattern repeated, written
               in 64 KiB pieces; the log entry's "written" shows the progress), for
               backpressure checks
  cached_tokens  report this many cached prompt tokens instead of the prefix cache's answer
  usage        "plain": usage without prompt_tokens_details (a pod run without
               --enable-prompt-tokens-details)
  headers      {name: value}: extra response header fields (JSON and SSE answers)
  kv_params    a prefill leg (kv_transfer_params.do_remote_decode true, max_tokens 1, not
               streamed) is answered with kv_transfer_params at the top level, as vLLM's
               NixlConnector does: this object, or by default {do_remote_prefill: true,
               do_remote_decode: false, remote_block_ids: [1, 2, 3], remote_engine_id:
               "engine-<pod>", remote_request_id: <X-Request-Id>, remote_host:
               "advertised.invalid", remote_port: 5600, tp_size: 1}; "none": no parameters
Usage, as vLLM reports it: completions and chats carry "usage" with prompt_tokens (prompt
bytes / 4, rounded up) and prompt_tokens_details.cached_tokens; a stream carries it only when
the request has "stream_options": {"include_usage": true}, as one last event with
"choices": [] before [DONE]. Cached tokens come from a small prefix cache per stub: the longest
prefix the prompt shares with an earlier one, in whole 16-token blocks (64 bytes), never the
prompt's last token (vLLM always computes one). /stub/reset empties it.
Control endpoints (never counted in stats)
  GET  /stub/stats    JSON counters, see State.snapshot()
  POST /stub/release  {"gate": name} or {} for every gate known so far
  POST /stub/reset    zero the counters
  POST /stub/config   {"models": [...], "health_status": 503, "defaults": {controls},
                       "kv_usage": 0.25, "metrics_stall": true (GET /metrics never answers),
                       "tokenize_answer": TEXT (POST /tokenize and the two render
                       endpoints answer 200 with TEXT as it is; 404 before)}
"""
import argparse
import ssl
import hashlib
import http.server
import json
import select
import socket
import sys
import threading
import time

MAX_WAIT_S = 120.0
BULK_PATTERN = b"0123456789abcdef"


class State:
    def __init__(self, name, models):
        self.lock = threading.Lock()
        self.name = name
        self.models = models
        self.health_status = 200
        self.kv_usage = None
        self.metrics_stall = False     # GET /metrics never answers (until the peer closes)
        self.tokenize_answer = None    # POST /tokenize's body, as it is (None: 404)
        self.tokenize_last = None      # the last question: [path, body as text]
        self.tokenize_calls = 0
        self.defaults = {}
        self.gates = {}
        self.reset()

    def reset(self):
        with self.lock:
            self.requests = {}
            self.outcomes = {}
            self.active = 0
            self.max_active = 0
            self.connections = 0
            self.tls_handshakes = 0
            self.tls_resumed = 0
            self.request_conns = set()
            self.last = None
            self.log = []
            self.prompts = []

    def gate(self, name):
        with self.lock:
            return self.gates.setdefault(str(name), threading.Event())

    def release(self, name):
        with self.lock:
            if name is None:
                events = list(self.gates.values())
            else:
                events = [self.gates.setdefault(str(name), threading.Event())]
        for ev in events:
            ev.set()

    def begin(self, path, conn_id, headers, body, ctl):
        with self.lock:
            self.requests[path] = self.requests.get(path, 0) + 1
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.request_conns.add(conn_id)
            entry = {"path": path, "conn": conn_id, "tag": ctl.get("tag"),
                     "body_bytes": len(body), "body_sha256": hashlib.sha256(body).hexdigest(),
                     "headers": headers, "outcome": "active", "t": time.time()}
            self.last = entry
            self.log.append(entry)
            if len(self.log) > 5000:
                del self.log[:1000]
            return entry

    def cached_tokens(self, prompt):
        """Tokens of `prompt` (bytes) this pod holds cached, then remembers it."""
        with self.lock:
            best = 0
            for p in self.prompts:
                n = min(len(p), len(prompt))
                k = 0
                while k < n and p[k] == prompt[k]:
                    k += 1
                best = max(best, k)
            if prompt not in self.prompts:
                self.prompts.append(prompt)
                if len(self.prompts) > 200:
                    del self.prompts[0]
        tokens = (len(prompt) + 3) // 4
        return min(best // 64 * 16, max(tokens - 1, 0) // 16 * 16)

    def end(self, entry, outcome):
        with self.lock:
            self.active -= 1
            entry["outcome"] = outcome
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def snapshot(self):
        with self.lock:
            completed = {}
            for e in self.log:
                if e["outcome"] == "completed":
                    completed[e["path"]] = completed.get(e["path"], 0) + 1
            return {
                "pod": self.name,
                "tokenize_calls": self.tokenize_calls,  # POST /tokenize or render answered
                "tokenize_last": self.tokenize_last,  # [path, body] of the last of them
                "requests": dict(self.requests),      # per path, /health included
                "completed": completed,               # per path, answered to the end
                "outcomes": dict(self.outcomes),      # completed|aborted|closed|stall_timeout
                "aborted": self.outcomes.get("aborted", 0),  # peer closed before the end
                "active": self.active,                # /v1 requests being answered now
                "max_active": self.max_active,
                "connections": self.connections,      # TCP connections accepted
                "tls_handshakes": self.tls_handshakes,  # --tls-cert: handshakes completed
                "tls_resumed": self.tls_resumed,      # ... of which resumed a session
                "request_connections": len(self.request_conns),  # ones that carried /v1 requests
                "last": self.last,
                "log": [{k: v for k, v in e.items() if k != "headers"} for e in self.log],
            }


def make_handler(state):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "stub-vllm/1"
        # TCP_NODELAY, as vLLM's server sets it: a head and a body written apart would
        # otherwise wait for the router's delayed ACK (40 ms) now and then.
        disable_nagle_algorithm = True

        def setup(self):
            if isinstance(self.request, ssl.SSLSocket):
                self.request.settimeout(10)
                self.request.do_handshake()  # a failure ends this connection only
                self.request.settimeout(None)
                with state.lock:
                    state.tls_handshakes += 1
                    state.tls_resumed += 1 if self.request.session_reused else 0
            super().setup()
            with state.lock:
                state.connections += 1
                self.conn_id = state.connections
            self.served = 0  # /v1 requests this connection carried

        def log_message(self, fmt, *args):
            pass

        # --- plumbing -------------------------------------------------------------------
        def read_body(self):
            te = (self.headers.get("Transfer-Encoding") or "").lower()
            if "chunked" in te:
                parts = []
                while True:
                    line = self.rfile.readline(65537)
                    size = int(line.split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(parts)
                    parts.append(self.rfile.read(size))
                    self.rfile.readline(65537)
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def peer_closed(self):
            try:
                r, _, _ = select.select([self.connection], [], [], 0)
                if not r:
                    return False
                return self.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

        def wait(self, event=None, seconds=None):
            """Waits for `event` (or `seconds`); False when the peer closed meanwhile."""
            end = time.monotonic() + (seconds if seconds is not None else MAX_WAIT_S)
            while True:
                if event is not None and event.is_set():
                    return True
                if self.peer_closed():
                    return False
                now = time.monotonic()
                if now >= end:
                    return event is None
                if event is not None:
                    event.wait(min(0.01, end - now))
                else:
                    time.sleep(min(0.01, end - now))

        def send_json(self, status, obj, extra=None):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("x-stub-pod", state.name)
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def write_chunk(self, data):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

        # --- GET ----------------------------------------------------------------------
        def do_GET(self):
            path = self.path.split("?")[0]
            if path == "/stub/stats":
                return self.send_json(200, state.snapshot())
            with state.lock:
                state.requests[path] = state.requests.get(path, 0) + 1
            if path == "/health":
                return self.send_json(state.health_status, {"status": "ok" if state.health_status == 200 else "down"})
            if path == "/metrics" and state.metrics_stall:
                self.close_connection = True
                self.wait(None, MAX_WAIT_S)
                return
            if path == "/metrics" and state.kv_usage is not None:
                data = ("# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
                        "# TYPE vllm:kv_cache_usage_perc gauge\n"
                        "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"stub-model\"} %r\n"
                        % state.kv_usage).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            if path == "/v1/models":
                return self.send_json(200, {"object": "list", "data": [
                    {"id": m, "object": "model", "owned_by": state.name, "created": 0} for m in state.models]})
            return self.send_json(404, {"error": {"message": "no such path", "type": "invalid_request_error", "code": "not_found"}})

        # --- POST ---------------------------------------------------------------------
        def do_POST(self):
            path = self.path.split("?")[0]
            body = self.read_body()
            if path.startswith("/stub/"):
                return self.control(path, body)
            if path in ("/tokenize", "/v1/completions/render", "/v1/chat/completions/render") \
                    and state.tokenize_answer is not None:
                with state.lock:
                    state.tokenize_calls += 1
                    state.tokenize_last = [path, body.decode("utf-8", "replace")]
                data = state.tokenize_answer.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return None
            if not path.startswith("/v1/"):
                return self.send_json(404, {"error": {"message": "no such path", "type": "invalid_request_error", "code": "not_found"}})
            try:
                req = json.loads(body) if body else {}
            except ValueError:
                req = {}
            if not isinstance(req, dict):
                req = {}
            ctl = dict(state.defaults)
            if isinstance(req.get("stub"), dict):
                ctl.update(req["stub"])
            for k, v in self.headers.items():
                if k.lower().startswith("x-stub-"):
                    ctl[k.lower()[7:].replace("-", "_")] = v
            headers = {k.lower(): v for k, v in self.headers.items()}
            entry = state.begin(path, self.conn_id, headers, body, ctl)
            entry["body"] = body[:1 << 20].decode("utf-8", "replace")
            entry["hdrs"] = headers
            so = req.get("stream_options")
            entry["include_usage"] = isinstance(so, dict) and so.get("include_usage") is True
            if ctl.get("close_reused") and self.served > 0:
                ctl["mode"] = "close"  # as a pod that closed its idle keep-alive connections
            self.served += 1
            outcome = "aborted"
            try:
                outcome = self.answer(path, req, body, ctl, entry)
            except (BrokenPipeError, ConnectionResetError, socket.timeout, OSError):
                outcome = "aborted"
                self.close_connection = True
            finally:
                state.end(entry, outcome)

        def control(self, path, body):
            try:
                arg = json.loads(body) if body else {}
            except ValueError:
                arg = {}
            if path == "/stub/release":
                state.release(arg.get("gate"))
            elif path == "/stub/reset":
                state.reset()
            elif path == "/stub/config":
                with state.lock:
                    if "models" in arg:
                        state.models = list(arg["models"])
                    if "health_status" in arg:
                        state.health_status = int(arg["health_status"])
                    if "defaults" in arg:
                        state.defaults = dict(arg["defaults"])
                    if "kv_usage" in arg:
                        state.kv_usage = float(arg["kv_usage"])
                    if "metrics_stall" in arg:
                        state.metrics_stall = bool(arg["metrics_stall"])
                    if "tokenize_answer" in arg:
                        state.tokenize_answer = arg["tokenize_answer"]
            else:
                return self.send_json(404, {"error": "unknown control"})
            return self.send_json(200, {"ok": True})

        def answer(self, path, req, body, ctl, entry):
            mode = ctl.get("mode")
            if mode == "close":
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return "closed"
            if mode == "stall":
                self.close_connection = True
                return "aborted" if not self.wait(None, MAX_WAIT_S) else "stall_timeout"
            if int(ctl.get("delay_ms") or 0) > 0:
                if not self.wait(None, int(ctl["delay_ms"]) / 1000.0):
                    self.close_connection = True
                    return "aborted"
            gate = state.gate(ctl["gate"]) if ctl.get("gate") is not None else None
            extra = {"x-stub-body-bytes": str(entry["body_bytes"]),
                     "x-stub-body-sha256": entry["body_sha256"]}
            extra.update(ctl.get("headers") or {})
            info = {"pod": state.name, "path": path, "tag": ctl.get("tag"),
                    "body_bytes": entry["body_bytes"], "body_sha256": entry["body_sha256"]}
            if ctl.get("bytes"):
                return self.send_bulk(int(ctl["bytes"]), entry)
            if ctl.get("status"):
                status = int(ctl["status"])
                self.send_json(status, {"error": {"message": "stub error", "type": "stub", "code": str(status)}, "stub": info}, extra)
                return "completed"
            model = req.get("model") or (state.models[0] if state.models else "stub-model")
            chat = path == "/v1/chat/completions"
            usage = self.usage(req, chat, ctl) if path in ("/v1/completions", "/v1/chat/completions") else None
            if req.get("stream") and path in ("/v1/completions", "/v1/chat/completions"):
                return self.stream(model, chat, ctl, gate, extra, info, usage, entry["include_usage"])
            if gate is not None and not self.wait(gate):
                self.close_connection = True
                return "aborted"
            if path == "/v1/completions":
                obj = {"id": "cmpl-stub", "object": "text_completion", "created": int(time.time()),
                       "model": model, "system_fingerprint": state.name,
                       "choices": [{"index": 0, "text": "hello from " + state.name, "logprobs": None, "finish_reason": "stop"}],
                       "usage": usage}
            elif chat:
                obj = {"id": "chatcmpl-stub", "object": "chat.completion", "created": int(time.time()),
                       "model": model, "system_fingerprint": state.name,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello from " + state.name}, "finish_reason": "stop"}],
                       "usage": usage}
            elif path == "/v1/embeddings":
                obj = {"object": "list", "model": model, "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}]}
            else:
                obj = {"object": "stub", "model": model}
            kv = req.get("kv_transfer_params")
            if (chat or path == "/v1/completions") and isinstance(kv, dict) and \
                    kv.get("do_remote_decode") is True and req.get("max_tokens") == 1 and \
                    ctl.get("kv_params") != "none":
                params = ctl.get("kv_params")
                if not isinstance(params, dict):
                    params = {"do_remote_prefill": True, "do_remote_decode": False,
                              "remote_block_ids": [1, 2, 3], "remote_engine_id": "engine-" + state.name,
                              "remote_request_id": self.headers.get("x-request-id"),
                              "remote_host": "advertised.invalid", "remote_port": 5600, "tp_size": 1}
                obj["kv_transfer_params"] = params
                obj["choices"][0]["finish_reason"] = "length"
            obj["stub"] = info
            self.send_json(200, obj, extra)
            return "completed"

        def usage(self, req, chat, ctl):
            """The usage object vLLM would report for this request."""
            if chat:
                prompt = json.dumps(req.get("messages"), sort_keys=True).encode()
            else:
                p = req.get("prompt")
                prompt = p.encode() if isinstance(p, str) else json.dumps(p).encode()
            cached = state.cached_tokens(prompt)
            if ctl.get("cached_tokens") is not None:
                cached = int(ctl["cached_tokens"])
            tokens = (len(prompt) + 3) // 4
            u = {"prompt_tokens": tokens, "completion_tokens": 3, "total_tokens": tokens + 3}
            if ctl.get("usage") != "plain":
                u["prompt_tokens_details"] = {"cached_tokens": cached}
            return u

        def send_bulk(self, n, entry):
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(n))
            self.send_header("x-stub-pod", state.name)
            self.end_headers()
            piece = BULK_PATTERN * 4096
            entry["written"] = 0
            while entry["written"] < n:
                data = piece[:n - entry["written"]]
                self.wfile.write(data)
                entry["written"] += len(data)
            return "completed"

        def stream(self, model, chat, ctl, gate, extra, info, usage, include_usage):
            n = int(ctl.get("events") or 4)
            abort_after = int(ctl.get("abort_after") or 0)
            interval = int(ctl.get("interval_ms") or 0) / 1000.0
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("x-stub-pod", state.name)
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            if ctl.get("prefill_gate") is not None:
                self.wfile.flush()
                if not self.wait(state.gate(ctl["prefill_gate"])):
                    self.close_connection = True
                    return "aborted"
            for i in range(n):
                if chat:
                    ev = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": int(time.time()),
                          "model": model, "system_fingerprint": state.name,
                          "choices": [{"index": 0, "delta": {"content": "tok%d " % i}, "finish_reason": "stop" if i == n - 1 else None}]}
                else:
                    ev = {"id": "cmpl-stub", "object": "text_completion", "created": int(time.time()),
                          "model": model, "system_fingerprint": state.name,
                          "choices": [{"index": 0, "text": "tok%d " % i, "finish_reason": "stop" if i == n - 1 else None}]}
                if i == 0:
                    ev["stub"] = info
                self.write_chunk(b"data: " + json.dumps(ev).encode() + b"\n\n")
                if abort_after and i + 1 >= abort_after:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return "closed"
                if i == 0 and gate is not None and not self.wait(gate):
                    self.close_connection = True
                    return "aborted"
                if interval and i < n - 1 and not self.wait(None, interval):
                    self.close_connection = True
                    return "aborted"
            if include_usage:
                ev = {"id": "cmpl-stub", "object": "chat.completion.chunk" if chat else "text_completion",
                      "created": int(time.time()), "model": model, "choices": [], "usage": usage}
                self.write_chunk(b"data: " + json.dumps(ev).encode() + b"\n\n")
            self.write_chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            return "completed"

    return Handler


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, socket.timeout, OSError)):
            super().handle_error(request, client_address)


def main():
    ap = argparse.ArgumentParser(description="stub vLLM backend for pcrouter tests")
    ap.add_argument("--name", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--models", default="stub-model", help="comma-separated model ids")
    ap.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (and --tls-key)")
    ap.add_argument("--tls-key")
    ap.add_argument("--tls-client-ca", help="require a client certificate signed by this CA")
    args = ap.parse_args()
    state = State(args.name, [m for m in args.models.split(",") if m])
    srv = Server((args.host, args.port), make_handler(state))
    if args.tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
        if args.tls_client_ca:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(args.tls_client_ca)
        # The handshake runs in the connection's own thread, on its first read.
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True, do_handshake_on_connect=False)
    print("listening on %s:%d" % srv.server_address[:2], flush=True)
    try:
        srv.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
