"""The request-body budget is a bound: floods of large uploads, on many HTTP/2 streams and on many
HTTP/1.1 connections, against a small limits.max_buffered_body_bytes. The bytes reserved never
pass the budget plus the reserve (one body past it, and the windows of its connection), the
bytes held never pass that plus each connection's allowance, the router's RSS follows, and every
upload is answered: 200, or 503 `body_budget_exhausted` once it waited timeouts.client_idle_ms
for budget. Each connection's first window (64 KiB) used to be joined by 1 MiB per request
taken whatever the budget, so memory grew with connections times streams."""
import json
import socket
import threading
import time

from attack import proc_rss_kb, router_env, sanitized
from attack_h2 import slow_uploads, upload_body
from conftest import PCROUTER, get_metrics, make_config, metric, wait_for

MiB = 1 << 20
KiB = 1 << 10
ALLOWANCE = 65535            # a connection's body bytes that need no budget (budget.h)
ASAN = sanitized(PCROUTER)
TSAN = sanitized(PCROUTER, "tsan")
RSS_FACTOR = 2.0 if ASAN else 1.0
# Allocator slack, evbuffer chains, nghttp2 state, and the copies of a body on its way to the pod
# (parsed prompt, upstream request, socket output).
RSS_OVERHEAD_MB = 64 if ASAN else 32


class Sampler:
    """Polls /metrics and the RSS every few ms while a flood runs; keeps the peaks."""

    def __init__(self, router):
        self.router = router
        self.peak = {"reserved": 0, "buffered": 0, "rss_mb": 0.0}
        self.first_rss_mb = proc_rss_kb(router.proc.pid) / 1024
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            try:
                m = get_metrics(self.router)
            except AssertionError:
                continue
            for key, name in (("reserved", "pcrouter_request_body_reserved_bytes"),
                              ("buffered", "pcrouter_request_body_buffered_bytes")):
                self.peak[key] = max(self.peak[key], metric(m, name) or 0)
            rss = proc_rss_kb(self.router.proc.pid)
            if rss:
                self.peak["rss_mb"] = max(self.peak["rss_mb"], rss / 1024)
            self.stop.wait(0.02)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def start(stub_factory, router_factory, budget, max_body, idle_ms):
    stub = stub_factory("pod-a")
    r = router_factory(make_config([stub], limits={"max_buffered_body_bytes": budget,
                                                   "max_body_bytes": max_body},
                                   timeouts={"client_idle_ms": idle_ms},
                                   # The Python pod parsing many large bodies at once answers
                                   # its health checks late: that is not what is tested.
                                   health={"timeout_ms": 5000, "fall": 10}), env=router_env())
    wait_for(lambda: stub.stats()["requests"].get("/health"), 15, what="a health check")
    return stub, r


def test_h2_streams_flood_stays_within_budget(stub_factory, router_factory):
    """128 streams on one h2c connection, 4 MiB each, against an 8 MiB budget: the reservation
    stays within the budget, one body past it and the windows of the connection's streams; what
    is held within that and the connection's allowance; RSS within those plus a fixed overhead.
    Every stream is answered (200, 503 when it waited for budget, 408 when the client left it
    unfed), none hangs. On the tree before the bound, each stream
    had its 1 MiB window whatever the budget: 128 MiB and more."""
    budget, max_body, streams, size = 8 * MiB, 4 * MiB, 128, 4 * MiB
    stub, r = start(stub_factory, router_factory, budget, max_body, idle_ms=5000)
    reserve = max_body + streams * ALLOWANCE
    with Sampler(r) as smp:
        hs, sent = slow_uploads(r.port, streams, size, rate=512 * MiB, duration=60)
        try:
            snap = hs.wait(lambda sn: all(v["ended"] or v["reset"] is not None for v in sn.values()),
                           30, "every stream answered")
        finally:
            hs.close()
    assert smp.peak["buffered"] <= budget + reserve + ALLOWANCE, smp.peak
    limit = smp.first_rss_mb + RSS_FACTOR * (budget + reserve + ALLOWANCE) / MiB + RSS_OVERHEAD_MB
    assert TSAN or smp.peak["rss_mb"] <= limit, (smp.peak, limit)
    assert smp.peak["reserved"] <= budget + reserve, smp.peak
    got = sorted(v["status"] for v in snap.values())
    # 408: a stream whose windows were open but which this client left unfed (it sends on the
    # first streams that have window, so the last ones can starve behind them).
    assert set(got) <= {"200", "503", "408"}, [g for g in got if g != "200"]
    assert got.count("200") >= 2, "no upload completed: %s" % got
    m = get_metrics(r)
    assert metric(m, "pcrouter_request_body_budget_refusals_total") == got.count("503")
    wait_for(lambda: metric(get_metrics(r), "pcrouter_request_body_reserved_bytes") == 0, 10,
             what="every reservation given back")
    assert metric(get_metrics(r), "pcrouter_request_body_buffered_bytes") == 0


def h1_upload(port, size, out, i, timeout=40.0):
    """One POST of `size` bytes with Content-Length, sent in 64 KiB pieces; out[i] = (status,
    body) or an exception's name."""
    body = upload_body(size)
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        try:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body))
            for off in range(0, len(body), 64 * KiB):
                s.sendall(body[off:off + 64 * KiB])
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
            head, _, rest = buf.partition(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1]) if head else 0
            length = 0
            for line in head.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v)
            while len(rest) < length:
                chunk = s.recv(65536)
                if not chunk:
                    break
                rest += chunk
            out[i] = (status, rest)
        finally:
            s.close()
    except OSError as e:  # the router cut a refused request short: recorded, checked below
        out[i] = type(e).__name__


def test_h1_connections_flood_stays_within_budget(stub_factory, router_factory):
    """48 HTTP/1.1 connections uploading 4 MiB each at once against an 8 MiB budget: the router
    stops reading the connections it has no budget for; the reservation and what is held stay
    within the budget, one body and the connections' allowances; every upload is answered 200
    or 503 body_budget_exhausted. Each connection used to take its first MiB whatever the
    budget."""
    budget, max_body, conns, size = 8 * MiB, 4 * MiB, 48, 4 * MiB
    stub, r = start(stub_factory, router_factory, budget, max_body, idle_ms=3000)
    out = [None] * conns
    with Sampler(r) as smp:
        ts = [threading.Thread(target=h1_upload, args=(r.port, size, out, i), daemon=True)
              for i in range(conns)]
        for t in ts:
            t.start()
        deadline = time.monotonic() + 60
        for t in ts:
            t.join(max(0.1, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in ts), "uploads still running after 60 s"
    per_conn = ALLOWANCE + 16 * KiB  # the allowance, and one read past it
    reserve = max_body + 64 * KiB
    assert smp.peak["buffered"] <= budget + reserve + conns * per_conn, smp.peak
    limit = smp.first_rss_mb + RSS_FACTOR * (budget + reserve + conns * per_conn) / MiB + RSS_OVERHEAD_MB
    assert TSAN or smp.peak["rss_mb"] <= limit, (smp.peak, limit)
    assert smp.peak["reserved"] <= budget + reserve, smp.peak
    statuses = [o[0] if isinstance(o, tuple) else o for o in out]
    assert all(s in (200, 503) for s in statuses), sorted(map(str, statuses))
    assert statuses.count(200) >= 2, statuses
    for o in out:
        if o[0] == 503:
            err = json.loads(o[1])["error"]
            assert err["code"] == "body_budget_exhausted", err
            assert "limits.max_buffered_body_bytes" in err["message"], err
    assert metric(get_metrics(r), "pcrouter_request_body_budget_refusals_total") == statuses.count(503)
    wait_for(lambda: metric(get_metrics(r), "pcrouter_request_body_reserved_bytes") == 0, 10,
             what="every reservation given back")


def test_small_bodies_need_no_budget(stub_factory, router_factory):
    """While stalled uploads hold the whole budget, a request whose body fits its connection's
    allowance is served at once on both protocols, its body in a read of its own."""
    from attack import clients_served
    budget = 4 * MiB
    stub, r = start(stub_factory, router_factory, budget, 16 * MiB, idle_ms=30000)
    hs, sent = slow_uploads(r.port, 16, 8 * MiB, rate=256 * MiB, duration=10, stop_after=12 * MiB)
    try:
        wait_for(lambda: metric(get_metrics(r), "pcrouter_request_body_reserved_bytes") >= budget,
                 15, what="the budget taken by stalled uploads")
        figs = clients_served(r, rate=20)
    finally:
        hs.close()
    for f in figs:
        assert f["client"]["failed"] == 0, f
