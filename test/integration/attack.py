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
  RawPod(respond)
      a TCP pod that records every byte it receives and answers each request with the bytes
      respond(request) returns; pcrouter's health checks should be off (health.interval_ms 0)
      so that only the requests under test reach it.
  h2 frames (h2_preface, h2_frame, h2_headers_block) and the attackers: slowloris connections,
      zero-window HTTP/2 readers, slow HTTP/2 uploads, frame floods, connections held open.

Everything is bounded in time: each wait has a deadline. Python standard library plus the
Debian python3-h2 stack (h2, hpack, hyperframe).
"""
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


def sanitized(binary):
    """Whether `binary` was built with AddressSanitizer (its RSS is larger, by a factor)."""
    try:
        with open(binary, "rb") as f:
            return b"__asan_init" in f.read()
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
# a pod that records every byte and answers with scripted bytes

class RawPod:
    """A TCP pod on loopback: every byte any connection sends it is kept (`received`), each
    request (head + Content-Length body) is parsed just enough to call respond(req), whose
    bytes are written back; respond may return (bytes, close) to close after writing.
    req: {"method", "target", "head" (bytes), "body" (bytes)}."""

    def __init__(self, respond, name="pod-raw"):
        self.name = name
        self.respond = respond
        self.lock = threading.Lock()
        self.received = bytearray()
        self.requests = []
        self.connections = 0
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(256)
        self.port = self.lsock.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.closed = False
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _recv_until(self, c, buf, done):
        """Reads (keeping every byte) until done(buf); None when the peer closed first."""
        while not done(buf):
            chunk = c.recv(65536)
            if not chunk:
                return None
            with self.lock:
                self.received += chunk
            buf += chunk
        return buf

    def _serve(self, c):
        c.settimeout(30)
        buf = b""
        try:
            while True:
                buf = self._recv_until(c, buf, lambda b: b"\r\n\r\n" in b)
                if buf is None:
                    return
                head, _, buf = buf.partition(b"\r\n\r\n")
                n = 0
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        n = int(v.strip() or b"0")
                buf = self._recv_until(c, buf, lambda b: len(b) >= n)
                if buf is None:
                    return
                body, buf = buf[:n], buf[n:]
                first = head.split(b"\r\n", 1)[0].split(b" ")
                req = {"method": first[0].decode("latin-1"),
                       "target": first[1].decode("latin-1") if len(first) > 1 else "",
                       "head": head, "body": body}
                with self.lock:
                    self.requests.append(req)
                answer = self.respond(req)
                close = False
                if isinstance(answer, tuple):
                    answer, close = answer
                c.sendall(answer)
                if close:
                    return
        except OSError:
            return
        finally:
            c.close()

    def snapshot(self):
        with self.lock:
            return {"connections": self.connections, "bytes": bytes(self.received),
                    "requests": list(self.requests)}

    def close(self):
        self.closed = True
        try:
            self.lsock.close()
        except OSError:
            pass
        with self.lock:
            conns, self.conns = self.conns, []
        for c in conns:
            try:
                c.close()
            except OSError:
                pass


def ok_response(body=b'{"choices":[{"text":"ok"}]}'):
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % len(body)) + body


# ------------------------------------------------------------------------------------------
# HTTP/2 clients that misbehave

BULK_PATTERN = b"0123456789abcdef"   # what the stub pod's `bytes` answer repeats


def bulk_sha(n):
    import hashlib
    h = hashlib.sha256()
    piece = BULK_PATTERN * 4096
    while n > 0:
        h.update(piece[:n])
        n -= len(piece)
    return h.hexdigest()


def h2_connect(port, window=65535, timeout=30.0):
    """A python-h2 client connection announcing `window` as its streams' initial window; a
    window above the default also opens the connection's window that far. (sock, conn)."""
    import h2.config
    import h2.connection
    import h2.settings
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.local_settings = h2.settings.Settings(
        client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
    conn.initiate_connection()
    if window > 65535:
        conn.increment_flow_control_window(min(window, 2 ** 31 - 1) - 65535)
    sock.sendall(conn.data_to_send())
    return sock, conn


def post_headers(port, path, length, extra=()):
    return [(":method", "POST"), (":path", path), (":scheme", "http"),
            (":authority", "127.0.0.1:%d" % port), ("content-type", "application/json"),
            ("content-length", str(length))] + list(extra)


def note_event(rec, e):
    """Updates a stream's record (status, bytes, ended, reset) from a python-h2 event; returns
    the DATA the event carried (b"" for any other)."""
    import h2.events
    if isinstance(e, h2.events.ResponseReceived):
        rec["status"] = dict(e.headers).get(b":status", b"").decode()
    elif isinstance(e, h2.events.DataReceived):
        rec["bytes"] += len(e.data)
        return e.data
    elif isinstance(e, h2.events.StreamEnded):
        rec["ended"] = True
    elif isinstance(e, h2.events.StreamReset):
        rec["reset"] = e.error_code
    return b""


def big_window_read(port, nbytes, timeout=60.0):
    """One h2c stream asking the stub pod for `nbytes`, with windows large enough for all of it
    so that the client never has to send a frame once the response flows (a WINDOW_UPDATE or a
    PING would wake a server that stopped writing). Returns status, bytes, sha256, whether the
    stream ended, and how many bytes the client sent after the first DATA frame."""
    import hashlib
    import h2.events
    sock, conn = h2_connect(port, window=2 ** 31 - 1, timeout=timeout)
    # The router's SETTINGS first, and our ACK, so that nothing is owed once DATA flows.
    settled = False
    while not settled:
        data = sock.recv(65536)
        if not data:
            raise AssertionError("the router closed the connection before its SETTINGS")
        settled = any(isinstance(e, h2.events.RemoteSettingsChanged) for e in conn.receive_data(data))
        sock.sendall(conn.data_to_send())
    body = json.dumps({"model": "stub-model", "prompt": "big window", "max_tokens": 8,
                       "stub": {"bytes": nbytes}}).encode()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, post_headers(port, "/v1/completions", len(body)))
    conn.send_data(sid, body, end_stream=True)
    sock.sendall(conn.data_to_send())
    res = {"status": None, "bytes": 0, "ended": False, "reset": None, "sent_during": 0}
    h = hashlib.sha256()
    deadline = time.monotonic() + timeout
    try:
        while not res["ended"] and res["reset"] is None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                data = sock.recv(1 << 20)
            except socket.timeout:
                break
            if not data:
                break
            for e in conn.receive_data(data):
                if getattr(e, "stream_id", None) == sid:
                    h.update(note_event(res, e))
            out = conn.data_to_send()
            if out:
                if res["bytes"] > 0:
                    res["sent_during"] += len(out)
                sock.sendall(out)
    finally:
        sock.close()
    res["sha256"] = h.hexdigest()
    return res


class H2Streams:
    """Streams on h2c connections (at most `per_conn` each), a reader thread per connection
    recording, per stream: status, DATA bytes, end, reset code. The client's windows are given
    back only when `ack` is true: with window=0 and ack=False no DATA can ever arrive."""

    def __init__(self, port, window=65535, ack=True, per_conn=200, timeout=30.0):
        self.port = port
        self.window = window
        self.ack = ack
        self.per_conn = per_conn
        self.timeout = timeout
        self.lock = threading.Lock()
        self.conns = []             # [sock, conn, nstreams, alive]
        self.streams = {}           # (conn index, sid) -> record
        self.closing = False

    def _conn(self):
        if not self.conns or self.conns[-1][2] >= self.per_conn or not self.conns[-1][3]:
            sock, conn = h2_connect(self.port, self.window, self.timeout)
            entry = [sock, conn, 0, True]
            self.conns.append(entry)
            threading.Thread(target=self._read, args=(len(self.conns) - 1,), daemon=True).start()
        return len(self.conns) - 1

    def open(self, path, body, end_stream=True, extra=(), length=None):
        """Opens a stream announcing `length` bytes of body (default len(body)) and sends what
        the window allows of `body` (the rest is the caller's, with send()). Returns its key."""
        ci = self._conn()
        sock, conn = self.conns[ci][0], self.conns[ci][1]
        with self.lock:
            sid = conn.get_next_available_stream_id()
            self.streams[(ci, sid)] = {"status": None, "bytes": 0, "ended": False, "reset": None,
                                       "sent": 0}
            conn.send_headers(sid, post_headers(self.port, path,
                                                len(body) if length is None else length, extra))
            n = min(len(body), conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
            if n > 0 or end_stream:
                conn.send_data(sid, body[:n], end_stream=end_stream and n == len(body))
            self.streams[(ci, sid)]["sent"] = n
            out = conn.data_to_send()
            self.conns[ci][2] += 1
        sock.sendall(out)
        return (ci, sid)

    def send(self, key, data, end_stream=False):
        """Sends what the windows allow of `data` now; returns the bytes sent (0: blocked)."""
        ci, sid = key
        sock, conn = self.conns[ci][0], self.conns[ci][1]
        with self.lock:
            st = self.streams[key]
            if st["reset"] is not None or st["ended"] or not self.conns[ci][3]:
                return -1
            n = min(len(data), conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
            if n <= 0:
                return 0
            try:
                conn.send_data(sid, data[:n], end_stream=end_stream and n == len(data))
            except Exception:
                return -1  # the stream closed meanwhile (an early answer, a reset)
            st["sent"] += n
            out = conn.data_to_send()
        sock.sendall(out)
        return n

    def _read(self, ci):
        import h2.events
        sock, conn = self.conns[ci][0], self.conns[ci][1]
        sock.settimeout(None)
        try:
            while not self.closing:
                r, _, _ = select.select([sock], [], [], 0.2)
                if not r:
                    continue
                data = sock.recv(1 << 20)
                if not data:
                    break
                with self.lock:
                    for e in conn.receive_data(data):
                        if isinstance(e, h2.events.ConnectionTerminated):
                            self.conns[ci][3] = False
                        st = self.streams.get((ci, getattr(e, "stream_id", None)))
                        if st is None:
                            continue
                        note_event(st, e)
                        if self.ack and isinstance(e, h2.events.DataReceived):
                            conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                    out = conn.data_to_send()
                if out:
                    sock.sendall(out)
        except (OSError, ValueError, Exception):  # noqa: B902 - the router may cut us off
            pass
        with self.lock:
            self.conns[ci][3] = False

    def snapshot(self):
        with self.lock:
            return {k: dict(v) for k, v in self.streams.items()}

    def wait(self, pred, timeout, what):
        deadline = time.monotonic() + timeout
        while True:
            snap = self.snapshot()
            if pred(snap):
                return snap
            if time.monotonic() > deadline:
                raise AssertionError("timed out after %.0fs waiting for %s" % (timeout, what))
            time.sleep(0.05)

    def close(self):
        self.closing = True
        for c in self.conns:
            try:
                c[0].close()
            except OSError:
                pass


def upload_body(size):
    """A completion request of `size` bytes: JSON whose prompt fills it."""
    head = b'{"model":"stub-model","max_tokens":8,"prompt":"'
    tail = b'"}'
    return head + b"u" * max(0, size - len(head) - len(tail)) + tail


def slow_uploads(port, streams, size, rate, duration, window=65535, stop_after=None):
    """`streams` POSTs of `size` bytes each on one h2c connection, sent round robin in 16 KiB
    pieces at most `rate` bytes a second in all, as flow control allows, for at most
    `duration` seconds or until `stop_after` bytes are sent (the uploads then stall). Returns
    the H2Streams (whose snapshot tells each stream's fate) and the bytes sent."""
    body = upload_body(size)
    hs = H2Streams(port, window=window, per_conn=streams)
    keys = [hs.open("/v1/completions", b"", end_stream=False, length=len(body))
            for _ in range(streams)]
    offs = {k: 0 for k in keys}
    sent_total = 0
    t0 = time.monotonic()
    end = t0 + duration
    while time.monotonic() < end and offs and (stop_after is None or sent_total < stop_after):
        progressed = False
        for k in list(offs):
            allowed = rate * (time.monotonic() - t0) - sent_total
            if allowed < 16384:
                break
            off = offs[k]
            n = hs.send(k, body[off:off + 16384], end_stream=off + 16384 >= len(body))
            if n < 0:
                del offs[k]
                continue
            if n > 0:
                progressed = True
                sent_total += n
                offs[k] = off + n
                if offs[k] >= len(body):
                    del offs[k]
        if not progressed:
            time.sleep(0.01)  # pacing: windows closed or the rate reached
    return hs, sent_total


# ------------------------------------------------------------------------------------------
# HTTP/2 frame floods

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FLOODS = ("ping", "settings", "empty_data", "continuation", "rapid_reset")


class _FloodConn:
    """One raw h2c connection of a flood: frames built with hyperframe, headers with hpack."""

    def __init__(self, port, read):
        import hpack
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.read = read
        self.enc = hpack.Encoder()
        self.port = port
        self.sid = 1
        self.sock.sendall(H2_PREFACE + self.frame("SettingsFrame", 0))

    @staticmethod
    def frame(kind, sid, **kw):
        import hyperframe.frame as F
        return getattr(F, kind)(sid, **kw).serialize()

    def headers(self, path, method="POST", length=None, end_headers=True, end_stream=False):
        h = [(":method", method), (":path", path), (":scheme", "http"),
             (":authority", "127.0.0.1:%d" % self.port)]
        if length is not None:
            h += [("content-type", "application/json"), ("content-length", str(length))]
        flags = (["END_HEADERS"] if end_headers else []) + (["END_STREAM"] if end_stream else [])
        sid = self.sid
        self.sid += 2
        return sid, self.frame("HeadersFrame", sid, data=self.enc.encode(h), flags=flags)

    def send(self, data):
        self.sock.sendall(data)
        if self.read:
            while select.select([self.sock], [], [], 0)[0]:
                if not self.sock.recv(1 << 20):
                    raise ConnectionResetError("closed by the router")

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def h2_flood(port, kind, duration, batch=256):
    """Floods h2c connections with `kind` frames for `duration` seconds, reconnecting whenever
    the router closes one (or stops reading it for 5 s). Returns frames sent and connections.
      ping, settings   PING / empty SETTINGS frames, the replies never read
      empty_data       a POST whose body is endless empty DATA frames
      continuation     a HEADERS frame followed by endless CONTINUATION frames
      rapid_reset      POST /v1/completions (HEADERS, DATA with END_STREAM) then RST_STREAM"""
    assert kind in FLOODS, kind
    body = small_completion("rapid reset")
    frames = conns = 0
    end = time.monotonic() + duration
    while time.monotonic() < end:
        try:
            c = _FloodConn(port, read=kind not in ("ping", "settings"))
        except OSError:
            time.sleep(0.05)  # pacing: the router is refusing or at its limit
            continue
        conns += 1
        try:
            if kind == "empty_data":
                sid, hdr = c.headers("/v1/completions", length=1 << 20)
                c.send(hdr)
            elif kind == "continuation":
                sid, hdr = c.headers("/v1/completions", length=10, end_headers=False)
                c.send(hdr)
                piece = c.enc.encode([("x-flood", "a" * 64)])
            while time.monotonic() < end:
                if kind == "ping":
                    data = c.frame("PingFrame", 0, opaque_data=b"12345678") * batch
                elif kind == "settings":
                    data = c.frame("SettingsFrame", 0) * batch
                elif kind == "empty_data":
                    data = c.frame("DataFrame", sid, data=b"") * batch
                elif kind == "continuation":
                    data = c.frame("ContinuationFrame", sid, data=piece) * batch
                else:
                    parts = []
                    for _ in range(batch // 4):
                        s, hdr = c.headers("/v1/completions", length=len(body))
                        parts += [hdr, c.frame("DataFrame", s, data=body, flags=["END_STREAM"]),
                                  c.frame("RstStreamFrame", s, error_code=8)]
                    data = b"".join(parts)
                c.send(data)
                frames += batch
        except (OSError, ValueError):
            pass  # the router closed it or stopped reading: a new connection
        finally:
            c.close()
    return {"frames": frames, "connections": conns}


# ------------------------------------------------------------------------------------------
# connection attacks

SLOW_HEAD = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"X-Padding: " + b"p" * 4000)   # never ends: the head is never complete


class Slowloris:
    """`n` HTTP/1.1 connections, each sending one more byte of a request head every
    `interval` seconds from one thread; while `reconnect`, the connections the router closed
    are re-opened at each tick. Counts what the router did to them: 408 answers, closes without
    an answer (evictions), anything else."""

    def __init__(self, port, n, interval, reconnect=True):
        self.port = port
        self.n = n
        self.interval = interval
        self.reconnect = reconnect
        self.lock = threading.Lock()
        self.counts = {"opened": 0, "open_failed": 0, "answered_408": 0, "closed_silently": 0,
                       "answered_other": 0}
        self.socks = {}          # fd -> [sock, bytes sent, bytes received]
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._fill()
        self.thread.start()
        return self

    def _open(self):
        try:
            sk = socket.create_connection(("127.0.0.1", self.port), timeout=2)
        except OSError:
            self.counts["open_failed"] += 1
            return
        sk.setblocking(False)
        sk.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.socks[sk.fileno()] = [sk, 0, b""]
        self.counts["opened"] += 1

    def _fill(self):
        with self.lock:
            while len(self.socks) < self.n and not self.stop_ev.is_set():
                before = self.counts["open_failed"]
                self._open()
                if self.counts["open_failed"] > before:
                    break

    def _ended(self, fd):
        sk, _, got = self.socks.pop(fd)
        if got.startswith(b"HTTP/1.1 408"):
            self.counts["answered_408"] += 1
        elif got:
            self.counts["answered_other"] += 1
        else:
            self.counts["closed_silently"] += 1
        sk.close()

    def _run(self):
        next_tick = time.monotonic()
        while not self.stop_ev.is_set():
            poller = select.poll()   # select() stops at fd 1024
            with self.lock:
                for fd in self.socks:
                    poller.register(fd, select.POLLIN)
            wait_ms = 1000 * max(0.0, min(0.05, next_tick - time.monotonic()))
            readable = [fd for fd, _ in poller.poll(wait_ms)]
            with self.lock:
                for fd in readable:
                    ent = self.socks.get(fd)
                    if ent is None:
                        continue
                    try:
                        data = ent[0].recv(65536)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if data:
                        ent[2] += data
                    else:
                        self._ended(fd)
                if time.monotonic() >= next_tick:
                    next_tick += self.interval
                    for fd in list(self.socks):
                        ent = self.socks[fd]
                        if ent[1] >= len(SLOW_HEAD):
                            continue
                        try:
                            ent[0].send(SLOW_HEAD[ent[1]:ent[1] + 1])
                            ent[1] += 1
                        except (BlockingIOError, InterruptedError):
                            pass
                        except OSError:
                            self._ended(fd)
                    ticked = True
                else:
                    ticked = False
            if self.reconnect and ticked:
                self._fill()

    def stats(self):
        with self.lock:
            out = dict(self.counts)
            out["open_now"] = len(self.socks)
        return out

    def stop(self):
        self.stop_ev.set()
        self.thread.join(10)
        with self.lock:
            for ent in self.socks.values():
                ent[0].close()
            self.socks.clear()
        return self.stats()


class HeldConns:
    """Plain TCP connections to the router, opened and held silent (for EMFILE)."""

    def __init__(self, port, n, timeout=2.0):
        self.socks = []
        self.failed = 0
        for _ in range(n):
            try:
                self.socks.append(socket.create_connection(("127.0.0.1", port), timeout=timeout))
            except OSError:
                self.failed += 1

    def close(self):
        for sk in self.socks:
            sk.close()
        self.socks = []


# ------------------------------------------------------------------------------------------
# the well-behaved client (child side)

def _h1_once(port, body, path, timeout):
    import http.client
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
