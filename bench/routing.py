#!/usr/bin/python3
"""bench/routing.py: `make bench-routing`: every routing policy on a real trace, side by side.

For each policy (round_robin, random, least_loaded, consistent_hash, cache_aware; random and
round_robin are what a Kubernetes Service does, kube-proxy's iptables and IPVS modes) it starts N
simulated
vLLM pods (bench/sim/vllm_sim, one process, one port each, caches cold) and pcrouter on a
generated config, replays the conversation trace through it (bench/sim/replay), and reads the
pods' /metrics. It does the same through HAProxy 2.6 hashing the first 256 bytes of the prompt
with bounded loads. Prints one table (hit rate, TTFT, inter-token latency, output tokens per
second) and the hit-rate and latency targets, writes bench/out/routing.json (per policy, besides
replay's figures, flat ones named ttft_mean_ms, itl_p99_ms, output_tokens_per_s, ...) and
bench/out/routing.png (TTFT distribution, ITL and hit rate per policy, gnuplot).
--engine step runs the pods on the step engine (vllm_sim --engine step), where prefill and
decode share each engine step, so what a router saves in prefill shows in every stream's ITL.

Then cache_aware again through several replicas of pcrouter (--replicas, default 1,2,4) with
the trace's requests spread over them round robin, each replica on its own index and (--share)
sharing it through a redis-server started for the run: the delivered hit rate against one
replica's, and what the sharing costs Redis (commands and bytes per routed request, memory at
the end).

With --workload NAME (`make bench-routing WORKLOAD=NAME [LOAD=light|knee|past]`, or
WORKLOAD=all) it runs one of bench/workloads.py's workloads at each of its three loads instead,
each on its own pool and time scale. Every run ends with one summary line per workload and load:
the routing targets for cache_aware against the best of the four baselines in that run (hit rate
>= 0.95 of the ceiling, max/mean share <= 1.1, TTFT p99 no worse, TTFT p50 within 5%).
--before DIR adds a row for another build's pcrouter (DIR/pcrouter) with cache_aware: before and
after in one run.

With --roles PpDd (`make bench-routing ROLES=2p6d [PD_MODES=auto,always,never]`) each workload
runs disaggregated instead, on the step engine: the same P+D pods collocated (every pod both,
cache_aware), then split (P prefill pods, D decode pods, vllm_sim --role) with pcrouter's
decision (pd.mode auto) and the two fixed rules (always, never). A workload tuned for another
pool size has its arrival rate scaled to P+D pods. The table adds where prompts were prefilled
(pcrouter_pd_decisions_total), and the targets: split+auto ITL p99 at most half collocated's with
TTFT p99 and output tokens per second no worse, and auto no worse than either fixed rule.

QUICK=1 replays a slice (first 2000 requests; 400 per workload and load) so the whole run takes
a couple of minutes. The helpers here (Sims, Router, run_replay) are also used by bench/demo.py and
test/integration/test_replay.py.
"""
import argparse
import json
import os
import re
import shlex
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
POLICIES = ["round_robin", "random", "least_loaded", "consistent_hash", "cache_aware"]
BASELINES = ["round_robin", "random", "least_loaded", "consistent_hash", "haproxy_hash"]


def traces_dir():
    """The traces: $PCR_TRACES, else bench/traces in this repository."""
    for d in (os.environ.get("PCR_TRACES"), os.path.join(HERE, "traces")):
        if d and os.path.isdir(d):
            return os.path.abspath(d)
    raise SystemExit("routing: no traces folder (set PCR_TRACES)")


class Proc:
    """A child process whose stderr is read line by line: wait_for() blocks until a line
    matches (with a deadline, no sleeping), then a thread keeps draining it."""

    def __init__(self, argv, label, echo=False):
        self.label = label
        self.echo = echo
        self.lines = []
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, start_new_session=True)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.p.stderr, selectors.EVENT_READ)
        self._buf = b""
        self._thread = None
        self.pos = 0   # lines before this one were looked at by wait_for

    def _take_lines(self):
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            text = line.decode(errors="replace")
            self.lines.append(text)
            if self.echo:
                print(text, file=sys.stderr, flush=True)

    def wait_for(self, pattern, timeout):
        """Returns the match of the first stderr line not yet looked at that matches pattern."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            while self.pos < len(self.lines):
                m = rx.search(self.lines[self.pos])
                self.pos += 1
                if m:
                    return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError("%s: no line matching %r within %.0fs; stderr:\n%s" % (
                    self.label, pattern, timeout, "\n".join(self.lines[-20:])))
            if not self._sel.select(timeout=left):
                continue
            chunk = os.read(self.p.stderr.fileno(), 65536)
            if not chunk:
                raise RuntimeError("%s exited (%s) before printing %r; stderr:\n%s" % (
                    self.label, self.p.wait(), pattern, "\n".join(self.lines[-20:])))
            self._buf += chunk
            self._take_lines()

    def drain(self):
        """From now on a thread reads stderr, so the child never blocks on a full pipe."""
        def run():
            fd = self.p.stderr.fileno()
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    return
                if not chunk:
                    return
                self._buf += chunk
                self._take_lines()
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def cpu_seconds(self):
        """User plus system CPU time the child has used so far (its threads included), from
        /proc; None once it has gone."""
        try:
            with open("/proc/%d/stat" % self.p.pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout=10):
        """SIGTERM, then SIGKILL after timeout. Returns the exit status."""
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(timeout=timeout)
        if self._thread:
            self._thread.join(timeout=2)
        self.p.stderr.close()
        return self.p.returncode


class Sims:
    """One vllm_sim process serving len(names) pods on ports the OS picks (or `ports`)."""

    def __init__(self, build, names, time_scale, capacity_tokens=None, ports=None, extra=(),
                 echo=False):
        exe = os.path.join(build, "bench", "sim", "vllm_sim")
        argv = [exe, "--time-scale", str(time_scale)]
        if capacity_tokens:
            argv += ["--capacity-tokens", str(capacity_tokens)]
        for i, name in enumerate(names):
            argv += ["--port", str(ports[i] if ports else 0), "--name", name]
        argv += list(extra)
        self.proc = Proc(argv, "vllm_sim", echo=echo)
        self.urls = {}
        self.kv = {}   # with --kv-events: each pod's publisher and replay endpoints
        kv = "--kv-events" in argv
        try:
            for _ in names:
                m = self.proc.wait_for(r"pod (\S+) listening on ([\d.]+):(\d+)", 30)
                self.urls[m.group(1)] = "http://%s:%s" % (m.group(2), m.group(3))
                if kv:
                    k = self.proc.wait_for(r"pod (\S+) kv-events (tcp://\S+) replay (tcp://\S+)", 30)
                    self.kv[k.group(1)] = {"endpoint": k.group(2), "replay_endpoint": k.group(3)}
            self.proc.wait_for(r"ready", 30)
        except Exception:
            self.proc.stop()
            raise
        self.proc.drain()

    def stop(self):
        return self.proc.stop()


# --access-log DIR: every pcrouter this run starts writes its JSON access log there, one file
# per run (policy-<ns>.log), to join predicted and delivered cached tokens request by request.
ACCESS_LOG_DIR = None


def router_config(backends, policy, capacity_tokens=None, port=0, routing=None, zones=None,
                  kv=None):
    """`zones`: None, or each backend's zone by name (the router's own is routing.zone).
    `kv`: each backend's KV-event endpoints by name (precise mode), or None."""
    return {
        "listen": [{"address": "127.0.0.1:%d" % port}],
        "backends": [dict({"name": n, "url": u},
                          **({"capacity_tokens": capacity_tokens} if capacity_tokens else {}),
                          **({"zone": zones[n]} if zones else {}),
                          **({"kv_events": kv[n]} if kv else {}))
                     for n, u in backends.items()],
        "routing": dict({"policy": policy}, **(routing or {})),
        "health": {"interval_ms": 1000},
        "log": ({"access_log": True, "access_log_format": "json",
                 "access_log_path": os.path.join(ACCESS_LOG_DIR, "%s-%d.log"
                                                 % (policy, time.monotonic_ns()))}
                if ACCESS_LOG_DIR else {"access_log": False}),
    }


class ZonedSims:
    """--zones: the pods in two zones, one vllm_sim each. The first half is in the router's
    zone "a"; the second half, zone "b", answers one round trip (`rtt_ms`) later."""

    def __init__(self, build, names, time_scale, capacity_tokens, rtt_ms, extra=()):
        h = (len(names) + 1) // 2
        self.near, self.far = names[:h], names[h:]
        self.parts = [Sims(build, self.near, time_scale, capacity_tokens, extra=extra)]
        try:
            self.parts.append(Sims(build, self.far, time_scale, capacity_tokens,
                                   extra=list(extra) + ["--rtt-ms", str(rtt_ms)]))
        except Exception:
            self.stop()
            raise
        self.urls = dict(self.parts[0].urls, **self.parts[1].urls)
        self.zones = dict({n: "a" for n in self.near}, **{n: "b" for n in self.far})

    def stop(self):
        for p in self.parts:
            p.stop()


class Router:
    """build/pcrouter on a config dict (written to tmpdir), ready when it says so."""

    def __init__(self, build, config, tmpdir, echo=False, config_path=None):
        exe = os.path.join(build, "pcrouter")
        if not os.path.exists(exe):
            raise RuntimeError("pcrouter is not built: %s is missing" % exe)
        if config_path is None:
            config_path = os.path.join(tmpdir, "pcrouter-%d.json" % os.getpid())
            with open(config_path, "w") as f:
                json.dump(config, f, indent=1)
        self.proc = Proc([exe, "-c", config_path], "pcrouter", echo=echo)
        try:
            m = self.proc.wait_for(r"listening on ([\d.]+):(\d+)", 30)
            self.url = "http://%s:%s" % (m.group(1), m.group(2))
            self.proc.wait_for(r"ready", 30)
        except Exception:
            self.proc.stop()
            raise
        self.proc.drain()

    def stop(self):
        return self.proc.stop(timeout=40)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_listening(port, timeout, proc):
    """Polls a TCP connect until the port accepts (HAProxy prints nothing when ready)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("haproxy exited with %s" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError("haproxy does not listen on %d" % port)


HAPROXY_CFG = """\
global
    maxconn 4096
    nbthread 1
    # Bodies up to 512 KiB fit one buffer, so json_query sees the whole request: the
    # largest prompt of the conversation trace is 126k tokens = 505 KB.
    tune.bufsize 524288
defaults
    mode http
    timeout connect 5s
    timeout client 600s
    timeout server 600s
    timeout http-keep-alive 60s
frontend fe
    bind 127.0.0.1:{port}
    default_backend pods
backend pods
    option http-buffer-request
    balance hash req.body,json_query('$.prompt'),bytes(0,256)
    hash-type consistent
    hash-balance-factor 125
    http-reuse always
{servers}
"""


class Haproxy:
    def __init__(self, backends, tmpdir):
        self.port = free_port()
        servers = "\n".join("    server %s %s maxconn 1000" % (n, u[len("http://"):])
                            for n, u in backends.items())
        path = os.path.join(tmpdir, "haproxy.cfg")
        with open(path, "w") as f:
            f.write(HAPROXY_CFG.format(port=self.port, servers=servers))
        self.p = subprocess.Popen(["haproxy", "-db", "-f", path], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        try:
            wait_listening(self.port, 20, self.p)
        except Exception:
            self.stop()
            raise
        self.url = "http://127.0.0.1:%d" % self.port

    def stop(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(timeout=10)


def run_replay(build, trace, target, pods, time_scale, limit, json_path, label, cap=None,
               timeout=None, progress=True, extra=()):
    """Runs bench/sim/replay; returns its JSON summary (dict). Raises on failure. `target` is
    a URL, or a list of them that the rows are spread over round robin."""
    exe = os.path.join(build, "bench", "sim", "replay")
    argv = [exe, "--trace", trace, "--time-scale", str(time_scale),
            "--json", json_path, "--label", label, "--pods", ",".join(pods)]
    for t in (target if isinstance(target, (list, tuple)) else [target]):
        argv += ["--target", t]
    if limit:
        argv += ["--limit", str(limit)]
    if cap:
        argv += ["--max-tokens-cap", str(cap)]
    if not progress:
        argv.append("--no-progress")
    argv += list(extra)
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=None if progress else subprocess.PIPE,
                       text=True, timeout=timeout)
    if p.returncode != 0 or not os.path.exists(json_path):
        raise RuntimeError("replay failed (%d):\n%s\n%s" % (p.returncode, p.stdout,
                                                            p.stderr or ""))
    with open(json_path) as f:
        return json.load(f)


# ------------------------------------------------------------------------------------------

def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else "-"


# Flat names for routing.json: each figure's p50, p90, p99 and mean, in model time.
FLAT = (("ttft", "ttft_ms_model"), ("itl", "itl_ms_model"), ("tpot", "tpot_ms_model"),
        ("e2e", "e2e_ms_model"))


def flat_figures(r):
    """Replay's figures under names that say what they are: ttft_mean_ms, itl_p99_ms, ...,
    output_tokens_per_s and requests_per_s (model time)."""
    out = {}
    for short, key in FLAT:
        for q, v in (r.get(key) or {}).items():
            out["%s_%s_ms" % (short, q)] = v
    out["output_tokens_per_s"] = r.get("output_tokens_per_s_model")
    out["requests_per_s"] = r.get("requests_per_s_model", r.get("throughput_rps_model"))
    return out


def schedule_args(sim_args):
    """The pods' --capacity-schedule, for replay's scheduled ceiling ([] without one)."""
    a = shlex.split(sim_args or "")
    for i, x in enumerate(a):
        if x == "--capacity-schedule" and i + 1 < len(a):
            return ["--capacity-schedule", a[i + 1]]
        if x.startswith("--capacity-schedule="):
            return ["--capacity-schedule", x.split("=", 1)[1]]
    return []


def print_table(results):
    """One row per run; an "of sched" column when the pods had a --capacity-schedule."""
    sched = any(r.get("fraction_of_scheduled_ceiling") is not None for r in results)
    head = ("policy", "hit rate", "of ceil") + (("of sched",) if sched else ()) + (
        "TTFT p50", "TTFT p99", "TTFT mean", "ITL mean", "ITL p99", "out tok/s", "max/mean",
        "req/s", "errors", "pred/del", "tok ms")
    w = max([16] + [len(r["label"]) for r in results])
    print(("%-*s %9s %8s" + (" %8s" if sched else "") +
           " %10s %10s %10s %9s %9s %9s %9s %7s %7s %8s %7s") % ((w,) + head))
    for r in results:
        t = r.get("ttft_ms_model", {})
        i = r.get("itl_ms_model", {})
        cols = [fmt(r.get("hit_rate"), ".4f"), fmt(r.get("fraction_of_ceiling"), ".3f")]
        if sched:
            cols.append(fmt(r.get("fraction_of_scheduled_ceiling"), ".3f"))
        print(("%-*s %9s %8s" + (" %8s" if sched else "") +
               " %9sms %9sms %9sms %7sms %7sms %9s %9s %7s %7d %8s %7s") % tuple(
            [w, r["label"]] + cols + [
                fmt(t.get("p50"), ".0f"), fmt(t.get("p99"), ".0f"), fmt(t.get("mean"), ".0f"),
                fmt(i.get("mean"), ".1f"), fmt(i.get("p99"), ".1f"),
                fmt(r.get("output_tokens_per_s_model"), ".0f"),
                fmt(r.get("share_max_over_mean"), ".2f"),
                fmt(r.get("throughput_rps_model"), ".2f"),
                r.get("errors", 0), fmt(r.get("pred_over_del"), ".3f"),
                fmt(r.get("tokenize_ms_wall_mean"), ".2f")]))


def check_targets(by):
    ca, rr, hp = by.get("cache_aware"), by.get("round_robin"), by.get("haproxy_hash")
    if not ca:
        return []
    out = []

    def line(name, ok, detail):
        out.append("%-4s %s (%s)" % ("MET" if ok else "MISS", name, detail))
    f = ca.get("fraction_of_ceiling")
    line("cache_aware hit rate >= 0.85 of ceiling", f is not None and f >= 0.85,
         "%s of %s" % (fmt(f, ".3f"), fmt(ca.get("ceiling"), ".4f")))
    s = ca.get("share_max_over_mean")
    line("cache_aware max/mean share <= 1.3", s is not None and s <= 1.3, fmt(s, ".2f"))
    p50 = ca["ttft_ms_model"].get("p50")
    if rr:
        rp50 = rr["ttft_ms_model"].get("p50")
        line("cache_aware TTFT p50 <= half of round_robin's",
             p50 is not None and rp50 is not None and p50 <= rp50 / 2,
             "%s ms vs %s ms" % (fmt(p50, ".0f"), fmt(rp50, ".0f")))
    if hp:
        line("cache_aware hit rate > haproxy hash",
             (ca.get("hit_rate") or 0) > (hp.get("hit_rate") or 0),
             "%s vs %s" % (fmt(ca.get("hit_rate"), ".4f"), fmt(hp.get("hit_rate"), ".4f")))
        a, b = ca["ttft_ms_model"].get("p99"), hp["ttft_ms_model"].get("p99")
        line("cache_aware TTFT p99 < haproxy hash", a is not None and b is not None and a < b,
             "%s ms vs %s ms" % (fmt(a, ".0f"), fmt(b, ".0f")))
    return out


def plot(results, outdir):
    """TTFT CDF per policy (left), inter-token latency per policy (middle) and hit rate per
    policy against the ceiling (right)."""
    png = os.path.join(outdir, "routing.png")
    plots = []
    for r in results:
        v = r.get("ttft_ms_model_sorted") or []
        path = os.path.join(outdir, "ttft_%s.dat" % r["label"])
        with open(path, "w") as f:
            n = len(v)
            for i, x in enumerate(v):
                f.write("%g %g\n" % (max(x, 1) / 1000.0, (i + 1) / n))
        plots.append("'%s' using 1:2 with lines lw 2 title '%s'" % (path, r["label"]))
    bars = os.path.join(outdir, "hitrate.dat")
    with open(bars, "w") as f:
        for i, r in enumerate(results):
            f.write("%d %s %g %g\n" % (i, r["label"], r.get("hit_rate") or 0,
                                       r.get("ceiling") or 0))
    itl = os.path.join(outdir, "itl.dat")
    with open(itl, "w") as f:
        for i, r in enumerate(results):
            t = r.get("itl_ms_model") or {}
            f.write("%d %s %g %g\n" % (i, r["label"], t.get("mean") or 0, t.get("p99") or 0))
    script = """
set terminal pngcairo size 2000,560 noenhanced
set output '%s'
set multiplot layout 1,3 title 'pcrouter routing benchmark (%s)'
set title 'time to first token (model seconds), CDF'
set logscale x
set xlabel 'TTFT (s)'
set ylabel 'fraction of requests'
set key bottom right
set grid
plot %s
unset logscale x
set title 'inter-token latency (model ms)'
set style fill solid 0.6
set boxwidth 0.6
set yrange [0:*]
set xlabel ''
set ylabel 'ms between token events'
set xtics rotate by -30
set key top left
plot '%s' using 1:3:xtic(2) with boxes title 'mean', \
     '%s' using 1:4 with points pt 7 ps 1.5 title 'p99'
set title 'delivered prefix-cache hit rate (pods metrics)'
set style fill solid 0.6
set boxwidth 0.6
set yrange [0:*]
set xlabel ''
set ylabel 'hit rate (tokens)'
set xtics rotate by -30
set key top left
plot '%s' using 1:3:xtic(2) with boxes title 'hit rate', \
     '%s' using 1:4 with linespoints lw 2 title 'LRU ceiling (all pods capacity)'
unset multiplot
""" % (png, results[0].get("trace", "").split("/")[-1], ", ".join(plots), itl, itl, bars,
       bars)
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True, timeout=60,
                       stderr=subprocess.PIPE)
        return png
    except (OSError, subprocess.SubprocessError) as e:
        print("routing: gnuplot failed: %s" % e, file=sys.stderr)
        return None


# ------------------------------------------------------------------------------------------
# several replicas, with and without sharing the index through Redis

class RedisServer:
    """redis-server on a free loopback port, data in memory only; `r` is a python3-redis client."""

    def __init__(self, tmpdir):
        import redis
        self.port = free_port()
        self.proc = Proc(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                          "--save", "", "--appendonly", "no", "--dir", tmpdir,
                          "--logfile", os.path.join(tmpdir, "redis.log")], "redis-server")
        self.proc.drain()
        self.r = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.r.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or self.proc.p.poll() is not None:
                    self.proc.stop()
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)
        self.url = "redis://127.0.0.1:%d/0" % self.port

    def cost(self, requests):
        """Commands and bytes Redis handled, per routed request, and its memory now."""
        cmds = self.r.info("commandstats")
        # Those of pcrouter only: not this script's INFO and CONFIG RESETSTAT.
        ours = {k: v["calls"] for k, v in cmds.items()
                if k.split("_", 1)[-1].split("|")[0] not in ("info", "config")}
        stats, mem = self.r.info("stats"), self.r.info("memory")
        n = max(requests, 1)
        return {"redis_commands_per_request": sum(ours.values()) / n,
                "redis_commands": ours,
                "redis_bytes_in_per_request": stats["total_net_input_bytes"] / n,
                "redis_bytes_out_per_request": stats["total_net_output_bytes"] / n,
                "redis_used_memory_bytes": mem["used_memory"],
                "redis_stream_entries": self.r.xlen("pcrouter:stream")}

    def stop(self):
        return self.proc.stop()


def run_replicas(args, build, trace, names, routing, tmp):
    """cache_aware through 1..N replicas, requests round robin, without and with sharing; every
    replica runs one worker thread, the single replica included, so that only the count and
    the sharing change. Returns the rows."""
    counts = [int(x) for x in args.replicas.split(",") if x.strip()]
    modes = {"both": ["off", "redis"], "on": ["redis"], "off": ["off"]}[args.share]
    configs = [(n, mode) for n in counts for mode in (modes if n > 1 else ["off"])]
    runs = {c: [] for c in configs}
    # --repeat: each repetition visits every setup, in a rotated order, so that a slow spell of
    # this shared machine does not always land on the same one; rows are medians.
    for k in range(args.repeat):
        for n, mode in configs[k % len(configs):] + configs[:k % len(configs)]:
            r = replica_run(args, build, trace, names, routing, tmp, n, mode, k)
            if r:
                runs[(n, mode)].append(r)
    rows = []
    for c in configs:
        got = sorted(runs[c], key=lambda r: r.get("hit_rate") or 0)
        if got:
            row = dict(got[len(got) // 2])
            row["hit_rates"] = [r.get("hit_rate") for r in runs[c]]
            rows.append(row)
    return rows


def router_prediction(router, keep=None):
    """What pcrouter predicted against what the pods delivered, in cached tokens, over the run:
    its pcrouter_cached_tokens_{predicted,delivered}_total summed over backends. `keep`: a file
    to write the router's whole /metrics to, for reading the run's decisions afterwards."""
    import urllib.request
    try:
        text = urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            router.url + "/metrics", timeout=10).read().decode()
    except OSError:
        return {}
    if keep:
        with open(keep, "w") as f:
            f.write(text)
    sums = {"predicted": 0.0, "delivered": 0.0}
    tok = {}
    for line in text.splitlines():
        m = re.match(r"pcrouter_cached_tokens_(predicted|delivered)_total\{[^}]*\} (\S+)$", line)
        if m:
            sums[m.group(1)] += float(m.group(2))
        # Precise mode: what asking the pods for tokens added before each decision (wall time).
        m = re.match(r'pcrouter_route_decision_seconds_(sum|count)\{phase="tokenize"\} (\S+)$', line)
        if m:
            tok[m.group(1)] = float(m.group(2))
        m = re.match(r"pcrouter_(precise_decisions|tokenize_cache_hits|tokenize_requests)_total (\S+)$",
                     line)
        if m:
            tok[m.group(1)] = float(m.group(2))
    if sums["delivered"] <= 0:
        return {}
    out = {"cached_predicted": sums["predicted"], "cached_delivered": sums["delivered"],
           "pred_over_del": sums["predicted"] / sums["delivered"]}
    if tok.get("count"):
        out["tokenize_ms_wall_mean"] = 1000.0 * tok["sum"] / tok["count"]
        out.update({k: tok[k] for k in ("precise_decisions", "tokenize_cache_hits",
                                         "tokenize_requests") if k in tok})
    return out


def share_counters(router):
    """The pcrouter_share_* counters of one replica, from its /metrics."""
    import urllib.request
    text = urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
        router.url + "/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"pcrouter_share_(updates_\w+_total|rejected_total|snapshots_\w+_total) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def replica_run(args, build, trace, names, routing, tmp, n, mode, k=0):
    # --index events: every replica follows the pods' KV events (precise mode), no Redis needed.
    events = args.index == "events"
    label = "%d replica%s%s%s" % (n, "s" if n > 1 else "", ", shared" if mode == "redis" else "",
                                  ", events" if events else "")
    sims, routers, rs = None, [], None
    t0 = time.monotonic()
    try:
        sims = Sims(build, names, args.time_scale, args.capacity_tokens,
                    extra=["--engine", args.engine] + (["--kv-events", "0"] if events else []))
        if mode == "redis":
            rs = RedisServer(tmp)
        for i in range(n):
            cfg = router_config(sims.urls, "cache_aware", args.capacity_tokens,
                                routing=dict(routing or {}, index="events") if events else routing,
                                kv=sims.kv if events else None)
            cfg["workers"] = 1
            if rs:
                cfg["redis"] = {"url": rs.url}
                if args.flush_ms:
                    cfg["redis"]["flush_ms"] = args.flush_ms
            path = os.path.join(tmp, "replica-%d.json" % i)
            with open(path, "w") as f:
                json.dump(cfg, f, indent=1)
            routers.append(Router(build, cfg, tmp, config_path=path))
        if rs:
            rs.r.config_resetstat()
        print("== cache_aware, %s" % label, flush=True)
        r = run_replay(build, trace, [x.url for x in routers], list(sims.urls.values()),
                       args.time_scale, args.limit,
                       os.path.join(args.out, "replay_replicas_%d_%s_%d.json" % (n, mode, k)), label,
                       cap=args.max_tokens_cap)
        r.update(replicas=n, sharing=mode)
        for i, x in enumerate(routers):   # each replica's /metrics, for reading its decisions
            router_prediction(x, os.path.join(
                args.out, "metrics_replicas_%d_%s_%d_r%d.txt" % (n, mode, k, i)))
        if rs:
            r.update(rs.cost(r.get("requests") or args.limit or 1))
            totals = {}
            for x in routers:
                for k, v in share_counters(x).items():
                    totals[k] = totals.get(k, 0) + v
            r["share_counters"] = totals
        return r
    except Exception as e:   # one broken run must not hide the others
        print("routing: %s failed: %s" % (label, e), file=sys.stderr, flush=True)
        return None
    finally:
        for x in routers:
            x.stop()
        if rs:
            rs.stop()
        if sims:
            sims.stop()
        print("   (%.0fs)" % (time.monotonic() - t0), flush=True)


def print_replicas(rows):
    base = next((r for r in rows if r["replicas"] == 1), None)
    h1 = base.get("hit_rate") if base else None
    print("%-22s %9s %9s %10s %10s %10s %12s %12s  %s" % (
        "replicas", "hit rate", "vs one", "TTFT p50", "TTFT p99", "cmds/req", "bytes/req",
        "redis mem", "runs"))
    for r in rows:
        t = r.get("ttft_ms_model", {})
        h = r.get("hit_rate")
        rel = h / h1 if isinstance(h, (int, float)) and h1 else None
        cost = "redis_commands_per_request" in r
        print("%-22s %9s %9s %9sms %9sms %10s %12s %12s  %s" % (
            r["label"], fmt(h, ".4f"), fmt(rel, ".3f"), fmt(t.get("p50"), ".0f"),
            fmt(t.get("p99"), ".0f"),
            fmt(r.get("redis_commands_per_request"), ".2f") if cost else "-",
            ("%.0f in %.0f out" % (r["redis_bytes_in_per_request"], r["redis_bytes_out_per_request"]))
            if cost else "-",
            ("%.1f MiB" % (r["redis_used_memory_bytes"] / 1048576.0)) if cost else "-",
            " ".join(fmt(x, ".4f") for x in r.get("hit_rates", []))))
    out = []
    if h1:
        for r in rows:
            if r["replicas"] == max(x["replicas"] for x in rows) and r["replicas"] > 1:
                h = r.get("hit_rate") or 0
                if r["sharing"] == "redis":
                    out.append("%-4s %d replicas sharing through Redis: hit rate at most 3%% below "
                               "one replica's (%.4f vs %.4f, %+.1f%%)" % (
                                   "MET" if h >= 0.97 * h1 else "MISS", r["replicas"],
                                   h, h1, 100 * (h - h1) / h1))
                else:
                    out.append("     %d replicas without sharing lose %.1f%% of one replica's hit "
                               "rate (%.4f vs %.4f)" % (r["replicas"], 100 * (h1 - h) / h1, h, h1))
    return out


def routing_targets(by):
    """The routing targets for cache_aware against the best baseline of the same run, as
    (name, met, detail); [] when cache_aware or every baseline is missing. Four; on the step
    engine a fifth, ITL p99 no worse than the best baseline's (the latency model's ITL is
    vllm_sim's write tick, not the pod's)."""
    ca = by.get("cache_aware")
    base = [by[k] for k in BASELINES if k in by and by[k].get("ttft_ms_model", {}).get("p50")]
    if not ca or not base or not ca.get("ttft_ms_model", {}).get("p50"):
        return []
    f, s = ca.get("fraction_of_ceiling"), ca.get("share_max_over_mean")
    p50, p99 = ca["ttft_ms_model"]["p50"], ca["ttft_ms_model"]["p99"]
    b50 = min(base, key=lambda r: r["ttft_ms_model"]["p50"])
    b99 = min(base, key=lambda r: r["ttft_ms_model"]["p99"])
    out = []
    itl = [r for r in base if (r.get("itl_ms_model") or {}).get("p99")]
    if ca.get("engine") == "step" and itl and (ca.get("itl_ms_model") or {}).get("p99"):
        i99 = min(itl, key=lambda r: r["itl_ms_model"]["p99"])
        out.append(("ITL p99 <= best", ca["itl_ms_model"]["p99"] <= i99["itl_ms_model"]["p99"],
                    "%.1f vs %s %.1f ms" % (ca["itl_ms_model"]["p99"], i99["label"],
                                            i99["itl_ms_model"]["p99"])))
    return [
        ("hit >= 0.95 of ceiling", f is not None and f >= 0.95, "%s" % fmt(f, ".3f")),
        ("share <= 1.1", s is not None and s <= 1.1, "%s" % fmt(s, ".2f")),
        ("p99 <= best", p99 <= b99["ttft_ms_model"]["p99"],
         "%.0f vs %s %.0f ms" % (p99, b99["label"], b99["ttft_ms_model"]["p99"])),
        ("p50 <= 1.05 best", p50 <= 1.05 * b50["ttft_ms_model"]["p50"],
         "%.0f vs %s %.0f ms" % (p50, b50["label"], b50["ttft_ms_model"]["p50"])),
    ] + out


def print_misconfig(rounds):
    """--misconfig over --repeat runs: each setup's median hit rate, TTFT p99 and predicted
    over delivered, and the share of the hit rate lost to the wrong capacity that feedback won
    back, at the medians (the figure the feedback is judged by)."""
    setups = ["cache_aware", "cache_aware_misconf_nofeedback", "cache_aware_misconf_feedback"]
    med = {}
    print("\nmisconfigured capacity, %d run(s):" % len(rounds))
    print("%-32s %-26s %8s %10s %9s" % ("setup", "hit rate (runs)", "median", "TTFT p99",
                                         "pred/del"))
    for label in setups:
        rs = [r for rnd in rounds for r in rnd if r.get("label") == label]
        if not rs:
            continue
        hits = [r["hit_rate"] for r in rs]
        p99 = statistics.median(r["ttft_ms_model"]["p99"] for r in rs)
        pd = [r["pred_over_del"] for r in rs if r.get("pred_over_del")]
        med[label] = statistics.median(hits)
        print("%-32s %-26s %8.4f %8.0fms %9s" % (
            label, ", ".join("%.4f" % h for h in hits), med[label], p99,
            "%.3f" % statistics.median(pd) if pd else "-"))
    if len(med) == 3:
        lost = med[setups[0]] - med[setups[1]]
        won = med[setups[2]] - med[setups[1]]
        print("lost to the wrong capacity: %.4f; won back by feedback: %.4f (%s)" % (
            lost, won, "%.0f%%" % (100 * won / lost) if lost > 0 else "nothing was lost"))


# GKE Inference Gateway against a Kubernetes Service in front of the same pods: output
# throughput, mean time to first token and mean inter-token latency.
GKE = {"throughput": 0.157, "ttft": 0.928, "itl": 0.626}


def gke_line(name, results):
    """cache_aware against random (a Service) in the same run, as GKE's three figures: output
    tokens per second higher by, mean TTFT and mean ITL lower by; None without both or without
    ITL (the latency engine before replay measured it)."""
    by = {r["label"]: r for r in results}
    ca, rnd = by.get("cache_aware"), by.get("random")
    if not ca or not rnd:
        return None
    try:
        tput = ca["output_tokens_per_s"] / rnd["output_tokens_per_s"] - 1
        ttft = 1 - ca["ttft_mean_ms"] / rnd["ttft_mean_ms"]
        itl = 1 - ca["itl_mean_ms"] / rnd["itl_mean_ms"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    got = {"throughput": tput, "ttft": ttft, "itl": itl}
    return "gke %-24s %s" % (name, "; ".join(
        "%s %s %+.1f%% (GKE %s%.1f%%)" % ("MET" if got[k] >= GKE[k] else
                                         "MISS", k, 100 * got[k] * (1 if k == "throughput" else -1),
                                         "+" if k == "throughput" else "-", 100 * GKE[k])
        for k in ("throughput", "ttft", "itl")))


def summary_line(name, results):
    t = routing_targets({r["label"]: r for r in results})
    if not t:
        return "summary %-20s cache_aware or the baselines did not run" % name
    return "summary %-20s %d/%d met: %s" % (name, sum(1 for _, ok, _ in t if ok), len(t), "; ".join(
        "%s %s (%s)" % ("MET" if ok else "MISS", what, d) for what, ok, d in t))


def median_results(rounds):
    """Each policy's figures over --repeat runs: the median of each (hit rate, its fraction of
    the ceiling, TTFT p50 and p99, share, throughput), the rest from its run of median hit
    rate; `runs` keeps every run's figures, for the JSON."""
    out = []
    for r0 in rounds[0]:
        rs = [r for rnd in rounds for r in rnd if r.get("label") == r0["label"]]
        rs_hit = sorted(rs, key=lambda r: r.get("hit_rate") or 0)
        m = dict(rs_hit[len(rs_hit) // 2])
        m["ttft_ms_model"] = dict(m.get("ttft_ms_model", {}))
        for k in ("hit_rate", "fraction_of_ceiling", "fraction_of_scheduled_ceiling",
                  "share_max_over_mean",
                  "throughput_rps_model", "pred_over_del"):
            v = [r[k] for r in rs if isinstance(r.get(k), (int, float))]
            if v:
                m[k] = statistics.median(v)
        for q in ("p50", "p99"):
            v = [r["ttft_ms_model"][q] for r in rs if r.get("ttft_ms_model", {}).get(q)]
            if v:
                m["ttft_ms_model"][q] = statistics.median(v)
        pooled = sorted(t for r in rs for t in r.get("ttft_ms_model_sorted") or [])
        if pooled:
            m["ttft_ms_model_pooled"] = {q: pooled[min(len(pooled) - 1, int(f * len(pooled)))]
                                         for q, f in (("p50", 0.50), ("p90", 0.90),
                                                      ("p99", 0.99))}
            m["ttft_ms_model_pooled"]["requests"] = len(pooled)
        m["runs"] = [{"hit_rate": r.get("hit_rate"), "fraction_of_ceiling":
                      r.get("fraction_of_ceiling"), "share_max_over_mean":
                      r.get("share_max_over_mean"),
                      "ttft_ms_model": {q: r.get("ttft_ms_model", {}).get(q)
                                        for q in ("p50", "p99")}} for r in rs]
        out.append(m)
    return out


def print_pooled(results):
    """TTFT over every run's requests together: a p99 of ten runs is the hundredth slowest of
    ten thousand, where one run's is the tenth of a thousand, which moves by half from run to
    run. Then the two TTFT targets on these figures."""
    rows = [r for r in results if r.get("ttft_ms_model_pooled")]
    if not rows:
        return
    print("TTFT of every run's requests pooled (model time):")
    for r in rows:
        t = r["ttft_ms_model_pooled"]
        print("  %-18s %6d requests  p50 %6.0f ms  p90 %7.0f ms  p99 %7.0f ms" % (
            r["label"], t["requests"], t["p50"], t["p90"], t["p99"]))
    # The TTFT targets of routing_targets(), on the pooled figures.
    pooled = {r["label"]: dict(r, ttft_ms_model=r["ttft_ms_model_pooled"]) for r in rows}
    t = [x for x in routing_targets(pooled) if x[0] in ("p99 <= best", "p50 <= 1.05 best")]
    if t:
        print("targets on the pooled TTFT: %s" % "; ".join(
            "%s %s (%s)" % ("MET" if ok else "MISS", what, d) for what, ok, d in t))


def targets_per_run(rounds):
    """How many of the runs met each target, each run's cache_aware against that run's
    baselines."""
    met, n = {}, 0
    for rnd in rounds:
        t = routing_targets({r["label"]: r for r in rnd})
        if not t:
            continue
        n += 1
        for what, ok, _ in t:
            met[what] = met.get(what, 0) + (1 if ok else 0)
    return met, n


def run_one(args, build, trace, pods, capacity, time_scale, limit, routing, label, outdir,
            sim_extra=(), rotate=0):
    """Every policy of args.policies (and args.before's cache_aware) on fresh pods, in turn;
    `rotate` starts the turn further down the list (repeated runs rotate it, so that a slow
    spell of this shared machine does not always fall on the same policy)."""
    names = ["pod-%d" % i for i in range(pods)]
    results = []
    sim_extra = list(sim_extra) + ["--engine", args.engine] + shlex.split(args.sim_args)
    print("routing: %s: %s, %s requests, %d pods x %d tokens, time scale %g" % (
        label, os.path.basename(trace), limit or "all", pods, capacity, time_scale), flush=True)
    policies = [p for p in args.policies.split(",") if p and p != "none"]
    # --index events: cache_aware on the pods' KV events (precise mode) in place of the
    # approximate index; both: the two side by side, on the same pods' settings.
    if args.index != "approximate" and "cache_aware" in policies:
        at = policies.index("cache_aware")
        policies[at:at + 1] = (["cache_aware", "cache_aware_events"] if args.index == "both"
                               else ["cache_aware_events"])
    if args.before:
        policies.append("cache_aware_before")
    if policies:
        k = rotate % len(policies)
        policies = policies[k:] + policies[:k]
    # --misconfig F: the config says each pod holds F times its real KV cache, and the pods hide
    # vllm:cache_config_info, so the router cannot learn better from a scrape; cache_aware runs
    # told the truth, then misinformed without and with the delivered-tokens feedback.
    variants = {}
    if args.misconfig:
        policies = ["cache_aware", "cache_aware_misconf_nofeedback", "cache_aware_misconf_feedback"]
        sim_extra = list(sim_extra) + ["--hide-cache-config"]
        wrong = int(capacity * args.misconfig)
        variants = {"cache_aware_misconf_nofeedback": (wrong, {"feedback": False}),
                    "cache_aware_misconf_feedback": (wrong, {"feedback": True})}
    with tempfile.TemporaryDirectory(prefix="pcr-routing-") as tmp:
        for policy in policies:
            sims = front = None
            t0 = time.monotonic()
            try:
                if args.zones:
                    sims = ZonedSims(build, names, time_scale, capacity, args.zones,
                                     extra=sim_extra)
                    zones = sims.zones
                    routing = dict(routing or {}, zone="a")
                else:
                    events = policy == "cache_aware_events"
                    sims = Sims(build, names, time_scale, capacity,
                                extra=sim_extra + (["--kv-events", "0"] if events else []))
                    zones = None
                if policy == "haproxy_hash":
                    front = Haproxy(sims.urls, tmp)
                elif policy == "cache_aware_before":
                    front = Router(os.path.abspath(args.before),
                                   router_config(sims.urls, "cache_aware", capacity,
                                                 routing=routing if zones else None,
                                                 zones=zones), tmp)
                elif policy == "cache_aware_events":
                    cfg = router_config(sims.urls, "cache_aware", capacity,
                                        routing=dict(routing or {}, index="events"), kv=sims.kv)
                    if args.workers:
                        cfg["workers"] = args.workers
                    front = Router(build, cfg, tmp)
                elif policy in variants:
                    cap_conf, extra_routing = variants[policy]
                    cfg = router_config(sims.urls, "cache_aware", cap_conf,
                                        routing=dict(routing, **extra_routing), zones=zones)
                    if args.workers:
                        cfg["workers"] = args.workers
                    front = Router(build, cfg, tmp)
                else:
                    # The baselines stand for a pool without pcrouter (a Service): every request
                    # goes to its pod at once, unless --routing says otherwise.
                    keys = dict(routing or {})
                    if policy != "cache_aware":
                        keys = dict({"hold_tokens": 0}, **keys)
                    cfg = router_config(sims.urls, policy, capacity, routing=keys, zones=zones)
                    if args.workers:
                        cfg["workers"] = args.workers
                    front = Router(build, cfg, tmp)
                print("== %s" % policy, flush=True)
                r = run_replay(build, trace, front.url, list(sims.urls.values()), time_scale,
                               limit, os.path.join(outdir, "replay_%s.json" % policy), policy,
                               cap=args.max_tokens_cap, progress=not args.no_progress,
                               extra=(["--unstreamed", str(args.unstreamed)]
                                      if args.unstreamed else []) +
                               (["--far-pods", ",".join(sims.far)] if zones else []) +
                               schedule_args(args.sim_args))
                if isinstance(front, Router):
                    r.update(router_prediction(
                        front, os.path.join(outdir, "metrics_%s.txt" % policy)))
                # CPU the front and the pods used over the run: on this 2-core machine a
                # router's own work slows the simulated pods and the load generator too.
                r["front_cpu_s"] = front.proc.cpu_seconds() if hasattr(front, "proc") else None
                r["pods_cpu_s"] = sims.proc.cpu_seconds() if hasattr(sims, "proc") else None
                r.update(flat_figures(r))
                r["engine"] = args.engine
                results.append(r)
            except Exception as e:   # one broken policy must not hide the others
                print("routing: %s failed: %s" % (policy, e), file=sys.stderr, flush=True)
            finally:
                if front:
                    front.stop()
                if sims:
                    sims.stop()
            print("   (%.0fs)" % (time.monotonic() - t0), flush=True)
    if results:
        print()
        print_table(results)
        if args.zones:
            print("crossed zones (requests, bytes): " + "; ".join(
                "%s %s, %s" % (r["label"], fmt(r.get("cross_zone_request_share"), ".3f"),
                               fmt(r.get("cross_zone_byte_share"), ".3f")) for r in results))
        print("CPU seconds over the run (front, pods): " + "; ".join(
            "%s %s, %s" % (r["label"], fmt(r.get("front_cpu_s"), ".1f"),
                           fmt(r.get("pods_cpu_s"), ".1f")) for r in results))
        print("\nhit rate: pods' vllm:prefix_cache_hits_total / queries_total over the run; of"
              " ceil: fraction of one LRU cache of all pods' capacity (%.4f);\nTTFT in model"
              " time (wall x time scale); req/s in model time." % (
                  results[0].get("ceiling") or 0))
        if results[0].get("ceiling_scheduled") is not None:
            print("of sched: fraction of that cache with the pods' --capacity-schedule (%.4f):"
                  " what pods whose capacity comes and goes could at best hit." %
                  results[0]["ceiling_scheduled"])
    return results


def parse_roles(text):
    """"2p6d" -> (2, 6)."""
    m = re.match(r"^(\d+)p(\d+)d$", text or "")
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise SystemExit("routing: --roles wants PpDd with P, D >= 1, e.g. 2p6d")
    return int(m.group(1)), int(m.group(2))


def pd_trace(name, load, path, pods):
    """The workload at `load` with its arrival rate scaled from its own pool to `pods` pods."""
    w = workloads.WORKLOADS[name]
    if w.get("trace"):
        raise SystemExit("routing: --roles takes the generated workloads (%s)" % ", ".join(
            n for n, v in workloads.WORKLOADS.items() if not v.get("trace")))
    x = w["loads"][load] * pods / w["pods"]
    rng = workloads.random.Random("%s/%s/%d" % (name, load, 1))
    rows = w["make"](rng, x)
    rows.sort(key=lambda r: r["timestamp"])
    t0 = rows[0]["timestamp"] if rows else 0
    with open(path, "w") as f:
        for r in rows:
            r["timestamp"] -= t0
            f.write(json.dumps(r, separators=(", ", ": ")) + "\n")


def pd_decisions(router):
    import urllib.request
    try:
        text = urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            router.url + "/metrics", timeout=10).read().decode()
    except OSError:
        return {}
    out = {}
    for m in re.finditer(r'^pcrouter_pd_decisions_total\{outcome="([a-z_]+)"\} (\S+)$', text,
                         re.M):
        out[m.group(1)] = int(float(m.group(2)))
    for m in re.finditer(r'^pcrouter_pd_prefill_leg_failures_total\{cause="([a-z_]+)"\} (\S+)$',
                         text, re.M):
        out["leg_" + m.group(1)] = int(float(m.group(2)))
    return out


def run_pd(args, build, trace, capacity, time_scale, limit, routing, label, outdir, rotate=0):
    """Collocated against split, each mode of args.pd_modes, on fresh step-engine pods."""
    p, d = args.roles
    names = ["pod-%d" % i for i in range(p + d)]
    roles = ["prefill"] * p + ["decode"] * d
    variants = [("collocated", None)] + [("split_" + m, m) for m in args.pd_modes.split(",") if m]
    k = rotate % len(variants)
    variants = variants[k:] + variants[:k]
    print("routing: %s disaggregated: %s, %s requests, %d+%d pods x %d tokens, time scale %g" % (
        label, os.path.basename(trace), limit or "all", p, d, capacity, time_scale), flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="pcr-pd-") as tmp:
        for name, mode in variants:
            sims = front = None
            t0 = time.monotonic()
            try:
                extra = ["--engine", "step", "--tick-us", "10000"]
                if mode:
                    extra += ["--role", ",".join(roles)]
                sims = Sims(build, names, time_scale, capacity, extra=extra)
                cfg = router_config(sims.urls, "cache_aware", capacity, routing=routing)
                if mode:
                    for b, role in zip(cfg["backends"], roles):
                        b["role"] = role
                    cfg["pd"] = dict(json.loads(args.pd), mode=mode)
                if args.workers:
                    cfg["workers"] = args.workers
                front = Router(build, cfg, tmp)
                print("== %s" % name, flush=True)
                r = run_replay(build, trace, front.url, list(sims.urls.values()), time_scale,
                               limit, os.path.join(outdir, "replay_%s.json" % name), name,
                               cap=args.max_tokens_cap, progress=not args.no_progress)
                r["pd"] = pd_decisions(front)
                r.update(flat_figures(r))
                r["engine"] = "step"
                results.append(r)
            except Exception as e:   # one broken run must not hide the others
                print("routing: %s failed: %s" % (name, e), file=sys.stderr, flush=True)
            finally:
                if front:
                    front.stop()
                if sims:
                    sims.stop()
            print("   (%.0fs)" % (time.monotonic() - t0), flush=True)
    order = {n: i for i, (n, _) in enumerate(sorted(variants, key=lambda v: v[1] or ""))}
    results.sort(key=lambda r: order.get(r["label"], 99))
    return results


def pd_targets(by):
    """(what, ok, detail) for the disaggregation targets, where the runs exist."""
    out = []
    col, auto = by.get("collocated"), by.get("split_auto")

    def q(r, key, pq):
        return (r or {}).get(key, {}).get(pq)
    if col and auto:
        a, c = q(auto, "itl_ms_model", "p99"), q(col, "itl_ms_model", "p99")
        out.append(("split+auto ITL p99 <= 0.5x collocated", a is not None and c and a <= c / 2,
                    "%s vs %s ms" % (fmt(a, ".1f"), fmt(c, ".1f"))))
        a, c = q(auto, "ttft_ms_model", "p99"), q(col, "ttft_ms_model", "p99")
        out.append(("split+auto TTFT p99 <= collocated", a is not None and c and a <= c,
                    "%s vs %s ms" % (fmt(a, ".0f"), fmt(c, ".0f"))))
        a, c = auto.get("output_tokens_per_s_model"), col.get("output_tokens_per_s_model")
        out.append(("split+auto out tok/s >= collocated", a is not None and c and a >= c * 0.99,
                    "%s vs %s" % (fmt(a, ".0f"), fmt(c, ".0f"))))
    for rule in ("split_always", "split_never"):
        other = by.get(rule)
        if not (auto and other):
            continue
        worse = []
        for key, what in (("ttft_ms_model", "TTFT p99"), ("itl_ms_model", "ITL p99")):
            a, o = q(auto, key, "p99"), q(other, key, "p99")
            if a is None or o is None or a > o * 1.05:
                worse.append("%s %s vs %s" % (what, fmt(a, ".1f"), fmt(o, ".1f")))
        a, o = auto.get("output_tokens_per_s_model"), other.get("output_tokens_per_s_model")
        if a is None or o is None or a < o * 0.95:
            worse.append("tok/s %s vs %s" % (fmt(a, ".0f"), fmt(o, ".0f")))
        out.append(("split+auto no worse than %s" % rule, not worse,
                    "; ".join(worse) if worse else "within 5%"))
    return out


def print_pd(name, results):
    print()
    print_table(results)
    for r in results:
        if r.get("pd"):
            print("  %-14s %s" % (r["label"], ", ".join(
                "%s %d" % (k, v) for k, v in sorted(r["pd"].items()) if v)))
    t = pd_targets({r["label"]: r for r in results})
    print("pd %-20s %d/%d met: %s" % (name, sum(1 for _, ok, _ in t if ok), len(t), "; ".join(
        "%s %s (%s)" % ("MET" if ok else "MISS", w, d) for w, ok, d in t)), flush=True)
    return t


def main():
    quick = os.environ.get("QUICK", "") not in ("", "0")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--workload", default=None,
                    help="one of %s, or all (bench/workloads.py); default: the whole"
                         " conversation trace as --trace, --pods ... say" % ", ".join(
                             workloads.WORKLOADS))
    ap.add_argument("--load", default="all", help="light, knee, past or all (with --workload)")
    ap.add_argument("--trace", default=None, help="default: conversation_trace.jsonl")
    ap.add_argument("--pods", type=int, default=8)
    ap.add_argument("--capacity-tokens", type=int, default=None,
                    help="KV cache per pod (default 1M tokens: an 8B model on an H200-class GPU;"
                         " the trace's working set is ~93M tokens; with --workload, the"
                         " workload's own pool unless given)")
    ap.add_argument("--time-scale", type=float, default=None,
                    help="model time per wall second (default 20; QUICK: 50; with --workload,"
                         " the workload's own unless given). One ms of scheduling jitter on"
                         " this shared machine is this many ms of TTFT")
    ap.add_argument("--limit", type=int, default=2000 if quick else 0,
                    help="first N requests (QUICK: 2000; with --workload, 400)")
    ap.add_argument("--max-tokens-cap", type=int, default=4096)
    ap.add_argument("--policies", default=",".join(POLICIES) + ",haproxy_hash")
    ap.add_argument("--before", default=None, metavar="DIR",
                    help="also run DIR/pcrouter (another build) with cache_aware, labelled"
                         " cache_aware_before")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--engine", choices=("latency", "step"), default="latency",
                    help="the pods' model: latency (default) or step (engine steps after"
                         " vLLM's scheduler: prefill slows the streams beside it)")
    ap.add_argument("--zones", type=float, default=0, metavar="RTT_MS",
                    help="pods in two zones: the router and the first half in zone a, the"
                         " rest in zone b, answering RTT_MS (model time) later; the table adds"
                         " the share of requests and bytes that crossed zones (default 0: one"
                         " zone)")
    ap.add_argument("--routing", default="{}",
                    help='extra routing keys for pcrouter, as JSON (e.g. \'{"load_weight": 0.5}\')')
    ap.add_argument("--index", choices=("approximate", "events", "both"), default="approximate",
                    help="cache_aware's index: approximate (default), events (precise mode: the"
                         " pods publish their KV events, vllm_sim --kv-events, and the router"
                         " follows them and tokenizes each prompt), or both, side by side"
                         " (cache_aware and cache_aware_events)")
    ap.add_argument("--sim-args", default="",
                    help="more vllm_sim flags for every run, e.g. '--foreign-load 2' or"
                         " '--capacity-schedule 2:1,2:0.25' (pods that evict in their own order)")
    ap.add_argument("--misconfig", type=float, default=0, metavar="F",
                    help="cache_aware only: told the pods' true capacity, then F times it with"
                         " the pods hiding vllm:cache_config_info, feedback off and on")
    ap.add_argument("--access-log", metavar="DIR", default=None,
                    help="write each pcrouter's JSON access log to DIR, one file per run")
    ap.add_argument("--workers", type=int, default=0,
                    help="pcrouter's worker threads (default: its own, one per core)")
    ap.add_argument("--replicas", default="1,2,4",
                    help="after the policies (conversation trace only): cache_aware through this"
                         " many replicas, one worker each (1 alone runs nothing more); with"
                         " --index events, every replica follows the pods' KV events")
    ap.add_argument("--share", choices=("both", "on", "off"), default="both",
                    help="replicas with and without sharing the index through Redis")
    ap.add_argument("--flush-ms", type=int, default=0,
                    help="redis.flush_ms of the shared runs (default: pcrouter's)")
    ap.add_argument("--unstreamed", type=float, default=0, metavar="F",
                    help="this fraction of the requests asks for a whole answer"
                         " (\"stream\": false), the same ones in every run; they count in"
                         " the hit rate and the shares, not in TTFT (default 0)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="runs of each replica setup (the table shows the run of median hit"
                         " rate), or of every policy on a --workload (the table and the"
                         " targets take the median of each figure, and each run's targets"
                         " are counted) (default 1; QUICK: 3 for the replica setups)")
    ap.add_argument("--roles", default=None, metavar="PpDd",
                    help="with --workload: disaggregated runs on P prefill and D decode pods"
                         " (e.g. 2p6d) against the same pods collocated, on the step engine")
    ap.add_argument("--pd-modes", default="auto,always,never",
                    help="with --roles: the pd.mode of each split run (default all three)")
    ap.add_argument("--pd", default="{}",
                    help='with --roles: extra pd keys for the split runs, as JSON (e.g.'
                         ' \'{"max_ttft_ratio": 3}\')')
    args = ap.parse_args()
    if args.roles:
        args.roles = parse_roles(args.roles)
        if args.workload is None:
            raise SystemExit("routing: --roles needs --workload (shared_prefix, chat, agentic)")
    if args.access_log:
        global ACCESS_LOG_DIR
        os.makedirs(args.access_log, exist_ok=True)
        ACCESS_LOG_DIR = os.path.abspath(args.access_log)
    if args.repeat is None:   # a workload's policies run once unless asked
        args.repeat = 3 if quick and (args.workload is None or args.misconfig) else 1
    if args.time_scale is None and args.workload is None:
        args.time_scale = 50 if quick else 20
    routing = json.loads(args.routing)
    build = os.path.abspath(args.build)
    os.makedirs(args.out, exist_ok=True)
    runs = []   # (name, results)
    if args.workload is None:
        trace = args.trace or os.path.join(traces_dir(), "conversation_trace.jsonl")
        results = run_one(args, build, trace, args.pods, args.capacity_tokens or 1000000,
                          args.time_scale,
                          args.limit, routing, "conversation (%s)" % (
                              "first %d" % args.limit if args.limit else "whole trace"),
                          args.out)
        replicas = []
        if any(int(x) > 1 for x in args.replicas.split(",") if x.strip()):
            names = ["pod-%d" % i for i in range(args.pods)]
            with tempfile.TemporaryDirectory(prefix="pcr-replicas-") as tmp:
                replicas = run_replicas(args, build, trace, names, routing, tmp)
        if not results and not replicas:
            return 1
        targets = check_targets({r["label"]: r for r in results}) if results else []
        if targets:
            print("\ntargets (hit rate, balance, TTFT):")
            for t in targets:
                print("  " + t)
        if replicas:
            print("\ncache_aware through several replicas of one worker each, requests round"
                  " robin (hit rate as above;\nRedis: commands, bytes in and out per routed"
                  " request, memory at the end; each row the run of median hit rate of %d):"
                  % args.repeat)
            targets_r = print_replicas(replicas)
            for r in replicas:
                if r.get("share_counters"):
                    print("  %s: %s" % (r["label"], ", ".join(
                        "%s %d" % (k, v) for k, v in sorted(r["share_counters"].items()))))
            for t in targets_r:
                print("  " + t)
            targets += targets_r
        summary = [{k: v for k, v in r.items() if k != "ttft_ms_model_sorted"} for r in results]
        summary_r = [{k: v for k, v in r.items() if k != "ttft_ms_model_sorted"} for r in replicas]
        with open(os.path.join(args.out, "routing.json"), "w") as f:
            json.dump({"results": summary, "replicas": summary_r, "targets": targets}, f, indent=1)
        png = plot(results, args.out) if results else None
        if png:
            print("\nwrote %s" % os.path.relpath(png))
        runs.append(("conversation", results))
    else:
        names = list(workloads.WORKLOADS) if args.workload == "all" else [args.workload]
        loads = list(workloads.LOADS) if args.load == "all" else [args.load]
        for n in names + loads:
            if n not in workloads.WORKLOADS and n not in workloads.LOADS:
                raise SystemExit("routing: unknown workload or load %r" % n)
        for name in names:
            w = workloads.WORKLOADS[name]
            for load in loads:
                outdir = os.path.join(args.out, "%s_%s" % (name, load))
                os.makedirs(outdir, exist_ok=True)
                trace = os.path.join(outdir, "trace.jsonl")
                workloads.write(name, load, trace)
                limit = args.limit if args.limit else (400 if quick else 0)
                if args.roles:
                    pods = sum(args.roles)
                    pd_trace(name, load, trace, pods)
                    rounds = [run_pd(args, build, trace, args.capacity_tokens or
                                     w["capacity_tokens"], args.time_scale or w["time_scale"],
                                     limit, routing, "%s/%s" % (name, load), outdir, rotate=k)
                              for k in range(args.repeat)]
                    results = median_results(rounds) if len(rounds) > 1 else rounds[0]
                    if len(rounds) > 1:   # median_results keeps TTFT; ITL and tok/s too
                        for r in results:
                            rs = [x for rnd in rounds for x in rnd if x["label"] == r["label"]]
                            r["itl_ms_model"] = dict(r.get("itl_ms_model", {}))
                            v = [x["itl_ms_model"]["p99"] for x in rs
                                 if x.get("itl_ms_model", {}).get("p99") is not None]
                            if v:
                                r["itl_ms_model"]["p99"] = statistics.median(v)
                            v = [x["output_tokens_per_s_model"] for x in rs
                                 if x.get("output_tokens_per_s_model") is not None]
                            if v:
                                r["output_tokens_per_s_model"] = statistics.median(v)
                    t = print_pd("%s/%s" % (name, load), results)
                    summary = [{k2: v for k2, v in r.items() if k2 != "ttft_ms_model_sorted"}
                               for r in results]
                    with open(os.path.join(outdir, "pd.json"), "w") as f:
                        json.dump({"workload": name, "load": load, "roles": "%dp%dd" % args.roles,
                                   "results": summary,
                                   "targets": [{"what": a, "met": b, "detail": c}
                                               for a, b, c in t]}, f, indent=1)
                    runs.append(("pd %s/%s" % (name, load), t))
                    continue
                # Tokens after the first leave the pods in 10 ms batches (wall): hundreds of
                # long streams at once would otherwise keep this machine's cores busy with
                # writes. Times to first token are not batched.
                capacity = args.capacity_tokens or w["capacity_tokens"]
                rounds = []
                for k in range(args.repeat):
                    rounds.append(run_one(args, build, trace, w["pods"], capacity,
                                          args.time_scale or w["time_scale"], limit, routing,
                                          "%s/%s" % (name, load), outdir,
                                          sim_extra=["--tick-us", "10000"],
                                          rotate=0 if args.misconfig else k))
                    if args.repeat > 1 and not args.misconfig:
                        print(summary_line("%s/%s run %d" % (name, load, k + 1), rounds[-1]),
                              flush=True)
                if args.misconfig:
                    results = rounds[len(rounds) // 2]
                    print_misconfig(rounds)
                elif len(rounds) > 1:
                    results = median_results(rounds)
                    met, n = targets_per_run(rounds)
                    print("\n%s/%s, medians of %d runs:" % (name, load, len(rounds)))
                    print_table(results)
                    print_pooled(results)
                    if n:
                        print("targets met run by run: %s" % "; ".join(
                            "%s %d/%d" % (what, c, n) for what, c in met.items()))
                else:
                    results = rounds[0]
                summary = [{k: v for k, v in r.items() if k != "ttft_ms_model_sorted"}
                           for r in results]
                with open(os.path.join(outdir, "routing.json"), "w") as f:
                    json.dump({"workload": name, "load": load, "results": summary}, f, indent=1)
                runs.append(("%s/%s" % (name, load), results))
                if not args.misconfig:   # no baselines ran: nothing to hold the targets against
                    print(summary_line("%s/%s" % (name, load), results), flush=True)
    if args.misconfig:
        return 0
    if args.roles:
        print("\ntargets (disaggregated, %dp%dd):" % args.roles)
        for name, t in runs:
            print("%-28s %d/%d met: %s" % (name, sum(1 for _, ok, _ in t if ok), len(t),
                                          "; ".join("%s %s (%s)" % ("MET" if ok else "MISS", w, d)
                                                    for w, ok, d in t)))
        return 0
    print("\ntargets (cache_aware against the best of %s):" % ", ".join(BASELINES))
    for name, results in runs:
        print(summary_line(name, results))
    gke = [g for g in (gke_line(name, results) for name, results in runs) if g]
    if gke:
        print("\ncache_aware against random (a Kubernetes Service), as GKE Inference Gateway"
              " reports itself:")
        for g in gke:
            print(g)
    return 0


if __name__ == "__main__":
    sys.exit(main())
