"""conftest.py: shared fixtures for pcrouter's integration tests.

Everything runs on loopback with ports the OS picks. `PCR_BUILD` names the build folder whose
`pcrouter` is tested (default: build/). Fixtures:
  stub_factory(name, models=None, port=0, host="127.0.0.1")
                                    starts a stub_backend.py process (see its docstring); a
                                    port given binds that one (a pod restarted in place)
  router_factory(config_dict, **popen_kw)  writes the config, starts pcrouter (extra Popen
                                    arguments: env, preexec_fn), waits for `ready`
  cluster(n=2, policy=..., ...)     n stubs pod-a, pod-b, ... and a router in front of them
  tls_cert                          (cert, key) made once by the `openssl` command
Every router a test started is stopped at teardown with SIGTERM and must exit 0 with no
sanitizer report on stderr. Waiting on state is polling with a deadline (wait_for), never a
bare sleep.
"""
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.abspath(os.environ.get("PCR_BUILD") or os.path.join(ROOT, "build"))
PCROUTER = os.path.join(BUILD, "pcrouter")
PY = "/usr/bin/python3"
STUB = os.path.join(HERE, "stub_backend.py")
# The last: a state machine's transition function saw a move its picture does not have.
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "runtime error:", "LeakSanitizer",
                     "WARNING: ThreadSanitizer", "invalid state transition")
STARTUP_S = 30.0
POD_NAMES = ["pod-a", "pod-b", "pod-c", "pod-d", "pod-e", "pod-f"]

_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# ------------------------------------------------------------------------------------------
# small utilities

def wait_for(pred, timeout=10.0, interval=0.02, what="condition"):
    """Polls pred() until it returns a truthy value (returned) or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(interval)


def free_port():
    """A loopback port nobody listens on (bound then released; used for dead backends)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def sha256(b):
    return hashlib.sha256(b).hexdigest()


class LineReader:
    """Drains a pipe in a thread, keeping every line, so the child never blocks on a full pipe
    and tests can look at what it printed."""

    def __init__(self, pipe, label):
        self.pipe = pipe
        self.label = label
        self.lines = []
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        for raw in iter(self.pipe.readline, b""):
            with self.cond:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def wait_line(self, regex, timeout, start=0):
        """Returns (index, match) of the first line at or after `start` matching regex,
        or None when the pipe closed or the deadline passed."""
        rx = re.compile(regex)
        deadline = time.monotonic() + timeout
        i = start
        with self.cond:
            while True:
                while i < len(self.lines):
                    m = rx.search(self.lines[i])
                    if m:
                        return i, m
                    i += 1
                left = deadline - time.monotonic()
                if self.closed or left <= 0:
                    return None
                self.cond.wait(left)

    def text(self):
        with self.cond:
            return "\n".join(self.lines)

    def tail(self, n=60):
        with self.cond:
            return "\n".join(self.lines[-n:])


# ------------------------------------------------------------------------------------------
# stub backends

class Stub:
    def __init__(self, name, models, tmpdir, port=0, host="127.0.0.1", tls=None):
        """tls: {"cert", "key"[, "ca"][, "client_ca"]}: the stub serves HTTPS; its own calls
        trust "ca" (else the certificate itself)."""
        self.name = name
        self.tls = tls
        args = [PY, STUB, "--name", name, "--port", str(port), "--host", host]
        if models:
            args += ["--models", ",".join(models)]
        if tls:
            args += ["--tls-cert", tls["cert"], "--tls-key", tls["key"]]
            if tls.get("client_ca"):
                args += ["--tls-client-ca", tls["client_ca"]]
        self.errpath = os.path.join(str(tmpdir), "stub-%s-%s-%d.err" % (name, host, port))
        self.errf = open(self.errpath, "ab")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.errf)
        self.out = LineReader(self.proc.stdout, name)
        got = self.out.wait_line(r"listening on ([\d.]+):(\d+)", 15)
        if got is None:
            self.close()
            raise AssertionError("stub %s did not start: %s" % (name, open(self.errpath).read()))
        self.host, self.port = got[1].group(1), int(got[1].group(2))
        self.url = "%s://%s:%d" % ("https" if tls else "http", self.host, self.port)
        self._opener = _direct
        if tls:
            import ssl
            ctx = ssl.create_default_context(cafile=tls.get("ca", tls["cert"]))
            if tls.get("client_ca"):
                ctx.load_cert_chain(tls["client_cert"], tls["client_key"])
            self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                                       urllib.request.HTTPSHandler(context=ctx))

    def _call(self, method, path, obj=None, timeout=10):
        data = json.dumps(obj).encode() if obj is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        with self._opener.open(req, timeout=timeout) as r:
            return json.loads(r.read())

    def stats(self):
        return self._call("GET", "/stub/stats")

    def release(self, gate=None):
        return self._call("POST", "/stub/release", {} if gate is None else {"gate": gate})

    def reset(self):
        return self._call("POST", "/stub/reset", {})

    def configure(self, **kw):
        return self._call("POST", "/stub/config", kw)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.errf.close()

    def kill(self):
        """SIGKILL, as a pod that dies: the kernel closes its connections."""
        self.close()


@pytest.fixture
def stub_factory(tmp_path):
    stubs = []

    def make(name, models=None, port=0, host="127.0.0.1", tls=None):
        s = Stub(name, models, tmp_path, port, host, tls)
        stubs.append(s)
        return s

    yield make
    for s in stubs:
        try:
            s.release()
        except Exception:
            pass
        s.close()


# ------------------------------------------------------------------------------------------
# the router

def deep_merge(base, over):
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


# For pods that record every byte they get: no metrics scrape, no model listing.
QUIET_SCRAPE = {"interval_ms": 0, "models_interval_ms": 0}


def make_config(backends, tls=None, **sections):
    """backends: Stub objects or (name, url) pairs. tls: (cert, key) adds a TLS listener."""
    listen = [{"address": "127.0.0.1:0"}]
    if tls:
        listen.append({"address": "127.0.0.1:0", "tls": {"cert": tls[0], "key": tls[1]}})
    bl = []
    for b in backends:
        if isinstance(b, Stub):
            bl.append({"name": b.name, "url": b.url})
        elif isinstance(b, dict):
            bl.append(b)
        else:
            bl.append({"name": b[0], "url": b[1]})
    cfg = {"listen": listen, "backends": bl,
           "health": {"interval_ms": 500, "fall": 2, "rise": 1},
           "timeouts": {"drain_ms": 5000},
           "log": {"access_log": True}}
    return deep_merge(cfg, sections)


class Router:
    def __init__(self, config, tmpdir, **popen_kw):
        self.config = config
        self.path = os.path.join(str(tmpdir), "pcrouter-%d.json" % id(self))
        with open(self.path, "w") as f:
            json.dump(config, f, indent=2)
        assert os.access(PCROUTER, os.X_OK), "no pcrouter binary at %s (build it first)" % PCROUTER
        self.outf = open(self.path + ".stdout", "wb")
        self.proc = subprocess.Popen([PCROUTER, "-c", self.path], stdout=self.outf,
                                     stderr=subprocess.PIPE, **popen_kw)
        self.err = LineReader(self.proc.stderr, "pcrouter")
        self.stopped = False
        try:
            self._await_ready(config)
        except BaseException:
            self.kill()  # never leave a half-started router behind
            raise

    def _await_ready(self, config):
        got = self.err.wait_line(r"\bready\b", STARTUP_S)
        if got is None:
            self.kill()
            raise AssertionError("pcrouter did not print `ready` within %ss (exit %s); stderr:\n%s"
                                 % (STARTUP_S, self.proc.poll(), self.err.tail()))
        self.ready_line = got[0]
        ports = []
        for line in self.err.lines[:got[0] + 1]:
            m = re.search(r"listening on (\[[^\]]*\]|[^\s:]+):(\d+)", line)
            if m:
                ports.append(int(m.group(2)))
        assert len(ports) >= len(config["listen"]), \
            "expected a `listening on HOST:PORT` line per listener; stderr:\n" + self.err.tail()
        assert all(p != 0 for p in ports), "listening lines must name the real port"
        self.ports = ports
        self.port = ports[0]
        tls_idx = [i for i, l in enumerate(config["listen"]) if "tls" in l]
        self.tls_port = ports[tls_idx[0]] if tls_idx else None
        self.base = "http://127.0.0.1:%d" % self.port

    def url(self, path, proto="h1"):
        if proto in ("h2", "h1tls"):
            return "https://127.0.0.1:%d%s" % (self.tls_port, path)
        return self.base + path

    def alive(self):
        return self.proc.poll() is None

    def stderr_text(self):
        return self.err.text()

    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout):
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("pcrouter did not exit within %ss; stderr:\n%s" % (timeout, self.err.tail()))
        self.stopped = True
        self.err.thread.join(5)
        return rc

    def assert_clean_exit(self, rc):
        text = self.err.text()
        bad = [m for m in SANITIZER_MARKERS if m in text]
        # The report itself, not the access log lines that may follow it.
        at = min(text.index(m) for m in bad) if bad else 0
        assert not bad, "sanitizer report in pcrouter's stderr:\n" + text[max(0, at - 500):at + 8000]
        assert rc == 0, "pcrouter exited with %s; stderr:\n%s" % (rc, self.err.tail())

    def stop(self, sig=signal.SIGTERM, timeout=None):
        """Signals, waits (drain timeout + margin), asserts exit 0 and no sanitizer text."""
        if self.stopped:
            return
        if timeout is None:
            timeout = self.config.get("timeouts", {}).get("drain_ms", 30000) / 1000.0 + 15
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.wait_exit(timeout)
        self.outf.close()
        self.assert_clean_exit(rc)

    def wait_stopped(self, timeout=30):
        """For a test that signalled pcrouter itself: waits, asserts exit 0 and no sanitizer text."""
        if self.stopped:
            return
        rc = self.wait_exit(timeout)
        self.outf.close()
        self.assert_clean_exit(rc)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.stopped = True


@pytest.fixture
def router_factory(tmp_path):
    routers = []

    def make(config, **popen_kw):
        r = Router(config, tmp_path, **popen_kw)
        routers.append(r)
        return r

    yield make
    errors = []
    for r in routers:
        if not r.stopped:
            try:
                r.stop()
            except AssertionError as e:
                errors.append(str(e))
    if errors:
        pytest.fail("\n\n".join(errors))


class Cluster:
    def __init__(self, router, stubs):
        self.router = router
        self.stubs = stubs
        self.by_name = {s.name: s for s in stubs}

    def url(self, path, proto="h1"):
        return self.router.url(path, proto)

    def stats(self):
        return {s.name: s.stats() for s in self.stubs}

    def release_all(self):
        for s in self.stubs:
            s.release()


@pytest.fixture
def cluster(stub_factory, router_factory):
    """cluster(n=2, policy="round_robin", models=None, tls=None, wait_healthy=True, popen=None,
    **sections); popen: extra Popen arguments for pcrouter (preexec_fn, env)."""

    def make(n=2, policy="round_robin", models=None, tls=None, wait_healthy=True, popen=None,
             **sections):
        stubs = [stub_factory(POD_NAMES[i], models[i] if models else None) for i in range(n)]
        if policy is not None:
            sections = deep_merge({"routing": {"policy": policy}}, sections)
        r = router_factory(make_config(stubs, tls=tls, **sections), **(popen or {}))
        if wait_healthy:
            wait_for(lambda: curl(r.url("/health")).status == 200, 15, 0.05, "/health 200")
        return Cluster(r, stubs)

    return make


@pytest.fixture(scope="session")
def tls_cert(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=30)
    return cert, key


# ------------------------------------------------------------------------------------------
# clients

class Resp:
    def __init__(self, status, version, headers, body, rc=0, stderr=""):
        self.status = status
        self.version = version
        self.headers = headers      # lower-case name -> list of values
        self.body = body
        self.rc = rc
        self.stderr = stderr

    def header(self, name, default=None):
        v = self.headers.get(name.lower())
        return v[-1] if v else default

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return "<Resp %s HTTP/%s %r %r>" % (self.status, self.version, self.headers, self.body[:300])


def parse_header_block(text):
    """Last header block of a curl -D dump: (status, {name: [values]})."""
    blocks = [b for b in re.split(r"\r?\n\r?\n", text) if b.strip()]
    if not blocks:
        return 0, {}
    lines = blocks[-1].splitlines()
    m = re.match(r"HTTP/[\d.]+ (\d+)", lines[0])
    headers = {}
    for l in lines[1:]:
        if ":" in l:
            k, v = l.split(":", 1)
            headers.setdefault(k.strip().lower(), []).append(v.strip())
    return (int(m.group(1)) if m else 0), headers


_seq = [0]
_seq_lock = threading.Lock()


def _tmpfile(suffix):
    with _seq_lock:
        _seq[0] += 1
        n = _seq[0]
    d = os.environ.get("PYTEST_TMP_CURL") or "/tmp"
    return os.path.join(d, "pcr-curl-%d-%d%s" % (os.getpid(), n, suffix))


def proto_args(proto, cacert=None):
    if proto == "h1":
        return ["--http1.1"]
    if proto == "h2c":
        return ["--http2-prior-knowledge"]
    if proto == "h2":
        return ["--http2"] + (["--cacert", cacert] if cacert else ["-k"])
    if proto == "h1tls":
        return ["--http1.1"] + (["--cacert", cacert] if cacert else ["-k"])
    raise ValueError(proto)


def curl(url, data=None, method=None, headers=None, proto="h1", cacert=None, timeout=30,
         extra=(), expect=False):
    """Runs curl once; returns Resp (status 0 when curl got no response, rc = curl's exit)."""
    hfile, bfile = _tmpfile(".h"), _tmpfile(".b")
    args = ["curl", "-sS", "--noproxy", "*", "--max-time", str(timeout), "-D", hfile, "-o", bfile,
            "-w", "%{http_code} %{http_version}"] + proto_args(proto, cacert)
    dfile = None
    if data is not None:
        if isinstance(data, (dict, list)):
            data = json.dumps(data)
        if isinstance(data, str):
            data = data.encode()
        dfile = _tmpfile(".d")
        with open(dfile, "wb") as f:
            f.write(data)
        args += ["--data-binary", "@" + dfile]
        if not any(h.lower().startswith("content-type:") for h in (headers or [])):
            args += ["-H", "Content-Type: application/json"]
        if not expect:
            args += ["-H", "Expect:"]
    if method:
        args += ["-X", method]
    for h in headers or []:
        args += ["-H", h]
    args += list(extra) + [url]
    try:
        p = subprocess.run(args, capture_output=True, timeout=timeout + 10)
        htext = open(hfile, "rb").read().decode("latin-1") if os.path.exists(hfile) else ""
        body = open(bfile, "rb").read() if os.path.exists(bfile) else b""
    finally:
        for f in (hfile, bfile, dfile):
            if f and os.path.exists(f):
                os.unlink(f)
    status, hdrs = parse_header_block(htext)
    out = p.stdout.decode().split()
    version = out[1] if len(out) > 1 else ""
    return Resp(status, version, hdrs, body, p.returncode, p.stderr.decode(errors="replace"))


class CurlStream:
    """A curl run in the background whose output (-i: headers then body) is read as it
    arrives, for SSE checks and for killing the client mid-stream."""

    def __init__(self, url, data, proto="h1", cacert=None, timeout=60, extra=()):
        if isinstance(data, (dict, list)):
            data = json.dumps(data)
        self.dfile = _tmpfile(".d")
        with open(self.dfile, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        args = ["curl", "-sS", "-N", "-i", "--noproxy", "*", "--max-time", str(timeout),
                "-H", "Content-Type: application/json", "-H", "Expect:",
                "--data-binary", "@" + self.dfile] + proto_args(proto, cacert) + list(extra) + [url]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.buf = b""
        self.cond = threading.Condition()
        self.done = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        fd = self.proc.stdout.fileno()
        while True:
            chunk = os.read(fd, 65536)
            with self.cond:
                if not chunk:
                    self.done = True
                    self.cond.notify_all()
                    return
                self.buf += chunk
                self.cond.notify_all()

    def wait_output(self, needle, timeout=15):
        """Waits until `needle` (bytes) appears in the output; returns the output so far."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while needle not in self.buf:
                left = deadline - time.monotonic()
                if self.done or left <= 0:
                    raise AssertionError("no %r in curl output within %ss; got %r; stderr %r"
                                         % (needle, timeout, self.buf[-2000:], self.stderr_if_done()))
                self.cond.wait(left)
            return self.buf

    def stderr_if_done(self):
        return self.proc.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""

    def output(self):
        with self.cond:
            return self.buf

    def finish(self, timeout=30):
        """Waits for curl to end; returns (rc, output)."""
        rc = self.proc.wait(timeout)
        self.thread.join(5)
        self.cleanup()
        return rc, self.buf

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.cleanup()

    def cleanup(self):
        if os.path.exists(self.dfile):
            os.unlink(self.dfile)


def split_head(raw):
    """curl -i output -> (status line, headers dict lower->value, body); last header block."""
    while True:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if not sep:
            return None, {}, raw
        lines = head.decode("latin-1").split("\r\n")
        if re.match(r"HTTP/[\d.]+ 1\d\d", lines[0]):
            raw = rest
            continue
        hdrs = {}
        for l in lines[1:]:
            if ":" in l:
                k, v = l.split(":", 1)
                hdrs[k.strip().lower()] = v.strip()
        return lines[0], hdrs, rest


def sse_events(body):
    """The `data:` payloads of an SSE body, in order."""
    return [l[5:].strip() for l in body.decode("utf-8", "replace").split("\n") if l.startswith("data:")]


class RawConn:
    """A plain socket to the router, for pipelining, malformed input and keep-alive checks."""

    def __init__(self, port, timeout=15):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        self.timeout = timeout

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("connection closed; buffered %r" % self.buf[:500])
        self.buf += chunk

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _exact(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_response(self):
        """One HTTP/1.1 response (1xx skipped): (status, headers lower->value, body)."""
        while True:
            status_line = self._line().decode("latin-1")
            m = re.match(r"HTTP/1\.[01] (\d{3})", status_line)
            assert m, "bad status line %r" % status_line
            status = int(m.group(1))
            hdrs = {}
            while True:
                l = self._line().decode("latin-1")
                if not l:
                    break
                k, _, v = l.partition(":")
                hdrs[k.strip().lower()] = v.strip()
            if 100 <= status < 200:
                continue
            break
        if "chunked" in hdrs.get("transfer-encoding", "").lower():
            body = b""
            while True:
                size = int(self._line().split(b";")[0], 16)
                if size == 0:
                    while self._line():
                        pass
                    break
                body += self._exact(size)
                self._exact(2)
        elif "content-length" in hdrs:
            body = self._exact(int(hdrs["content-length"]))
        elif status in (204, 304):
            body = b""
        else:
            while True:
                try:
                    self._fill()
                except EOFError:
                    break
            body, self.buf = self.buf, b""
        return status, hdrs, body

    def read_until_close_or_data(self, timeout):
        """For malformed input: returns bytes received until the peer closed, or what arrived
        within `timeout` if it stayed open. Raises on timeout with nothing received."""
        self.sock.settimeout(timeout)
        got = self.buf
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return got, True
                got += chunk
                if b"\r\n\r\n" in got:
                    return got, False
        except ConnectionResetError:
            return got, True
        except socket.timeout:
            if got:
                return got, False
            raise AssertionError("router neither answered nor closed within %ss" % timeout)

    def close(self):
        self.sock.close()


def http_request(method, path, body=None, headers=None, host="127.0.0.1"):
    """Bytes of one HTTP/1.1 request with Content-Length."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    lines = ["%s %s HTTP/1.1" % (method, path), "Host: %s" % host]
    if body is not None:
        lines += ["Content-Type: application/json", "Content-Length: %d" % len(body)]
    lines += list(headers or [])
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def h2_all_answered(client, sids, timeout=30, what="every request answered"):
    """Waits until each of `client`'s streams `sids` ended (an H2Client), each with 200."""
    client.wait(lambda: all(client.streams[s]["ended"] for s in sids), timeout, what=what)
    for s in sids:
        assert client.streams[s]["headers"][":status"] == "200", client.streams[s]


class H2Client:
    """A minimal h2c client on python3-h2, for RST_STREAM and frame-level checks."""

    def __init__(self, port, timeout=15):
        import h2.config
        import h2.connection
        self.h2 = __import__("h2.events").events
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.flush()
        self.streams = {}
        self.goaway = None  # (error code, last stream id) of the server's GOAWAY

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def request(self, method, path, body=None, headers=(), flush=True):
        """Opens a stream; with flush=False its frames wait in the connection for the next
        flush (several streams in one write), unless flow control makes the body wait."""
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        sid = self.conn.get_next_available_stream_id()
        hdrs = [(":method", method), (":path", path), (":scheme", "http"),
                (":authority", "127.0.0.1:%d" % self.port)]
        if body is not None:
            hdrs += [("content-type", "application/json"), ("content-length", str(len(body)))]
        hdrs += list(headers)
        self.conn.send_headers(sid, hdrs, end_stream=body is None)
        self.streams[sid] = {"headers": None, "data": bytearray(), "ended": False, "reset": None}
        if body is not None:
            self._send_body(sid, body, flush=flush)
        if flush:
            self.flush()
        return sid

    def _send_body(self, sid, body, timeout=30, flush=True):
        """Sends as flow control allows; stops early if the server ended or reset the stream
        (an early answer such as 413)."""
        deadline = time.monotonic() + timeout
        off = 0
        while off < len(body):
            st = self.streams[sid]
            if st["ended"] or st["reset"] is not None:
                return
            if time.monotonic() > deadline:
                raise AssertionError("h2 request body not sent within %ss (flow control)" % timeout)
            window = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
            if window <= 0:
                self.flush()
                self.pump(0.2)
                continue
            chunk = body[off:off + window]
            off += len(chunk)
            self.conn.send_data(sid, chunk, end_stream=off >= len(body))
            if flush:
                self.flush()

    def pump(self, timeout):
        """Reads once (bounded) and dispatches events; False on EOF."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return True
        if not data:
            return False
        ev = self.h2
        for e in self.conn.receive_data(data):
            st = self.streams.get(getattr(e, "stream_id", None))
            if isinstance(e, ev.ResponseReceived) and st is not None:
                st["headers"] = {k.decode() if isinstance(k, bytes) else k:
                                 v.decode() if isinstance(v, bytes) else v for k, v in e.headers}
            elif isinstance(e, ev.DataReceived):
                self.conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                if st is not None:
                    st["data"] += e.data
            elif isinstance(e, ev.StreamEnded) and st is not None:
                st["ended"] = True
            elif isinstance(e, ev.StreamReset) and st is not None:
                st["reset"] = e.error_code
            elif isinstance(e, ev.ConnectionTerminated):
                self.goaway = (e.error_code, e.last_stream_id)
        self.flush()
        return True

    def wait_closed(self, timeout=15):
        """Reads until the server closes the connection (AssertionError past `timeout`)."""
        deadline = time.monotonic() + timeout
        while self.pump(min(0.5, max(0.01, deadline - time.monotonic()))):
            if time.monotonic() > deadline:
                raise AssertionError("the connection is still open after %ss" % timeout)

    def wait(self, pred, timeout=15, what="h2 condition"):
        deadline = time.monotonic() + timeout
        while not pred():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("timed out waiting for " + what)
            if not self.pump(min(left, 0.5)):
                if pred():
                    return
                raise AssertionError("connection closed while waiting for " + what)

    def reset(self, sid):
        import h2.errors
        self.conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
        self.flush()

    def close(self):
        try:
            self.conn.close_connection()
            self.flush()
        except Exception:
            pass
        self.sock.close()


class Load:
    """Steady load: `threads` client threads, each on its own keep-alive HTTP/1.1 connection,
    POST body_fn(n) to `path` one after another until stop(). Every request's outcome is kept
    as a dict: t0, t1 (time.time()), status (0: no HTTP response), backend (the
    x-pcrouter-backend header), error (the exception's text, if any)."""

    def __init__(self, port, body_fn, threads=4, path="/v1/completions", timeout=30):
        import http.client
        self._http = http.client
        self.port = port
        self.body_fn = body_fn
        self.path = path
        self.timeout = timeout
        self.results = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.n = 0
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for t in self.threads:
            t.start()

    def _next(self):
        with self.lock:
            self.n += 1
            return self.n

    def _run(self):
        conn = None
        while not self.stopping.is_set():
            body = json.dumps(self.body_fn(self._next()))
            rec = {"t0": time.time(), "status": 0, "backend": None, "error": None}
            try:
                if conn is None:
                    conn = self._http.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
                conn.request("POST", self.path, body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                rec["status"] = r.status
                rec["backend"] = r.getheader("x-pcrouter-backend")
                if r.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, self._http.HTTPException) as e:
                rec["error"] = "%s: %s" % (type(e).__name__, e)
                if conn is not None:
                    conn.close()
                conn = None
            rec["t1"] = time.time()
            with self.lock:
                self.results.append(rec)
        if conn is not None:
            conn.close()

    def count(self):
        with self.lock:
            return len(self.results)

    def wait_count(self, n, timeout=20):
        wait_for(lambda: self.count() >= n, timeout, 0.02, "%d requests of the load" % n)

    def stop(self, timeout=40):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout)
            assert not t.is_alive(), "a load thread did not finish within %ss" % timeout
        return list(self.results)

    def failures(self):
        with self.lock:
            return [r for r in self.results if r["status"] != 200]


# ------------------------------------------------------------------------------------------
# metrics and bodies

def parse_metrics(text):
    """Prometheus text -> list of (name, {label: value}, float)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)", line)
        if not m:
            continue
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        try:
            out.append((m.group(1), labels, float(m.group(4))))
        except ValueError:
            pass
    return out


def metric(text, name, **labels):
    """Sum of the series `name` whose labels include `labels`; None if no such series."""
    vals = [v for n, l, v in parse_metrics(text) if n == name and all(l.get(k) == str(x) for k, x in labels.items())]
    return sum(vals) if vals else None


def get_metrics(router):
    r = curl(router.url("/metrics"))
    assert r.status == 200, r
    return r.body.decode()


def completion(prompt, model="stub-model", stream=False, **stub):
    body = {"model": model, "prompt": prompt, "max_tokens": 8}
    if stream:
        body["stream"] = True
    if stub:
        body["stub"] = stub
    return body


def chat(messages, model="stub-model", stream=False, **stub):
    body = {"model": model, "messages": messages, "max_tokens": 8}
    if stream:
        body["stream"] = True
    if stub:
        body["stub"] = stub
    return body


def assert_error(resp, status, code, etype=None):
    """An OpenAI-style error: status, JSON {"error": {"message", "type", "code"}}."""
    assert resp.status == status, "expected %d, got %r" % (status, resp)
    try:
        obj = json.loads(resp.body)
    except ValueError:
        raise AssertionError("error body is not JSON: %r" % resp.body[:500])
    err = obj.get("error")
    assert isinstance(err, dict), obj
    assert isinstance(err.get("message"), str) and err["message"], obj
    assert isinstance(err.get("type"), str) and err["type"], obj
    assert err.get("code") == code, obj
    if etype is not None:
        assert err["type"] == etype, obj
    return err
