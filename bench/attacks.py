#!/usr/bin/python3
"""Attack benchmark (`make bench-attacks`): each attack of the hardening work once, at the
scale it was reported at where this machine allows, against a fresh pcrouter and fresh stub
pods, with a well-behaved client measured during it.

For each attack it prints the router's peak RSS, its CPU time over the attack (seconds and % of
one core), and the well-behaved client's served/failed requests and p99 latency; a first row
without any attack is the reference. The client is an HTTP/1.1 client in its own process
posting a small completion 20 times a second, a fresh connection each time; the attackers are
threads of this process. The harness is test/integration/attack*.py, shared with the attack
tests (test/integration/test_attack_*.py), which run the same attacks at a small scale and
assert on them.

Where that scale does not fit a few seconds here, a setting is changed, and the row's note
says so: slowloris uses timeouts.request_header_ms 2000 and a byte every 500 ms (reported
with 10 s and 5 s); zero-window readers use timeouts.client_write_ms 2000 (default 30000).
The first uploads use the default 512 MiB budget, the others 128 MiB; `uploads_mem` adds
limits.max_memory_bytes 64 MiB. Each attack lasts 10 s
(the 64 MiB response is read again and again for that long), the uploads 30 s.

Usage: bench/attacks.py --build build [--only name,name] [--duration S]
QUICK=1 shortens every attack to 3 s (a smoke run, not a measurement).
Results also go to bench/out/attacks.json.
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

def loop_threads(n, duration, fn):
    """Runs fn() in `n` threads until `duration` has passed; returns how many calls finished."""
    end = time.monotonic() + duration
    counts = [0] * n

    def run(i):
        while time.monotonic() < end:
            try:
                fn()
            except Exception:  # noqa: B902 - the router may cut any attacker off
                pass
            counts[i] += 1
    ts = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(duration + 30)
    return sum(counts)


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
    body = json.dumps({"model": "bad-model", "prompt": "to the bad pod", "max_tokens": 8})

    def one():
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", ctx["port"], timeout=10)
        try:
            c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            c.getresponse().read()
        finally:
            c.close()
    done = loop_threads(4, ctx["duration"], one)
    return "%d requests (4 threads) to a pod answering status 0/99/600/700/999, 101, 1 MiB headers, broken chunking" % done


SMUGGLE = [
    b"Transfer-Encoding : chunked", b"Content-Length: 4\r\nContent-Length: 5",
    b"Content-Length: 4\r\nTransfer-Encoding: chunked", b"Transfer-Encoding: chunked, identity",
    b"Transfer-Encoding:\r\n chunked", b"Transfer-Encoding: identity\r\n chunked",
]


def attack_smuggling(ctx):
    i = [0]

    def one():
        i[0] += 1
        v = SMUGGLE[i[0] % len(SMUGGLE)]
        host = b"Host: x\r\n" if i[0] % 7 else b""
        s = socket.create_connection(("127.0.0.1", ctx["port"]), timeout=5)
        try:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\n" + host + v + b"\r\n\r\n0\r\n\r\n"
                      b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")
            while s.recv(65536):
                pass
        finally:
            s.close()
    done = loop_threads(4, ctx["duration"], one)
    snap = ctx["raw"].snapshot()
    return "%d attempts (4 threads); the pod received %d bytes" % (done, len(snap["bytes"]))


def attack_big_window(ctx):
    end = time.monotonic() + ctx["duration"]
    n = whole = 0
    want = H2.bulk_sha(64 * MiB)
    while n == 0 or time.monotonic() < end:
        res = H2.big_window_read(ctx["port"], 64 * MiB, timeout=120)
        n += 1
        whole += res["bytes"] == 64 * MiB and res["sha256"] == want
    return "64 MiB responses over h2c, windows never updated: %d of %d arrived whole" % (whole, n)


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
    with opener.open(router.url("/metrics"), timeout=5) as r:
        return C.metric(r.read().decode(), "pcrouter_backend_in_flight") or 0


def zero_window_readers(ctx, stub, sample=False, extra=()):
    """300 h2c streams whose window stays 0, topped up ten times a second as the router resets
    them (client_write_ms), each asking the stub pod for `stub` (its controls). With `sample`,
    the requests in flight to the pods at each top-up. Returns (opened, reset, samples)."""
    body = json.dumps(C.completion("zero window", stream=True, **stub)).encode()
    hs = H2.H2Streams(ctx["port"], window=0, ack=False, per_conn=150)
    n, opened, active = 300, 0, []
    end = time.monotonic() + ctx["duration"]
    try:
        while time.monotonic() < end:
            live = sum(1 for v in hs.snapshot().values() if v["reset"] is None and not v["ended"])
            for _ in range(n - live):
                hs.open("/v1/completions", body, extra=extra)
                opened += 1
            time.sleep(0.1)  # pacing: top up the 300 streams ten times a second
            if sample:
                active.append(in_flight_to_pods(ctx["router"]))
        resets = sum(1 for v in hs.snapshot().values() if v["reset"] is not None)
    finally:
        hs.close()
    return opened, resets, active


def attack_zero_window(ctx):
    """Readers of answers that never end (the pod sends a first event, then waits)."""
    opened, resets, _ = zero_window_readers(ctx, {"gate": "never", "events": 4})
    aborted = sum(s.stats()["aborted"] for s in ctx["stubs"])
    return "300 kept open, 2 pods x 128 connections: %d opened, %d reset, %d pod requests cancelled" % (
        opened, resets, aborted)


def attack_zero_window_answers(ctx):
    """Readers of answers the pod finishes (384 KiB, more than the 256 KiB a response may queue
    for writing): with response buffering the pod's connection is free at the answer's end,
    without it at the reader's reset after client_write_ms."""
    opened, resets, active = zero_window_readers(ctx, {"bytes": 384 << 10}, sample=True)
    mean = sum(active) / len(active) if active else 0
    return ("300 kept open, 384 KiB answers, 2 pods x 128 connections: %d opened, %d reset; "
            "requests in flight to the pods: %.0f on average, %d at most" % (
                opened, resets, mean, max(active or [0])))


def attack_zero_window_nginx(ctx):
    """The same readers against nginx pods: 384 KiB answers at nginx's speed."""
    opened, resets, active = zero_window_readers(ctx, {}, sample=True, extra=[("x-answer", "big")])
    mean = sum(active) / len(active) if active else 0
    return ("300 kept open, 384 KiB answers from nginx pods, 2 pods x 128 connections: %d opened, "
            "%d reset; requests in flight to the pods: %.0f on average, %d at most" % (
                opened, resets, mean, max(active or [0])))


def attack_uploads(ctx):
    # Three times as long as the others: the sender here reaches about 100 MB/s, and the
    # budget, the windows and the bodies on their way to the pods add up to about 900 MiB.
    hs, sent = H2.slow_uploads(ctx["port"], 256, 32 * MiB, rate=400 * MiB, duration=3 * ctx["duration"])
    snap = hs.snapshot()
    hs.close()
    done = sum(1 for v in snap.values() if v["status"] == "200")
    return "one h2c connection, budget 512 MiB: %d MiB sent, %d uploads complete" % (
        sent // MiB, done)


def attack_uploads_128(ctx):
    hs, sent = H2.slow_uploads(ctx["port"], 256, 32 * MiB, rate=400 * MiB, duration=3 * ctx["duration"])
    snap = hs.snapshot()
    hs.close()
    done = sum(1 for v in snap.values() if v["status"] == "200")
    refused = sum(1 for v in snap.values() if v["status"] == "503")
    return "one h2c connection, budget 128 MiB: %d MiB sent, %d uploads complete, %d got 503" % (
        sent // MiB, done, refused)


def attack_uploads_mem(ctx):
    hs, sent = H2.slow_uploads(ctx["port"], 256, 32 * MiB, rate=400 * MiB, duration=3 * ctx["duration"])
    snap = hs.snapshot()
    hs.close()
    done = sum(1 for v in snap.values() if v["status"] == "200")
    refused = sum(1 for v in snap.values() if v["status"] == "503")
    return "one h2c connection, memory limit 64 MiB: %d MiB sent, %d uploads complete, %d got 503" % (
        sent // MiB, done, refused)


def _h1_upload(port, size, deadline, res):
    """One HTTP/1.1 POST of `size` bytes with Content-Length, sent in 64 KiB pieces until done
    or `deadline`; res gets the status (0: none)."""
    body = H2.upload_body(size)
    status = 0
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body))
            off = 0
            while off < len(body) and time.monotonic() < deadline:
                try:
                    off += s.send(body[off:off + 65536])
                except socket.timeout:
                    continue  # the router is not reading: its budget is taken
            s.settimeout(max(1.0, deadline - time.monotonic()))
            head = s.recv(4096)
            if head.startswith(b"HTTP/1.1 "):
                status = int(head[9:12])
        finally:
            s.close()
    except OSError:
        pass
    res.append(status)


def attack_h1_uploads(ctx):
    res = []
    deadline = time.monotonic() + 3 * ctx["duration"]
    ts = [threading.Thread(target=_h1_upload, args=(ctx["port"], 32 * MiB, deadline, res), daemon=True)
          for _ in range(200)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(max(0.1, deadline + 10 - time.monotonic()))
    return "200 connections, budget 128 MiB: %d uploads complete, %d got 503, %d unanswered" % (
        res.count(200), res.count(503), 200 - res.count(200) - res.count(503))


def attack_slowloris(ctx):
    sl = attack_conn.Slowloris(ctx["port"], 2000, 0.5, reconnect=True).start()
    time.sleep(ctx["duration"])  # the attack's length: the attackers run in their thread
    st = sl.stop()
    return "a byte every 500 ms, re-opened when closed, limit 1,000: %d opened, %d got 408, %d evicted" % (
        st["opened"], st["answered_408"], st["closed_silently"])


def attack_emfile(ctx):
    held = attack_conn.HeldConns(ctx["port"], 150)
    time.sleep(ctx["duration"])  # the attack's length: the connections are simply held
    held.close()
    t0 = time.monotonic()
    C.wait_for(lambda: C.curl(ctx["router"].url("/v1/completions"), C.completion("back"), timeout=5).status == 200,
               30, 0.05, "service back")
    lines = [l for l in ctx["router"].err.lines if "accept" in l]
    return "150 connections held: %d accept log lines; served again %.2f s after they closed" % (
        len(lines), time.monotonic() - t0)


def attack_flood(kind):
    def run(ctx):
        res = H2.h2_flood(ctx["port"], kind, ctx["duration"])
        return "%d frames sent on %d connections" % (res["frames"], res["connections"])
    return run


def limit_fds():
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


# name, what the row shows, setup, attack. Setup: pods (stub names), raw (a RawPod backend),
# pod (per-backend overrides), config sections, popen (pcrouter's Popen arguments).
SCENARIOS = [
    ("none", "no attack (reference)", {}, None),
    ("bad_pods", "misbehaving pod", {"raw": True}, attack_bad_pods),
    ("smuggling", "smuggling variants", {"raw": True}, attack_smuggling),
    ("big_window", "64 MiB response, big window", {}, attack_big_window),
    ("zero_window", "300 zero-window h2 readers",
     {"pod": {"max_connections": 128}, "config": {"timeouts": {"client_write_ms": 2000}}},
     attack_zero_window),
    ("zero_window_answers", "300 zero-window h2 readers of answers that end",
     {"pod": {"max_connections": 128}, "config": {"timeouts": {"client_write_ms": 2000}}},
     attack_zero_window_answers),
    ("none_nginx", "no attack, nginx pods (reference)", {"nginx": True}, None),
    ("zero_window_nginx", "300 zero-window h2 readers of answers that end, nginx pods",
     {"nginx": True, "pod": {"max_connections": 128},
      "config": {"timeouts": {"client_write_ms": 2000}}},
     attack_zero_window_nginx),
    ("uploads", "256 x 32 MiB slow uploads", {}, attack_uploads),
    ("uploads_128", "256 x 32 MiB slow uploads, budget 128 MiB",
     {"config": {"limits": {"max_buffered_body_bytes": 128 * MiB}}}, attack_uploads_128),
    ("uploads_h1", "200 x 32 MiB HTTP/1.1 uploads, budget 128 MiB",
     {"config": {"limits": {"max_buffered_body_bytes": 128 * MiB}}}, attack_h1_uploads),
    ("uploads_mem", "256 x 32 MiB slow uploads, limits.max_memory_bytes 64 MiB",
     {"config": {"limits": {"max_memory_bytes": 64 * MiB}}}, attack_uploads_mem),
    ("slowloris", "2,000 slowloris connections",
     {"config": {"limits": {"max_client_connections": 1000}, "timeouts": {"request_header_ms": 2000}}},
     attack_slowloris),
    ("emfile", "EMFILE (ulimit -n 64)", {"popen": {"preexec_fn": limit_fds}}, attack_emfile),
] + [("flood_" + k, k.replace("_", " ") + " flood", {}, attack_flood(k)) for k in H2.FLOODS]


def run_scenario(name, what, setup, fn, duration, tmp):
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
        sections = C.deep_merge({"log": {"access_log": False}, "health": {"interval_ms": 0}},
                                setup.get("config", {}))
        router = C.Router(C.make_config(backends, **sections), tmp, env=A.router_env(),
                          **setup.get("popen", {}))
        ctx = {"router": router, "port": router.port, "stubs": stubs, "raw": raw,
               "duration": duration}
        C.wait_for(lambda: C.curl(router.url("/v1/completions"), C.completion("warm")).status == 200,
                   15, 0.05, "a first request served")
        with A.Watch(router, proto="h1", rate=20) as w:
            note = fn(ctx) if fn else (time.sleep(duration) or "")
        figs = dict(w.figures, name=name, what=what, note=note, alive=router.alive())
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
    return "| %s | %.0f MiB | %.2f s (%.0f%%) | %d / %d | %s |" % (
        r["what"], r["rss_peak_mb"], r["cpu_s"], r["cpu_pct"], c["served"], c["failed"], p99)


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
    print("pcrouter %s; each attack %.0f s; well-behaved client: HTTP/1.1, 20 requests/s, a fresh "
          "connection each%s" % (C.PCROUTER, duration, " (QUICK: a smoke run)" if quick else ""))
    results, failures = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name, what, setup, fn in todo:
            print("... %s" % what, flush=True)
            try:
                r = run_scenario(name, what, setup, fn, duration, tmp)
            except (AssertionError, OSError) as e:
                first = (str(e).splitlines() or [type(e).__name__])[0][:300]
                failures.append("%s: %s" % (name, first))
                print("    FAILED: %s" % first, flush=True)
                continue
            results.append(r)
            print("    %s" % r["note"] if r["note"] else "", flush=True)
    print()
    print("| attack | router peak RSS | router CPU (% of a core) | client served / failed | client p99 |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        print(fmt_row(r))
    print()
    for r in results:
        if r["note"]:
            print("- %s: %s" % (r["what"], r["note"]))
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(OUT_DIR, "attacks.json"), "w") as f:
        json.dump({"duration_s": duration, "results": results, "failures": failures}, f, indent=2)
    for f in failures:
        print("FAILED " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
