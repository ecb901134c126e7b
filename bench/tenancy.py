#!/usr/bin/python3
"""Tenants sharing one pool through pcrouter's flow control (make bench-tenancy).

Simulated vLLM pods (bench/sim/vllm_sim, one process) behind pcrouter with two tenants named
by a header (routing.tenant_header). Two experiments, each a set of runs in this invocation so
every ratio is against a baseline measured alongside it:

  1. Priority. An interactive tenant (priority 10) at a steady rate, a batch tenant (priority
     0) flooding at --flood times the pool's prefill capacity. Runs: interactive alone, batch
     alone, both with flow control, both without, and (unless --scheduling-policy fcfs) both
     with flow control and the pods' priority scheduling: vllm_sim --scheduling-policy
     priority, the tenants' pod_priority set (interactive 0, batch 10: lower is served
     first), so a pod serves an interactive prompt before the batch prompts it holds. Every
     run but the last has fcfs pods and no pod_priority, as before. Reported: the interactive tenant's TTFT p99
     against its run alone, its rejections, the batch tenant's rejections and its output
     tokens a second against its run alone, and what the pods did whoever asked: the prompt
     tokens they computed a second (the interactive tenant's included) against the batch
     tenant's run alone, and their preemptions. With --engine step the pods' steps are
     bounded (--max-num-batched-tokens, STEP_BATCHED_TOKENS below) in every run alike.
  2. Fairness. Two tenants of equal priority and weight, one sending long prompts and one
     short, both flooding. Runs: with flow control, without. Reported: tokens served to each
     (prompt plus output, as the pods reported them) and their ratio, and the hit rate (cached
     over prompt tokens) against the run without flow control.

  3. Memory (--only memory). --waiting requests (100,000 by default) wait in the flow queue
     at once: one pod that never answers (vllm_sim --stall-rate 1) and flow_control's
     inflight_per_pod keep the pool saturated, and h2load opens the requests as HTTP/2
     streams over --h2-connections connections. Reported: pcrouter's RSS before, with all of
     them waiting, and after; the bytes per waiting request, against the bound docs/TENANCY.md
     states; then the clients leave (h2load is stopped) and every queue gauge must return to
     0 and RSS come back down.

Load is open-loop (Poisson arrivals), each request a streamed completion on its own
connection, measured by asyncio in this process. --quick for a short smoke run.
"""
import argparse
import asyncio
import contextlib
import hashlib
import http.client
import json
import os
import random
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from routing import Router, Sims  # noqa: E402

MODEL = "sim-8b"
# The step engine's pods: vLLM's --max-num-batched-tokens as an operator sets it to bound a
# step's prefill, so an interactive prompt waits at most a short step for the GPU (vLLM's own
# defaults are 8192 on an H100, 2048 on smaller GPUs, 1024 on a TPU v6e: engine/arg_utils.py).
STEP_BATCHED_TOKENS = 1024
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo"]


def text(rng, tokens):
    """About `tokens` tokens of text (4 bytes a token, as pcrouter and the simulator count)."""
    out, n = [], 0
    while n < tokens * 4:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:tokens * 4]


class Stats:
    def __init__(self):
        self.ttft = []          # seconds, requests that got a first token
        self.status = {}        # status -> count
        self.prompt = 0         # tokens the pods reported
        self.cached = 0
        self.output = 0
        self.done = 0

    def count(self, status):
        self.status[status] = self.status.get(status, 0) + 1


class Run(dict):
    """One run's Stats by tenant, and what the pods did."""
    def __init__(self, stats):
        super().__init__(stats)
        self.prefill = 0        # prompt tokens the pods computed (not found cached)
        self.preemptions = 0


def dechunk(b):
    out, i = [], 0
    while i < len(b):
        j = b.find(b"\r\n", i)
        if j < 0:
            break
        try:
            n = int(b[i:j].split(b";")[0], 16)
        except ValueError:
            break
        if n == 0:
            break
        out.append(b[j + 2:j + 2 + n])
        i = j + 2 + n + 2
    return b"".join(out)


async def one_request(host, port, tenant, prompt, max_tokens, stats, timeout):
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    head = ("POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            "x-tenant: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            % (tenant, len(body))).encode()
    t0 = time.monotonic()
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        w.write(head + body)
        data = b""
        status = None
        first = None
        deadline = t0 + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise asyncio.TimeoutError()
            chunk = await asyncio.wait_for(r.read(65536), left)
            if not chunk:
                break
            data += chunk
            if status is None and b"\r\n" in data:
                status = int(data.split(b" ", 2)[1])
            if first is None and status == 200 and b"\r\n\r\n" in data and \
                    b"data:" in data.split(b"\r\n\r\n", 1)[1]:
                first = time.monotonic()
        w.close()
    except (OSError, asyncio.TimeoutError, ValueError, IndexError):
        stats.count("error")
        return
    stats.count(status)
    if status != 200:
        return
    stats.done += 1
    if first is not None:
        stats.ttft.append(first - t0)
    # The usage event (include_usage): the pod's own token counts.
    head, _, payload = data.partition(b"\r\n\r\n")
    if b"chunked" in head.lower():
        payload = dechunk(payload)
    for line in payload.split(b"\n"):
        if line.startswith(b"data:") and b'"usage"' in line and b"prompt_tokens" in line:
            try:
                u = json.loads(line[5:]).get("usage") or {}
            except ValueError:
                continue
            stats.prompt += u.get("prompt_tokens", 0)
            stats.output += u.get("completion_tokens", 0)
            stats.cached += (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


async def open_loop(host, port, tenant, rate, duration, make_prompt, max_tokens, stats, seed,
                    timeout):
    """Poisson arrivals at `rate` a second for `duration` seconds."""
    rng = random.Random(seed)
    tasks = []
    t_end = time.monotonic() + duration
    nxt = time.monotonic()
    while True:
        nxt += rng.expovariate(rate)
        if nxt >= t_end:
            break
        await asyncio.sleep(max(0.0, nxt - time.monotonic()))
        tasks.append(asyncio.ensure_future(one_request(host, port, tenant, make_prompt(rng),
                                                       max_tokens, stats, timeout)))
    if tasks:
        await asyncio.gather(*tasks)


def p(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


@contextlib.contextmanager
def pool(args, tmp, npods, settings, policy="fcfs"):
    """Fresh simulated pods (scheduling `policy`) and a pcrouter in front (`settings` added to
    its config); yields the router's (host, port)."""
    sims = Sims(args.build, ["pod-%d" % i for i in range(npods)], 1.0,
                extra=["--max-num-seqs", "64", "--engine", args.engine,
                       "--scheduling-policy", policy] +
                      (["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
                       if args.max_num_batched_tokens else []) +
                      (["--long-prefill-token-threshold", str(args.long_prefill_token_threshold)]
                       if args.long_prefill_token_threshold else []))
    router = None
    try:
        cfg = dict({"listen": [{"address": "127.0.0.1:0"}],
                    "backends": [{"name": n, "url": u} for n, u in sims.urls.items()],
                    "workers": 1, "health": {"interval_ms": 1000},
                    "log": {"access_log": False}}, **settings)
        router = Router(args.build, cfg, tmp)
        host, port = router.url[len("http://"):].split(":")
        yield host, int(port), sims
    finally:
        if router:
            router.stop()
        sims.stop()


def run(args, tmp, flow, loads, npods=None, pod_priority=False):
    """One run: fresh pods and router; `loads` is [(tenant, rate, make_prompt, max_tokens)].
    pod_priority: the pods schedule by priority and the tenants give theirs."""
    settings = {
        "routing": {"policy": "cache_aware", "tenant_header": "x-tenant"},
        "tenants": {"interactive": {"priority": 10}, "batch": {"priority": 0},
                    "long": {"priority": 0}, "short": {"priority": 0}},
        "flow_control": {"enabled": flow, "prefill_per_pod": args.prefill_per_pod,
                         "ttl_ms": args.ttl_ms, "max_queue_requests": args.max_queue},
    }
    if pod_priority:
        settings["tenants"]["interactive"]["pod_priority"] = 0
        settings["tenants"]["batch"]["pod_priority"] = 10
    with pool(args, tmp, npods or args.pods, settings,
              "priority" if pod_priority else "fcfs") as (host, port, sims):
        stats = {t: Stats() for t, _, _, _ in loads}
        t0 = time.monotonic()

        async def main():
            await asyncio.gather(*[
                open_loop(host, port, t, rate, args.duration, mk, mt, stats[t], 11 + i,
                          args.ttl_ms / 1000 + 60)
                for i, (t, rate, mk, mt) in enumerate(loads)])
        asyncio.run(main())
        el = time.monotonic() - t0
        # What the pods did, whoever asked: prefill (prompt tokens not found cached) and
        # preemptions, from their own counters.
        stats = Run(stats)
        for url in sims.urls.values():
            h, pt = url[len("http://"):].split(":")
            m = scrape(h, int(pt))
            stats.prefill += int(gauge_sum(m, "vllm:prompt_tokens_total") -
                                 gauge_sum(m, "vllm:prefix_cache_hits_total"))
            stats.preemptions += int(gauge_sum(m, "vllm:num_preemptions_total"))
        print("#   pods: %d prefill tokens, %d preemptions, %.1f s"
              % (stats.prefill, stats.preemptions, el), file=sys.stderr, flush=True)
        return stats, el


def experiment_priority(args, tmp):
    cap = args.pods * 1e6 / (70 * args.batch_tokens)   # batch prompts a second the pods prefill
    inter = ("interactive", args.interactive_rate, lambda r: text(r, args.interactive_tokens), 32)
    batch = ("batch", args.flood * cap, lambda r: text(r, args.batch_tokens), 64)
    rows = {}
    setups = [("interactive alone", True, [inter], False),
              ("batch alone", True, [batch], False),
              ("both, flow control", True, [inter, batch], False),
              ("both, no flow control", False, [inter, batch], False)]
    if args.scheduling_policy == "priority":
        setups.append(("both, flow control + pod priority", True, [inter, batch], True))
    for label, flow, loads, prio in setups:
        if args.setups and not any(x in label for x in args.setups.split(",")):
            continue
        runs = [run(args, tmp, flow, loads, pod_priority=prio) for _ in range(args.repeat)]
        rows[label] = runs
        for stats, el in runs:
            print("# %-34s %s" % (label, {t: (len(s.ttft), s.status) for t, s in stats.items()}),
                  file=sys.stderr, flush=True)
    return cap, rows


def med(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def report_priority(args, cap, rows):
    base_p99 = med([p(s["interactive"].ttft, 0.99)
                    for s, _ in rows.get("interactive alone", [])])
    base_tput = med([s["batch"].output / el for s, el in rows.get("batch alone", [])])
    base_work = med([s.prefill / el for s, el in rows.get("batch alone", [])])
    print("\n## Priority: interactive at %.1f req/s, batch flooding at %.0fx the pool's prefill "
          "capacity (%.1f req/s of %d-token prompts), %d pods (%s engine%s), %ds runs, median "
          "of %d" % (args.interactive_rate, args.flood, cap, args.batch_tokens, args.pods,
                     args.engine, ", %d tokens a step" % args.max_num_batched_tokens
                     if args.engine == "step" and args.max_num_batched_tokens else "",
                     args.duration, args.repeat))
    print("\n| run | interactive TTFT p50 | p99 | p99 / alone | interactive rejected | "
          "batch rejected | batch output tok/s | / batch alone | pods' prefill tok/s | "
          "/ batch alone | preemptions |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, runs in rows.items():
        def col(t, f):
            return med([f(s[t], el) for s, el in runs]) if t in runs[0][0] else float("nan")
        p50 = col("interactive", lambda s, el: p(s.ttft, 0.5))
        p99 = col("interactive", lambda s, el: p(s.ttft, 0.99))
        irej = col("interactive", lambda s, el: sum(v for k, v in s.status.items() if k != 200))
        brej = col("batch", lambda s, el: sum(v for k, v in s.status.items() if k != 200))
        tput = col("batch", lambda s, el: s.output / el)
        work = med([s.prefill / el for s, el in runs])
        preempt = med([s.preemptions for s, el in runs])
        print("| %s | %.3f s | %.3f s | %s | %s | %s | %s | %s | %.0f | %s | %d |" % (
            label, p50, p99, "%.2fx" % (p99 / base_p99) if p99 == p99 else "-",
            "%d" % irej if irej == irej else "-", "%d" % brej if brej == brej else "-",
            "%.0f" % tput if tput == tput else "-",
            "%.2fx" % (tput / base_tput) if tput == tput and base_tput else "-",
            work, "%.2fx" % (work / base_work) if base_work == base_work and base_work else "-",
            preempt))


def experiment_fairness(args, tmp):
    # Each tenant asks about a few documents of its own (half of each prompt, the part the pods
    # can reuse), both more than the pool serves: served first come first served, each gets
    # what it offers in proportion; by tokens, as much as the other.
    half_l, half_s = args.long_tokens // 2, args.short_tokens // 2
    docs_long = [text(random.Random(100 + i), half_l) for i in range(4)]
    docs_short = [text(random.Random(200 + i), half_s) for i in range(4)]
    loads = [("long", args.fair_rate, lambda r: r.choice(docs_long) + " " + text(r, half_l), 32),
             ("short", args.short_rate, lambda r: r.choice(docs_short) + " " + text(r, half_s), 32)]
    rows = {}
    for label, flow in (("flow control", True), ("no flow control", False)):
        rows[label] = [run(args, tmp, flow, loads, args.fair_pods) for _ in range(args.repeat)]
        for stats, el in rows[label]:
            print("# %-16s %s" % (label, {t: (s.done, s.status) for t, s in stats.items()}),
                  file=sys.stderr, flush=True)
    return rows


def report_fairness(args, rows):
    print("\n## Fairness: tenants `long` (%d-token prompts, %.1f req/s) and `short` (%d, %.1f "
          "req/s), half of each a shared document, equal priority and weight, %d pod(s), %ds "
          "runs, median of %d" % (args.long_tokens, args.fair_rate, args.short_tokens,
                                  args.short_rate, args.fair_pods, args.duration, args.repeat))
    print("\n| run | long: tokens served | short: tokens served | short / long | "
          "long rejected | short rejected | served a second (until the last answer) | hit rate | "
          "/ no flow control |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    hit_base = med([(s["long"].cached + s["short"].cached) / max(1, s["long"].prompt + s["short"].prompt)
                    for s, _ in rows["no flow control"]])
    for label, runs in rows.items():
        served = {t: med([s[t].prompt + s[t].output for s, _ in runs]) for t in ("long", "short")}
        rej = {t: med([sum(v for k, v in s[t].status.items() if k != 200) for s, _ in runs])
               for t in ("long", "short")}
        hit = med([(s["long"].cached + s["short"].cached) / max(1, s["long"].prompt + s["short"].prompt)
                   for s, _ in runs])
        rate = med([sum(x.prompt + x.output for x in s.values()) / el for s, el in runs])
        print("| %s | %d | %d | %.2f | %d | %d | %.0f | %.3f | %.2fx |" % (
            label, served["long"], served["short"], served["short"] / max(1, served["long"]),
            rej["long"], rej["short"], rate, hit, hit / hit_base if hit_base else float("nan")))


def experiment_auth(args, tmp):
    """401s: keys that match nothing, keys that differ from a configured one in their last
    byte only, and no key, interleaved over one keep-alive connection; the time of each."""
    keys = ["sk-bench-%064d" % i for i in range(args.auth_keys)]
    auth = {"keys": [{"sha256": hashlib.sha256(k.encode()).hexdigest()} for k in keys]}
    with pool(args, tmp, 1, {"auth": auth}) as (host, port):
        conn = http.client.HTTPConnection(host, port, timeout=10)
        body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1})
        rng = random.Random(5)
        times = {"random key": [], "a key but its last byte": [], "no key": []}
        for i in range(args.auth_requests):
            kind = list(times)[i % 3]
            h = {"Content-Type": "application/json"}
            if kind == "random key":
                h["Authorization"] = "Bearer sk-bench-%064x" % rng.getrandbits(256)
            elif kind != "no key":
                h["Authorization"] = "Bearer " + rng.choice(keys)[:-1] + "x"
            t0 = time.perf_counter()
            conn.request("POST", "/v1/completions", body, h)
            r = conn.getresponse()
            r.read()
            times[kind].append(time.perf_counter() - t0)
            assert r.status == 401, r.status
        return times


def report_auth(args, times):
    print("\n## Auth: %d configured keys, %d requests over one keep-alive connection, all 401"
          % (args.auth_keys, args.auth_requests))
    print("\n| key | requests | p50 | p99 |")
    print("| --- | --- | --- | --- |")
    for k, v in times.items():
        print("| %s | %d | %.0f us | %.0f us |" % (k, len(v), p(v, 0.5) * 1e6, p(v, 0.99) * 1e6))


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def scrape(host, port):
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return text


def gauge_sum(text, name):
    """The sum of a metric's samples (every label set)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


# What must be 0 once the waiting clients are gone: every queue and what it holds.
QUEUE_GAUGES = ["pcrouter_tenant_queue_requests", "pcrouter_tenant_concurrent_requests",
                "pcrouter_backend_held_requests", "pcrouter_request_body_buffered_bytes",
                "pcrouter_backend_queued_prefill_tokens", "pcrouter_requests_in_flight"]


def poll(what, fn, timeout):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() > deadline:
            if not v:
                raise RuntimeError("timed out waiting for " + what)
            return v
        time.sleep(0.2)


def experiment_memory(args, tmp):
    """--waiting requests in the flow queue at once; RSS, then the clients leave."""
    import subprocess
    n, conns = args.waiting, args.h2_connections
    streams = -(-n // conns)
    sims = Sims(args.build, ["pod-0"], 1.0, extra=["--stall-rate", "1"])
    router = None
    h2 = None
    try:
        cfg = {"listen": [{"address": "127.0.0.1:0"}],
               "backends": [{"name": nm, "url": u} for nm, u in sims.urls.items()],
               "workers": 1, "health": {"interval_ms": 1000},
               "log": {"access_log": False},
               "routing": {"policy": "cache_aware", "tenant_header": "x-tenant"},
               "tenants": {"batch": {"priority": 0}},
               "limits": {"max_concurrent_streams": streams},
               "timeouts": {"response_ms": 600000, "stream_idle_ms": 600000,
                            "client_idle_ms": 600000},
               "flow_control": {"enabled": True, "inflight_per_pod": 1,
                                "ttl_ms": 600000, "max_queue_requests": n + 10,
                                "max_queue_bytes": 1 << 34}}
        router = Router(args.build, cfg, tmp)
        host, port = router.url[len("http://"):].split(":")
        port = int(port)
        pid = router.proc.p.pid
        body = os.path.join(tmp, "body.json")
        rng = random.Random(3)
        with open(body, "w") as f:
            json.dump({"model": MODEL, "prompt": text(rng, args.waiting_tokens),
                       "max_tokens": 16, "stream": True}, f)
        # Warm: one request through, so the pools and allocator arenas exist before the base.
        scrape(host, port)
        base = rss_bytes(pid)
        t0 = time.monotonic()
        h2 = subprocess.Popen(["h2load", "-c", str(conns), "-m", str(streams), "-n",
                               str(streams * conns), "-t", "1", "-d", body,
                               "-H", "x-tenant: batch", "-H", "content-type: application/json",
                               "http://%s:%d/v1/completions" % (host, port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
        want = streams * conns - 1   # one is at the (stalled) pod
        poll("%d waiting" % want,
             lambda: gauge_sum(scrape(host, port), "pcrouter_tenant_queue_requests") >= want,
             args.waiting_timeout)
        t_fill = time.monotonic() - t0
        time.sleep(1)  # reading RSS, not synchronising: let the last streams' buffers settle
        text_m = scrape(host, port)
        waiting = gauge_sum(text_m, "pcrouter_tenant_queue_requests")
        body_bytes = gauge_sum(text_m, "pcrouter_request_body_buffered_bytes")
        loaded = rss_bytes(pid)
        h2.kill()
        h2.wait(30)
        h2 = None
        t1 = time.monotonic()
        # The one at the stalled pod is gone with its client too: everything is 0.
        def empty():
            t = scrape(host, port)
            return t if all(gauge_sum(t, g) == 0 for g in QUEUE_GAUGES) else None
        m = poll("every queue gauge at 0", empty, 120)
        t_empty = time.monotonic() - t1
        # RSS comes back as the control thread trims (pcr_budget_trim, on its tick): the
        # lowest of 10 s of readings, or the first within 32 MiB of the base.
        after = rss_bytes(pid)
        deadline = time.monotonic() + 10
        while after > base + (32 << 20) and time.monotonic() < deadline:
            time.sleep(0.5)
            after = min(after, rss_bytes(pid))
        return dict(n=int(waiting), base=base, loaded=loaded, after=after, body=body_bytes,
                    t_fill=t_fill, t_empty=t_empty, conns=conns, streams=streams,
                    gauges={g: gauge_sum(m, g) for g in QUEUE_GAUGES})
    finally:
        if h2 is not None:
            h2.kill()
        if router:
            router.stop()
        sims.stop()


def report_memory(args, r):
    per = (r["loaded"] - r["base"]) / max(1, r["n"])
    body = r["body"] / max(1, r["n"])
    bound = args.bound + body
    print("\n## Memory: %d requests waiting in the flow queue (%d h2c connections x %d streams, "
          "prompts of %d tokens)" % (r["n"], r["conns"], r["streams"], args.waiting_tokens))
    print("\n| | value |")
    print("| --- | --- |")
    print("| RSS before | %.1f MiB |" % (r["base"] / 2**20))
    print("| RSS with them waiting | %.1f MiB (filled in %.1f s) |" % (r["loaded"] / 2**20,
                                                                      r["t_fill"]))
    print("| bytes per waiting request | %.0f (bound %.0f: %d + its body) |" % (per, bound,
                                                                              args.bound))
    print("| of which request bodies | %.0f |" % body)
    print("| clients gone: every queue gauge 0 after | %.1f s |" % r["t_empty"])
    print("| RSS after | %.1f MiB |" % (r["after"] / 2**20))
    ok = per <= bound and all(v == 0 for v in r["gauges"].values()) and \
        r["after"] <= r["base"] + (r["loaded"] - r["base"]) * 0.25
    print("\n%s: per request %s the bound, queues %s, RSS %s" % (
        "PASS" if ok else "FAIL", "within" if per <= bound else "over",
        "empty" if all(v == 0 for v in r["gauges"].values()) else "NOT empty",
        "back down" if r["after"] <= r["base"] + (r["loaded"] - r["base"]) * 0.25
        else "still up"))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--pods", type=int, default=2)
    ap.add_argument("--duration", type=int, default=30, help="seconds of load per run")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each setup (medians)")
    ap.add_argument("--flood", type=float, default=5.0, help="batch load, times the capacity")
    ap.add_argument("--interactive-rate", type=float, default=2.0)
    ap.add_argument("--interactive-tokens", type=int, default=1000)
    ap.add_argument("--batch-tokens", type=int, default=4000)
    ap.add_argument("--long-tokens", type=int, default=8000)
    ap.add_argument("--short-tokens", type=int, default=1000)
    ap.add_argument("--fair-rate", type=float, default=6.0,
                    help="long prompts a second in the fairness runs")
    ap.add_argument("--short-rate", type=float, default=24.0,
                    help="short prompts a second in the fairness runs")
    ap.add_argument("--fair-pods", type=int, default=1)
    ap.add_argument("--prefill-per-pod", type=int, default=4000,
                    help="flow_control.prefill_per_pod")
    ap.add_argument("--ttl-ms", type=int, default=10000)
    ap.add_argument("--max-queue", type=int, default=400)
    ap.add_argument("--engine", default="latency", choices=["latency", "step"],
                    help="vllm_sim's engine: FIFO prefill (latency) or vLLM's steps with "
                         "chunked prefill (step)")
    ap.add_argument("--scheduling-policy", default="priority", choices=["fcfs", "priority"],
                    help="priority (default): the priority experiment adds a run with the "
                         "pods' priority scheduling and the tenants' pod_priority; fcfs: not")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None,
                    help="step engine: the pods' token budget per step, vLLM's flag; default "
                         "%d, an operator's bound on a step (so on the wait for its end) for "
                         "interactive TTFT (0: vllm_sim's own default, 8192, vLLM's on an "
                         "H100)" % STEP_BATCHED_TOKENS)
    ap.add_argument("--long-prefill-token-threshold", type=int, default=0,
                    help="step engine: the most prompt tokens one request computes in a step "
                         "(vLLM's --long-prefill-token-threshold; 0: no limit)")
    ap.add_argument("--setups", default="",
                    help="priority: only the runs whose label has one of these comma-separated "
                         "words (for experiments; the table needs 'alone')")
    ap.add_argument("--auth-keys", type=int, default=1000)
    ap.add_argument("--auth-requests", type=int, default=30000)
    ap.add_argument("--waiting", type=int, default=100000,
                    help="memory: requests waiting at once")
    ap.add_argument("--waiting-tokens", type=int, default=256,
                    help="memory: each waiting request's prompt, tokens (4 bytes each)")
    ap.add_argument("--h2-connections", type=int, default=20)
    ap.add_argument("--waiting-timeout", type=float, default=300)
    ap.add_argument("--bound", type=int, default=6144,
                    help="memory: the bytes a waiting request may cost over its body's "
                         "(docs/TENANCY.md)")
    ap.add_argument("--only", choices=["priority", "fairness", "auth", "memory"])
    ap.add_argument("--quick", action="store_true", help="10 s runs")
    args = ap.parse_args()
    if args.max_num_batched_tokens is None:
        args.max_num_batched_tokens = STEP_BATCHED_TOKENS if args.engine == "step" else 0
    if args.quick:
        args.duration = 10
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "priority"):
            cap, rows = experiment_priority(args, tmp)
            report_priority(args, cap, rows)
        if args.only in (None, "fairness"):
            rows = experiment_fairness(args, tmp)
            report_fairness(args, rows)
        if args.only in (None, "auth"):
            report_auth(args, experiment_auth(args, tmp))
        if args.only == "memory":
            if not report_memory(args, experiment_memory(args, tmp)):
                sys.exit(1)


if __name__ == "__main__":
    main()
