"""Resilience: health checks apart from traffic, scrapes on their own clock, passive outlier
detection (ejection, back-off, probes, panic), a pod killed under load, a pod restarting in a
few milliseconds, and what the prefix index keeps of a pod that was away.

Every pod is a real process on loopback (the stub, or bench/sim's vllm_sim where the test needs
vLLM's /metrics); timestamps compared with pcrouter's log lines come from the same wall clock
(its lines start with an ISO-8601 UTC time to the millisecond)."""
import calendar
import os
import re
import signal
import sys
import threading
import time

import pytest

from conftest import (BUILD, H2Client, Load, completion, curl, free_port, get_metrics,
                      make_config, metric, wait_for)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench"))
import resilience  # noqa: E402  (bench/resilience.py: post, an HTTP/1.1 client read to EOF)
import routing  # noqa: E402  (bench/routing.py: Sims, vllm_sim processes)

# A prompt long enough for several 256-byte prefix blocks.
SYSTEM = "You are a careful assistant. " * 40


def prompt(tag):
    return SYSTEM + "Question %s: what is the answer?" % tag


def log_time(line):
    """The wall-clock time (seconds since the epoch) a pcrouter log line starts with."""
    m = re.match(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{3})Z", line)
    assert m, "no timestamp in %r" % line
    y, mo, d, h, mi, s, ms = (int(x) for x in m.groups())
    return calendar.timegm((y, mo, d, h, mi, s)) + ms / 1000.0


def log_lines(router, regex, start=0):
    rx = re.compile(regex)
    with router.err.cond:
        lines = list(router.err.lines[start:])
    return [l for l in lines if rx.search(l)]


def backend_metric(router, name, backend):
    return metric(get_metrics(router), name, backend=backend)


# ---- checks apart from traffic ------------------------------------------------------------

def test_saturated_pool_keeps_pod_up_and_its_prefixes(stub_factory, router_factory):
    """Every request connection of the pod carries a long stream: its health checks still pass
    (they have a connection of their own), it is neither marked down nor ejected, and the index
    keeps its prefixes."""
    a = stub_factory("pod-a")
    r = router_factory(make_config([{"name": "pod-a", "url": a.url, "max_connections": 2}],
                                   workers=1, routing={"policy": "cache_aware"},
                                   health={"interval_ms": 100, "timeout_ms": 300, "fall": 1}))
    assert curl(r.url("/v1/completions"), completion(prompt("warm"))).status == 200
    blocks = wait_for(lambda: backend_metric(r, "pcrouter_index_blocks", "pod-a"), 10,
                      what="prefix blocks indexed for pod-a")
    from conftest import CurlStream
    streams = [CurlStream(r.url("/v1/completions"),
                          completion(prompt("s%d" % i), stream=True, gate="long"))
               for i in range(6)]
    try:
        # Both connections carry a stream; the other four wait for one in pcrouter's queue.
        wait_for(lambda: a.stats()["active"] == 2, 15, what="the pool saturated")
        checks = a.stats()["requests"].get("/health", 0)
        wait_for(lambda: a.stats()["requests"].get("/health", 0) >= checks + 8, 15,
                 what="health checks answered while the pool is full")
        assert a.stats()["active"] == 2
        text = get_metrics(r)
        assert metric(text, "pcrouter_backend_up", backend="pod-a") == 1, text
        assert metric(text, "pcrouter_backend_ejected", backend="pod-a") == 0, text
        assert metric(text, "pcrouter_backend_ejections_total", backend="pod-a") == 0, text
        assert metric(text, "pcrouter_index_blocks", backend="pod-a") >= blocks, text
        assert "is down" not in r.stderr_text()
        a.release("long")
        for cs in streams:
            rc, out = cs.finish(30)
            assert rc == 0 and b"[DONE]" in out, out[-500:]
    finally:
        for cs in streams:
            cs.kill()


def test_health_checks_off_scrapes_go_on(router_factory, tmp_path):
    """health.interval_ms 0 turns off health checks, not the scrape of the pod's /metrics."""
    sims = routing.Sims(BUILD, ["sim-a"], 100)
    try:
        r = router_factory(make_config([("sim-a", sims.urls["sim-a"])],
                                       health={"interval_ms": 0}, scrape={"interval_ms": 100}))
        for i in range(3):
            resp = curl(r.url("/v1/completions"), completion(prompt(i), model="sim-8b"))
            assert resp.status == 200, resp
        wait_for(lambda: (backend_metric(r, "pcrouter_backend_prefix_cache_queries_tokens_total",
                                         "sim-a") or 0) > 0, 10,
                 what="the pod's prefix-cache counters scraped")
        assert metric(get_metrics(r), "pcrouter_delivered_hit_rate") is not None
    finally:
        sims.stop()


def test_a_stalled_metrics_page_is_let_go_and_checks_go_on(cluster):
    """A pod that never finishes its /metrics holds the check connection only for
    scrape.timeout_ms: the next scrapes are sent, and health checks behind them keep the pod
    up (timeouts.response_ms, 10 minutes, would have held it that long)."""
    c = cluster(1, health={"interval_ms": 100, "timeout_ms": 500},
                scrape={"interval_ms": 100, "timeout_ms": 300})
    a = c.stubs[0]
    a.configure(metrics_stall=True)
    seen = a.stats()["requests"].get("/metrics", 0)
    wait_for(lambda: a.stats()["requests"].get("/metrics", 0) >= seen + 4, 15,
             what="scrapes after stalled ones")
    health = a.stats()["requests"].get("/health", 0)
    wait_for(lambda: a.stats()["requests"].get("/health", 0) >= health + 3, 15,
             what="health checks between the stalled scrapes")
    assert metric(get_metrics(c.router), "pcrouter_backend_up", backend="pod-a") == 1
    assert "is down" not in c.router.stderr_text()
    assert curl(c.url("/v1/completions"), completion("still served")).status == 200


def test_a_slow_metrics_page_never_delays_a_health_check(cluster):
    """A pod whose /metrics takes as long as scrape.timeout_ms (one byte at a time, or never
    finished) must not fail its health checks: they have a connection of their own rather
    than waiting behind the scrape, whose wait would eat their own deadline. Such a pod used
    to be marked down whenever a check waited longer than its deadline left (at the defaults,
    both 1000 ms, now and then; with a shorter health deadline, at once)."""
    c = cluster(1, health={"interval_ms": 150, "timeout_ms": 300, "fall": 2},
                scrape={"interval_ms": 50, "timeout_ms": 1000})
    a = c.stubs[0]
    a.configure(metrics_stall=True)
    seen = a.stats()["requests"].get("/metrics", 0)
    wait_for(lambda: a.stats()["requests"].get("/metrics", 0) >= seen + 2, 15,
             what="stalled scrapes")
    health = a.stats()["requests"].get("/health", 0)
    wait_for(lambda: a.stats()["requests"].get("/health", 0) >= health + 8, 20,
             what="health checks while scrapes stall")
    assert "is down" not in c.router.stderr_text(), c.router.err.tail()
    assert metric(get_metrics(c.router), "pcrouter_backend_up", backend="pod-a") == 1


# ---- passive outlier detection ------------------------------------------------------------

def sequential(router, n, tag="q", **stub):
    """n requests one after another: their (status, backend) pairs."""
    out = []
    for i in range(n):
        resp = curl(router.url("/v1/completions"), completion("%s%d" % (tag, i), **stub))
        out.append((resp.status, resp.header("x-pcrouter-backend")))
    return out


def test_5xx_in_a_row_eject_and_traffic_moves(cluster):
    # The ejection outlasts the test: 40 requests and 3 health checks take more than 5 s on a
    # loaded machine under ASan, and an ejection that ended would be a pass or fail by the clock.
    c = cluster(2, policy="round_robin", health={"interval_ms": 100},
                outlier={"consecutive_errors": 3, "ejection_ms": 30000})
    a = c.by_name["pod-a"]
    a.configure(defaults={"status": 500})
    start = len(c.router.err.lines)
    got = []
    wait_for(lambda: got.extend(sequential(c.router, 2)) or
             backend_metric(c.router, "pcrouter_backend_ejected", "pod-a") == 1, 15,
             what="pod-a ejected")
    # Exactly the threshold reached it in a row before it was ejected.
    assert [s for s, b in got].count(500) == 3, got
    line = log_lines(c.router, r"backend pod-a ejected for 30000 ms after 3 errors \(5xx\)", start)
    assert line, c.router.err.tail()
    # pod-a answers its health checks, yet it stays out for its whole ejection: a pod that
    # passes /health while failing requests must not be let back every probe.
    served = a.stats()["requests"].get("/v1/completions", 0)
    checks = a.stats()["requests"].get("/health", 0)
    after = sequential(c.router, 30, "moved")
    wait_for(lambda: a.stats()["requests"].get("/health", 0) >= checks + 3, 10,
             what="health checks of the ejected pod")
    after += sequential(c.router, 10, "moved-more")
    assert all(s == 200 and b == "pod-b" for s, b in after), after
    assert a.stats()["requests"].get("/v1/completions", 0) == served
    assert backend_metric(c.router, "pcrouter_backend_ejected", "pod-a") == 1


def test_4xx_never_ejects(cluster):
    c = cluster(2, policy="round_robin", workers=1, outlier={"consecutive_errors": 2})
    c.by_name["pod-a"].configure(defaults={"status": 400})
    got = sequential(c.router, 20)
    assert sorted(set(got)) == [(200, "pod-b"), (400, "pod-a")], got
    assert [b for s, b in got].count("pod-a") == 10
    text = get_metrics(c.router)
    assert metric(text, "pcrouter_backend_ejections_total", backend="pod-a") == 0, text
    assert metric(text, "pcrouter_backend_ejected", backend="pod-a") == 0, text


def test_failed_connects_eject_after_threshold(stub_factory, router_factory):
    b = stub_factory("pod-b")
    r = router_factory(make_config([("pod-dead", "http://127.0.0.1:%d" % free_port()), b],
                                   workers=1, routing={"policy": "round_robin"},
                                   health={"interval_ms": 60000, "fall": 100},
                                   outlier={"consecutive_connect_errors": 3,
                                            "ejection_ms": 30000}))
    seen = []
    for i in range(20):
        resp = curl(r.url("/v1/completions"), completion("c%d" % i))
        assert resp.status == 200 and resp.header("x-pcrouter-backend") == "pod-b", resp
        text = get_metrics(r)
        seen.append((metric(text, "pcrouter_retries_total"),
                     metric(text, "pcrouter_backend_ejected", backend="pod-dead")))
    # Each request round robin sent to pod-dead was retried on pod-b; the third ejected it, and
    # no request was sent there after that.
    first = next(i for i, (_, ej) in enumerate(seen) if ej == 1)
    assert seen[first][0] == 3, seen
    assert all(ej == 1 and n == 3 for n, ej in seen[first:]), seen
    assert re.search(r"backend pod-dead ejected for 30000 ms after 3 failed connects",
                     r.stderr_text())


def test_pod_back_within_a_probe_after_connect_ejection(stub_factory, router_factory):
    a = stub_factory("pod-a")
    b = stub_factory("pod-b")
    r = router_factory(make_config([a, b], routing={"policy": "round_robin"},
                                   health={"interval_ms": 60000, "fall": 100},
                                   outlier={"consecutive_connect_errors": 2,
                                            "ejection_ms": 20000, "probe_ms": 100}))
    port = a.port
    a.kill()
    wait_for(lambda: sequential(r, 2, "k") and
             backend_metric(r, "pcrouter_backend_ejected", "pod-a") == 1, 15,
             what="pod-a ejected for failed connects")
    assert all(s == 200 for s, _ in sequential(r, 6, "away")), "retried on pod-b"
    a2 = stub_factory("pod-a", port=port)
    t_back = time.monotonic()
    wait_for(lambda: backend_metric(r, "pcrouter_backend_ejected", "pod-a") == 0, 10, 0.01,
             what="pod-a back in rotation")
    # Its ejection had 20 s to run: a probe (every 100 ms) brought it back.
    assert time.monotonic() - t_back < 3.0
    got = sequential(r, 6, "back")
    assert ("200", "pod-a") in [(str(s), b) for s, b in got], got
    assert a2.stats()["requests"].get("/v1/completions", 0) >= 1
    assert re.search(r"backend pod-a answers its probe: back in rotation", r.stderr_text())


def test_repeated_ejections_back_off(cluster):
    c = cluster(2, policy="round_robin", health={"interval_ms": 100},
                outlier={"consecutive_errors": 2, "ejection_ms": 300, "max_ejection_ms": 5000})
    c.by_name["pod-a"].configure(defaults={"status": 500})
    start = len(c.router.err.lines)
    load = Load(c.router.port, lambda n: completion("b%d" % n), threads=2)
    try:
        wait_for(lambda: len(log_lines(c.router, r"backend pod-a ejected for", start)) >= 3, 20,
                 what="three ejections of pod-a")
    finally:
        load.stop()
    lines = log_lines(c.router, r"backend pod-a ejected for", start)[:3]
    ms = [int(re.search(r"ejected for (\d+) ms", l).group(1)) for l in lines]
    assert ms == [300, 600, 1200], lines
    # Each ejection ran its course before the pod could fail again (log times are to the ms).
    t = [log_time(l) for l in lines]
    assert t[1] - t[0] >= 0.300 - 0.002, lines
    assert t[2] - t[1] >= 0.600 - 0.002, lines
    # pod-b took everything pod-a could not: only pod-a's own 500s reached clients.
    fails = [x for x in load.results if x["status"] != 200]
    assert all(x["status"] == 500 and x["backend"] == "pod-a" for x in fails), fails[:5]


def test_panic_sends_to_ejected_pods_rather_than_503(cluster):
    c = cluster(2, policy="round_robin", health={"interval_ms": 100},
                outlier={"consecutive_errors": 2, "ejection_ms": 20000})
    for s in c.stubs:
        s.configure(defaults={"status": 500})
    wait_for(lambda: sequential(c.router, 2, "p") and
             all(backend_metric(c.router, "pcrouter_backend_ejected", n) == 1
                 for n in ("pod-a", "pod-b")), 15, what="both pods ejected")
    for s in c.stubs:
        s.configure(defaults={})
    panics = metric(get_metrics(c.router), "pcrouter_panic_routes_total")
    got = sequential(c.router, 4, "after")
    assert all(s == 200 for s, _ in got), got
    assert metric(get_metrics(c.router), "pcrouter_panic_routes_total") >= panics + 4
    assert curl(c.url("/health")).status == 200


# ---- a pod killed under load ----------------------------------------------------------------

def run_threads(fns):
    results = [None] * len(fns)

    def one(i):
        results[i] = fns[i]()
    ts = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(fns))]
    for t in ts:
        t.start()
    return ts, results


def first_line_after(router, regex, t0):
    """Time (log clock) of the first line matching regex logged at or after t0, or None."""
    for l in log_lines(router, regex):
        t = log_time(l)
        if t >= t0 - 0.001:
            return t
    return None


@pytest.mark.parametrize("proto", ["h1", "h2c"])
def test_pod_killed_under_200_streams(stub_factory, router_factory, proto):
    """200 requests in flight over three pods, half of them streams whose first event went out;
    pod-c is killed. The requests it had not started answering are retried on the others and
    succeed; its streams end with a visible error; it gets no new request once it has been
    dead for a second; it rejoins when it comes back on its port."""
    stubs = [stub_factory(n) for n in ("pod-a", "pod-b", "pod-c")]
    victim = stubs[2]
    r = router_factory(make_config(stubs, routing={"policy": "round_robin"},
                                   health={"interval_ms": 500, "fall": 2},
                                   timeouts={"drain_ms": 5000}))
    wait_for(lambda: curl(r.url("/health")).status == 200, 15, what="/health 200")
    n = 200
    bodies = [completion("k%d" % i, stream=(i % 2 == 0), gate="g", events=4) for i in range(n)]
    h2 = None
    if proto == "h1":
        threads, results = run_threads([lambda b=b: resilience.post(r.port, b) for b in bodies])
    else:
        h2 = H2Client(r.port, timeout=60)
        sids = [h2.request("POST", "/v1/completions", b) for b in bodies]
    try:
        def in_flight():
            if h2 is not None:
                h2.pump(0.05)
            return sum(s.stats()["active"] for s in stubs) == n
        wait_for(in_flight, 40, what="all %d requests in flight at the pods" % n)
        on_victim = victim.stats()["active"]
        assert on_victim >= 20, on_victim
        port = victim.port
        t_kill = time.time()
        victim.kill()
        # New requests keep coming during and after the death.
        load = Load(r.port, lambda k: completion("after%d" % k), threads=4)
        wait_for(lambda: load.count() >= 20 and time.time() > t_kill + 1.5, 20,
                 what="load through the first 1.5 s after the kill")
        # The requests pod-c had not answered yet now wait at the other pods' gate.
        wait_for(lambda: sum(s.stats()["active"] for s in stubs[:2]) >= n // 2 + 1, 20,
                 what="pod-c's unanswered requests retried elsewhere")
        for s in stubs[:2]:
            s.release("g")
        if h2 is None:
            for t in threads:
                t.join(60)
                assert not t.is_alive(), "a client did not finish"
        else:
            h2.wait(lambda: all(h2.streams[s]["ended"] or h2.streams[s]["reset"] is not None
                                for s in sids), 60, "every h2 stream to end")
            results = []
            for s in sids:
                st = h2.streams[s]
                hdrs = st["headers"] or {}
                results.append({"status": int(hdrs.get(":status", 0)), "body": bytes(st["data"]),
                                "backend": hdrs.get("x-pcrouter-backend"),
                                "complete": st["ended"], "reset": st["reset"]})
        after = load.stop()
    finally:
        if h2 is not None:
            h2.close()
        for s in stubs[:2]:
            try:
                s.release()
            except OSError:
                pass
    cut = 0
    for i, (b, res) in enumerate(zip(bodies, results)):
        pod = res["backend"]
        if not b.get("stream"):
            # Not streaming yet when pod-c died: retried, answered.
            assert res["status"] == 200 and res["complete"], (i, res)
            assert pod in ("pod-a", "pod-b"), (i, res)
            continue
        assert res["status"] == 200, (i, res)
        if pod != "pod-c":
            assert res["complete"] and b"[DONE]" in res["body"], (i, res)
            continue
        cut += 1
        assert not res["complete"] and b"[DONE]" not in res["body"], (i, res)
        if proto == "h1":
            assert b"event: error" in res["body"] and b'"code":"response_cut"' in res["body"], res
        else:
            assert res["reset"] is not None, res  # RST_STREAM
    assert cut >= 10, "pod-c carried %d streams" % cut
    # Every new request succeeded, none on the dead pod.
    bad = [x for x in after if x["status"] != 200 or x["backend"] == "pod-c"]
    assert not bad, bad[:5]
    # Out of rotation within a second: no request was sent to it after that.
    out_at = first_line_after(r, r"backend pod-c (ejected|is down)", t_kill)
    assert out_at is not None and out_at - t_kill < 1.0, r.err.tail()
    late = [l for l in log_lines(r, r"backend pod-c failed before answering")
            if log_time(l) > t_kill + 1.0]
    assert not late, late[:5]
    # It comes back on its port and takes requests again.
    back = stub_factory("pod-c", port=port)
    wait_for(lambda: any(b == "pod-c" for _, b in sequential(r, 3, "rejoin")), 15,
             what="pod-c back in rotation")
    assert back.stats()["requests"].get("/v1/completions", 0) >= 1


# ---- a pod restarting in a few milliseconds ---------------------------------------------------

def restart_sim(sims, name, port, time_scale):
    """SIGKILL the vllm_sim process serving `name`, start a new one on the same port at once:
    returns (new Sims, kill time, time the new one listened)."""
    t_kill = time.time()
    os.killpg(sims.proc.p.pid, signal.SIGKILL)
    sims.proc.p.wait(10)
    new = routing.Sims(BUILD, [name], time_scale, ports=[port])
    return new, t_kill, time.time()


@pytest.mark.parametrize("pods", [1, 2])
def test_quick_restart_under_load(router_factory, pods):
    """A pod killed and started again on its port at once (a few ms: one exec) under steady
    load. With another pod, nothing fails: what the restarting pod could not take is retried
    there. Alone, only requests sent while it was gone can fail (there is no other pod), and
    none after it is back: not a health interval of 503s."""
    scale = 200
    victim = routing.Sims(BUILD, ["pod-v"], scale)
    other = routing.Sims(BUILD, ["pod-o"], scale) if pods == 2 else None
    try:
        urls = dict(victim.urls, **(other.urls if other else {}))
        r = router_factory(make_config(sorted(urls.items()), routing={"policy": "round_robin"},
                                       health={"interval_ms": 2000, "fall": 2},
                                       timeouts={"drain_ms": 5000}))
        wait_for(lambda: curl(r.url("/health")).status == 200, 15, what="/health 200")
        port = int(victim.urls["pod-v"].rsplit(":", 1)[1])
        load = Load(r.port, lambda k: completion("r%d" % k, model="sim-8b"), threads=6)
        try:
            load.wait_count(300)
            victim, t_kill, t_back = restart_sim(victim, "pod-v", port, scale)
            n_kill = load.count()

            def pod_v_served_again():
                with load.lock:
                    return any(x["t0"] > t_back + 0.5 and x["backend"] == "pod-v"
                               for x in load.results)
            wait_for(lambda: load.count() >= n_kill + 600 and time.time() > t_back + 1.0 and
                     pod_v_served_again(), 30, what="load after the restart")
        finally:
            results = load.stop()
        fails = [x for x in results if x["status"] != 200]
        served_after = [x for x in results if x["t0"] > t_back + 0.5 and x["backend"] == "pod-v"]
        print("restart: gap %.1f ms, %d requests, %d failed" % (
            (t_back - t_kill) * 1000, len(results), len(fails)))
        assert served_after, "pod-v took no request after its restart"
        if pods == 2:
            assert not fails, fails[:5]
        else:
            # Requests in flight at the kill or sent in the gap; none once it is back.
            assert all(t_kill - 0.5 <= x["t0"] <= t_back + 0.5 for x in fails), \
                [x for x in fails if not t_kill - 0.5 <= x["t0"] <= t_back + 0.5][:5]
            assert all(x["status"] in (0, 502, 503) for x in fails), fails[:5]
            # There was no other pod: pcrouter does not claim to retry on one.
            assert "retrying on another backend" not in r.stderr_text()
    finally:
        victim.stop()
        if other:
            other.stop()


# ---- down is not forgotten ----------------------------------------------------------------------

@pytest.mark.parametrize("keep_ms", [300000, 0])
def test_pod_away_for_a_moment_keeps_its_prefixes(stub_factory, router_factory, keep_ms):
    """A pod that could not be reached for a while still holds its KV cache: its index entries
    stay, and a prompt warm there before is warm there again when it is back. With
    routing.unavailable_keep_ms 0 (what "down" meant before) they are dropped at once, which
    shows the test can tell."""
    stubs = [stub_factory("pod-a"), stub_factory("pod-b")]
    r = router_factory(make_config(stubs, routing={"policy": "cache_aware",
                                                   "unavailable_keep_ms": keep_ms},
                                   health={"interval_ms": 100, "fall": 1, "rise": 1}))
    wait_for(lambda: curl(r.url("/health")).status == 200, 15, what="/health 200")
    first = curl(r.url("/v1/completions"), completion(prompt("kept")))
    assert first.status == 200, first
    owner = first.header("x-pcrouter-backend")
    again = curl(r.url("/v1/completions"), completion(prompt("kept")))
    assert (again.header("x-pcrouter-backend"), again.header("x-pcrouter-route")) == (owner, "warm")
    # /metrics shows one worker's replica of the index, which learns within a tick; both
    # requests had the same prompt, so once there its count does not move.
    blocks = wait_for(lambda: backend_metric(r, "pcrouter_index_blocks", owner), 10,
                      what="the prompt indexed for %s" % owner)
    s = next(x for x in stubs if x.name == owner)
    port = s.port
    s.kill()
    wait_for(lambda: backend_metric(r, "pcrouter_backend_up", owner) == 0, 10,
             what="%s down" % owner)
    # While it is away the traffic goes elsewhere, and the index still says what it holds.
    for i in range(3):
        away = curl(r.url("/v1/completions"), completion(prompt("other%d" % i)))
        assert away.status == 200 and away.header("x-pcrouter-backend") != owner, away
    if not keep_ms:
        # Every replica drops them once it has heard the pod is down (within a tick).
        wait_for(lambda: backend_metric(r, "pcrouter_index_blocks", owner) == 0, 10,
                 what="%s's entries dropped" % owner)
    kept = backend_metric(r, "pcrouter_index_blocks", owner)
    stub_factory(owner, port=port)
    wait_for(lambda: backend_metric(r, "pcrouter_backend_up", owner) == 1, 10,
             what="%s up again" % owner)
    back = curl(r.url("/v1/completions"), completion(prompt("kept")))
    if keep_ms:
        assert kept == blocks
        assert (back.header("x-pcrouter-backend"), back.header("x-pcrouter-route")) == \
            (owner, "warm"), back
    else:
        assert kept == 0
        assert back.header("x-pcrouter-route") != "warm" or \
            back.header("x-pcrouter-backend") != owner, back


def test_pod_restart_seen_by_scrape_drops_its_prefixes(router_factory):
    """A pod whose /metrics shows a restart (its counters start again, a new
    process_start_time_seconds) holds nothing any more: its entries are dropped at once, even
    though it was never seen down."""
    scale = 100
    sims = {n: routing.Sims(BUILD, [n], scale) for n in ("sim-a", "sim-b")}
    try:
        urls = sorted((n, s.urls[n]) for n, s in sims.items())
        r = router_factory(make_config(urls, routing={"policy": "cache_aware"},
                                       health={"interval_ms": 60000},
                                       scrape={"interval_ms": 100}))
        resp = curl(r.url("/v1/completions"), completion(prompt("restart"), model="sim-8b"))
        assert resp.status == 200, resp
        owner = resp.header("x-pcrouter-backend")
        # /metrics shows one worker's replica of the index: it learns within a tick.
        wait_for(lambda: backend_metric(r, "pcrouter_index_blocks", owner) > 0, 10,
                 what="the prompt indexed for %s" % owner)
        # The pod's counters have been scraped once with this request in them.
        wait_for(lambda: (backend_metric(r, "pcrouter_backend_prefix_cache_queries_tokens_total",
                                         owner) or 0) > 0, 10, what="a scrape after the request")
        port = int(sims[owner].urls[owner].rsplit(":", 1)[1])
        sims[owner], _, _ = restart_sim(sims[owner], owner, port, scale)
        wait_for(lambda: backend_metric(r, "pcrouter_backend_restarts_total", owner) == 1, 10,
                 what="the restart seen by the scrape")
        wait_for(lambda: backend_metric(r, "pcrouter_index_blocks", owner) == 0, 10,
                 what="%s's entries dropped" % owner)
        assert backend_metric(r, "pcrouter_backend_up", owner) == 1
        assert re.search(r"backend %s restarted \(its metrics say so\)" % owner, r.stderr_text())
        resp = curl(r.url("/v1/completions"), completion(prompt("restart"), model="sim-8b"))
        assert resp.status == 200 and resp.header("x-pcrouter-route") != "warm", resp
        # A pod that served nothing has no counter to go back: its start time tells.
        idle = next(n for n in sims if n != owner)
        assert backend_metric(r, "pcrouter_backend_prefix_cache_queries_tokens_total", idle) == 0
        port = int(sims[idle].urls[idle].rsplit(":", 1)[1])
        sims[idle], _, _ = restart_sim(sims[idle], idle, port, scale)
        wait_for(lambda: backend_metric(r, "pcrouter_backend_restarts_total", idle) == 1, 10,
                 what="the idle pod's restart seen by its start time")
    finally:
        for s in sims.values():
            s.stop()


# ---- a dead pooled connection -------------------------------------------------------------------

def test_dead_pooled_connection_is_retried_on_a_fresh_one(stub_factory, router_factory):
    """A pod closed the router's idle keep-alive connections (a restart, its own idle timeout):
    a request that finds one dead is sent again on a new connection, not on the next idle one
    (older, and as dead), and succeeds though there is no other pod to retry on."""
    a = stub_factory("pod-a")
    r = router_factory(make_config([a], workers=1, upstream={"retries": 0},
                                   outlier={"consecutive_errors": 0}))
    from conftest import CurlStream
    streams = [CurlStream(r.url("/v1/completions"), completion("p%d" % i, gate="pool"))
               for i in range(4)]
    try:
        wait_for(lambda: a.stats()["active"] == 4, 15, what="four pooled connections busy")
        a.release("pool")
        for cs in streams:
            rc, out = cs.finish(30)
            assert rc == 0 and b" 200" in out.split(b"\r\n", 1)[0], out[:300]
    finally:
        for cs in streams:
            cs.kill()
    opened = a.stats()["connections"]
    a.configure(defaults={"close_reused": True})
    for i in range(3):
        resp = curl(r.url("/v1/completions"), completion("after%d" % i, tag="after"))
        assert resp.status == 200, resp
    log = a.stats()["log"]
    closed = [e for e in log if e["tag"] == "after" and e["outcome"] == "closed"]
    answered = [e for e in log if e["tag"] == "after" and e["outcome"] == "completed"]
    # Each request tried one pooled connection, found it dead, and went to a new one.
    assert len(closed) == 3, log[-8:]
    assert all(e["conn"] > opened for e in answered), log[-8:]
