#!/usr/bin/python3
"""Proxy benchmark (`make bench-proxies`): pcrouter against HAProxy 2.6 and nginx, round robin.

Owns the whole run: it writes the configs (templates in bench/proxies/), starts two stub backends
(one nginx process answering a fixed ~2 KiB completion), HAProxy, nginx and pcrouter on loopback,
drives each target with wrk (HTTP/1.1) and h2load (h2c, prior knowledge) posting a ~2 KiB
completion request, and prints requests/s, p50 and p99 latency per target (medians over
repetitions) with pcrouter's ratio to each. Results also go to bench/out/proxies.json.

This machine has 2 cores shared by everything, and runs vary by 20-35%: each repetition visits
every target once per protocol, in an order rotated from one repetition to the next, and the
figures are medians over repetitions. Every process started here is killed on exit.

TLS (docs/BENCHMARKS.md): `--modes plain,tls,tls-pods,tls-both` picks what is encrypted (the
clients' side, the pods' side, both), with one ECDSA P-256 certificate the harness makes with
openssl, TLS 1.3 and X25519 on every proxy (checked with s_client before loading); `--tls` is
`--modes tls,tls-pods`. `--matrix` runs every mode twice, pinned (`--pin split`) and unpinned
(`--pin none`), each at one thread and at the default thread count (pcrouter `workers` 0 against
HAProxy's default nbthread). `--handshakes` adds new and resumed TLS handshakes per proxy
CPU-second (openssl s_time -new / -reuse), `--idle N` the memory per idle keep-alive
connection (HTTP/1.1 and h2 over TLS; bench/proxies/idle_conns.py opens them).

Python standard library only (and the h2 package for `--idle`'s h2 rows). Usage:
    bench/proxies.py --build build [--reps N] [--duration S] [--pin split|none] [--defaults]
    bench/proxies.py --build build --modes plain,tls,tls-pods --matrix --handshakes --idle 10000
    QUICK=1 bench/proxies.py ...      # 2 repetitions of 2 s: a smoke run, not a measurement
    KEEP_TMP=1 ...                    # keep the temp folder (configs, pcrouter.log, error logs)
    --only direct,pcrouter,haproxy,nginx,haproxy_default,nginx_default   # a subset of targets
"""

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import http.client

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TEMPLATES = os.path.join(HERE, "proxies")
OUT_DIR = os.path.join(HERE, "out")

START_TIMEOUT = 15.0      # seconds any process gets to start listening
RUN_SLACK = 30.0          # seconds a load generator may overrun its duration before it is killed


class BenchError(Exception):
    pass


# ----------------------------------------------------------------------------------------------
# Bodies

def request_body(size=2048):
    """A completion request of about `size` bytes: {"model","prompt","max_tokens"}."""
    words = ("the quick brown fox jumps over the lazy dog while the router keeps its prefix "
             "cache warm and every pod answers in time ").split()
    prompt, i, n = [], 0, 0
    while n < size - 48:
        prompt.append(words[i % len(words)])
        n += len(prompt[-1]) + 1
        i += 1
    body = json.dumps({"model": "m", "prompt": " ".join(prompt), "max_tokens": 16},
                      separators=(",", ":"))
    return body.encode()


def response_body():
    """A completion response of about 2 KiB, with no quote or backslash nginx would interpret."""
    text = ("Lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
            "incididunt ut labore et dolore magna aliqua. ") * 16
    body = {"id": "cmpl-bench", "object": "text_completion", "created": 1700000000, "model": "m",
            "choices": [{"index": 0, "text": text[:1800], "logprobs": None,
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": 500, "completion_tokens": 16, "total_tokens": 516}}
    s = json.dumps(body, separators=(",", ":"))
    assert "'" not in s and "\\" not in s and "$" not in s
    return s


# ----------------------------------------------------------------------------------------------
# Processes

class Procs:
    """Every process this run starts, each in its own process group so that stopping it also
    stops its children (nginx workers). Only these groups, by id, are ever signalled."""

    def __init__(self, pin):
        self.pin = pin
        self.procs = []

    def start(self, name, argv, cpus, stdout=None, stderr=None):
        if self.pin and cpus:
            argv = ["taskset", "-c", cpus] + argv
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                             stdout=stdout if stdout is not None else subprocess.DEVNULL,
                             stderr=stderr if stderr is not None else subprocess.DEVNULL,
                             start_new_session=True)
        p.bench_name = name
        self.procs.append(p)
        return p

    def stop(self, p, grace=3.0):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        # The group may outlive its leader (nginx workers): make sure it is gone.
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self):
        for p in list(self.procs):
            self.stop(p)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, logfile=None, timeout=START_TIMEOUT):
    """Bounded poll until something accepts on 127.0.0.1:port; fails early if proc exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError("%s exited with status %s before listening on %d%s"
                             % (proc.bench_name, proc.returncode, port, log_tail(logfile)))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.02)
    raise BenchError("%s: nothing listens on port %d after %.0f s%s"
                     % (proc.bench_name, port, timeout, log_tail(logfile)))


def group_cpu_seconds(pgid):
    """User and system CPU time of every live process in process group pgid (from /proc)."""
    user = system = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:
            user += int(fields[11])
            system += int(fields[12])
    tck = os.sysconf("SC_CLK_TCK")
    return user / tck, system / tck


def group_rss_kb(pgid):
    """Resident memory (VmRSS, KiB) of every live process in process group pgid."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                if int(f.read().rsplit(")", 1)[1].split()[2]) != pgid:
                    continue
            with open("/proc/%s/status" % pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total


def log_tail(path, n=15):
    if not path or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        lines = f.readlines()[-n:]
    return "\n  log %s:\n    %s" % (path, "    ".join(lines)) if lines else ""


def render(template, out_path, **values):
    with open(os.path.join(TEMPLATES, template)) as f:
        text = f.read()
    for k, v in values.items():
        text = text.replace("@%s@" % k, str(v))
    left = re.findall(r"@[A-Z0-9_]+@", text)
    if left:
        raise BenchError("%s: unfilled placeholders %s" % (template, sorted(set(left))))
    with open(out_path, "w") as f:
        f.write(text)
    return out_path


def tool_version(argv):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (r.stdout + r.stderr).strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "?"


# ----------------------------------------------------------------------------------------------
# Targets

class Target:
    """One thing under load: its name, ports per protocol, and how to (re)start it."""

    def __init__(self, name, label, starter=None):
        self.name = name          # short key used in JSON
        self.label = label        # what the table prints
        self.starter = starter    # callable returning (proc, {"h1": port, "h2": port}, logfile)
        self.proc = None
        self.ports = {}
        self.log = None
        self.crashes = []

    def start(self):
        self.proc, self.ports, self.log = self.starter()

    def alive(self):
        return self.proc is None or self.proc.poll() is None


def make_pki(d):
    """A CA and a server certificate it signs (ECDSA P-256, for localhost and 127.0.0.1), made
    with openssl: every proxy and the TLS pods serve the same one."""
    def ossl(*argv):
        r = subprocess.run(("openssl",) + argv, cwd=d, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise BenchError("openssl %s: %s" % (argv[0], r.stderr[-500:]))
    ec = ("-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
    ossl("genpkey", *ec, "-out", "ca.key")
    ossl("req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=pcr-bench-ca", "-days", "2",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", "ca.pem")
    ossl("genpkey", *ec, "-out", "server.key")
    ossl("req", "-new", "-key", "server.key", "-subj", "/CN=localhost", "-out", "server.csr")
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    ossl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
         "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.pem")
    pki = {k: os.path.join(d, v) for k, v in (("ca", "ca.pem"), ("cert", "server.pem"),
                                              ("key", "server.key"), ("bundle", "server-haproxy.pem"))}
    with open(pki["bundle"], "w") as out:   # HAProxy's crt: certificate then key, one file
        for k in ("cert", "key"):
            with open(pki[k]) as f:
                out.write(f.read())
    return pki


MODES = ("plain", "tls", "tls-pods", "tls-both")
TLS_NAME = "TLSv1.3"        # the one version every TLS row pins (HAProxy, nginx; pcrouter's max)
TLS_GROUP = "X25519"        # the one key-exchange group (OpenSSL's first; HAProxy, nginx pinned)


class Bench:
    def __init__(self, args, pin=None, mode="plain"):
        self.args = args
        self.pin = pin or args.pin
        self.mode = mode
        self.tls_front = mode in ("tls", "tls-both")   # clients speak TLS to the proxy
        self.tls_pods = mode in ("tls-pods", "tls-both")  # the proxy speaks TLS to the pods
        self.scheme = "https" if self.tls_front else "http"
        self.procs = Procs(self.pin == "split")
        self.dir = tempfile.mkdtemp(prefix="pcr-bench-proxies-")
        self.pki = make_pki(self.dir) if (self.tls_front or self.tls_pods) else None
        # The idle rows need a client connection each beyond the default caps. HAProxy wants
        # two descriptors per connection of maxconn under the hard limit: where that is lower
        # than asked (20000 here: 9,600 connections), every proxy gets the count that fits.
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        fits = (hard - 600) // 2 - 100 if hard != resource.RLIM_INFINITY else args.idle
        self.idle = min(args.idle, fits)
        self.maxconn = max(8000, self.idle + 200)
        self.req = request_body()
        self.resp = response_body()
        # Pinning ("split"): the load generator and the stub backends share CPU 0, the proxy
        # under test gets CPU 1 to itself. The rows at the proxies' defaults run unpinned.
        self.cpu_client = "0"
        self.cpu_backends = "0"
        self.cpu_proxy = "1"
        self.cpu_all = "0,1"     # two-thread rows: the proxy may use both (it competes with the
                                 # load generator and backends on CPU 0: CPU per request is the
                                 # figure to read there)
        self.backend_ports = {}

    # -- backends ------------------------------------------------------------------------------
    def start_backends(self):
        b1, b1h2, b2 = free_port(), free_port(), free_port()
        for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(self.dir, "backends-tmp", d), exist_ok=True)
        ports = {"b1": b1, "b1_h2c": b1h2, "b2": b2}
        tls_servers = ""
        if self.pki:
            # b1s, b2s: the pods over TLS (HTTP/1.1); b1_h2s: backend 1 with ALPN h2 (direct).
            for name, extra in (("b1s", ""), ("b2s", ""), ("b1_h2s", " http2")):
                ports[name] = free_port()
                tls_servers += (
                    "server {\n        listen 127.0.0.1:%d ssl%s backlog=4096;\n"
                    "        ssl_certificate %s;\n        ssl_certificate_key %s;\n"
                    "        ssl_protocols %s;\n        ssl_ecdh_curve %s;\n"
                    "        location = /v1/completions { return 200 '%s'; }\n"
                    "        location = /health { return 200 'ok'; }\n    }\n    "
                    % (ports[name], extra, self.pki["cert"], self.pki["key"], TLS_NAME,
                       TLS_GROUP, self.resp))
        conf = render("backends_nginx.conf.tmpl", os.path.join(self.dir, "backends.conf"),
                      DIR=self.dir, B1_PORT=b1, B1_H2C_PORT=b1h2, B2_PORT=b2, RESPONSE=self.resp,
                      TLS_SERVERS=tls_servers)
        log = os.path.join(self.dir, "backends-error.log")
        p = self.procs.start("backends(nginx)", ["nginx", "-p", self.dir, "-c", conf, "-e", log],
                             self.cpu_backends)
        for port in ports.values():
            wait_port(port, p, log)
        self.backend_ports = ports
        return p

    def pod_ports(self):
        """The two pods' ports as the proxies reach them (TLS ones with TLS to the pods)."""
        if self.tls_pods:
            return self.backend_ports["b1s"], self.backend_ports["b2s"]
        return self.backend_ports["b1"], self.backend_ports["b2"]

    # -- proxies -------------------------------------------------------------------------------
    def start_haproxy(self, matched, threads=1, hashing=False):
        """matched: pinned to the proxy's CPU with `threads` threads; else HAProxy's defaults.
        hashing: balance on a hash of the JSON prompt (what HAProxy offers for prefix affinity:
        it sees only what fits its buffer, here 512 KiB, as in bench/routing.py)."""
        tag = ("matched%d" % threads if matched else "default") + ("-hash" if hashing else "")
        port = free_port()
        if hashing:
            balance = ("option http-buffer-request\n    balance hash req.body,json_query('$.prompt'),"
                       "bytes(0,256)\n    hash-type consistent\n    hash-balance-factor 125")
            tune = "tune.bufsize 524288"
        else:
            balance, tune = "balance roundrobin", ""
        bind_ssl = server_ssl = ""
        ver = TLS_NAME
        if self.tls_front:
            bind_ssl = ("ssl crt %s alpn h2,http/1.1 ssl-min-ver %s ssl-max-ver %s curves %s"
                        % (self.pki["bundle"], ver, ver, TLS_GROUP))
        if self.tls_pods:
            server_ssl = ("ssl verify required ca-file %s sni str(localhost) verifyhost localhost "
                          "ssl-min-ver %s ssl-max-ver %s" % (self.pki["ca"], ver, ver))
        p1, p2 = self.pod_ports()
        conf = render("haproxy.cfg.tmpl", os.path.join(self.dir, "haproxy-%s.cfg" % tag),
                      NBTHREAD="nbthread %d" % threads if matched else "", PORT=port,
                      TUNE=tune, BALANCE=balance, MAXCONN=self.maxconn, BIND_SSL=bind_ssl,
                      SERVER_SSL=server_ssl, B1_PORT=p1, B2_PORT=p2)
        log = os.path.join(self.dir, "haproxy-%s.log" % tag)
        cpus = (self.cpu_proxy if threads == 1 else self.cpu_all) if matched else None
        with open(log, "w") as lf:
            p = self.procs.start("haproxy-" + tag, ["haproxy", "-db", "-f", conf], cpus,
                                 stdout=lf, stderr=lf)
        wait_port(port, p, log)
        return p, {"h1": port, "h2": port}, log

    def start_nginx(self, matched):
        tag = "matched" if matched else "default"
        h1, h2 = free_port(), free_port()
        for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(self.dir, "nginx-%s-tmp" % tag, d), exist_ok=True)
        server_ssl = proxy_ssl = ""
        if self.tls_front:
            server_ssl = ("ssl_certificate %s;\n        ssl_certificate_key %s;\n"
                          "        ssl_protocols %s;\n        ssl_ecdh_curve %s;"
                          % (self.pki["cert"], self.pki["key"], TLS_NAME, TLS_GROUP))
        if self.tls_pods:
            proxy_ssl = ("proxy_ssl_verify on;\n            proxy_ssl_trusted_certificate %s;\n"
                         "            proxy_ssl_name localhost;\n"
                         "            proxy_ssl_server_name on;\n"
                         "            proxy_ssl_protocols %s;\n"
                         "            proxy_ssl_session_reuse on;" % (self.pki["ca"], TLS_NAME))
        p1, p2 = self.pod_ports()
        conf = render("nginx.conf.tmpl", os.path.join(self.dir, "nginx-%s.conf" % tag),
                      DIR=self.dir, TAG=tag, WORKERS=1 if matched else "auto", H1_PORT=h1,
                      H2C_PORT=h2, B1_PORT=p1, B2_PORT=p2,
                      H1_LISTEN="ssl" if self.tls_front else "",
                      H2_LISTEN="ssl http2" if self.tls_front else "http2",
                      SERVER_SSL=server_ssl, SCHEME="https" if self.tls_pods else "http",
                      PROXY_SSL=proxy_ssl)
        log = os.path.join(self.dir, "nginx-%s-error.log" % tag)
        p = self.procs.start("nginx-" + tag, ["nginx", "-p", self.dir, "-c", conf, "-e", log],
                             self.cpu_proxy if matched else None)
        for port in (h1, h2):
            wait_port(port, p, log)
        return p, {"h1": h1, "h2": h2}, log

    def start_pcrouter(self, policy="cache_aware", workers=1, io_uring=True, binary=None,
                       batch_wait_us=None):
        """binary: another build's pcrouter (--before) instead of --build's. batch_wait_us:
        None leaves pcrouter's default."""
        tag = "%s-w%d%s%s%s" % (policy, workers, "" if io_uring else "-epoll",
                                "-before" if binary else "",
                                "" if batch_wait_us is None else "-bw%d" % batch_wait_us)
        conf = os.path.join(self.dir, "pcrouter-%s.json" % tag)
        listen = {"address": "127.0.0.1:0"}
        if self.tls_front:
            listen["tls"] = {"cert": self.pki["cert"], "key": self.pki["key"]}
        backends = []
        for name, port in zip(("b1", "b2"), self.pod_ports()):
            b = {"name": name, "url": "%s://127.0.0.1:%d" % (
                "https" if self.tls_pods else "http", port)}
            if self.tls_pods:
                b["tls"] = {"ca_file": self.pki["ca"], "server_name": "localhost"}
            backends.append(b)
        cfg = {
            "listen": [listen],
            "backends": backends,
            "workers": workers,
            "io_uring": io_uring,
            "routing": {"policy": policy},
            "limits": {"max_body_bytes": 4 << 20, "max_client_connections": self.maxconn},
            "timeouts": {"client_idle_ms": 900000},
            "log": {"access_log": False},
            "health": {"interval_ms": 1000},
            "scrape": {"interval_ms": 0, "models_interval_ms": 0},
        }
        if batch_wait_us is not None:
            cfg["batch_wait_us"] = batch_wait_us
        with open(conf, "w") as f:
            json.dump(cfg, f, indent=2)
        log = os.path.join(self.dir, "pcrouter-%s.log" % tag)
        # A private copy: the build folder is shared and may be relinked while the bench runs.
        exe = os.path.join(self.dir, "pcrouter-before" if binary else "pcrouter")
        if not os.path.exists(exe):
            shutil.copy2(binary or self.args.pcrouter, exe)
        argv = [exe, "-c", conf]
        if self.args.perf and policy == "cache_aware" and workers == 1 and io_uring and not binary:
            data = os.path.join(OUT_DIR, "perf-pcrouter%s.data" % (
                "" if self.mode == "plain" else "-" + self.mode))
            os.makedirs(OUT_DIR, exist_ok=True)
            argv = ["perf", "record", "-e", "cpu-clock", "-F", "999", "-g", "-o", data, "--"] + argv
        # workers 0 (one per CPU it may use) is the default-count row: unpinned, as HAProxy's.
        p = self.procs.start("pcrouter-" + tag, argv,
                             self.cpu_proxy if workers == 1 else
                             self.cpu_all if workers else None,
                             stderr=subprocess.PIPE)
        port_box, ready = [], threading.Event()

        def drain():
            # Reads stderr to the end so that pcrouter never blocks on a full pipe; the log is
            # kept for the report. The port comes from "listening on 127.0.0.1:PORT".
            with open(log, "w") as lf:
                for raw in p.stderr:
                    line = raw.decode(errors="replace")
                    lf.write(line)
                    lf.flush()
                    m = re.search(r"listening on (?:\[[^\]]*\]|[0-9.]+):(\d+)", line)
                    if m and not port_box:
                        port_box.append(int(m.group(1)))
                    if re.search(r"\bready\b", line):
                        ready.set()
            ready.set()   # EOF: pcrouter exited; the waiter below sees it

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(START_TIMEOUT) or p.poll() is not None or not port_box:
            p.poll()
            raise BenchError("pcrouter did not report 'listening on' and 'ready' within %.0f s "
                             "(exit status %s)%s" % (START_TIMEOUT, p.returncode, log_tail(log)))
        wait_port(port_box[0], p, log)
        return p, {"h1": port_box[0], "h2": port_box[0]}, log

    # -- checks --------------------------------------------------------------------------------
    def smoke(self, target):
        """One HTTP/1.1 POST and a few h2c ones (h2 over TLS) must get 200 with the stub's body."""
        if self.tls_front:
            ctx = ssl.create_default_context(cafile=self.pki["ca"])
            c = http.client.HTTPSConnection("127.0.0.1", target.ports["h1"], timeout=5,
                                            context=ctx)
        else:
            c = http.client.HTTPConnection("127.0.0.1", target.ports["h1"], timeout=5)
        try:
            c.request("POST", "/v1/completions", body=self.req,
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
        finally:
            c.close()
        if r.status != 200 or data.decode(errors="replace") != self.resp:
            raise BenchError("%s (HTTP/1.1): status %d, %d body bytes (expected 200, %d)"
                             % (target.label, r.status, len(data), len(self.resp)))
        res = self.run_h2load(target, n=8)
        if res["ok"] != 8:
            raise BenchError("%s (%s): %d of 8 requests got 2xx: %s"
                             % (target.label, self.proto_label("h2"), res["ok"], res["raw_tail"]))

    def proto_label(self, p):
        if self.tls_front:
            return "HTTP/1.1+TLS" if p == "h1" else "h2+TLS"
        return "HTTP/1.1" if p == "h1" else "h2c"

    def tls_check(self, target):
        """What a TLS client negotiates with target (version, cipher, group), from s_client:
        every proxy must give the same, or the rows would not compare like with like."""
        out = {}
        for p in ("h1", "h2"):
            r = subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % target.ports[p],
                                "-alpn", "h2,http/1.1" if p == "h2" else "http/1.1",
                                "-CAfile", self.pki["ca"]],
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               errors="replace", timeout=15)
            text = r.stdout + r.stderr
            ver = re.search(r"New, (TLSv[\d.]+), Cipher is (\S+)", text)
            grp = re.search(r"Server Temp Key: ([^,\s]+)", text)
            alpn = re.search(r"ALPN protocol: (\S+)", text)
            vfy = re.search(r"Verify return code: (\d+)", text)
            out[p] = "%s %s %s ALPN %s verify %s" % (
                ver.group(1) if ver else "?", ver.group(2) if ver else "?",
                grp.group(1) if grp else "?", alpn.group(1) if alpn else "-",
                "ok" if vfy and vfy.group(1) == "0" else "FAILED")
            want = "%s %s" % (TLS_NAME, TLS_GROUP)
            if not ver or ver.group(1) != TLS_NAME or not grp or grp.group(1) != TLS_GROUP:
                raise BenchError("%s (%s) negotiates %s, not %s" % (target.label, p, out[p], want))
            if p == "h2" and (not alpn or alpn.group(1) != "h2"):
                raise BenchError("%s (%s) does not select h2 by ALPN: %s" % (target.label, p, out[p]))
        return out

    # -- handshakes ----------------------------------------------------------------------------
    def run_s_time(self, target, reuse, duration):
        """openssl s_time against target's TLS port for `duration` seconds: new handshakes each
        time (-new) or the first session resumed (-reuse). Each connection asks for /health
        over HTTP/1.0, which every proxy answers itself (HAProxy's `http-request return`): a
        TLS 1.3 client has its session ticket only once it has read after the handshake.
        Returns the connections it made and how many of them resumed (s_time prints one 'r'
        per resumed one, '*' per full one)."""
        argv = ["openssl", "s_time", "-connect", "127.0.0.1:%d" % target.ports["h1"],
                "-reuse" if reuse else "-new", "-time", str(duration), "-tls1_3",
                "-www", "/health"]
        if self.procs.pin:
            argv = ["taskset", "-c", self.cpu_client] + argv
        t0 = time.monotonic()
        out = self._run(argv, duration)
        secs = time.monotonic() - t0
        m = re.search(r"(\d+) connections in ([\d.]+)s", out)
        if not m:
            raise BenchError("s_time gave no summary:\n" + out[-2000:])
        n = int(m.group(1))
        marks = re.findall(r"^([r*t3]+)$", out, re.M)
        resumed = sum(x.count("r") for x in marks)
        return {"handshakes": n, "resumed": resumed, "rps": n / secs if secs else 0.0,
                "requests": n, "ok": n, "errors": {}, "p50_ms": 0.0, "p99_ms": 0.0,
                "raw_tail": out[-600:]}

    # -- idle connections ----------------------------------------------------------------------
    def run_idle(self, target, proto):
        """RSS of the proxy's processes per idle keep-alive connection: args.idle connections
        opened (one POST each), held, measured, closed. Returns the figures."""
        pgid = target.proc.pid
        before = group_rss_kb(pgid)
        argv = [sys.executable, os.path.join(TEMPLATES, "idle_conns.py"), "--port",
                str(target.ports[proto]), "--count", str(self.idle), "--deadline",
                str(self.args.idle_deadline), "--body", self.req_file]
        if self.tls_front:
            argv.append("--tls")
        if proto == "h2":
            argv.append("--h2")
        if self.procs.pin:
            argv = ["taskset", "-c", self.cpu_client] + argv
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        line, box = "", []
        t = threading.Thread(target=lambda: box.append(p.stdout.readline()), daemon=True)
        t.start()
        t.join(self.args.idle_deadline + 30)
        line = box[0] if box else ""
        if line.startswith("OPEN"):
            time.sleep(self.args.idle_settle)  # a fixed idle time, the same for every proxy
        after = group_rss_kb(pgid)
        # One more request on each held connection: a proxy that closed some of them before
        # the RSS was read would show a figure too low, so those count as failed.
        again = ""
        try:
            if line.startswith("OPEN"):
                p.stdin.write("again\n")
                p.stdin.flush()
                box2 = []
                t2 = threading.Thread(target=lambda: box2.append(p.stdout.readline()), daemon=True)
                t2.start()
                t2.join(self.args.idle_deadline + 30)
                again = box2[0] if box2 else ""
            p.stdin.write("\n")
            p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
        m = re.search(r"OPEN (\d+) FAILED (\d+)(.*)", line)
        if not m:
            raise BenchError("idle_conns.py gave no count: %r" % line)
        n, failed = int(m.group(1)), int(m.group(2))
        a = re.search(r"AGAIN (\d+) FAILED (\d+)", again)
        return {"open": n, "failed": failed, "error": m.group(3).strip(),
                "again_ok": int(a.group(1)) if a else None,
                "rss_before_kb": before, "rss_after_kb": after,
                "bytes_per_conn": (after - before) * 1024.0 / n if n else 0.0}

    # -- load generators -----------------------------------------------------------------------
    def wrk_script(self):
        path = os.path.join(self.dir, "post.lua")
        body = self.req.decode()
        with open(path, "w") as f:
            f.write('wrk.method = "POST"\n'
                    'wrk.headers["Content-Type"] = "application/json"\n'
                    'wrk.body = [==[%s]==]\n'
                    'function done(s, latency, requests)\n'
                    '  local e = s.errors\n'
                    '  io.write(string.format("PCRBENCH %%d %%d %%d %%d %%d %%d %%d %%d %%d\\n",\n'
                    '    s.requests, s.duration, e.connect, e.read, e.write, e.status,\n'
                    '    e.timeout, latency:percentile(50), latency:percentile(99)))\n'
                    'end\n' % body)
        return path

    def run_wrk(self, target, duration):
        argv = ["wrk", "-t1", "-c%d" % self.args.h1_conns, "-d%ds" % duration, "--timeout", "5s",
                "-s", self.lua, "%s://127.0.0.1:%d/v1/completions" % (self.scheme,
                                                                     target.ports["h1"])]
        if self.procs.pin:
            argv = ["taskset", "-c", self.cpu_client] + argv
        out = self._run(argv, duration)
        m = re.search(r"^PCRBENCH (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)",
                      out, re.M)
        if not m:
            raise BenchError("wrk gave no summary:\n" + out[-2000:])
        req, dur_us, e_conn, e_read, e_write, e_status, e_timeout, p50, p99 = map(int, m.groups())
        errors = {"connect": e_conn, "read": e_read, "write": e_write, "status_ge_400": e_status,
                  "timeout": e_timeout}
        return {"rps": req / (dur_us / 1e6) if dur_us else 0.0, "requests": req,
                "ok": req - e_status, "p50_ms": p50 / 1000.0, "p99_ms": p99 / 1000.0,
                "errors": errors, "raw_tail": out[-600:]}

    def run_h2load(self, target, duration=None, n=None, rate=None, proto="h2"):
        """h2load against the target: for `duration` s at full speed (-c/-m of the args), for
        `n` requests (a smoke run), or with `rate` = (clients, requests a second each), one
        request at a time per client, over `proto` (h1 or h2)."""
        logf = os.path.join(self.dir, "h2load.log")
        if os.path.exists(logf):
            os.unlink(logf)
        argv = ["h2load", "-t1", "-H", "content-type: application/json", "-d", self.req_file,
                "--log-file", logf]
        if rate:
            argv += ["-c%d" % rate[0], "-m1", "--rps", str(rate[1]), "-D", str(duration)]
        elif duration:
            argv += ["-c%d" % self.args.h2_conns, "-m%d" % self.args.h2_streams,
                     "-D", str(duration)]
        else:
            argv += ["-c1", "-m4", "-n%d" % n]
        if proto == "h1":
            argv.append("--h1")
        # https: h2load offers ALPN h2 (its default list), which every TLS row must select.
        argv.append("%s://127.0.0.1:%d/v1/completions" % (self.scheme, target.ports[proto]))
        if self.procs.pin:
            argv = ["taskset", "-c", self.cpu_client] + argv
        out = self._run(argv, duration or 5)
        m = re.search(r"finished in ([\d.]+)(us|ms|s), ([\d.]+) req/s", out)
        rq = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                       r"(\d+) failed, (\d+) errored, (\d+) timeout", out)
        sc = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
        if not (m and rq and sc):
            raise BenchError("h2load gave no summary:\n" + out[-2000:])
        times, statuses = [], {}
        if os.path.exists(logf):
            with open(logf) as f:
                for line in f:
                    parts = line.split("\t")
                    if len(parts) >= 3:
                        statuses[parts[1]] = statuses.get(parts[1], 0) + 1
                        times.append(int(parts[2]))
        times.sort()
        total, started, done, ok_, failed, errored, timeout = map(int, rq.groups())
        # With -D, the streams still in flight when the time is up are cancelled and counted as
        # started but not done: that is how h2load stops, not an error of the target.
        errors = {"failed": failed, "errored": errored, "timeout": timeout,
                  "3xx": int(sc.group(2)), "4xx": int(sc.group(3)), "5xx": int(sc.group(4))}
        return {"rps": float(m.group(3)), "requests": done, "ok": min(done, int(sc.group(1))),
                "p50_ms": percentile(times, 50) / 1000.0, "p99_ms": percentile(times, 99) / 1000.0,
                "errors": errors, "statuses": statuses, "raw_tail": out[-600:]}

    def _run(self, argv, duration):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                               timeout=duration + RUN_SLACK, start_new_session=True)
        except subprocess.TimeoutExpired as e:
            raise BenchError("%s did not finish within %.0f s" % (argv[0], duration + RUN_SLACK))
        return r.stdout + r.stderr


def rotation(targets, reps, kinds):
    """(rep, kind, target, last) for every repetition, kind and target: each repetition starts
    one target further, so that none always runs first (a slow drift of the machine then falls
    on every target alike); `last` marks the repetition's last run."""
    for rep in range(reps):
        order = targets[rep % len(targets):] + targets[:rep % len(targets)]
        for i, kind in enumerate(kinds):
            for j, t in enumerate(order):
                yield rep, kind, t, i == len(kinds) - 1 and j == len(order) - 1


def paired_ratios(pcr_runs, runs):
    """Median over repetitions of pcrouter's figure over the target's in the same repetition:
    less exposed to slow drifts of the machine than the ratio of the medians. A virtual machine
    can run everything 20% slower for a minute and then fast again: the medians of two targets
    can then come from different speeds, while the two runs of one repetition, back to back,
    mostly share one (paired_per_core_ratio: the target's CPU per request over pcrouter's)."""
    by_rep = {r["rep"]: r for r in runs}
    rps, p99, core = [], [], []
    for r in pcr_runs:
        o = by_rep.get(r["rep"])
        if o and o["rps"]:
            rps.append(r["rps"] / o["rps"])
            if r["p99_ms"] and o["p99_ms"]:   # none for handshakes
                p99.append(r["p99_ms"] / o["p99_ms"])
            if r.get("cpu_us_per_req") and o.get("cpu_us_per_req"):
                core.append(o["cpu_us_per_req"] / r["cpu_us_per_req"])
    if not rps:
        return {}
    out = {"paired_rps_ratio": statistics.median(rps),
           "paired_p99_ratio": statistics.median(p99) if p99 else None}
    if core:
        out["paired_per_core_ratio"] = statistics.median(core)
        out["per_rep_per_core_ratios"] = core
    return out


def percentile(sorted_values, p):
    """Nearest-rank percentile of an already sorted list (0 for an empty one)."""
    if not sorted_values:
        return 0
    k = max(0, min(len(sorted_values) - 1, int(-(-p * len(sorted_values) // 100)) - 1))
    return sorted_values[k]


# ----------------------------------------------------------------------------------------------
# Main

def find_pcrouter(build):
    for rel in ("pcrouter", "router/pcrouter"):
        path = os.path.join(build, rel)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    quick = os.environ.get("QUICK", "") not in ("", "0")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="meson build folder")
    ap.add_argument("--reps", type=int, default=2 if quick else 5)
    ap.add_argument("--duration", type=int, default=2 if quick else 5,
                    help="seconds per load run")
    ap.add_argument("--h1-conns", type=int, default=32, help="wrk connections")
    ap.add_argument("--h2-conns", type=int, default=4, help="h2load connections")
    ap.add_argument("--h2-streams", type=int, default=16, help="h2load streams per connection")
    ap.add_argument("--pin", choices=("split", "none"), default="split",
                    help="split: load generator and backends on CPU 0, proxy on CPU 1")
    ap.add_argument("--defaults", action="store_true",
                    help="add HAProxy/nginx rows at their default thread/worker counts")
    ap.add_argument("--no-two-threads", dest="two_threads", action="store_false",
                    help="skip the 2-worker / nbthread 2 rows")
    ap.add_argument("--bodies", default="2048,32768",
                    help="request body sizes in bytes, comma-separated (e.g. 2048,32768,262144)")
    ap.add_argument("--perf", action="store_true",
                    help="record a perf profile (cpu-clock) of pcrouter cache_aware, 1 worker, "
                         "into bench/out/perf-pcrouter.data")
    ap.add_argument("--only", default="", help="comma-separated target names (debugging)")
    ap.add_argument("--before", metavar="DIR", default="",
                    help="also run DIR's pcrouter (another build folder) as cache_aware, 1 "
                         "worker: an A/B of two builds in one run")
    ap.add_argument("--protos", default="h1,h2",
                    help="comma-separated protocols to load: h1 (wrk), h2 (h2load, h2c); one "
                         "alone keeps a --perf profile to that protocol")
    ap.add_argument("--modes", default="plain",
                    help="comma-separated: plain, tls (clients to the proxy), tls-pods (the "
                         "proxy to the pods, verified), tls-both")
    ap.add_argument("--tls", action="store_true", help="short for --modes tls,tls-pods")
    ap.add_argument("--threads", default="1",
                    help="1, default or 1,default: the default-count rows are pcrouter "
                         "workers 0 against HAProxy's default nbthread (and nginx auto)")
    ap.add_argument("--matrix", action="store_true",
                    help="every mode pinned (split) and unpinned (none), at 1 thread and the "
                         "default count; the variant rows (hash, round_robin, epoll, 2 "
                         "threads) are left out unless --only names them")
    ap.add_argument("--handshakes", action="store_true",
                    help="TLS modes: new and resumed handshakes per proxy CPU-second "
                         "(openssl s_time -new / -reuse, --duration each)")
    ap.add_argument("--idle", type=int, default=0, metavar="N",
                    help="memory per idle keep-alive connection with N connections (HTTP/1.1, "
                         "and h2 in TLS modes) on each proxy")
    ap.add_argument("--idle-deadline", type=float, default=300.0,
                    help="seconds the idle client gets to open its connections")
    ap.add_argument("--idle-settle", type=float, default=2.0,
                    help="seconds the connections stay idle, all open, before the RSS is read: "
                         "what a proxy frees from an idle connection after a while counts "
                         "(pcrouter after 1 s)")
    ap.add_argument("--latency", type=int, default=0, metavar="RPS",
                    help="also the latency each proxy adds at a moderate, fixed rate: RPS "
                         "requests a second in all from 16 clients (h2load --rps), against "
                         "the direct row")
    ap.add_argument("--latency-only", action="store_true",
                    help="with --latency: skip the full-speed runs (and their targets)")
    ap.add_argument("--json", default=os.path.join(OUT_DIR, "proxies.json"))
    a = ap.parse_args()
    a.modes = ["tls", "tls-pods"] if a.tls and a.modes == "plain" else \
        [x for x in a.modes.split(",") if x]
    if not a.modes or set(a.modes) - set(MODES):
        ap.error("--modes: some of %s, comma-separated" % ", ".join(MODES))
    if a.latency_only and not a.latency:
        ap.error("--latency-only needs --latency RPS")
    a.threads = [x for x in a.threads.split(",") if x]
    if not a.threads or set(a.threads) - {"1", "default"}:
        ap.error("--threads: 1, default or both")
    a.pins = [a.pin]
    if a.matrix:
        a.pins, a.threads, a.two_threads = ["split", "none"], ["1", "default"], False
    a.quick = quick
    a.build = os.path.abspath(a.build)
    a.pcrouter = find_pcrouter(a.build)
    a.bodies = [int(x) for x in a.bodies.split(",") if x]
    a.protos = [x for x in a.protos.split(",") if x]
    if not a.protos or set(a.protos) - {"h1", "h2"}:
        ap.error("--protos: h1, h2 or both, comma-separated")
    a.before_exe = find_pcrouter(os.path.abspath(a.before)) if a.before else None
    if a.before and a.before_exe is None:
        ap.error("--before %s: no pcrouter binary there" % a.before)
    return a


def fmt_ratio(x):
    return "%.2f" % x if x else "-"


def main():
    args = parse_args()
    tools = ("nginx", "haproxy", "wrk", "h2load") + (("taskset",) if "split" in args.pins else ())
    if args.modes != ["plain"] or args.handshakes:
        tools += ("openssl",)
    for tool in tools:
        if not shutil.which(tool):
            print("bench/proxies.py: %s not found (make deps-bench installs it)" % tool,
                  file=sys.stderr)
            return 2
    if os.cpu_count() and os.cpu_count() < 2:
        args.pins = ["none"]

    # SIGTERM/SIGINT unwind through the finally below, which stops every process.
    def on_signal(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_signal)

    configs = []
    for pin in args.pins:
        for mode in args.modes:
            if len(args.pins) * len(args.modes) > 1:
                print("=" * 100 + "\n%s, %s\n" % (MODE_TEXT[mode], PIN_TEXT[pin]) + "=" * 100,
                      flush=True)
            b = Bench(args, pin, mode)
            anomalies, notes = [], []
            try:
                configs.append(run(b, args, anomalies, notes))
            except BenchError as e:
                print("bench/proxies.py: %s" % e, file=sys.stderr)
                return 1
            except KeyboardInterrupt:
                print("bench/proxies.py: interrupted", file=sys.stderr)
                return 130
            finally:
                b.procs.stop_all()
                if os.environ.get("KEEP_TMP"):
                    print("kept %s" % b.dir, file=sys.stderr)
                else:
                    shutil.rmtree(b.dir, ignore_errors=True)
    if len(configs) > 1 or args.handshakes or args.idle or "default" in args.threads:
        matrix_report(args, configs)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(configs[0] if len(configs) == 1 else {"configs": configs}, f, indent=1)
    print("\nwrote %s" % os.path.relpath(args.json, ROOT))
    return 0


MODE_TEXT = {"plain": "plain text both ways", "tls": "TLS from the clients, plain to the pods",
             "tls-pods": "plain from the clients, TLS to the pods (verified)",
             "tls-both": "TLS from the clients and to the pods"}
PIN_TEXT = {"split": "pinned (--pin split)", "none": "unpinned (--pin none): shared cores"}
# pcrouter's row and HAProxy's it is paired with, per thread count.
PAIRS = (("pcrouter", "haproxy", "1 thread"), ("pcrouter_w0", "haproxy_default", "default"))


def pair_rows(b, results, protos, size):
    """pcrouter over HAProxy, requests per proxy CPU-second, paired by repetition."""
    rows = []
    for pcr, ha, threads in PAIRS:
        for p in protos:
            pr = paired_ratios(results.get(pcr, {}).get(p, []), results.get(ha, {}).get(p, []))
            if "paired_per_core_ratio" in pr:
                rows.append({"pin": b.pin, "mode": b.mode, "threads": threads,
                             "what": "%s %d B" % (b.proto_label(p), size),
                             "ratio": pr["paired_per_core_ratio"],
                             "reps": pr["per_rep_per_core_ratios"],
                             "rps_ratio": pr["paired_rps_ratio"],
                             "p99_ratio": pr["paired_p99_ratio"]})
    return rows


def matrix_report(args, configs):
    print("\n" + "=" * 100)
    print("pcrouter over HAProxy 2.6, paired by repetition (median of the per-repetition ratios;"
          "\neach repetition's in brackets): requests (handshakes) per proxy CPU-second; "
          "req/s and p99 beside")
    print("%-6s %-9s %-9s %-30s %6s  %-26s %6s %6s" % ("pin", "mode", "threads", "row", "ratio",
                                                     "per repetition", "req/s", "p99"))
    for c in configs:
        for r in c.get("pairs", []):
            print("%-6s %-9s %-9s %-30s %5.2fx  %-26s %6s %6s"
                  % (r["pin"], r["mode"], r["threads"], r["what"], r["ratio"],
                     "(" + " ".join("%.2f" % x for x in r["reps"]) + ")",
                     fmt_ratio(r.get("rps_ratio")), fmt_ratio(r.get("p99_ratio"))))
    idle = [(c["settings"]["pin"], c["settings"]["mode"], row) for c in configs
            for row in c.get("idle", [])]
    if idle:
        print("\nIdle keep-alive connections (%d asked): proxy RSS per connection, one POST "
              "made on each" % args.idle)
        for pin, mode, row in idle:
            print("%-6s %-9s %-34s %-12s %6d open %5d failed %8.0f B/conn"
                  % (pin, mode, row["label"], row["proto"], row["open"], row["failed"],
                     row["bytes_per_conn"]))
    if args.quick:
        print("\nQUICK run: smoke figures, not a measurement.")


def set_body(b, size):
    """Every load generator posts this body from now on."""
    b.req = request_body(size)
    b.req_file = os.path.join(b.dir, "request-%d.json" % size)
    with open(b.req_file, "wb") as f:
        f.write(b.req)
    b.lua = b.wrk_script()


def make_targets(b, args):
    direct = Target("direct", "direct (backend 1)")
    if b.tls_front:
        direct.ports = {"h1": b.backend_ports["b1s"], "h2": b.backend_ports["b1_h2s"]}
    else:
        direct.ports = {"h1": b.backend_ports["b1"], "h2": b.backend_ports["b1_h2c"]}
    targets = [direct,
               Target("haproxy", "HAProxy round robin, 1 thread", lambda: b.start_haproxy(True)),
               Target("haproxy_hash", "HAProxy JSON hash, 1 thread",
                      lambda: b.start_haproxy(True, hashing=True)),
               Target("nginx", "nginx round robin, 1 worker", lambda: b.start_nginx(True))]
    if args.pcrouter:
        targets += [Target("pcrouter", "pcrouter cache_aware, 1 worker", b.start_pcrouter),
                    Target("pcrouter_rr", "pcrouter round_robin, 1 worker",
                           lambda: b.start_pcrouter("round_robin")),
                    Target("pcrouter_epoll", "pcrouter cache_aware, 1 worker, io_uring off",
                           lambda: b.start_pcrouter(io_uring=False)),
                    Target("pcrouter_nowait", "pcrouter cache_aware, 1 worker, batch_wait_us 0",
                           lambda: b.start_pcrouter(batch_wait_us=0))]
        if args.before:
            targets.append(Target("pcrouter_before", "pcrouter cache_aware, 1 worker, --before",
                                  lambda: b.start_pcrouter(binary=args.before_exe)))
    if args.two_threads:
        targets.append(Target("haproxy_t2", "HAProxy round robin, 2 threads",
                              lambda: b.start_haproxy(True, threads=2)))
        if args.pcrouter:
            targets.append(Target("pcrouter_w2", "pcrouter cache_aware, 2 workers",
                                  lambda: b.start_pcrouter(workers=2)))
    if args.defaults or "default" in args.threads:
        targets += [Target("haproxy_default", "HAProxy default nbthread",
                           lambda: b.start_haproxy(False)),
                    Target("nginx_default", "nginx workers auto", lambda: b.start_nginx(False))]
    if "default" in args.threads and args.pcrouter:
        targets.append(Target("pcrouter_w0", "pcrouter cache_aware, workers 0 (default)",
                              lambda: b.start_pcrouter(workers=0)))
    if args.only:
        keep = set(args.only.split(","))
        targets = [t for t in targets if t.name in keep]
    elif b.mode != "plain" or args.matrix:
        # The TLS and matrix rows: the proxies at their thread counts, not the variants.
        keep = {"direct", "haproxy", "nginx", "pcrouter", "pcrouter_before", "haproxy_t2",
                "pcrouter_w2", "haproxy_default", "nginx_default", "pcrouter_w0"}
        targets = [t for t in targets if t.name in keep]
    return targets


def run(b, args, anomalies, notes):
    backends = b.start_backends()
    targets = make_targets(b, args)
    if not args.pcrouter:
        notes.append("pcrouter not found in %s (build it: ninja -C %s): its rows are missing"
                     % (args.build, args.build))
    set_body(b, args.bodies[0])
    negotiated = {}
    for t in list(targets):
        try:
            if t.starter:
                t.start()
            b.smoke(t)
            if b.tls_front:
                negotiated[t.name] = b.tls_check(t)
        except BenchError as e:
            if not t.name.startswith("pcrouter"):
                raise
            # The router is the thing being built: say what went wrong and still measure the rest.
            anomalies.append("%s left out: %s" % (t.label, e))
            if t.proc:
                b.procs.stop(t.proc)
            targets.remove(t)

    versions = {"haproxy": tool_version(["haproxy", "-v"]),
                "nginx": tool_version(["nginx", "-v"]),
                "wrk": tool_version(["wrk", "--version"]).split(" Copyright")[0],
                "h2load": tool_version(["h2load", "--version"]),
                "pcrouter": tool_version([args.pcrouter, "--version"]) if args.pcrouter else "-"}
    header(b, args, versions, targets)
    for name, n in negotiated.items():
        print("  TLS %-16s h1: %s; h2: %s" % (name, n["h1"], n["h2"]))
    if negotiated:
        print(flush=True)

    protos = tuple(p for p in ("h1", "h2") if p in args.protos)
    summaries, all_results, pairs = {}, {}, []
    for size in [] if args.latency_only else args.bodies:
        set_body(b, size)
        for t in targets:
            if t.name != "direct":
                b.smoke(t)
        # Warm-up: one short run per target and protocol, so pools and caches are filled.
        for t in targets:
            if "h1" in protos:
                b.run_wrk(t, 1)
            if "h2" in protos:
                b.run_h2load(t, duration=1)
        results = {t.name: {p: [] for p in protos} for t in targets}
        for rep, proto, t, last in rotation(targets, args.reps, protos):
            if not t.alive():
                restart(t, anomalies, rep, proto, b)
            pgid = (t.proc or backends).pid
            cpu0 = group_cpu_seconds(pgid)
            r = b.run_wrk(t, args.duration) if proto == "h1" else \
                b.run_h2load(t, duration=args.duration)
            cpu1 = group_cpu_seconds(pgid)
            user, system = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
            per = 1e6 / r["requests"] if r["requests"] else 0.0
            r["cpu_us_per_req"] = (user + system) * per
            # The split says where a difference lies: the proxy's own code, or the kernel's
            # work for it (system calls, TCP).
            r["cpu_user_us_per_req"] = user * per
            r["cpu_sys_us_per_req"] = system * per
            r["rep"] = rep
            results[t.name][proto].append(r)
            bad = {k: v for k, v in r["errors"].items() if v}
            if bad or r["ok"] < r["requests"]:
                anomalies.append("%s %s %d B rep %d: %d requests, %d 2xx, errors %s"
                                 % (t.label, b.proto_label(proto), len(b.req), rep + 1,
                                    r["requests"], r["ok"], bad))
            if not t.alive():
                restart(t, anomalies, rep, proto, b)
            if last:
                print("  %d B bodies: repetition %d/%d done" % (len(b.req), rep + 1, args.reps),
                      flush=True)
        summaries[size] = report(b, targets, results, protos, len(b.req))
        pairs += pair_rows(b, results, protos, len(b.req))
        for t in targets:
            for p in protos:
                for r in results[t.name][p]:
                    r.pop("raw_tail", None)
        all_results[size] = results
    handshakes = run_handshakes(b, args, targets, backends, anomalies, pairs) \
        if args.handshakes and b.tls_front else {}
    idle = run_idle_rows(b, args, targets, anomalies) if args.idle else []
    latency = run_latency(b, args, targets, anomalies) if args.latency else {}
    if backends.poll() is not None:
        anomalies.append("the stub backends exited (status %s)" % backends.returncode)
    verdicts = targets_report(b, summaries)
    for n in notes:
        print("note: " + n)
    if anomalies:
        print("\nAnomalies (errors, non-2xx, crashes):")
        for a in anomalies:
            print("  " + a)
    else:
        print("\nNo errors, non-2xx responses or crashes on any target.")
    return {"settings": {"reps": args.reps, "duration_s": args.duration,
                                "quick": args.quick, "pin": b.pin, "mode": b.mode,
                                "tls": "%s %s, ECDSA P-256" % (TLS_NAME, TLS_GROUP)
                                       if b.pki else None,
                                "bodies": args.bodies,
                                "h1": "wrk -t1 -c%d" % args.h1_conns,
                                "h2": "h2load -t1 -c%d -m%d" % (args.h2_conns, args.h2_streams),
                                "response_bytes": len(b.resp),
                                "loadavg_end": os.getloadavg()},
                   "versions": versions, "summary": {str(k): v for k, v in summaries.items()},
                   "verdicts": verdicts, "runs": {str(k): v for k, v in all_results.items()},
                   "negotiated": negotiated, "pairs": pairs, "handshakes": handshakes,
                   "idle": idle, "latency": latency, "anomalies": anomalies, "notes": notes}


def measured(t, backends, fn):
    """fn()'s result with the CPU time the target's processes spent meanwhile."""
    pgid = (t.proc or backends).pid
    cpu0 = group_cpu_seconds(pgid)
    r = fn()
    cpu1 = group_cpu_seconds(pgid)
    r["cpu_s"] = (cpu1[0] - cpu0[0]) + (cpu1[1] - cpu0[1])
    r["cpu_us_per_req"] = r["cpu_s"] * 1e6 / r["requests"] if r["requests"] else 0.0
    return r


def run_handshakes(b, args, targets, backends, anomalies, pairs):
    """New and resumed TLS handshakes per proxy CPU-second, apart from requests: openssl
    s_time -new / -reuse, each target once per repetition in a rotated order."""
    results = {t.name: {"new": [], "reuse": []} for t in targets}
    for rep, kind, t, last in rotation(targets, args.reps, ("new", "reuse")):
        if not t.alive():
            restart(t, anomalies, rep, "handshakes", b)
        r = measured(t, backends, lambda: b.run_s_time(t, kind == "reuse", args.duration))
        r["rep"] = rep
        if kind == "reuse" and r["handshakes"] and r["resumed"] < r["handshakes"] - 1:
            anomalies.append("%s: %d of %d -reuse handshakes resumed (rep %d)"
                             % (t.label, r["resumed"], r["handshakes"], rep + 1))
        results[t.name][kind].append(r)
        if last:
            print("  handshakes: repetition %d/%d done" % (rep + 1, args.reps), flush=True)
    print("\nTLS handshakes (openssl s_time -tls1_3, one at a time), medians")
    print("%-42s %-8s %9s %9s %10s %12s" % ("target", "kind", "hs/s", "resumed", "CPU us/hs",
                                            "hs/CPU-s"))
    out = {}
    for t in targets:
        for kind in ("new", "reuse"):
            rs = results[t.name][kind]
            if not rs:
                continue
            cpu = statistics.median(r["cpu_us_per_req"] for r in rs)
            m = {"hs_per_s": statistics.median(r["rps"] for r in rs),
                 "resumed_share": statistics.median(r["resumed"] / r["handshakes"]
                                                    if r["handshakes"] else 0 for r in rs),
                 "cpu_us_per_hs": cpu, "hs_per_cpu_s": 1e6 / cpu if cpu else 0.0}
            out.setdefault(t.name, {})[kind] = dict(m, runs=rs)
            print("%-42s %-8s %9.0f %8.0f%% %10.1f %12.0f"
                  % (t.label, kind, m["hs_per_s"], 100 * m["resumed_share"], cpu,
                     m["hs_per_cpu_s"]))
    for pcr, ha, threads in PAIRS:
        for kind in ("new", "reuse"):
            pr = paired_ratios(results.get(pcr, {}).get(kind, []),
                               results.get(ha, {}).get(kind, []))
            if "paired_per_core_ratio" in pr:
                pairs.append({"pin": b.pin, "mode": b.mode, "threads": threads,
                              "what": "%s handshakes" % ("resumed" if kind == "reuse" else "new"),
                              "ratio": pr["paired_per_core_ratio"],
                              "reps": pr["per_rep_per_core_ratios"],
                              "rps_ratio": pr["paired_rps_ratio"]})
    return out


LATENCY_CLIENTS = 16


def run_latency(b, args, targets, anomalies):
    """Latency at a moderate, fixed rate (--latency requests a second in all, from 16 clients
    one request at a time each: h2load --rps, HTTP/1.1 and h2c), every target once per
    repetition in a rotated order. What a proxy adds is its p50 and p99 less the direct row's
    of the same repetition; the medians over repetitions are compared with HAProxy's."""
    rate = (LATENCY_CLIENTS, max(1, args.latency // LATENCY_CLIENTS))
    protos = [p for p in ("h1", "h2") if p in args.protos]
    results = {t.name: {p: [] for p in protos} for t in targets}
    for rep, proto, t, last in rotation(targets, args.reps, protos):
        if not t.alive():
            restart(t, anomalies, rep, "latency", b)
        r = b.run_h2load(t, duration=args.duration, rate=rate, proto=proto)
        r["rep"] = rep
        bad = {k: v for k, v in r["errors"].items() if v}
        if bad or r["ok"] < r["requests"]:
            anomalies.append("%s latency %s rep %d: %d requests, %d 2xx, errors %s"
                             % (t.label, b.proto_label(proto), rep + 1, r["requests"], r["ok"],
                                bad))
        r.pop("raw_tail", None)
        results[t.name][proto].append(r)
        if last:
            print("  latency: repetition %d/%d done" % (rep + 1, args.reps), flush=True)
    print("\nLatency at %d requests a second (%d clients x %d, one request at a time), %d B "
          "bodies, medians; added: less direct's in the same repetition"
          % (rate[0] * rate[1], rate[0], rate[1], len(b.req)))
    print("%-42s %-10s %8s %8s %9s %9s %8s" % ("target", "protocol", "req/s", "p50 ms", "p99 ms",
                                              "+p50 ms", "+p99 ms"))
    out = {}
    for proto in protos:
        direct = {r["rep"]: r for r in results.get("direct", {}).get(proto, [])}
        for t in targets:
            rs = results[t.name][proto]
            if not rs:
                continue
            add50 = [r["p50_ms"] - direct[r["rep"]]["p50_ms"] for r in rs if r["rep"] in direct]
            add99 = [r["p99_ms"] - direct[r["rep"]]["p99_ms"] for r in rs if r["rep"] in direct]
            m = {"rps": statistics.median(r["rps"] for r in rs),
                 "p50_ms": statistics.median(r["p50_ms"] for r in rs),
                 "p99_ms": statistics.median(r["p99_ms"] for r in rs),
                 "added_p50_ms": statistics.median(add50) if add50 else None,
                 "added_p99_ms": statistics.median(add99) if add99 else None}
            out.setdefault(t.name, {})[proto] = dict(m, runs=rs)
            print("%-42s %-10s %8.0f %8.3f %9.3f %9s %8s"
                  % (t.label, b.proto_label(proto), m["rps"], m["p50_ms"], m["p99_ms"],
                     "-" if m["added_p50_ms"] is None else "%.3f" % m["added_p50_ms"],
                     "-" if m["added_p99_ms"] is None else "%.3f" % m["added_p99_ms"]))
        print()
    for pcr, ha, threads in PAIRS:
        for proto in protos:
            a, h = out.get(pcr, {}).get(proto), out.get(ha, {}).get(proto)
            if not a or not h or a["added_p50_ms"] is None or h["added_p50_ms"] is None:
                continue
            met = a["added_p50_ms"] <= h["added_p50_ms"] and a["added_p99_ms"] <= h["added_p99_ms"]
            print("  %s %s, %s: added p50 / p99 %.3f / %.3f ms against HAProxy's %.3f / %.3f: "
                  "%s" % (b.proto_label(proto), threads, b.pin, a["added_p50_ms"],
                          a["added_p99_ms"], h["added_p50_ms"], h["added_p99_ms"],
                          "met" if met else "missed"))
            paired_latency(a, h, "pcrouter")
            # The variants (--before, batch_wait_us 0, ...) against the same HAProxy rows.
            if pcr == "pcrouter":
                for t in targets:
                    v = out.get(t.name, {}).get(proto)
                    if t.name.startswith("pcrouter_") and t.name != "pcrouter_w0" and v:
                        paired_latency(v, h, t.label)
    return out


def paired_latency(a, h, label):
    """a's p50 and p99 less HAProxy's, paired by repetition: the two ran back to back, so the
    machine's drift over the run cancels (direct's figure too). Negative: `a` adds less."""
    hr = {r["rep"]: r for r in h["runs"]}
    for q in ("p50_ms", "p99_ms"):
        d = [r[q] - hr[r["rep"]][q] for r in a["runs"] if r["rep"] in hr]
        if d:
            print("    %s, %s less HAProxy, paired: median %+.3f ms; at or below in %d of %d "
                  "repetitions" % (q[:3], label, statistics.median(d), sum(x <= 0 for x in d),
                                   len(d)))


def run_idle_rows(b, args, targets, anomalies):
    """Memory per idle keep-alive connection, each proxy restarted before each protocol so that
    the figure is not what an earlier run left in its allocator."""
    rows = []
    protos = ("h1", "h2") if b.tls_front else ("h1",)
    if b.idle < args.idle:
        print("note: %d idle connections, not %d: the hard descriptor limit (%d) caps HAProxy"
              % (b.idle, args.idle, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    for t in targets:
        if t.name not in ("pcrouter", "haproxy", "nginx", "pcrouter_w0", "haproxy_default",
                          "nginx_default"):
            continue
        for p in protos:
            b.procs.stop(t.proc)
            t.start()
            b.smoke(t)
            try:
                r = b.run_idle(t, p)
            except BenchError as e:
                anomalies.append("%s idle %s: %s" % (t.label, p, e))
                continue
            if r["failed"]:
                anomalies.append("%s idle %s: %d connections failed (%s)"
                                 % (t.label, b.proto_label(p), r["failed"], r["error"]))
            if r["again_ok"] is None or r["again_ok"] < r["open"]:
                anomalies.append("%s idle %s: %s of %d held connections served a second request "
                                 "after the RSS was read" % (t.label, b.proto_label(p),
                                                             r["again_ok"], r["open"]))
            r.update(label=t.label, proto=b.proto_label(p), target=t.name)
            rows.append(r)
            print("  idle %-40s %-12s %6d open: %.0f bytes of RSS a connection"
                  % (t.label, b.proto_label(p), r["open"], r["bytes_per_conn"]), flush=True)
    return rows


def restart(t, anomalies, rep, proto, b):
    anomalies.append("%s died during rep %d (%s), exit status %s%s"
                     % (t.label, rep + 1, proto, t.proc.returncode, log_tail(t.log)))
    t.crashes.append(rep)
    b.procs.stop(t.proc)
    t.start()


def header(b, args, versions, targets):
    pin = ("taskset: wrk/h2load and the stub backends on CPU 0, a one-thread proxy on CPU 1, a "
           "two-thread one on both, default-count ones unpinned" if b.pin == "split" else
           "no CPU pinning: load generator, pods and proxy share every core")
    print("Proxy benchmark: 2 stub backends (one nginx, 1 worker, fixed reply); %s"
          % MODE_TEXT[b.mode])
    if b.pki:
        print("  TLS: %s, %s, one ECDSA P-256 certificate for every proxy and pod%s"
              % (TLS_NAME, TLS_GROUP, "; pods verified against the bench CA (HAProxy `ssl verify "
                 "required ... sni str(localhost)`, pcrouter https:// with tls.ca_file)"
                 if b.tls_pods else ""))
    print("  %s%s" % ("QUICK run: " if args.quick else "",
                      "%d repetitions x %d s per target and protocol, targets rotated per "
                      "repetition; medians shown" % (args.reps, args.duration)))
    print("  POST /v1/completions, request bodies of %s bytes, response %d B"
          % (", ".join(str(x) for x in args.bodies), len(b.resp)))
    print("  %s: wrk -t1 -c%d; %s: h2load -t1 -c%d -m%d (%s)"
          % (b.proto_label("h1"), args.h1_conns, b.proto_label("h2"), args.h2_conns,
             args.h2_streams, "https://, ALPN h2" if b.tls_front else "prior knowledge"))
    print("  " + pin)
    load = os.getloadavg()
    print("  load average at start: %.2f %.2f %.2f%s" % (load + (
        "  (the machine is busy with other work: expect more noise)" if load[0] > 1.0 else "",)))
    print("  nginx proxies use two ports (h1 and h2c: `listen ... http2` is HTTP/2-only); "
          "HAProxy and pcrouter serve both on one port")
    for k, v in versions.items():
        print("  %-9s %s" % (k, v))
    print(flush=True)


def report(b, targets, results, protos, size):
    """One table per body size; returns the medians and pcrouter's ratios."""
    med = {}
    for t in targets:
        for p in protos:
            rs = results[t.name][p]
            if rs:
                med[(t.name, p)] = {k: statistics.median(r[k] for r in rs)
                                    for k in ("rps", "p50_ms", "p99_ms", "cpu_us_per_req",
                                              "cpu_user_us_per_req", "cpu_sys_us_per_req")}
    print("\n%d-byte request bodies" % size)
    print("%-42s %-12s %8s %8s %8s %8s %6s %6s %9s %10s %10s"
          % ("target", "protocol", "req/s", "p50 ms", "p99 ms", "CPU us/r", "user", "sys",
             "req/CPU-s", "pcr per-core", "pcr req/s"))
    summary = {}
    for p in protos:
        pcr = med.get(("pcrouter", p))
        for t in targets:
            m = med.get((t.name, p))
            if not m:
                continue
            per_core = 1e6 / m["cpu_us_per_req"] if m["cpu_us_per_req"] else 0.0
            # pcrouter (cache_aware, 1 worker) against this row: requests per CPU-second (its
            # CPU per request under the row's), and requests per second.
            cr = m["cpu_us_per_req"] / pcr["cpu_us_per_req"] \
                if pcr and pcr["cpu_us_per_req"] and t.name != "direct" else None
            rr = pcr["rps"] / m["rps"] if pcr and m["rps"] else None
            paired = paired_ratios(results.get("pcrouter", {}).get(p, []), results[t.name][p])
            me = t.name == "pcrouter"
            print("%-42s %-12s %8.0f %8.2f %8.2f %8.1f %6.1f %6.1f %9.0f %10s %10s"
                  % (t.label, b.proto_label(p), m["rps"], m["p50_ms"],
                     m["p99_ms"], m["cpu_us_per_req"], m["cpu_user_us_per_req"],
                     m["cpu_sys_us_per_req"], per_core,
                     "" if me or t.name == "direct" else fmt_ratio(cr),
                     "" if me else fmt_ratio(rr)))
            summary.setdefault(t.name, {})[p] = dict(m, per_core=per_core, pcr_per_core_ratio=cr,
                                                     pcr_rps_ratio=rr, **paired)
        print()
    print("CPU us/r: CPU time (user+sys) of the proxy's processes per request (direct: of the stub\n"
          "  backends); user, sys: its two parts. req/CPU-s: requests per CPU-second. pcr per-core: pcrouter cache_aware (1\n"
          "  worker)'s requests per CPU-second over the row's; pcr req/s: its req/s over the row's.")
    return summary


def targets_report(b, summaries):
    """The per-core and every-core targets, per body size and protocol."""
    verdicts = {}
    print("\nTargets:")
    for size, summary in summaries.items():
        for p in ("h1", "h2"):
            name = "%s %d B" % (b.proto_label(p), size)
            ha = summary.get("haproxy", {}).get(p)
            pcr = summary.get("pcrouter", {}).get(p)
            if ha and pcr and pcr.get("cpu_us_per_req"):
                # The verdict takes the ratio paired by repetition (paired_ratios) when there are
                # three repetitions or more; the ratio of the medians is shown beside it.
                r = ha["cpu_us_per_req"] / pcr["cpu_us_per_req"]
                reps = ha.get("per_rep_per_core_ratios", [])
                pr = ha.get("paired_per_core_ratio") if len(reps) >= 3 else None
                ok = (pr if pr is not None else r) >= 1.1
                verdicts["per core %s" % name] = {"ratio": r, "paired_ratio": pr, "met": ok}
                print("  %-16s pcrouter cache_aware per core >= 1.1x HAProxy round robin: %-4s "
                      "(%s%.2fx on the medians: %.1f vs %.1f us of CPU per request)"
                      % (name, "met" if ok else "MISS",
                         "" if pr is None else "%.2fx paired by repetition (%s); "
                         % (pr, " ".join("%.2f" % x for x in reps)),
                         r, pcr["cpu_us_per_req"], ha["cpu_us_per_req"]))
            h2, p2 = (summary.get(n, {}).get(p) for n in ("haproxy_t2", "pcrouter_w2"))
            if h2 and p2:
                print("  %-16s 2 workers vs HAProxy nbthread 2: %.2fx req/s, %.2fx per core"
                      % (name, p2["rps"] / h2["rps"] if h2["rps"] else 0,
                         h2["cpu_us_per_req"] / p2["cpu_us_per_req"] if p2["cpu_us_per_req"] else 0))
            hh = summary.get("haproxy_hash", {}).get(p)
            if hh and pcr and pcr.get("cpu_us_per_req"):
                print("  %-16s CPU per request vs HAProxy's JSON hash: %.2fx (%.1f vs %.1f us)"
                      % (name, pcr["cpu_us_per_req"] / hh["cpu_us_per_req"],
                         pcr["cpu_us_per_req"], hh["cpu_us_per_req"]))
    return verdicts


if __name__ == "__main__":
    sys.exit(main())
