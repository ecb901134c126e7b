#!/usr/bin/python3
"""Attack benchmark (`make bench-attacks`): each attack of the hardening work against a fresh
pcrouter and fresh stub pods, with a well-behaved client measured during it, and the router's
memory held to the bound it was configured with.

Every run sets the memory bounds explicitly (BOUNDS: limits.max_memory_bytes 256 MiB, body
budget 128 MiB, responses 64 MiB, 1 MiB per response; a scenario may change them). For each
attack it prints the router's RSS before the attack (baseline) and its peak, the peak of the
memory it accounts for (pcrouter_memory_accounted_bytes, read from the admin listener), the
bound with the fixed overhead RSS may hold beyond it (overhead_mb; docs/BENCHMARKS.md says
how it was measured) and whether the peak stayed within, the router's CPU time, and the well-behaved client's served/failed requests and p99.
The client is an HTTP/1.1 client in its own process posting a small completion 20 times a
second, a fresh connection each time. The attackers: attack_conn.ManyConns (any number of raw
connections from one epoll thread), h2load (uploads, zero-window and big-window readers) and
attack_conn.Slowloris, from test/integration/attack*.py, which the attack tests share.

Without --conns each attack runs at the scale it was reported at; with --conns 1,100,10000
each attack made of connections runs once per count (the descriptor limit is raised to its
hard limit, which the router inherits, and limits.max_client_connections to the count plus
1,000); EMFILE and the references run once. Settings shortened to fit: slowloris uses
timeouts.request_header_ms 2000 and a byte every 500 ms, zero-window readers
timeouts.client_write_ms 2000. Each attack lasts 10 s, the uploads 30 s.

Usage: bench/attacks.py --build build [--only name,name] [--duration S] [--conns 1,100,10000]
                        [--access-log DIR]
QUICK=1 shortens every attack to 3 s (a smoke run, not a measurement).
Results also go to bench/out/attacks.json, with each client request's start and latency.
--access-log DIR keeps the router's access log of each run (JSON lines, DIR/NAME-CONNS.log), and
what each stub pod received (DIR/NAME-CONNS.POD.json).
"""
import argparse
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT_DIR = os.path.join(HERE, "out")
sys.path.insert(0, os.path.join(ROOT, "test", "integration"))

MiB = 1 << 20


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="build folder holding pcrouter")
    ap.add_argument("--only", default="", help="comma-separated attack names")
    ap.add_argument("--duration", type=float, default=None, help="seconds per attack (default 10)")
    ap.add_argument("--list", action="store_true", help="list the attacks and exit")
    ap.add_argument("--conns", default="", help="comma-separated attacking connection counts "
                    "(e.g. 1,100,10000): each attack made of connections runs at each")
    ap.add_argument("--access-log", default="", metavar="DIR",
                    help="write the router's JSON access log of each run to DIR/NAME-CONNS.log, "
                    "and the stub pods' request logs beside it")
    return ap.parse_args()


ARGS = parse_args()
os.environ["PCR_BUILD"] = os.path.abspath(os.path.join(ROOT, ARGS.build))
import attack as A  # noqa: E402  (after PCR_BUILD: conftest reads it at import)
import attack_conn  # noqa: E402
import attack_h2 as H2  # noqa: E402
import attack_pod  # noqa: E402
import conftest as C  # noqa: E402


# ----------------------------------------------------------------------------------------------
# attackers that run for a while (the tests use the same pieces at a small scale)

def h1_request(path, body):
    """An HTTP/1.1 POST whose connection closes after the answer."""
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (path, len(body), body))


def conns_attack(ctx, first, more=None, read=True, reconnect=True):
    """ctx["conns"] connections of attack_conn.ManyConns for the attack's length; their counts."""
    m = attack_conn.ManyConns(ctx["port"], ctx["conns"], first, more, read, reconnect).start()
    time.sleep(ctx["duration"])  # the attack's length: the connections run in their thread
    return m.stop()


def bad_pod_responses():
    """What the misbehaving pod answers, in turn (test_attack_pods.py checks each)."""
    body = b'{"choices":[]}'
    out = [b"HTTP/1.1 %03d Weird\r\nContent-Length: %d\r\n\r\n%s" % (code, len(body), body)
           for code in (0, 99, 600, 700, 999)]
    out.append(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
    out.append(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * MiB + b"\r\nContent-Length: 2\r\n\r\n{}")
    out.append(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n")
    return out


def attack_bad_pods(ctx):
    n = [0]
    lock = threading.Lock()
    resp = bad_pod_responses()

    def answer(req):
        with lock:
            n[0] += 1
            return resp[n[0] % len(resp)], True
    ctx["raw"].respond = answer
    req = h1_request(b"/v1/completions", json.dumps(
        {"model": "bad-model", "prompt": "to the bad pod", "max_tokens": 8}).encode())
    st = conns_attack(ctx, lambda i: req)
    return "%d requests (%d connections at once) to a pod answering status 0/99/600/700/999, 101, " \
        "1 MiB headers, broken chunking" % (st["opened"], ctx["conns"])


SMUGGLE = [
    b"Transfer-Encoding : chunked", b"Content-Length: 4\r\nContent-Length: 5",
    b"Content-Length: 4\r\nTransfer-Encoding: chunked", b"Transfer-Encoding: chunked, identity",
    b"Transfer-Encoding:\r\n chunked", b"Transfer-Encoding: identity\r\n chunked",
]


def attack_smuggling(ctx):
    i = [0]

    def one(_):
        i[0] += 1
        host = b"Host: x\r\n" if i[0] % 7 else b""
        return (b"POST /v1/completions HTTP/1.1\r\n" + host + SMUGGLE[i[0] % len(SMUGGLE)] +
                b"\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")
    st = conns_attack(ctx, one)
    snap = ctx["raw"].snapshot()
    return "%d attempts (%d connections at once); the pod received %d bytes" % (
        st["opened"], ctx["conns"], len(snap["bytes"]))


def attack_idle(h2):
    def run(ctx):
        first = H2.PREFACE + H2.raw_frame(0x4, 0, 0, b"") if h2 else b""
        st = conns_attack(ctx, lambda i: first, reconnect=False)
        return "%d opened, %d failed to open, %d closed by the router" % (
            st["opened"], st["open_failed"], st["closed"])
    return run


NGINX_PODS = """daemon off;
master_process off;
worker_processes 1;
pid %(dir)s/pods.pid;
error_log %(dir)s/pods-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %(dir)s/tmp;
    proxy_temp_path %(dir)s/tmp;
    fastcgi_temp_path %(dir)s/tmp;
    uwsgi_temp_path %(dir)s/tmp;
    scgi_temp_path %(dir)s/tmp;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    default_type application/json;
    sendfile on;
%(servers)s
}
"""

NGINX_SERVER = """    server {
        listen 127.0.0.1:%(port)d backlog=4096;
        # An answer of `big.json` for a request with `X-Answer: big`, a small completion for
        # any other (the 405 a static file gives a POST is turned into the file itself).
        location = /v1/completions {
            if ($http_x_answer = "big") { rewrite ^ /big.json last; }
            return 200 '{"id":"c","object":"text_completion","model":"stub-model","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}';
        }
        location = /big.json { internal; root %(dir)s; error_page 405 =200 $uri; }
        location = /health { return 200 'ok'; }
        location = /v1/models { return 200 '{"object":"list","data":[{"id":"stub-model","object":"model"}]}'; }
    }
"""


class NginxPods:
    """Two pods in one nginx process (one worker): the well-behaved client's small answer at
    nginx's speed, and a `big_bytes` answer for requests carrying `X-Answer: big`. The Python
    stub pods cost a core between them under a zero-window top-up; these leave the CPU to the
    router, so that the row measures the router rather than its pods."""

    def __init__(self, tmp, big_bytes):
        if shutil.which("nginx") is None:
            raise OSError("nginx is not installed (make bench installs it)")
        self.dir = tempfile.mkdtemp(dir=tmp, prefix="nginx-pods-")
        os.makedirs(os.path.join(self.dir, "tmp"))
        with open(os.path.join(self.dir, "big.json"), "wb") as f:
            f.write(b"x" * big_bytes)
        socks = []
        for _ in range(2):
            sk = socket.socket()
            sk.bind(("127.0.0.1", 0))
            socks.append(sk)
        self.ports = [sk.getsockname()[1] for sk in socks]
        for sk in socks:
            sk.close()  # nginx binds them next; a bench, not a test, may take that race
        servers = "".join(NGINX_SERVER % {"port": p, "dir": self.dir} for p in self.ports)
        conf = os.path.join(self.dir, "pods.conf")
        with open(conf, "w") as f:
            f.write(NGINX_PODS % {"dir": self.dir, "servers": servers})
        self.proc = subprocess.Popen(["nginx", "-c", conf, "-p", self.dir], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        end = time.monotonic() + 10
        for port in self.ports:
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    if self.proc.poll() is not None or time.monotonic() > end:
                        self.close()
                        raise OSError("nginx pods did not start (see %s/pods-error.log)" % self.dir)
                    time.sleep(0.05)  # bounded poll for nginx's listening sockets

    def backends(self, extra):
        return [dict({"name": "pod-%d" % i, "url": "http://127.0.0.1:%d" % p,
                      "models": ["stub-model"]}, **extra) for i, p in enumerate(self.ports)]

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def in_flight_to_pods(router):
    """pcrouter_backend_in_flight over the pods: requests until their answer's end at the pod."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open("http://127.0.0.1:%d/metrics" % router.ports[-1], timeout=5) as r:
        return C.metric(r.read().decode(), "pcrouter_backend_in_flight") or 0


def h2load(ctx, body, conns, streams, extra=(), bits=None, h1=False, during=None):
    """h2load posting `body` for the attack's length on `conns` connections of `streams`
    streams each (HTTP/1.1 with `h1`), streams' windows 2^bits-1 when `bits` is given (0: shut
    for good), `extra` headers; `during()` is called every 100 ms while it runs. Returns its
    request counts (started, succeeded, failed, errored; a stream the router resets is failed)."""
    path = os.path.join(ctx["tmp"], "h2load-body-%d-%s" % (len(body), hash(body) & 0xffff))
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(body)
    argv = ["h2load", "-t", str(min(2, conns)), "-c", str(conns), "-m", str(streams),
            "-D", "%d" % max(1, round(ctx["duration"])), "-d", path,
            "-H", "content-type: application/json"]
    for k, v in extra:
        argv += ["-H", "%s: %s" % (k, v)]
    if bits is not None:
        argv += ["-w", str(bits), "-W", str(max(16, bits))]
    argv += (["--h1"] if h1 else []) + ["http://127.0.0.1:%d/v1/completions" % ctx["port"]]
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        end = time.monotonic() + ctx["duration"] + 60
        while proc.poll() is None and time.monotonic() < end:
            if during is not None:
                during()
            time.sleep(0.1)  # pacing of `during`; h2load ends on its own at -D
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    counts = dict.fromkeys(("started", "succeeded", "failed", "errored"), 0)
    for line in text.splitlines():
        if line.startswith("requests:"):
            for part in line.split(":", 1)[1].split(","):
                n, _, key = part.strip().partition(" ")
                if key in counts:
                    counts[key] = int(n)
    return counts


def zero_window_readers(ctx, stub, sample=False, extra=(), bits=0):
    """300 h2c streams (at least one per connection) whose windows stay 0 (2^bits - 1 bytes with
    `bits`), opened again as the router resets them (client_write_ms), each asking the pod for
    `stub` (the stub pod's controls). With `sample`, the requests in flight to the pods every
    100 ms. Returns the note."""
    body = json.dumps(C.completion("zero window", stream=True, **stub)).encode()
    streams = min(150, -(-300 // ctx["conns"]))
    active = []
    def during():
        try:
            active.append(in_flight_to_pods(ctx["router"]))
        except OSError:
            pass  # a scrape too slow under the attack: that sample is missing
    during = during if sample else None
    st = h2load(ctx, body, ctx["conns"], streams, extra=extra, bits=bits, during=during)
    note = "%d x %d streams, 2 pods x 128 connections: %d opened, %d reset" % (
        ctx["conns"], streams, st["started"], st["failed"] + st["errored"])
    if sample:
        note += "; requests in flight to the pods: %.0f on average, %d at most" % (
            sum(active) / max(1, len(active)), max(active or [0]))
    return note


def attack_endless(bits):
    """Readers of answers that never end (the pod sends a first event, then waits), their
    streams' windows 2^bits - 1 bytes. At 0 they take nothing. At 1 byte h2load gives each byte
    back as it takes it, so the router sees every answer read as it comes, a byte a round trip:
    not blind, never reset, many long answers of one client."""
    def run(ctx):
        note = zero_window_readers(ctx, {"gate": "never", "events": 4}, bits=bits)
        aborted = sum(s.stats()["aborted"] for s in ctx["stubs"])
        return "%s, %d pod requests cancelled" % (note, aborted)
    return run


def attack_zero_window_answers(ctx):
    """Readers of answers the pod finishes (384 KiB, more than the 256 KiB a response may queue
    for writing): with response buffering the pod's connection is free at the answer's end,
    without it at the reader's reset after client_write_ms."""
    return zero_window_readers(ctx, {"bytes": 384 << 10}, sample=True)


def attack_zero_window_nginx(ctx):
    """The same readers against nginx pods: 384 KiB answers at nginx's speed."""
    return zero_window_readers(ctx, {}, sample=True, extra=[("x-answer", "big")])


def attack_big_window(ctx):
    """64 MiB answers read with windows that hold all of them, one stream per connection."""
    body = json.dumps(C.completion("big window", bytes=64 * MiB)).encode()
    st = h2load(ctx, body, ctx["conns"], 1, bits=30)
    return "64 MiB responses over h2c, windows never updated: %d of %d arrived whole" % (
        st["succeeded"], st["started"])


def attack_h2_uploads(ctx):
    """32 MiB uploads on h2c connections, 256 streams in all (at least one per connection)."""
    streams = max(1, 256 // ctx["conns"])
    st = h2load(ctx, H2.upload_body(32 * MiB), ctx["conns"], streams)
    return "%d x %d streams: %d uploads started, %d complete, %d refused or reset" % (
        ctx["conns"], streams, st["started"], st["succeeded"], st["failed"] + st["errored"])


def attack_h1_uploads(ctx):
    st = h2load(ctx, H2.upload_body(32 * MiB), ctx["conns"], 1, h1=True)
    return "%d connections: %d uploads started, %d complete, %d refused" % (
        ctx["conns"], st["started"], st["succeeded"], st["failed"] + st["errored"])


def attack_slowloris(ctx):
    sl = attack_conn.Slowloris(ctx["port"], ctx["conns"], 0.5, reconnect=True).start()
    time.sleep(ctx["duration"])  # the attack's length: the attackers run in their thread
    st = sl.stop()
    return "%d connections, a byte every 500 ms, re-opened when closed, limit %d: %d opened, " \
        "%d got 408, %d evicted" % (ctx["conns"], ctx["limits"]["max_client_connections"],
                                    st["opened"], st["answered_408"], st["closed_silently"])


def attack_emfile(ctx):
    held = attack_conn.HeldConns(ctx["port"], ctx["conns"])
    time.sleep(ctx["duration"])  # the attack's length: the connections are simply held
    held.close()
    t0 = time.monotonic()
    C.wait_for(lambda: C.curl(ctx["router"].url("/v1/completions"), C.completion("back"), timeout=5).status == 200,
               30, 0.05, "service back")
    lines = [l for l in ctx["router"].err.lines if "accept" in l]
    return "%d connections held: %d accept log lines; served again %.2f s after they closed" % (
        ctx["conns"], len(lines), time.monotonic() - t0)


def attack_flood(kind):
    def run(ctx):
        first, more = H2.flood_script(kind, ctx["port"])
        st = conns_attack(ctx, first, more, read=kind not in ("ping", "settings"))
        return "%d connections at once, %d opened in all, %d MiB of frames" % (
            ctx["conns"], st["opened"], st["sent"] // MiB)
    return run


def limit_fds():
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


# The memory bounds every run configures (a scenario may change them): the bound a row's RSS
# is held to is limits.max_memory_bytes, plus the overhead below.
BOUNDS = {"max_memory_bytes": 256 * MiB, "max_buffered_body_bytes": 128 * MiB,
          "max_buffered_response_bytes": 64 * MiB, "max_response_buffer_bytes": MiB,
          "max_body_bytes": 32 * MiB, "max_client_connections": 10000}
# What RSS may hold beyond limits.max_memory_bytes, a fixed amount (docs/BENCHMARKS.md, "At 1,
# 100 and 10,000 connections", says how it was measured): the idle process, and the one request
# body allowed past the budget, held up to four times on its way to the pod (body, parsed
# prompt, upstream request, socket output) while the account counts it once. What connections
# hold is in the account itself (connections, requests' readers, libevent's buffers), so more
# connections get no more room.
IDLE_MB = 8
BODY_COPIES = 4


def overhead_mb(limits, conns):
    return IDLE_MB + BODY_COPIES * limits["max_body_bytes"] / MiB


def lim(**kw):
    return {"config": {"limits": kw}}


# name, what the row shows, connections at the reported scale (None: the attack is not made of
# connections that could be multiplied, so --conns does not apply), setup, attack. Setup: raw
# (a RawPod backend), nginx (nginx pods), pod (per-backend overrides), config sections, popen
# (pcrouter's Popen arguments).
RAW = {"raw": True, "config": {"scrape": C.QUIET_SCRAPE}}  # the raw pod records only requests
ZW = {"pod": {"max_connections": 128}, "config": {"timeouts": {"client_write_ms": 2000}}}
SCENARIOS = [
    ("none", "no attack (reference)", None, {}, None),
    ("idle_h1", "idle HTTP/1.1 connections", 10000, {}, attack_idle(False)),
    ("idle_h2c", "idle h2c connections (preface and SETTINGS sent)", 10000, {}, attack_idle(True)),
    ("bad_pods", "misbehaving pod", 4, RAW, attack_bad_pods),
    ("smuggling", "smuggling variants", 4, RAW, attack_smuggling),
    ("big_window", "64 MiB response, big window", 1, {}, attack_big_window),
    ("zero_window", "300 zero-window h2 readers", 2, ZW, attack_endless(0)),
    ("one_byte_window", "300 h2 streams of endless answers, 1-byte windows", 2, ZW,
     attack_endless(1)),
    ("zero_window_answers", "300 zero-window h2 readers of answers that end", 2, ZW,
     attack_zero_window_answers),
    ("none_nginx", "no attack, nginx pods (reference)", None, {"nginx": True}, None),
    ("zero_window_nginx", "300 zero-window h2 readers of answers that end, nginx pods", 2,
     dict(ZW, nginx=True), attack_zero_window_nginx),
    ("uploads", "256 x 32 MiB h2c uploads, budget 512 MiB, memory 1 GiB", 1,
     lim(max_buffered_body_bytes=512 * MiB, max_memory_bytes=1024 * MiB), attack_h2_uploads),
    ("uploads_128", "256 x 32 MiB h2c uploads, budget 128 MiB", 1, {}, attack_h2_uploads),
    ("uploads_h1", "32 MiB HTTP/1.1 uploads, budget 128 MiB", 200, {}, attack_h1_uploads),
    ("uploads_mem", "256 x 32 MiB h2c uploads, limits.max_memory_bytes 64 MiB", 1,
     lim(max_memory_bytes=64 * MiB), attack_h2_uploads),
    ("slowloris", "slowloris", 2000,
     {"config": {"limits": {"max_client_connections": 1000}, "timeouts": {"request_header_ms": 2000}}},
     attack_slowloris),
    ("emfile", "EMFILE (ulimit -n 64)", None, {"popen": {"preexec_fn": limit_fds}}, attack_emfile),
] + [("flood_" + k, k.replace("_", " ") + " flood", 1, {}, attack_flood(k)) for k in H2.FLOODS]
EMFILE_CONNS = 150


PARTS = ("request_bodies", "responses", "index", "tokenize_cache", "requests", "connections",
         "buffers", "http2")


class AccountSampler:
    """The router's account (pcrouter_memory_accounted_bytes, all parts) and its client
    connections, read from the admin listener's /metrics every 250 ms in a thread; the peaks."""

    def __init__(self, router):
        self.url = "http://127.0.0.1:%d/metrics" % router.ports[-1]
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.peak = {"accounted": 0, "connections": 0}
        self.parts = {}               # MiB by part, at the account's peak
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop_ev.wait(0.25):
            try:
                with self.opener.open(self.url, timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                continue
            acct = C.metric(text, "pcrouter_memory_accounted_bytes") or 0
            if acct > self.peak["accounted"]:
                self.peak["accounted"] = acct
                self.parts = {p: round((C.metric(text, "pcrouter_memory_accounted_bytes", part=p)
                                        or 0) / MiB, 1) for p in PARTS}
            self.peak["connections"] = max(self.peak["connections"],
                                           C.metric(text, "pcrouter_client_connections") or 0)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.thread.join(5)
        return False


def run_scenario(name, what, conns, setup, fn, duration, tmp):
    nginx = NginxPods(tmp, 384 << 10) if setup.get("nginx") else None
    stubs = [] if nginx else [C.Stub(p, None, tmp) for p in ("pod-a", "pod-b")]
    raw = attack_pod.RawPod(lambda req: attack_pod.ok_response()) if setup.get("raw") else None
    router = None
    try:
        backends = [dict({"name": s.name, "url": s.url}, **setup.get("pod", {})) for s in stubs]
        if nginx is not None:
            backends = nginx.backends(setup.get("pod", {}))
        if raw is not None:
            backends = [{"name": "pod-a", "url": stubs[0].url, "models": ["stub-model"]},
                        {"name": "pod-raw", "url": raw.url, "models": ["bad-model"]}]
        sections = C.deep_merge({"log": {"access_log": False}, "health": {"interval_ms": 0},
                                 "admin": {"address": "127.0.0.1:0"}, "limits": BOUNDS},
                                setup.get("config", {}))
        limits = sections["limits"] = dict(sections["limits"])
        if ARGS.access_log:
            os.makedirs(ARGS.access_log, exist_ok=True)
            sections["log"] = {"access_log": True, "access_log_format": "json",
                               "access_log_path": os.path.abspath(os.path.join(
                                   ARGS.access_log, "%s-%s.log" % (name, conns)))}
        if ARGS.conns and conns is not None:  # room for every attacker and the client
            limits["max_client_connections"] = max(limits["max_client_connections"], conns + 1000)
        router = C.Router(C.make_config(backends, **sections), tmp, env=A.router_env(),
                          **setup.get("popen", {}))
        ctx = {"router": router, "port": router.port, "stubs": stubs, "raw": raw, "tmp": tmp,
               "duration": duration, "conns": conns, "limits": limits}
        C.wait_for(lambda: C.curl(router.url("/v1/completions"), C.completion("warm")).status == 200,
                   15, 0.05, "a first request served")
        with AccountSampler(router) as acct, A.Watch(router, proto="h1", rate=20) as w:
            note = fn(ctx) if fn else (time.sleep(duration) or "")
        figs = dict(w.figures, name=name, what=what, conns=conns, note=note, alive=router.alive(),
                    bound_mb=limits["max_memory_bytes"] / MiB, overhead_mb=overhead_mb(limits, conns),
                    accounted_peak_mb=acct.peak["accounted"] / MiB,
                    connections_peak=acct.peak["connections"], accounted_parts_mb=acct.parts)
        figs["within"] = figs["rss_peak_mb"] <= figs["bound_mb"] + figs["overhead_mb"]
        if ARGS.access_log:  # and what each stub pod received, when (its last 5,000 requests)
            for s in stubs:
                with open(os.path.join(ARGS.access_log, "%s-%s.%s.json" % (name, conns, s.name)),
                          "w") as f:
                    json.dump(s.stats().get("log", []), f)
        # Each client request: when it started (s since the first), its latency (ms), whether
        # it was served; to put the slow ones beside the access log's lines.
        rs = w.client.results if w.client is not None else []
        figs["client_requests"] = [(round(r[0] - rs[0][0], 4), round(1000 * r[1], 2), r[2])
                                   for r in rs]
        router.stop()
        figs["clean_exit"] = True
        return figs
    finally:
        if router is not None and not router.stopped:
            router.kill()
        if raw is not None:
            raw.close()
        if nginx is not None:
            nginx.close()
        for s in stubs:
            s.close()


def fmt_row(r):
    c = r["client"]
    p99 = "%.0f ms" % c["p99_ms"] if c["p99_ms"] is not None else "-"
    conns = "-" if r["conns"] is None else "{:,}".format(r["conns"])
    return "| %s | %s | %.0f MiB | %.0f MiB | %.0f MiB | %.0f + %.0f MiB | %s | %.2f s (%.0f%%) | %d / %d | %s |" % (
        r["what"], conns, r["rss_first_mb"] or 0, r["rss_peak_mb"], r["accounted_peak_mb"],
        r["bound_mb"], r["overhead_mb"], "yes" if r["within"] else "**no**", r["cpu_s"],
        r["cpu_pct"], c["served"], c["failed"], p99)


def runs(todo):
    """(scenario, connections) in the order they run: every scenario at its reported scale, or
    with --conns at each of those counts (a scenario not made of connections once)."""
    if not ARGS.conns:
        return [(s, s[2] if s[0] != "emfile" else EMFILE_CONNS) for s in todo]
    counts = [int(x) for x in ARGS.conns.split(",")]
    out = []
    for s in todo:
        if s[2] is None:
            out.append((s, EMFILE_CONNS if s[0] == "emfile" else None))
        else:
            out += [(s, n) for n in counts]
    return out


def main():
    quick = os.environ.get("QUICK") == "1"
    duration = ARGS.duration or (3.0 if quick else 10.0)
    todo = [s for s in SCENARIOS if not ARGS.only or s[0] in ARGS.only.split(",")]
    if ARGS.list:
        for s in SCENARIOS:
            print("%-20s %s" % (s[0], s[1]))
        return 0
    if not os.access(C.PCROUTER, os.X_OK):
        print("no pcrouter at %s (make build first)" % C.PCROUTER, file=sys.stderr)
        return 1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the router inherits it
    print("pcrouter %s; each attack %.0f s; descriptors %d; well-behaved client: HTTP/1.1, 20 "
          "requests/s, a fresh connection each%s" % (C.PCROUTER, duration, hard,
                                                    " (QUICK: a smoke run)" if quick else ""))
    results, failures = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for (name, what, _, setup, fn), conns in runs(todo):
            print("... %s, %s connections" % (what, conns), flush=True)
            d = duration * (3 if name.startswith("uploads") else 1)
            try:
                r = run_scenario(name, what, conns, setup, fn, d, tmp)
            except (AssertionError, OSError) as e:
                first = (str(e).splitlines() or [type(e).__name__])[0][:300]
                failures.append("%s@%s: %s" % (name, conns, first))
                print("    FAILED: %s" % first, flush=True)
                continue
            results.append(r)
            print("    %s" % r["note"] if r["note"] else "", flush=True)
    print()
    print("| attack | connections | baseline RSS | peak RSS | account peak | bound + overhead | within "
          "| router CPU (% of a core) | client served / failed | client p99 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(fmt_row(r))
    print()
    for r in results:
        if r["note"]:
            print("- %s, %s connections: %s" % (r["what"], r["conns"], r["note"]))
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(OUT_DIR, "attacks.json"), "w") as f:
        json.dump({"duration_s": duration, "conns": ARGS.conns, "results": results,
                   "failures": failures}, f, indent=2)
    for f in failures:
        print("FAILED " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
