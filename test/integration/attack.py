#!/usr/bin/python3
"""attack.py: what the attack tests (test_attack_*.py) and bench/attacks.py share: a measured
well-behaved client, a sampler of the router process, misbehaving pods and clients.

  ClientProc(port, proto="h1"|"h2c", rate=20)
      a well-behaved client in a child process (this file run as a script, so that the attack
      threads of the parent cannot delay it), posting a small completion request `rate` times
      a second: HTTP/1.1 on a fresh connection each time, or h2c streams on one connection
      (re-opened when it breaks). One result line per request; summary() gives served,
      failed, p50/p99 latency and the failure reasons.
  Sampler(pid)
      RSS (VmRSS of /proc/PID/status) and CPU time (utime + stime of /proc/PID/stat) of the
      router, sampled in a thread; figures(): peak and first RSS, CPU seconds and % of a core.
  Watch(router, port=..., proto=...)
      both around an attack: `with Watch(r) as w: attack()`, then w.figures.

The attackers live beside it: attack_pod.py (a raw pod that records every byte and answers
with scripted bytes), attack_h2.py (HTTP/2 clients that misbehave and frame floods),
attack_conn.py (slowloris, connections held open).

Everything is bounded in time: each wait has a deadline. Python standard library plus the
Debian python3-h2 stack (h2, hpack, hyperframe).
"""
import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

PY = "/usr/bin/python3"
HERE = os.path.dirname(os.path.abspath(__file__))
CLK_TCK = os.sysconf("SC_CLK_TCK")


def sanitized(binary, which="asan"):
    """Whether `binary` was built with AddressSanitizer ("asan": its RSS is larger, by a
    factor) or ThreadSanitizer ("tsan": its RSS, shadow memory included, says nothing about
    the router's own, and its CPU is several times the release build's)."""
    try:
        with open(binary, "rb") as f:
            return ("__%s_init" % which).encode() in f.read()
    except OSError:
        return False


def router_env():
    """pcrouter's environment for RSS figures: under AddressSanitizer freed memory waits in a
    quarantine (256 MiB by default) that would count as RSS; a small one keeps RSS meaningful
    (ASAN_OPTIONS is ignored by a build without the sanitizer)."""
    opts = os.environ.get("ASAN_OPTIONS", "")
    return dict(os.environ, ASAN_OPTIONS=(opts + ":" if opts else "") + "quarantine_size_mb=8")


def percentile(values, p):
    """Nearest-rank percentile of a list (None when empty)."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(round(p / 100.0 * len(v) + 0.5)) - 1))
    return v[k]


def small_completion(tag):
    return json.dumps({"model": "stub-model", "prompt": "well-behaved %s" % tag,
                       "max_tokens": 8}).encode()


# ------------------------------------------------------------------------------------------
# the router process: RSS and CPU

def proc_rss_kb(pid):
    """VmRSS in KiB, None once the process is gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return None


def proc_cpu_s(pid):
    """User + system CPU seconds so far, None once the process is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def proc_fds(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return None


class Sampler:
    """Samples a process's RSS every `interval` seconds in a thread, from start() to stop()."""

    def __init__(self, pid, interval=0.05):
        self.pid = pid
        self.interval = interval
        self.samples = []           # (t, rss_kb)
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.cpu0 = self.cpu1 = None
        self.t0 = self.t1 = None

    def start(self):
        self.t0 = time.monotonic()
        self.cpu0 = proc_cpu_s(self.pid)
        self.thread.start()
        return self

    def _run(self):
        while not self.stop_ev.is_set():
            rss = proc_rss_kb(self.pid)
            if rss is not None:
                self.samples.append((time.monotonic(), rss))
            self.stop_ev.wait(self.interval)

    def stop(self):
        self.stop_ev.set()
        self.thread.join(5)
        self.t1 = time.monotonic()
        self.cpu1 = proc_cpu_s(self.pid)
        rss = proc_rss_kb(self.pid)
        if rss is not None:
            self.samples.append((self.t1, rss))
        return self.figures()

    def peak_kb(self):
        return max((r for _, r in self.samples), default=0)

    def figures(self):
        wall = (self.t1 or time.monotonic()) - self.t0
        cpu = None
        if self.cpu0 is not None and self.cpu1 is not None:
            cpu = self.cpu1 - self.cpu0
        return {"rss_first_mb": self.samples[0][1] / 1024.0 if self.samples else None,
                "rss_peak_mb": self.peak_kb() / 1024.0,
                "rss_last_mb": self.samples[-1][1] / 1024.0 if self.samples else None,
                "cpu_s": cpu, "wall_s": wall,
                "cpu_pct": 100.0 * cpu / wall if cpu is not None and wall > 0 else None}


# ------------------------------------------------------------------------------------------
# the well-behaved client (parent side)

class ClientProc:
    """Runs this file as `client` in a child process and collects its result lines."""

    def __init__(self, port, proto="h1", rate=20.0, timeout=10.0, path="/v1/completions"):
        self.port = port
        self.proto = proto
        self.results = []            # (t_monotonic_start, latency_s, ok, detail)
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [PY, os.path.abspath(__file__), "client", "--port", str(port), "--proto", proto,
             "--rate", str(rate), "--timeout", str(timeout), "--path", path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        if not self.started.wait(15):
            self.stop()
            raise AssertionError("the well-behaved client did not start: %r"
                                 % self.proc.stderr.read()[-2000:])

    def _read(self):
        # The child's clock is the same CLOCK_MONOTONIC as ours (time.monotonic on Linux).
        for raw in iter(self.proc.stdout.readline, b""):
            parts = raw.decode("utf-8", "replace").rstrip("\n").split(" ", 3)
            if parts[0] == "started":
                self.started.set()
                continue
            if len(parts) < 3:
                continue
            with self.lock:
                self.results.append((float(parts[1]), float(parts[2]), parts[0] == "ok",
                                     parts[3] if len(parts) > 3 else ""))

    def count(self, ok=True):
        with self.lock:
            return sum(1 for r in self.results if r[2] == ok)

    def stop(self):
        """Ends the child (its stdin closes: it finishes the request in flight) and waits."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.thread.join(5)
        return self.summary()

    def summary(self, since=None, until=None):
        with self.lock:
            rs = [r for r in self.results
                  if (since is None or r[0] >= since) and (until is None or r[0] <= until)]
        lat = [r[1] for r in rs if r[2]]
        reasons = {}
        for r in rs:
            if not r[2]:
                reasons[r[3]] = reasons.get(r[3], 0) + 1
        return {"served": len(lat), "failed": len(rs) - len(lat),
                "p50_ms": 1000 * percentile(lat, 50) if lat else None,
                "p99_ms": 1000 * percentile(lat, 99) if lat else None,
                "max_ms": 1000 * max(lat) if lat else None,
                "reasons": reasons}


class Watch:
    """The router's RSS and CPU, and a well-behaved client's results, around an attack.
    `with Watch(router) as w: ...`; then w.figures (also w.client, w.sampler while inside).
    With client=False only the router is sampled."""

    def __init__(self, router, proto="h1", rate=20.0, client=True, timeout=10.0, pid=None):
        self.pid = pid or router.proc.pid
        self.port = router.port
        self.proto = proto
        self.rate = rate
        self.want_client = client
        self.timeout = timeout
        self.client = None
        self.sampler = None
        self.figures = None

    def __enter__(self):
        self.sampler = Sampler(self.pid).start()
        if self.want_client:
            try:
                self.client = ClientProc(self.port, self.proto, self.rate, self.timeout)
            except BaseException:
                self.sampler.stop()
                raise
        return self

    def __exit__(self, *exc):
        figs = {}
        if self.client is not None:
            figs["client"] = self.client.stop()
        figs.update(self.sampler.stop())
        self.figures = figs
        return False


def clients_served(router, n=10, rate=20.0, timeout=5.0, within=20.0):
    """A well-behaved client over HTTP/1.1, then one over h2c, each until it has had `n`
    answers (within `within` s, else AssertionError); returns their Watch figures."""
    figs = []
    for proto in ("h1", "h2c"):
        with Watch(router, proto=proto, rate=rate, timeout=timeout) as w:
            end = time.monotonic() + within
            while w.client.count() < n:
                if time.monotonic() > end:
                    raise AssertionError("%d %s requests not answered within %ss" % (n, proto, within))
                time.sleep(0.05)  # bounded poll of the client's count
        figs.append(w.figures)
    return figs


def describe(figs):
    """One line of figures, for assertion messages and logs."""
    c = figs.get("client") or {}
    return ("router RSS peak %.1f MiB (first %.1f), CPU %.2f s (%.0f%% of a core over %.1f s); "
            "client served %s failed %s p99 %s ms %s"
            % (figs["rss_peak_mb"], figs["rss_first_mb"] or 0, figs["cpu_s"] or 0,
               figs["cpu_pct"] or 0, figs["wall_s"], c.get("served"), c.get("failed"),
               "%.1f" % c["p99_ms"] if c.get("p99_ms") is not None else "-",
               c.get("reasons") or ""))


# ------------------------------------------------------------------------------------------
# the well-behaved client (child side)

def _h1_once(port, body, path, timeout):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            return False, "status %d" % resp.status
        if b'"choices"' not in data:
            return False, "bad body"
        return True, ""
    finally:
        conn.close()


class _H2Conn:
    """One h2c connection of the well-behaved client."""

    def __init__(self, port, timeout):
        import h2.config
        import h2.connection
        import h2.events
        self.ev = h2.events
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.port = port
        self.dead = False

    def request(self, path, body, timeout):
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(":method", "POST"), (":path", path), (":scheme", "http"),
                                     (":authority", "127.0.0.1:%d" % self.port),
                                     ("content-type", "application/json"),
                                     ("content-length", str(len(body)))])
        self.conn.send_data(sid, body, end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        status, data = None, b""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.conn.reset_stream(sid)
                self.sock.sendall(self.conn.data_to_send())
                return False, "timeout"
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                self.dead = True
                return False, "connection closed"
            for e in self.conn.receive_data(chunk):
                if isinstance(e, self.ev.ConnectionTerminated):
                    self.dead = True
                if getattr(e, "stream_id", None) != sid:
                    continue
                if isinstance(e, self.ev.ResponseReceived):
                    status = dict(e.headers).get(b":status")
                elif isinstance(e, self.ev.DataReceived):
                    data += e.data
                    self.conn.acknowledge_received_data(e.flow_controlled_length, sid)
                elif isinstance(e, self.ev.StreamReset):
                    return False, "stream reset"
                elif isinstance(e, self.ev.StreamEnded):
                    out = self.conn.data_to_send()
                    if out:
                        self.sock.sendall(out)
                    if status != b"200":
                        return False, "status %s" % (status or b"-").decode()
                    return (True, "") if b'"choices"' in data else (False, "bad body")
            out = self.conn.data_to_send()
            if out:
                self.sock.sendall(out)
            if self.dead:
                return False, "goaway"

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def client_main(argv):
    import argparse
    ap = argparse.ArgumentParser(description="a well-behaved client: one line per request")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--proto", choices=["h1", "h2c"], default="h1")
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--path", default="/v1/completions")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if a.proto == "h2c":  # imported now: the first request's latency is the router's, not this
        import h2.connection  # noqa: F401
    out = sys.stdout
    out.write("started\n")
    out.flush()
    period = 1.0 / a.rate
    h2c = None
    n = 0
    next_t = time.monotonic()
    while True:
        # Stop when the parent closes our stdin; pacing waits on it too.
        left = max(0.0, next_t - time.monotonic())
        r, _, _ = select.select([sys.stdin], [], [], left)
        if r and not os.read(sys.stdin.fileno(), 4096):
            break
        if time.monotonic() < next_t:
            continue
        next_t += period
        if next_t < time.monotonic() - period:
            next_t = time.monotonic()  # fell behind (a slow request): no burst to catch up
        n += 1
        body = small_completion(str(n))
        t0 = time.monotonic()
        try:
            if a.proto == "h1":
                ok, why = _h1_once(a.port, body, a.path, a.timeout)
            else:
                if h2c is None or h2c.dead:
                    if h2c is not None:
                        h2c.close()
                    h2c = _H2Conn(a.port, a.timeout)
                ok, why = h2c.request(a.path, body, a.timeout)
        except (OSError, Exception) as e:  # noqa: B902 - any failure is a failed request
            ok, why = False, type(e).__name__
            if h2c is not None:
                h2c.dead = True
        lat = time.monotonic() - t0
        out.write("%s %.6f %.6f %s\n" % ("ok" if ok else "fail", t0, lat, why.replace("\n", " ")))
        out.flush()
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        sys.exit(client_main(sys.argv[2:]))
    sys.stderr.write("usage: attack.py client --port N [--proto h1|h2c] [--rate R]\n")
    sys.exit(2)
