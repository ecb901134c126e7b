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

Python standard library only. Usage:
    bench/proxies.py --build build [--reps N] [--duration S] [--pin split|none] [--no-defaults]
    QUICK=1 bench/proxies.py ...      # 2 repetitions of 2 s: a smoke run, not a measurement
    KEEP_TMP=1 ...                    # keep the temp folder (configs, pcrouter.log, error logs)
    --only direct,pcrouter,haproxy,nginx,haproxy_default,nginx_default   # a subset of targets
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
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

def request_body():
    """A completion request of about 2 KiB: {"model","prompt","max_tokens"}."""
    words = ("the quick brown fox jumps over the lazy dog while the router keeps its prefix "
             "cache warm and every pod answers in time ").split()
    prompt, i = [], 0
    while sum(len(w) + 1 for w in prompt) < 2000:
        prompt.append(words[i % len(words)])
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
    """User+system CPU time of every live process in process group pgid (from /proc)."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


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


class Bench:
    def __init__(self, args):
        self.args = args
        self.procs = Procs(args.pin == "split")
        self.dir = tempfile.mkdtemp(prefix="pcr-bench-proxies-")
        self.req = request_body()
        self.resp = response_body()
        # Pinning ("split"): the load generator and the stub backends share CPU 0, the proxy
        # under test gets CPU 1 to itself. The rows at the proxies' defaults run unpinned.
        self.cpu_client = "0"
        self.cpu_backends = "0"
        self.cpu_proxy = "1"
        self.backend_ports = {}

    # -- backends ------------------------------------------------------------------------------
    def start_backends(self):
        b1, b1h2, b2 = free_port(), free_port(), free_port()
        for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(self.dir, "backends-tmp", d), exist_ok=True)
        conf = render("backends_nginx.conf.tmpl", os.path.join(self.dir, "backends.conf"),
                      DIR=self.dir, B1_PORT=b1, B1_H2C_PORT=b1h2, B2_PORT=b2, RESPONSE=self.resp)
        log = os.path.join(self.dir, "backends-error.log")
        p = self.procs.start("backends(nginx)", ["nginx", "-p", self.dir, "-c", conf, "-e", log],
                             self.cpu_backends)
        for port in (b1, b1h2, b2):
            wait_port(port, p, log)
        self.backend_ports = {"b1": b1, "b1_h2c": b1h2, "b2": b2}
        return p

    # -- proxies -------------------------------------------------------------------------------
    def start_haproxy(self, matched):
        tag = "matched" if matched else "default"
        port = free_port()
        conf = render("haproxy.cfg.tmpl", os.path.join(self.dir, "haproxy-%s.cfg" % tag),
                      NBTHREAD="nbthread 1" if matched else "", PORT=port,
                      B1_PORT=self.backend_ports["b1"], B2_PORT=self.backend_ports["b2"])
        log = os.path.join(self.dir, "haproxy-%s.log" % tag)
        with open(log, "w") as lf:
            p = self.procs.start("haproxy-" + tag, ["haproxy", "-db", "-f", conf],
                                 self.cpu_proxy if matched else None, stdout=lf, stderr=lf)
        wait_port(port, p, log)
        return p, {"h1": port, "h2": port}, log

    def start_nginx(self, matched):
        tag = "matched" if matched else "default"
        h1, h2 = free_port(), free_port()
        for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(self.dir, "nginx-%s-tmp" % tag, d), exist_ok=True)
        conf = render("nginx.conf.tmpl", os.path.join(self.dir, "nginx-%s.conf" % tag),
                      DIR=self.dir, TAG=tag, WORKERS=1 if matched else "auto", H1_PORT=h1,
                      H2C_PORT=h2, B1_PORT=self.backend_ports["b1"],
                      B2_PORT=self.backend_ports["b2"])
        log = os.path.join(self.dir, "nginx-%s-error.log" % tag)
        p = self.procs.start("nginx-" + tag, ["nginx", "-p", self.dir, "-c", conf, "-e", log],
                             self.cpu_proxy if matched else None)
        for port in (h1, h2):
            wait_port(port, p, log)
        return p, {"h1": h1, "h2": h2}, log

    def start_pcrouter(self):
        conf = os.path.join(self.dir, "pcrouter.json")
        with open(conf, "w") as f:
            json.dump({
                "listen": [{"address": "127.0.0.1:0"}],
                "backends": [
                    {"name": "b1", "url": "http://127.0.0.1:%d" % self.backend_ports["b1"]},
                    {"name": "b2", "url": "http://127.0.0.1:%d" % self.backend_ports["b2"]}],
                "routing": {"policy": "round_robin"},
                "log": {"access_log": False},
                "health": {"interval_ms": 1000},
            }, f, indent=2)
        log = os.path.join(self.dir, "pcrouter.log")
        # A private copy: the build folder is shared and may be relinked while the bench runs.
        exe = os.path.join(self.dir, "pcrouter")
        if not os.path.exists(exe):
            shutil.copy2(self.args.pcrouter, exe)
        p = self.procs.start("pcrouter", [exe, "-c", conf], self.cpu_proxy,
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
        """One HTTP/1.1 POST and a few h2c ones must get 200 with the stub's body."""
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
            raise BenchError("%s (h2c): %d of 8 requests got 2xx: %s"
                             % (target.label, res["ok"], res["raw_tail"]))

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
                "-s", self.lua, "http://127.0.0.1:%d/v1/completions" % target.ports["h1"]]
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

    def run_h2load(self, target, duration=None, n=None):
        logf = os.path.join(self.dir, "h2load.log")
        if os.path.exists(logf):
            os.unlink(logf)
        argv = ["h2load", "-t1", "-H", "content-type: application/json", "-d", self.req_file,
                "--log-file", logf]
        if duration:
            argv += ["-c%d" % self.args.h2_conns, "-m%d" % self.args.h2_streams,
                     "-D", str(duration)]
        else:
            argv += ["-c1", "-m4", "-n%d" % n]
        argv.append("http://127.0.0.1:%d/v1/completions" % target.ports["h2"])
        if self.procs.pin:
            argv = ["taskset", "-c", self.cpu_client] + argv
        out = self._run(argv, duration or 5)
        m = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s", out)
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
            r = subprocess.run(argv, capture_output=True, text=True, timeout=duration + RUN_SLACK,
                               start_new_session=True)
        except subprocess.TimeoutExpired as e:
            raise BenchError("%s did not finish within %.0f s" % (argv[0], duration + RUN_SLACK))
        return r.stdout + r.stderr


def paired_ratios(pcr_runs, runs):
    """Median over repetitions of pcrouter's figure over the target's in the same repetition:
    less exposed to slow drifts of the machine than the ratio of the medians."""
    by_rep = {r["rep"]: r for r in runs}
    rps, p99 = [], []
    for r in pcr_runs:
        o = by_rep.get(r["rep"])
        if o and o["rps"] and o["p99_ms"]:
            rps.append(r["rps"] / o["rps"])
            p99.append(r["p99_ms"] / o["p99_ms"])
    if not rps:
        return {}
    return {"paired_rps_ratio": statistics.median(rps), "paired_p99_ratio": statistics.median(p99)}


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
    ap.add_argument("--no-defaults", action="store_true",
                    help="skip the HAProxy/nginx rows at their default thread/worker counts")
    ap.add_argument("--only", default="", help="comma-separated target names (debugging)")
    ap.add_argument("--json", default=os.path.join(OUT_DIR, "proxies.json"))
    a = ap.parse_args()
    a.quick = quick
    a.build = os.path.abspath(a.build)
    a.pcrouter = find_pcrouter(a.build)
    return a


def fmt_ratio(x):
    return "%.2f" % x if x else "-"


def main():
    args = parse_args()
    for tool in ("nginx", "haproxy", "wrk", "h2load") + (("taskset",) if args.pin == "split"
                                                          else ()):
        if not shutil.which(tool):
            print("bench/proxies.py: %s not found (make deps-bench installs it)" % tool,
                  file=sys.stderr)
            return 2
    if os.cpu_count() and os.cpu_count() < 2 and args.pin == "split":
        args.pin = "none"

    # SIGTERM/SIGINT unwind through the finally below, which stops every process.
    def on_signal(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_signal)

    b = Bench(args)
    anomalies, notes = [], []
    try:
        return run(b, args, anomalies, notes)
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


def run(b, args, anomalies, notes):
    b.req_file = os.path.join(b.dir, "request.json")
    with open(b.req_file, "wb") as f:
        f.write(b.req)
    b.lua = b.wrk_script()
    backends = b.start_backends()

    direct = Target("direct", "direct (backend 1)")
    direct.ports = {"h1": b.backend_ports["b1"], "h2": b.backend_ports["b1_h2c"]}
    targets = [direct,
               Target("haproxy", "HAProxy nbthread 1", lambda: b.start_haproxy(True)),
               Target("nginx", "nginx 1 worker", lambda: b.start_nginx(True))]
    if args.pcrouter:
        targets.append(Target("pcrouter", "pcrouter", b.start_pcrouter))
    else:
        notes.append("pcrouter not found in %s (build it: ninja -C %s): its rows are missing"
                     % (args.build, args.build))
    if not args.no_defaults:
        targets += [Target("haproxy_default", "HAProxy default nbthread",
                           lambda: b.start_haproxy(False)),
                    Target("nginx_default", "nginx workers auto", lambda: b.start_nginx(False))]
    if args.only:
        keep = set(args.only.split(","))
        targets = [t for t in targets if t.name in keep]

    for t in list(targets):
        try:
            if t.starter:
                t.start()
            b.smoke(t)
        except BenchError as e:
            if t.name != "pcrouter":
                raise
            # The router is the thing being built: say what went wrong and still measure the rest.
            anomalies.append("pcrouter left out: %s" % e)
            if t.proc:
                b.procs.stop(t.proc)
            targets.remove(t)

    versions = {"haproxy": tool_version(["haproxy", "-v"]),
                "nginx": tool_version(["nginx", "-v"]),
                "wrk": tool_version(["wrk", "--version"]).split(" Copyright")[0],
                "h2load": tool_version(["h2load", "--version"]),
                "pcrouter": tool_version([args.pcrouter, "--version"]) if args.pcrouter else "-"}
    header(b, args, versions, targets)

    # Warm-up: one short run per target and protocol, so pools and caches are filled.
    for t in targets:
        b.run_wrk(t, 1)
        b.run_h2load(t, duration=1)

    protos = ("h1", "h2")
    results = {t.name: {p: [] for p in protos} for t in targets}
    for rep in range(args.reps):
        order = targets[rep % len(targets):] + targets[:rep % len(targets)]
        for proto in protos:
            for t in order:
                if not t.alive():
                    restart(t, anomalies, rep, proto, b)
                pgid = (t.proc or backends).pid
                cpu0 = group_cpu_seconds(pgid)
                r = b.run_wrk(t, args.duration) if proto == "h1" else \
                    b.run_h2load(t, duration=args.duration)
                cpu = group_cpu_seconds(pgid) - cpu0
                r["cpu_us_per_req"] = cpu * 1e6 / r["requests"] if r["requests"] else 0.0
                r["rep"] = rep
                results[t.name][proto].append(r)
                bad = {k: v for k, v in r["errors"].items() if v}
                if bad or r["ok"] < r["requests"]:
                    anomalies.append("%s %s rep %d: %d requests, %d 2xx, errors %s"
                                     % (t.label, "HTTP/1.1" if proto == "h1" else "h2c", rep + 1,
                                        r["requests"], r["ok"], bad))
                if not t.alive():
                    restart(t, anomalies, rep, proto, b)
        print("  repetition %d/%d done" % (rep + 1, args.reps), flush=True)
    if backends.poll() is not None:
        anomalies.append("the stub backends exited (status %s)" % backends.returncode)

    summary = report(targets, results, protos, anomalies, notes)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    for t in targets:
        for p in protos:
            for r in results[t.name][p]:
                r.pop("raw_tail", None)
    with open(args.json, "w") as f:
        json.dump({"settings": {"reps": args.reps, "duration_s": args.duration,
                                "quick": args.quick, "pin": args.pin,
                                "h1": "wrk -t1 -c%d" % args.h1_conns,
                                "h2": "h2load -t1 -c%d -m%d" % (args.h2_conns, args.h2_streams),
                                "request_bytes": len(b.req), "response_bytes": len(b.resp),
                                "loadavg_end": os.getloadavg()},
                   "versions": versions, "summary": summary, "runs": results,
                   "anomalies": anomalies, "notes": notes}, f, indent=1)
    print("\nwrote %s" % os.path.relpath(args.json, ROOT))
    return 0


def restart(t, anomalies, rep, proto, b):
    anomalies.append("%s died during rep %d (%s), exit status %s%s"
                     % (t.label, rep + 1, proto, t.proc.returncode, log_tail(t.log)))
    t.crashes.append(rep)
    b.procs.stop(t.proc)
    t.start()


def header(b, args, versions, targets):
    pin = ("taskset: wrk/h2load and the stub backends on CPU 0, the proxy under test on CPU 1 "
           "(rows at the proxies' defaults unpinned)" if args.pin == "split"
           else "no CPU pinning")
    print("Proxy benchmark: round robin over 2 stub backends (one nginx, 1 worker, fixed reply)")
    print("  %s%s" % ("QUICK run: " if args.quick else "",
                      "%d repetitions x %d s per target and protocol, targets rotated per "
                      "repetition; medians shown" % (args.reps, args.duration)))
    print("  POST /v1/completions, request %d B, response %d B"
          % (len(b.req), len(b.resp)))
    print("  HTTP/1.1: wrk -t1 -c%d; h2c: h2load -t1 -c%d -m%d (prior knowledge)"
          % (args.h1_conns, args.h2_conns, args.h2_streams))
    print("  " + pin)
    load = os.getloadavg()
    print("  load average at start: %.2f %.2f %.2f%s" % (load + (
        "  (the machine is busy with other work: expect more noise)" if load[0] > 1.0 else "",)))
    print("  nginx proxies use two ports (h1 and h2c: `listen ... http2` is HTTP/2-only); "
          "HAProxy and pcrouter serve both on one port")
    for k, v in versions.items():
        print("  %-9s %s" % (k, v))
    print(flush=True)


def report(targets, results, protos, anomalies, notes):
    med = {}
    for t in targets:
        for p in protos:
            rs = results[t.name][p]
            if rs:
                med[(t.name, p)] = {k: statistics.median(r[k] for r in rs)
                                    for k in ("rps", "p50_ms", "p99_ms", "cpu_us_per_req")}
    have_pcr = any(t.name == "pcrouter" for t in targets)
    print("\n%-26s %-8s %8s %8s %8s %8s %9s %9s %9s"
          % ("target", "protocol", "req/s", "p50 ms", "p99 ms", "CPU us/r", "pcr/x rps",
             "pcr/x p99", "pcr/x CPU"))
    summary = {}
    for p in protos:
        pcr = med.get(("pcrouter", p))
        for t in targets:
            m = med.get((t.name, p))
            if not m:
                continue
            rr = pcr["rps"] / m["rps"] if pcr and m["rps"] else None
            pr = pcr["p99_ms"] / m["p99_ms"] if pcr and m["p99_ms"] else None
            paired = paired_ratios(results.get("pcrouter", {}).get(p, []), results[t.name][p])
            cr = pcr["cpu_us_per_req"] / m["cpu_us_per_req"] \
                if pcr and m["cpu_us_per_req"] and t.name != "direct" else None
            me = t.name == "pcrouter"
            print("%-26s %-8s %8.0f %8.2f %8.2f %8.1f %9s %9s %9s"
                  % (t.label, "HTTP/1.1" if p == "h1" else "h2c", m["rps"], m["p50_ms"],
                     m["p99_ms"], m["cpu_us_per_req"], "" if me else fmt_ratio(rr),
                     "" if me else fmt_ratio(pr), "" if me else fmt_ratio(cr)))
            summary.setdefault(t.name, {})[p] = dict(m, pcr_rps_ratio=rr, pcr_p99_ratio=pr,
                                                     pcr_cpu_ratio=cr, **paired)
        print()
    print("CPU us/r: CPU time (user+sys) of the proxy's processes per request (direct: of the stub\n"
          "  backends); less sensitive than req/s to other load on the machine.\n"
          "pcr/x rps: pcrouter's req/s over the row's (higher is better); pcr/x p99 and pcr/x CPU:\n"
          "  pcrouter's p99 and CPU per request over the row's (lower is better)")

    verdicts = {}
    if have_pcr:
        print("\nTargets (level with nginx, within 10% of HAProxy), against the proxies configured like "
              "pcrouter (one thread):")
        for p in protos:
            pcr, ha, ng = (med.get((n, p)) for n in ("pcrouter", "haproxy", "nginx"))
            if not (pcr and ha and ng):
                continue
            pn = summary["nginx"][p].get("paired_rps_ratio")
            ph = summary["haproxy"][p].get("paired_rps_ratio")
            checks = [("req/s >= nginx", pcr["rps"] >= ng["rps"],
                       "%.2fx; same-repetition ratios, median %.2fx" % (pcr["rps"] / ng["rps"], pn)),
                      ("req/s within 10% of HAProxy", pcr["rps"] >= 0.9 * ha["rps"],
                       "%.2fx; same-repetition ratios, median %.2fx" % (pcr["rps"] / ha["rps"], ph)),
                      ("p99 <= nginx", pcr["p99_ms"] <= ng["p99_ms"],
                       "%.2f vs %.2f ms" % (pcr["p99_ms"], ng["p99_ms"])),
                      ("p99 <= HAProxy", pcr["p99_ms"] <= ha["p99_ms"],
                       "%.2f vs %.2f ms" % (pcr["p99_ms"], ha["p99_ms"]))]
            name = "HTTP/1.1" if p == "h1" else "h2c"
            for what, ok, detail in checks:
                print("  %-8s %-28s %-4s (%s)" % (name, what, "met" if ok else "MISS", detail))
                verdicts["%s: %s" % (name, what)] = ok
    summary["_verdicts"] = verdicts
    for n in notes:
        print("note: " + n)
    if anomalies:
        print("\nAnomalies (errors, non-2xx, crashes):")
        for a in anomalies:
            print("  " + a)
    else:
        print("\nNo errors, non-2xx responses or crashes on any target.")
    return summary


if __name__ == "__main__":
    sys.exit(main())
