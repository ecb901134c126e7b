"""limits.max_memory_bytes: the memory pcrouter accounts for (request bodies, responses kept for
slow clients, the index, requests in flight, connections, the tokenize cache) against a limit,
with actions at 80% (no body budget past the one-request reserve), 90% (new requests and h2
streams answered 503 server_overloaded / memory_pressure with Retry-After) and 95% (the public
listeners stop accepting), each ending 5 points below where it starts.

An upload held open (a client that sends part of a body of known length and waits) pushes the
account over each threshold in turn; the requests already admitted still complete 200, a
connection opened while accepting is paused is answered only once the load leaves, and the
admin listener's /metrics is served throughout. Without the feature the key is unknown and the
router does not start; without the actions the 503s, the pause and the gauges are missing."""
import json
import signal
import socket
import time

import pytest

from attack import router_env
from attack_h2 import H2Streams, upload_body
from conftest import (H2Client, RawConn, completion, curl, http_request, make_config, metric,
                      wait_for)

MiB = 1 << 20
KiB = 1 << 10
LIMIT = 8 * MiB
ACTIONS = ("shrink_windows", "refuse_requests", "stop_accepting")


def admin_metrics(r):
    resp = curl("http://127.0.0.1:%d/metrics" % r.ports[-1], timeout=10)
    assert resp.status == 200, resp
    return resp.body.decode()


def active(r):
    m = admin_metrics(r)
    return {a: metric(m, "pcrouter_overload_action_active", action=a) for a in ACTIONS}


def accounted(m):
    return int(sum(v for n, v in parts(m).items()))


def parts(m):
    names = ("request_bodies", "responses", "index", "tokenize_cache", "requests", "connections",
             "buffers", "http2")
    return {p: metric(m, "pcrouter_memory_accounted_bytes", part=p) or 0 for p in names}


def start(stub_factory, router_factory, limit=LIMIT, limits=(), **extra):
    stub = stub_factory("pod-a")
    cfg = make_config([stub], admin={"address": "127.0.0.1:0"},
                      limits=dict(limits, max_memory_bytes=limit),
                      # The account is added up on this tick: short, so the test is quick.
                      outlier={"probe_ms": 20},
                      health={"timeout_ms": 5000, "fall": 10}, **extra)
    r = router_factory(cfg, env=router_env())
    wait_for(lambda: stub.stats()["requests"].get("/health"), 15, what="a health check")
    return stub, r


class Upload:
    """An HTTP/1.1 POST of a body of known length, sent a piece at a time on demand."""

    def __init__(self, port, size):
        self.body = upload_body(size)
        self.sent = 0
        self.conn = RawConn(port, timeout=30)
        self.conn.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                       b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                       % len(self.body))

    def send(self, n):
        n = int(min(n, len(self.body) - self.sent))
        self.conn.send(self.body[self.sent:self.sent + n])
        self.sent += n

    def finish(self):
        """Sends the rest; returns the response's status and body."""
        self.send(len(self.body))
        status, _, body = self.conn.read_response()
        self.conn.sock.close()
        return status, body


def push_to(r, up, fraction, others=()):
    """Sends the upload's body a piece at a time until the account is `fraction` of the limit.

    A piece the router takes by reference keeps its read buffer alive: what it holds is up to
    4x the bytes (PCR_BODY_TAKE_MIN in exchange.h), depending on how the kernel split them into
    reads. So each piece is a quarter of what is missing, and the account is read again once
    its tick shows the piece held: it reaches the fraction without passing the next threshold,
    however the reads fall."""
    target = fraction * LIMIT
    while True:
        m = admin_metrics(r)
        need = target - accounted(m)
        if need <= 0.01 * target:
            return
        assert up.sent < len(up.body), ("the upload is sent and the account is short", parts(m))
        up.send(max(need / 4, 8 * KiB))
        want = up.sent + sum(o.sent for o in others)
        wait_for(lambda: parts(admin_metrics(r))["request_bodies"] >= want, 15,
                 what="the account holding %d body bytes" % want)


def assert_overloaded(resp):
    assert resp.status == 503, resp
    err = json.loads(resp.body)["error"]
    assert err["type"] == "server_overloaded", err
    assert err["code"] == "memory_pressure", err
    assert "limits.max_memory_bytes" in err["message"] and str(LIMIT) in err["message"], err
    assert resp.header("retry-after") == "1", resp


def test_actions_at_each_threshold(stub_factory, router_factory):
    stub, r = start(stub_factory, router_factory)
    m = admin_metrics(r)
    assert metric(m, "pcrouter_memory_limit_bytes") == LIMIT
    assert active(r) == {a: 0 for a in ACTIONS}
    # The account is added up on the control thread's tick: 0 until the first one.
    wait_for(lambda: accounted(admin_metrics(r)) > 0, 15, what="the account's first tick")
    m = admin_metrics(r)
    idle = accounted(m)
    assert 0 < idle < 0.5 * LIMIT, parts(m)

    big = Upload(r.port, 10 * MiB)           # reserves its whole body at its first read
    small = Upload(r.port, 48 * KiB)         # within a connection's allowance: needs no budget
    small.send(16 * KiB)
    push_to(r, big, 0.40, [small])
    m = admin_metrics(r)
    p = parts(m)
    assert p["request_bodies"] >= big.sent + small.sent, p
    assert p["connections"] >= 2 * 1000 and p["requests"] >= 2 * 4000, p

    # 80%: no body budget past the one-request reserve; requests are still admitted.
    push_to(r, big, 0.85, [small])
    wait_for(lambda: active(r) == {"shrink_windows": 1, "refuse_requests": 0, "stop_accepting": 0},
             10, what="shrink_windows alone")
    late = Upload(r.port, 1 * MiB)           # asks for budget: refused, then takes the reserve
    late.send(8 * KiB)
    wait_for(lambda: (metric(admin_metrics(r), "pcrouter_overload_refusals_total",
                             action="shrink_windows") or 0) >= 1, 10,
             what="a budget grant refused by shrink_windows")
    resp = curl(r.url("/v1/completions"), completion("admitted at 85%"))
    assert resp.status == 200, resp

    # 90%: new requests and new h2 streams get 503; what is in flight goes on.
    push_to(r, big, 0.92, [small, late])
    wait_for(lambda: active(r)["refuse_requests"] == 1, 10, what="refuse_requests")
    assert_overloaded(curl(r.url("/v1/completions"), completion("refused at 92%")))
    assert_overloaded(curl(r.url("/v1/chat/completions"), {"messages": []}, proto="h2c"))
    h2 = H2Client(r.port)
    try:
        sid = h2.request("POST", "/v1/completions", completion("a new h2 stream"))
        h2.wait(lambda: h2.streams[sid]["ended"] or h2.streams[sid]["reset"] is not None, 10,
                "the refused stream's answer")
        assert h2.streams[sid]["headers"][":status"] == "503", h2.streams[sid]
        assert json.loads(bytes(h2.streams[sid]["data"]))["error"]["code"] == "memory_pressure"
        # Then the connection ends, as an HTTP/1.1 one does after its 503: GOAWAY, then close.
        h2.wait_closed(10)
        assert h2.goaway is not None and h2.goaway[1] >= sid, h2.goaway
    finally:
        h2.close()
    status, body = small.finish()
    assert status == 200, body[:300]

    # 95%: the public listeners stop accepting; the admin listener does not.
    push_to(r, big, 0.97, [late])
    wait_for(lambda: active(r)["stop_accepting"] == 1, 10, what="stop_accepting")
    m = admin_metrics(r)
    assert metric(m, "pcrouter_overload_accept_pauses_total") >= 1
    accepted = metric(m, "pcrouter_client_connections_total")
    waiting = socket.create_connection(("127.0.0.1", r.port), timeout=10)   # the kernel's backlog
    waiting.sendall(http_request("POST", "/v1/completions", completion("waited for accept")))
    waiting.settimeout(1.0)
    try:
        got = waiting.recv(1)
        raise AssertionError("answered while accepting is paused: %r" % got)
    except socket.timeout:
        pass
    m = admin_metrics(r)
    # Only the admin scrapes were accepted meanwhile.
    assert metric(m, "pcrouter_client_connections_total") - accepted <= 3, m

    # The load leaves: the uploads complete, every action ends, the waiting connection is served.
    status, body = big.finish()
    assert status == 200, body[:300]
    status, body = late.finish()
    assert status == 200, body[:300]
    wait_for(lambda: active(r) == {a: 0 for a in ACTIONS}, 15, what="every action off")
    waiting.settimeout(15)
    buf = b""
    while b"\r\n" not in buf:
        chunk = waiting.recv(4096)
        assert chunk, "closed unanswered"
        buf += chunk
    waiting.close()
    assert buf.startswith(b"HTTP/1.1 200"), buf[:200]
    m = admin_metrics(r)
    assert metric(m, "pcrouter_overload_refusals_total", action="refuse_requests") >= 3
    # The gauge is the control thread's last tick: the last body is released as its exchange
    # ends, which may follow the client's last byte by a tick.
    wait_for(lambda: metric(admin_metrics(r), "pcrouter_memory_accounted_bytes",
                            part="request_bodies") == 0, 10, what="every body's bytes released")
    assert "memory:" in r.stderr_text() and "stop_accepting on" in r.stderr_text()


def test_hysteresis_and_off(stub_factory, router_factory):
    """An action ends only 5 points below its threshold; with the limit at 0 nothing acts, and a
    reload changes the limit in force."""
    stub, r = start(stub_factory, router_factory)
    big = Upload(r.port, 10 * MiB)
    push_to(r, big, 0.82)
    wait_for(lambda: active(r)["shrink_windows"] == 1, 10, what="shrink_windows")
    # A reload to a limit the account is at 78% of: within the margin, the action stays on.
    cfg = dict(r.config)
    cfg["limits"] = {"max_memory_bytes": int(accounted(admin_metrics(r)) / 0.78)}
    reload_config(r, cfg)
    limit = cfg["limits"]["max_memory_bytes"]
    wait_for(lambda: metric(admin_metrics(r), "pcrouter_memory_limit_bytes") == limit, 10,
             what="the reloaded limit")
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:       # several ticks of 20 ms
        assert active(r)["shrink_windows"] == 1
    # Past the margin (under 75%), it ends.
    cfg["limits"] = {"max_memory_bytes": int(accounted(admin_metrics(r)) / 0.70)}
    reload_config(r, cfg)
    wait_for(lambda: active(r)["shrink_windows"] == 0, 10, what="shrink_windows off")
    # 0: off, whatever the account.
    cfg["limits"] = {"max_memory_bytes": 0}
    reload_config(r, cfg)
    wait_for(lambda: metric(admin_metrics(r), "pcrouter_memory_limit_bytes") == 0, 10,
             what="the limit off")
    big.send(1 * MiB)
    resp = curl(r.url("/v1/completions"), completion("no limit"))
    assert resp.status == 200, resp
    assert active(r) == {a: 0 for a in ACTIONS}
    status, body = big.finish()
    assert status == 200, body[:300]


def reload_config(r, cfg):
    m = admin_metrics(r)
    ok = metric(m, "pcrouter_config_reloads_total", result="ok")
    with open(r.path, "w") as f:
        json.dump(cfg, f)
    r.config = cfg
    r.send_signal(signal.SIGHUP)
    wait_for(lambda: metric(admin_metrics(r), "pcrouter_config_reloads_total", result="ok") == ok + 1,
             15, 0.05, "the reload")


def test_auto_without_a_cgroup_limit_is_off(stub_factory, router_factory):
    """The default, "auto": 0.9 of the cgroup v2 memory.max, or off where there is none (as on
    this machine when it has none; the unit tests read fake cgroup trees)."""
    stub = stub_factory("pod-a")
    r = router_factory(make_config([stub]))
    limit = metric(curl(r.url("/metrics")).body.decode(), "pcrouter_memory_limit_bytes")
    text = r.stderr_text()
    if "no cgroup memory.max: off" in text:
        assert limit == 0
    else:
        assert "\"auto\":" in text and limit > 0, text


class Requests:
    """What Heads and Waiting share: `n` HTTP/2 streams (`hs`, one connection each) or
    HTTP/1.1 connections (`conns`); the HTTP/2 statuses once every stream is answered; close."""

    def h2_statuses(self, timeout):
        snap = self.hs.wait(lambda s: all(v["status"] for v in s.values()), timeout,
                            "every answer")
        return [int(v["status"]) for v in snap.values()]

    def close(self):
        for c in getattr(self, "conns", []):
            c.sock.close()
        if self.proto == "h2c":
            self.hs.close()


class Heads(Requests):
    """`n` requests of `size` body bytes whose heads are sent now and bodies later: HTTP/2
    streams (one connection each) or HTTP/1.1 connections. bodies() sends every body whole and
    returns the statuses answered."""

    def __init__(self, port, proto, n, size):
        self.proto, self.body = proto, upload_body(size)
        if proto == "h2c":
            self.hs = H2Streams(port, per_conn=1, timeout=30)
            self.keys = [self.hs.open("/v1/completions", b"", end_stream=False, length=size)
                         for _ in range(n)]
        else:
            self.conns = [RawConn(port, timeout=30) for _ in range(n)]
            for c in self.conns:
                c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                       b"application/json\r\nContent-Length: %d\r\n\r\n" % size)

    def bodies(self):
        if self.proto == "h1":
            for c in self.conns:
                c.send(self.body)
            return [c.read_response()[0] for c in self.conns]
        for k in self.keys:
            off = 0
            while off < len(self.body):  # frames of 16 KiB, within the window: never blocked
                sent = self.hs.send(k, self.body[off:], end_stream=True)
                if sent < 0:
                    break  # answered and reset already
                assert sent > 0, "a window shut within the allowance"
                off += sent
        return self.h2_statuses(15)


@pytest.mark.parametrize("proto", ["h1", "h2c"])
def test_bodies_begun_past_the_limit_are_refused(proto, stub_factory, router_factory):
    """Requests whose heads were admitted while memory was plenty, and whose bodies begin only
    once the account is past 90%, are refused 503 at their first body byte, the bytes not held:
    each would otherwise hold up to its connection's allowance (64 KiB) whatever the limit, so
    that many connections could take the process past it. The body begun before (the upload)
    still completes."""
    stub, r = start(stub_factory, router_factory)
    n = 16
    heads = Heads(r.port, proto, n, 48 * KiB)
    try:
        # Admitted: their requests are in the account (the upload's is not open yet).
        wait_for(lambda: parts(admin_metrics(r))["requests"] >= n * 4365, 15,
                 what="the requests in the account")
        up = Upload(r.port, 10 * MiB)
        push_to(r, up, 0.92)
        held = metric(admin_metrics(r), "pcrouter_request_body_buffered_bytes")
        assert heads.bodies() == [503] * n
        m = admin_metrics(r)
        assert metric(m, "pcrouter_request_body_buffered_bytes") <= held, (held, parts(m))
        assert metric(m, "pcrouter_overload_refusals_total", action="refuse_requests") >= n
        status, _ = up.finish()
        assert status == 200
    finally:
        heads.close()


class Waiting(Requests):
    """`n` requests whose bodies wait for body budget while another request holds it, each
    holding what its connection's allowance let the router take: HTTP/2 streams (one
    connection each) that send their whole window, or HTTP/1.1 chunked bodies (no length, so
    read a piece at a time until the allowance is full). statuses() waits for every answer."""

    def __init__(self, port, proto, n):
        self.proto = proto
        body = upload_body(MiB)
        if proto == "h2c":
            self.hs = H2Streams(port, per_conn=1, timeout=30)
            for _ in range(n):
                k = self.hs.open("/v1/completions", b"", end_stream=False, length=len(body))
                off = 0
                while off < 65535:  # the stream's first window: never blocked
                    sent = self.hs.send(k, body[off:65535])
                    assert sent > 0, "a window shut within the allowance"
                    off += sent
        else:
            self.conns = [RawConn(port, timeout=30) for _ in range(n)]
            for c in self.conns:
                c.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                       b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s"
                       % (96 * KiB, body[:96 * KiB]))

    def statuses(self, timeout):
        if self.proto == "h1":
            deadline = time.monotonic() + timeout
            out = []
            for c in self.conns:
                c.sock.settimeout(max(0.1, deadline - time.monotonic()))
                out.append(c.read_response()[0])
            return out
        return self.h2_statuses(timeout)


@pytest.mark.parametrize("proto", ["h1", "h2c"])
def test_bodies_waiting_for_budget_are_refused_past_the_limit(proto, stub_factory,
                                                              router_factory):
    """Requests whose bodies began while memory was plenty and then wait for body budget (an
    upload holds it) are answered 503 once the account passes 90%, within a tick rather than
    at timeouts.client_idle_ms, and the bytes each held within its connection's allowance are
    freed: otherwise every such connection keeps up to 64 KiB whatever the limit, and 10,000
    connections 625 MiB. The upload allowed past the budget is not refused and completes."""
    # Refusing them all must leave the account past 90%: before the account's tick has seen
    # the crossing, whether refusing is on is decided afresh, without its hysteresis. Each
    # holds about 120 KiB in the account (its allowance, its body reader, its blocks), so a
    # few, against 94% of the limit.
    limit = 16 * MiB
    stub, r = start(stub_factory, router_factory, limit=limit,
                    limits={"max_buffered_body_bytes": 256 * KiB},
                    timeouts={"client_idle_ms": 60000})
    n = 3
    # Its whole length reserved at its head, past the budget: the one request allowed past it.
    up = Upload(r.port, 20 * MiB)
    up.send(MiB)
    wait_for(lambda: metric(admin_metrics(r), "pcrouter_request_body_buffered_bytes") >= MiB, 15,
             what="the upload's first MiB held")
    waiting = Waiting(r.port, proto, n)
    try:
        wait_for(lambda: metric(admin_metrics(r), "pcrouter_request_body_buffered_bytes") >=
                 up.sent + n * 48 * KiB, 15, what="the waiting bodies held")
        assert not active(r)["refuse_requests"]
        up.send(int(0.94 * limit) - accounted(admin_metrics(r)))
        # Refused within ticks of the crossing; client_idle_ms is a minute.
        assert waiting.statuses(10) == [503] * n
        wait_for(lambda: metric(admin_metrics(r), "pcrouter_request_body_buffered_bytes") <=
                 up.sent + 16 * KiB, 10, what="the waiting bodies freed")
        status, _ = up.finish()
        assert status == 200
        wait_for(lambda: not active(r)["refuse_requests"], 15, what="the account back down")
        resp = curl(r.url("/v1/completions"), completion("after the upload"), proto=proto)
        assert resp.status == 200, resp
    finally:
        waiting.close()


@pytest.mark.parametrize("proto", ["h1", "h2c"])
def test_the_account_counts_what_receiving_connections_hold(proto, stub_factory, router_factory):
    """Connections whose bodies wait for budget each hold a body reader (about 40 KiB: the JSON
    scanner, its scratch, the prefix key) and libevent's chains beyond their bytes, which the
    account's per-request and per-connection figures leave out: 10,000 of them took RSS past
    the limit by 13 KiB each with the account within it. The account's parts other than the
    bodies' bytes must rise by at least 36 KiB per such connection."""
    stub, r = start(stub_factory, router_factory, limit=256 * MiB,
                    limits={"max_buffered_body_bytes": 256 * KiB},
                    timeouts={"client_idle_ms": 60000})
    n = 24
    up = Upload(r.port, 20 * MiB)  # holds the budget, so that the others wait
    up.send(MiB)
    wait_for(lambda: metric(admin_metrics(r), "pcrouter_request_body_buffered_bytes") >= MiB, 15,
             what="the upload's first MiB held")

    def others(m):
        p = parts(m)
        return accounted(m) - p["request_bodies"], p

    wait_for(lambda: parts(admin_metrics(r))["request_bodies"] >= MiB, 15,
             what="the account's tick after the upload")
    before, _ = others(admin_metrics(r))
    waiting = Waiting(r.port, proto, n)
    try:
        wait_for(lambda: metric(admin_metrics(r), "pcrouter_request_body_buffered_bytes") >=
                 up.sent + n * 48 * KiB, 15, what="the waiting bodies held")
        want = before + n * 36 * KiB
        wait_for(lambda: others(admin_metrics(r))[0] >= want, 15,
                 what="the account's other parts up by 36 KiB per waiting connection (%d)" % want)
        status, _ = up.finish()
        assert status == 200
    finally:
        waiting.close()


def test_the_account_counts_nghttp2s_sessions(stub_factory, router_factory):
    """An h2c connection with an open stream holds an nghttp2 session (about 13 KiB in RSS: the
    session, its stream map, HPACK rings, the page of its frame buffer that frames use), which
    the account counted in a fixed 13,400 bytes a connection, with the connection's own state,
    idle or busy: 10,000 upload streams took RSS 180 MiB past the account. The `http2` part
    counts what the sessions hold: at least 12 KiB for each of these, and nothing of them once
    their connections are gone."""
    stub, r = start(stub_factory, router_factory, limit=256 * MiB,
                    timeouts={"client_idle_ms": 60000})
    wait_for(lambda: accounted(admin_metrics(r)) > 0, 15, what="the account's first tick")
    before = parts(admin_metrics(r))["http2"]
    n = 32
    hs = H2Streams(r.port, per_conn=1, timeout=30)
    try:
        for _ in range(n):  # a stream whose body is still to come: its session stays awake
            hs.open("/v1/completions", b"", end_stream=False, length=1000)
        want = before + n * 12 * KiB
        wait_for(lambda: parts(admin_metrics(r))["http2"] >= want, 15,
                 what="the http2 part up by 12 KiB a session (%d)" % want)
    finally:
        hs.close()
    wait_for(lambda: parts(admin_metrics(r))["http2"] <= before + 2 * KiB, 15,
             what="the http2 part back where it was (%d) once the connections closed" % before)


def test_a_burst_of_connections_is_seen_before_the_tick(stub_factory, router_factory):
    """The account's tick runs every outlier.probe_ms (here 10 minutes: only the one at start).
    A burst of h2c connections, each with a stream open, takes nghttp2's part past 95% of the
    limit between two ticks: each accept reads libevent's and nghttp2's counts afresh, so the
    listener pauses anyway. Read at the tick alone, they were seen up to 100 ms late: 10,000
    connections arrive in less."""
    stub = stub_factory("pod-a")
    cfg = make_config([stub], admin={"address": "127.0.0.1:0"}, workers=1,
                      limits={"max_memory_bytes": MiB}, outlier={"probe_ms": 600000},
                      health={"timeout_ms": 5000, "fall": 10}, timeouts={"client_idle_ms": 60000})
    r = router_factory(cfg, env=router_env())
    m = admin_metrics(r)
    assert accounted(m) < 0.5 * MiB, parts(m)  # the tick at start: far from the limit
    hs = H2Streams(r.port, per_conn=1, timeout=30)
    try:
        for _ in range(128):  # about 14 KiB of nghttp2 each: 1.8 MiB if all were taken
            hs.open("/v1/completions", b"", end_stream=False, length=1000)
        wait_for(lambda: (metric(admin_metrics(r), "pcrouter_overload_accept_pauses_total") or 0)
                 >= 1, 15, what="the listener paused by an accept's fresh account")
        assert parts(admin_metrics(r))["http2"] == 0  # the tick has not run since the start
    finally:
        hs.close()


def test_answers_nobody_reads_stay_within_the_limit(stub_factory, router_factory):
    """Zero-window readers of answers that end: 10,000 of them took the account to 2.6 times a
    256 MiB limit, each answer queueing 256 KiB for writing and up to 1 MiB more kept for its
    reader, whatever the account said. Past shrink_windows' threshold nothing more is kept and
    an answer queues at most 64 KiB for writing, so each pod connection pauses and the account
    stays within the limit, where these 64 answers of 1 MiB would take it to four times it. When
    the readers leave, the account falls and requests are served again."""
    limit, n, conns = 16 * MiB, 64, 8
    stub = stub_factory("pod-a")
    cfg = make_config([{"name": "pod-a", "url": stub.url, "max_connections": conns}],
                      admin={"address": "127.0.0.1:0"}, workers=1, log={"access_log": False},
                      limits={"max_memory_bytes": limit}, outlier={"probe_ms": 20},
                      health={"timeout_ms": 5000, "fall": 10})
    r = router_factory(cfg, env=router_env())
    wait_for(lambda: stub.stats()["requests"].get("/health"), 15, what="a health check")
    wait_for(lambda: accounted(admin_metrics(r)) > 0, 15, what="the account's first tick")
    peak = [0]

    def paused():
        m = admin_metrics(r)
        peak[0] = max(peak[0], accounted(m))
        return (metric(m, "pcrouter_overload_action_active", action="shrink_windows") == 1 and
                metric(m, "pcrouter_response_backpressure_total") >= conns)

    body = json.dumps(completion("read by nobody", bytes=MiB)).encode()
    hs = H2Streams(r.port, window=0, ack=False)
    try:
        for _ in range(n):
            hs.open("/v1/completions", body)
        wait_for(paused, 30, what="memory short and every pod connection paused")
        for _ in range(10):  # a few more ticks of the account: it stays where it is
            paused()
        done = stub.stats()["requests"].get("/v1/completions", 0)
    finally:
        hs.close()
    assert peak[0] <= limit, "account peaked at %d bytes, limit %d" % (peak[0], limit)
    assert done < n, done
    wait_for(lambda: active(r) == {a: 0 for a in ACTIONS}, 15, what="every action off")
    resp = curl(r.url("/v1/completions"), completion("after the readers left"))
    assert resp.status == 200, resp


def test_requests_served_leave_the_account(stub_factory, router_factory):
    """A routed request's body reader is counted in the account (41,360 bytes) while the request
    holds it, and the request lets it go once its body is read. The count must go with it: when
    it did not, every request served added 35 KiB (then) to the account for good, and a router with a
    memory limit refused everything after some tens of thousands of requests."""
    stub, r = start(stub_factory, router_factory, limit=256 * MiB)
    wait_for(lambda: accounted(admin_metrics(r)) > 0, 15, what="the account's first tick")
    for i in range(50):
        resp = curl(r.url("/v1/completions"), completion("request %d" % i))
        assert resp.status == 200, resp
    resp = curl(r.url("/v1/chat/completions"), {"messages": [{"role": "user", "content": "h2"}]},
                proto="h2c")
    assert resp.status == 200, resp
    # Nothing is in flight now but a scrape (one request's 4,365 bytes, no reader).
    wait_for(lambda: parts(admin_metrics(r))["requests"] < 41360, 10,
             what="the account's requests back to nothing")
