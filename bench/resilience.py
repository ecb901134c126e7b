#!/usr/bin/python3
"""bench/resilience.py: `make bench-resilience`: what failures cost, measured on real processes.

  kill     three vllm_sim pods (one process each) under 200 concurrent streams and a steady
           load of short requests; one pod is SIGKILLed, then started again on its port. Time
           from the kill to the pod's ejection (pcrouter's log), requests lost among those not
           yet streaming (target 0), its streams ended visibly, requests sent to it more than
           1 s after its death, time to rejoin.
  restart  h2load keeps a steady load on pcrouter; the pod is killed and started again on its
           port at once (a few ms: one exec). Failed requests, with the pod alone and with a
           second pod (docs/BENCHMARKS.md has the figure from before this work).
  scrape   pcrouter with 64 backends (one vllm_sim serving 64 pods, /metrics grown to vLLM's
           size with --metrics-pad-bytes), no traffic: its CPU (utime + stime from
           /proc/PID/stat) over 30 s, as % of one core, with scrapes every 200 ms and without.
  hitrate  bench-routing's QUICK replay (conversation trace, first 2000 requests, time scale
           50, 8 pods x 1M tokens, cache_aware) with one pod paused (SIGSTOP: unreachable, its
           cache kept) or restarted (its cache lost) a third of the way in, with
           routing.unavailable_keep_ms at its default ("down is not forgotten") and at 0 (a pod
           marked down loses its entries at once: the behaviour before). Delivered hit rate from
           pcrouter's pcrouter_delivered_hit_rate (the pods' counters, a restart included).

Prints one table per part, writes bench/out/resilience.json. Each measure runs --repeat times
(3; the hit rates are medians, with the lowest and highest); --parts picks some; QUICK=1 runs
each once and measures the scrape CPU over 10 s instead of 30. Every wait has a deadline.
"""
import argparse
import json
import os
import re
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
sys.path.insert(0, HERE)
import routing  # noqa: E402  (Sims, Router, run_replay)

MODEL = "sim-8b"
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def metrics(url):
    with _direct.open(url + "/metrics", timeout=10) as r:
        return r.read().decode()


def metric(text, name, **labels):
    """Sum of the series `name` whose labels include `labels`; None if there is none."""
    total = None
    for line in text.splitlines():
        m = re.match(r"([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == str(v) for k, v in labels.items()):
            total = (total or 0) + float(m.group(3))
    return total


def log_time(line):
    """Seconds since the epoch of a pcrouter log line (ISO-8601 UTC to the ms)."""
    m = re.match(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{3})Z", line)
    if not m:
        return None
    import calendar
    y, mo, d, h, mi, s, ms = (int(x) for x in m.groups())
    return calendar.timegm((y, mo, d, h, mi, s)) + ms / 1000.0


def port_of(url):
    return int(url.rsplit(":", 1)[1])


def kill_sims(sims):
    """SIGKILL, as a pod that dies; returns the time of the kill."""
    t = time.time()
    os.killpg(sims.proc.p.pid, signal.SIGKILL)
    sims.proc.p.wait(10)
    return t


def wait_until(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(0.01)


# ---- HTTP/1.1 clients ----------------------------------------------------------------------

def post(port, body, timeout=60):
    """One POST /v1/completions on its own connection, read to EOF. Returns a dict: t0, t_first
    (first response byte), status, backend, body (de-chunked), complete (the last chunk came),
    error."""
    out = {"t0": time.time(), "t_first": None, "status": 0, "backend": None, "body": b"",
           "complete": False, "error": None}
    data = json.dumps(body).encode()
    raw = b""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            if out["t_first"] is None:
                out["t_first"] = time.time()
            raw += chunk
        s.close()
    except OSError as e:
        out["error"] = str(e)
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return out
    lines = head.decode("latin-1").split("\r\n")
    out["status"] = int(lines[0].split()[1])
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
    out["backend"] = hdrs.get("x-pcrouter-backend")
    if "chunked" not in hdrs.get("transfer-encoding", ""):
        out["body"] = rest
        out["complete"] = len(rest) == int(hdrs.get("content-length", -1))
        return out
    body = b""
    while True:
        line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            break
        size = int(line.split(b";")[0] or b"0", 16)
        if size == 0:
            out["complete"] = True
            break
        body += rest[:size]
        if len(rest) < size + 2:
            break
        rest = rest[size + 2:]
    out["body"] = body
    return out


class Steady:
    """`threads` clients sending short requests one after another until stop()."""

    def __init__(self, port, threads, max_tokens):
        self.port, self.max_tokens = port, max_tokens
        self.results, self.lock, self.stopping = [], threading.Lock(), threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(threads)]
        for t in self.threads:
            t.start()

    def run(self, i):
        n = 0
        while not self.stopping.is_set():
            n += 1
            r = post(self.port, {"model": MODEL, "prompt": "steady %d %d " % (i, n) * 20,
                                 "max_tokens": self.max_tokens})
            with self.lock:
                self.results.append(r)

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(60)
        return self.results


# ---- kill ----------------------------------------------------------------------------------

def part_kill(build, tmp):
    scale = 2   # a 12 ms token takes 6 ms: a 400-token stream lasts about 2.4 s
    names = ["pod-a", "pod-b", "pod-c"]
    sims = {n: routing.Sims(build, [n], scale) for n in names}
    router = None
    try:
        urls = {n: s.urls[n] for n, s in sims.items()}
        cfg = routing.router_config(urls, "cache_aware")
        cfg["health"] = {"interval_ms": 2000}   # the default: ejection comes from traffic
        router = routing.Router(build, cfg, tmp)
        port = port_of(router.url)
        streams = [None] * 200
        threads = []
        for i in range(200):
            body = {"model": MODEL, "prompt": "stream %d " % i * 40, "max_tokens": 400,
                    "stream": True}

            def one(i=i, body=body):
                streams[i] = post(port, body)
            threads.append(threading.Thread(target=one, daemon=True))
        for t in threads:
            t.start()
        steady = Steady(port, 8, 50)
        time.sleep(1.0)
        victim = "pod-c"
        t_kill = kill_sims(sims[victim])
        time.sleep(2.0)
        sims[victim] = routing.Sims(build, [victim], scale, ports=[port_of(urls[victim])])
        t_back = time.time()
        wait_until(lambda: any(r["backend"] == victim and r["t0"] > t_back
                               for r in list(steady.results)), 20, "the pod to rejoin")
        rejoin = min(r["t0"] for r in steady.results
                     if r["backend"] == victim and r["t0"] > t_back) - t_back
        time.sleep(0.5)
        load = steady.stop()
        for t in threads:
            t.join(60)
        lines = list(router.proc.lines)
    finally:
        if router:
            router.stop()
        for s in sims.values():
            s.stop()
    out_t = [log_time(l) for l in lines
             if re.search(r"backend %s (ejected|is down)" % victim, l)]
    out_t = [t for t in out_t if t is not None and t >= t_kill - 0.001]
    late = [l for l in lines if "backend %s failed before answering" % victim in l
            and (log_time(l) or 0) > t_kill + 1.0]
    on_victim = [s for s in streams if s["backend"] == victim and s["t_first"] and
                 s["t_first"] < t_kill]
    visible = [s for s in on_victim if not s["complete"] and b"event: error" in s["body"]]
    not_streaming = [s for s in streams if not (s["t_first"] and s["t_first"] < t_kill)]
    not_streaming += [r for r in load if not (r["t_first"] and r["t_first"] < t_kill)
                      and (r["t_first"] or r["t0"]) >= t_kill - 1.0]
    lost = [r for r in not_streaming if r["status"] != 200 or not r["complete"]]
    return {
        "kill_to_ejection_ms": round((min(out_t) - t_kill) * 1000) if out_t else None,
        "streams_on_victim": len(on_victim),
        "streams_ended_visibly": len(visible),
        "not_yet_streaming": len(not_streaming),
        "lost_not_yet_streaming": len(lost),
        "sent_to_dead_pod_after_1s": len(late),
        "rejoin_after_restart_ms": round(rejoin * 1000),
        "steady_requests": len(load),
    }


# ---- restart -------------------------------------------------------------------------------

def h2load_counts(text):
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                  r"(\d+) failed, (\d+) errored", text)
    codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text)
    rate = re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", text)
    if not m or not codes:
        raise RuntimeError("h2load said:\n" + text)
    done, ok2xx, errored = int(m.group(3)), int(codes.group(1)), int(m.group(6))
    return {"requests": done, "failed": done - ok2xx + errored,
            "req_per_s": float(rate.group(1)) if rate else None}


def part_restart(build, tmp, pods):
    scale = 1000
    victim = routing.Sims(build, ["pod-v"], scale)
    other = routing.Sims(build, ["pod-o"], scale) if pods == 2 else None
    router = None
    body = os.path.join(tmp, "restart.json")
    with open(body, "w") as f:
        json.dump({"model": MODEL, "prompt": "restart " * 64, "max_tokens": 1}, f)
    try:
        urls = dict(victim.urls, **(other.urls if other else {}))
        cfg = routing.router_config(urls, "round_robin")
        cfg["health"] = {"interval_ms": 2000}
        router = routing.Router(build, cfg, tmp)
        log = os.path.join(tmp, "h2load.log")
        if os.path.exists(log):
            os.unlink(log)  # h2load appends
        h2 = subprocess.Popen(["h2load", "--h1", "-c", "16", "-t", "1", "-D", "4", "-d", body,
                               "-H", "content-type: application/json", "--log-file", log,
                               router.url + "/v1/completions"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(1.5)
        t_kill = kill_sims(victim)
        victim = routing.Sims(build, ["pod-v"], scale, ports=[port_of(urls["pod-v"])])
        gap = time.time() - t_kill
        text, _ = h2.communicate(timeout=60)
    finally:
        if router:
            router.stop()
        victim.stop()
        if other:
            other.stop()
    r = h2load_counts(text)
    # Per request: start (us since the epoch), status (-1: no response), duration (us).
    fails = []
    with open(log) as f:
        for line in f:
            start, status, _ = line.split("\t")[:3]
            if not 200 <= int(status) < 300:
                fails.append(int(start) / 1e6 - t_kill)
    r.update({"pods": pods, "gap_ms": round(gap * 1000, 1),
              "failures_from_ms": round(min(fails) * 1000, 1) if fails else "-",
              "failures_to_ms": round(max(fails) * 1000, 1) if fails else "-"})
    return r


# ---- scrape --------------------------------------------------------------------------------

def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def part_scrape(build, tmp, secs, pad, interval_ms):
    names = ["pod-%d" % i for i in range(64)]
    sims = routing.Sims(build, names, 1, extra=["--metrics-pad-bytes", str(pad)])
    router = None
    try:
        cfg = {"listen": [{"address": "127.0.0.1:0"}],
               "backends": [{"name": n, "url": u} for n, u in sims.urls.items()],
               "scrape": {"interval_ms": interval_ms}, "log": {"access_log": False}}
        router = routing.Router(build, cfg, tmp)
        page = len(urllib.request.urlopen(sims.urls["pod-0"] + "/metrics", timeout=10).read())
        pid = router.proc.p.pid
        time.sleep(2)
        c0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(secs)
        c1, t1 = cpu_seconds(pid), time.monotonic()
    finally:
        if router:
            router.stop()
        sims.stop()
    return {"pods": 64, "page_bytes": page, "scrape_interval_ms": interval_ms,
            "seconds": secs, "cpu_pct_of_one_core": round(100 * (c1 - c0) / (t1 - t0), 2)}


# ---- hit rate ------------------------------------------------------------------------------

def part_hitrate(build, tmp, event, keep_ms):
    """One QUICK replay; `event` None, "pause" or "restart" happens to pod-3 a third of the way."""
    scale, limit, cap, capacity = 50, 2000, 4096, 1000000
    trace = os.path.join(routing.traces_dir(), "conversation_trace.jsonl")
    with open(trace) as f:
        last_ts = 0
        for i, line in enumerate(f):
            if i >= limit:
                break
            last_ts = json.loads(line)["timestamp"]
    wall = last_ts / 1000.0 / scale
    names = ["pod-%d" % i for i in range(8)]
    victim_name = "pod-3"
    others = routing.Sims(build, [n for n in names if n != victim_name], scale, capacity)
    victim = routing.Sims(build, [victim_name], scale, capacity)
    router = None
    holder = {"victim": victim}
    try:
        urls = dict(others.urls, **victim.urls)
        urls = {n: urls[n] for n in names}
        routing_keys = {"unavailable_keep_ms": keep_ms} if keep_ms is not None else {}
        cfg = routing.router_config(urls, "cache_aware", capacity, routing=routing_keys)
        # A pod that stops answering is marked down within about a second.
        cfg["health"] = {"interval_ms": 500, "timeout_ms": 500, "fall": 2}
        router = routing.Router(build, cfg, tmp)

        def happen():
            time.sleep(wall / 3)
            v = holder["victim"]
            if event == "pause":
                os.killpg(v.proc.p.pid, signal.SIGSTOP)
                time.sleep(3.0)
                os.killpg(v.proc.p.pid, signal.SIGCONT)
            elif event == "restart":
                kill_sims(v)
                time.sleep(1.0)
                holder["victim"] = routing.Sims(build, [victim_name], scale, capacity,
                                                ports=[port_of(urls[victim_name])])
        t = threading.Thread(target=happen, daemon=True) if event else None
        if t:
            t.start()
        r = routing.run_replay(build, trace, router.url, list(urls.values()), scale, limit,
                               os.path.join(tmp, "replay.json"), event or "none", cap=cap,
                               timeout=600, progress=False)
        if t:
            t.join(30)
        time.sleep(0.6)   # the last scrape of every pod
        text = metrics(router.url)
        lines = list(router.proc.lines)
    finally:
        if router:
            router.stop()
        others.stop()
        holder["victim"].stop()
    return {"event": event or "none",
            "unavailable_keep_ms": keep_ms if keep_ms is not None else 300000,
            "delivered_hit_rate": round(metric(text, "pcrouter_delivered_hit_rate"), 4),
            "replay_errors": r.get("errors"),
            "victim_down": any("backend %s is down" % victim_name in l for l in lines),
            "victim_restart_seen": any("backend %s restarted" % victim_name in l for l in lines)}


# ---- main ----------------------------------------------------------------------------------

def table(title, rows, cols):
    print("\n" + title)
    print("| " + " | ".join(h for h, _ in cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(k, "-")) for _, k in cols) + " |")


def main():
    quick = os.environ.get("QUICK", "") not in ("", "0")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--parts", default="kill,restart,scrape,hitrate")
    ap.add_argument("--scrape-seconds", type=float, default=10 if quick else 30)
    ap.add_argument("--repeat", type=int, default=1 if quick else 3)
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    parts = args.parts.split(",")
    os.makedirs(args.out, exist_ok=True)
    res = {}
    with tempfile.TemporaryDirectory(prefix="pcr-resil-") as tmp:
        if "kill" in parts:
            print("kill: 3 pods, 200 streams + steady load, SIGKILL one ...", flush=True)
            res["kill"] = [part_kill(build, tmp) for _ in range(args.repeat)]
            table("pod killed under 200 streams (HTTP/1.1), one row per run", res["kill"], [
                ("kill to ejection", "kill_to_ejection_ms"),
                ("its streams", "streams_on_victim"), ("ended visibly", "streams_ended_visibly"),
                ("not yet streaming", "not_yet_streaming"),
                ("of those lost", "lost_not_yet_streaming"),
                ("sent to it > 1 s after death", "sent_to_dead_pod_after_1s"),
                ("rejoined after restart (ms)", "rejoin_after_restart_ms")])
        if "restart" in parts:
            print("\nrestart: h2load 4 s, the pod restarted in place at 1.5 s ...", flush=True)
            res["restart"] = [part_restart(build, tmp, pods) for pods in (1, 2)
                              for _ in range(args.repeat)]
            table("pod restarted in place under steady load (h2load --h1 -c 16, 4 s), "
                  "one row per run",
                  res["restart"], [("pods", "pods"), ("req/s", "req_per_s"),
                                   ("restart gap (ms)", "gap_ms"), ("requests", "requests"),
                                   ("failed", "failed"),
                                   ("first failure sent (ms from kill)", "failures_from_ms"),
                                   ("last failure sent", "failures_to_ms")])
        if "scrape" in parts:
            print("\nscrape: 64 pods, pcrouter idle, %.0f s per row ..." % args.scrape_seconds,
                  flush=True)
            res["scrape"] = [part_scrape(build, tmp, args.scrape_seconds, pad, every)
                             for pad, every in ((40000, 200), (0, 200), (40000, 0))
                             for _ in range(args.repeat)]
            table("pcrouter CPU, 64 backends, no traffic, one row per run", res["scrape"], [
                ("pods", "pods"), ("page bytes", "page_bytes"),
                ("scrape every (ms)", "scrape_interval_ms"), ("seconds", "seconds"),
                ("CPU, % of one core", "cpu_pct_of_one_core")])
        if "hitrate" in parts:
            print("\nhitrate: bench-routing QUICK replays, pod-3 paused or restarted ...",
                  flush=True)
            runs = [(None, None), ("pause", None), ("pause", 0), ("restart", None),
                    ("restart", 0)]
            res["hitrate"] = []
            for e, k in runs:
                got = [part_hitrate(build, tmp, e, k) for _ in range(args.repeat)]
                rates = sorted(g["delivered_hit_rate"] for g in got)
                res["hitrate"].append(dict(got[0], runs=got,
                                           delivered_hit_rate=rates[len(rates) // 2],
                                           range="%.4f-%.4f" % (rates[0], rates[-1]),
                                           victim_down=sum(g["victim_down"] for g in got),
                                           victim_restart_seen=sum(g["victim_restart_seen"]
                                                                   for g in got),
                                           replay_errors=sum(g["replay_errors"] or 0
                                                             for g in got)))
            table("delivered hit rate, QUICK replay (2000 requests, scale 50, cache_aware), "
                  "median of %d" % args.repeat,
                  res["hitrate"], [("pod-3", "event"),
                                   ("unavailable_keep_ms", "unavailable_keep_ms"),
                                   ("delivered hit rate", "delivered_hit_rate"),
                                   ("lowest-highest", "range"),
                                   ("runs it was marked down", "victim_down"),
                                   ("runs its restart was seen", "victim_restart_seen"),
                                   ("replay errors, all runs", "replay_errors")])
    with open(os.path.join(args.out, "resilience.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
