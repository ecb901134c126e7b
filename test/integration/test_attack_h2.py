"""Issue 7, HTTP/2 clients that misbehave: a big-window reader of a 64 MiB response (it used to
stall), zero-window readers holding pod connections, many slow uploads against the body budget.
Each runs with a well-behaved client measured alongside (attack.Watch) and the router's RSS
sampled."""
import json
import time

from attack import (H2Streams, Watch, big_window_read, bulk_sha, describe, router_env, sanitized,
                    slow_uploads)
from conftest import PCROUTER, RawConn, completion, get_metrics, make_config, metric, wait_for

MiB = 1 << 20
# RSS beyond the accounted buffers: allocator slack, evbuffer chains, nghttp2 state. Under
# AddressSanitizer every figure grows by its shadow memory and redzones.
ASAN = sanitized(PCROUTER)
RSS_FACTOR = 2.0 if ASAN else 1.0
RSS_OVERHEAD_MB = 64 if ASAN else 24


def test_big_window_reader_gets_every_byte(cluster):
    """A client whose windows hold the whole 64 MiB response never has to send a frame: the
    router must keep writing on its own (it used to stop after 4-7 MiB until the client sent
    something)."""
    c = cluster(1)
    total = 64 * MiB
    with Watch(c.router, proto="h2c", rate=10) as w:
        res = big_window_read(c.router.port, total, timeout=60)
    assert res["status"] == "200" and res["ended"], (res, describe(w.figures))
    assert res["bytes"] == total and res["sha256"] == bulk_sha(total), res
    assert res["sent_during"] == 0, "the client sent %d bytes mid-response" % res["sent_during"]
    assert w.figures["client"]["failed"] == 0, describe(w.figures)


def test_slow_uploads_stay_within_budget_and_complete(stub_factory, router_factory):
    """64 streams x 2 MiB on one connection against an 8 MiB body budget: the router's RSS stays
    within the budget plus what it has granted as flow-control windows (64 x 1 MiB initial
    windows, one body allowed past the budget) and a fixed overhead, and every upload still
    completes. They used to deadlock: partial bodies filled the budget, none could finish, the
    shut connection window kept even the exempt stream from sending, and all got 408."""
    stub = stub_factory("pod-a")
    budget, streams, size = 8 * MiB, 64, 2 * MiB
    r = router_factory(make_config([stub], limits={"max_buffered_body_bytes": budget,
                                                   "max_body_bytes": 64 * MiB},
                                   timeouts={"client_idle_ms": 20000}), env=router_env())
    wait_for(lambda: stub.stats()["requests"].get("/health"), 15, what="a health check")
    with Watch(r, proto="h1", rate=10) as w:
        hs, sent = slow_uploads(r.port, streams, size, rate=64 * MiB, duration=40)
        try:
            snap = hs.wait(lambda sn: all(v["ended"] or v["reset"] is not None for v in sn.values()),
                           40, "every upload answered")
        finally:
            hs.close()
    figs = w.figures
    got = sorted(v["status"] or "reset" for v in snap.values())
    assert got == ["200"] * streams, (got, describe(figs))
    done = [e for e in stub.stats()["log"] if e["path"] == "/v1/completions" and e["body_bytes"] == size]
    assert len(done) == streams, "the pod got %d whole uploads" % len(done)
    granted_mb = (budget + streams * MiB + size) / MiB
    limit = figs["rss_first_mb"] + RSS_FACTOR * granted_mb + RSS_OVERHEAD_MB
    assert figs["rss_peak_mb"] <= limit, (
        "RSS peak %.0f MiB > %.0f MiB first + %.1f x (%d MiB budget + %d x 1 MiB windows + "
        "%d MiB body past the budget) + %d MiB overhead"
        % (figs["rss_peak_mb"], figs["rss_first_mb"], RSS_FACTOR, budget // MiB, streams,
           size // MiB, RSS_OVERHEAD_MB))
    assert figs["client"]["failed"] == 0 and figs["client"]["served"] > 0, describe(figs)
    assert metric(get_metrics(r), "pcrouter_request_body_buffered_bytes") == 0


def test_stalled_uploads_do_not_starve_small_requests(stub_factory, router_factory):
    """Uploads that fill the body budget and then stop sending hold it until client_idle_ms;
    meanwhile small requests on other connections are served: an HTTP/2 stream has its initial
    window whatever the budget, and an HTTP/1.1 request its first MiB. HTTP/1.1 requests whose
    body came in a read of its own used to wait for the stalled uploads' 408."""
    stub = stub_factory("pod-a")
    r = router_factory(make_config([stub], limits={"max_buffered_body_bytes": 8 * MiB,
                                                   "max_body_bytes": 64 * MiB},
                                   timeouts={"client_idle_ms": 30000}), env=router_env())
    wait_for(lambda: stub.stats()["requests"].get("/health"), 15, what="a health check")
    hs, sent = slow_uploads(r.port, 32, 4 * MiB, rate=256 * MiB, duration=15, stop_after=24 * MiB)
    try:
        wait_for(lambda: metric(get_metrics(r), "pcrouter_request_body_buffered_bytes") >= 8 * MiB,
                 15, what="the budget filled by partial uploads")
        body = json.dumps(completion("small one")).encode()
        for i in range(3):
            conn = RawConn(r.port, timeout=5)
            try:
                conn.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body))
                time.sleep(0.05)  # pacing: the body comes in a read of its own
                conn.send(body)
                assert conn.read_response()[0] == 200
            finally:
                conn.close()
        with Watch(r, proto="h1", rate=10, timeout=5) as w1:
            wait_for(lambda: w1.client.count() >= 10, 20, what="10 HTTP/1.1 requests")
        with Watch(r, proto="h2c", rate=10, timeout=5) as w2:
            wait_for(lambda: w2.client.count() >= 10, 20, what="10 h2c requests")
    finally:
        hs.close()
    for w in (w1, w2):
        assert w.figures["client"]["failed"] == 0, describe(w.figures)
    # The uploads themselves were not answered: they are still waiting, not lost.
    assert not any(v["ended"] for v in hs.snapshot().values())
