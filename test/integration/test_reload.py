"""Hot reload (SIGHUP): pods added and removed under load with nothing dropped, routing knobs,
limits, timeouts and the log level taking effect, listeners added and removed, a renewed TLS
certificate served to new connections while old ones keep theirs, and a config with an error
refused with its errors logged while the old one keeps running. pcrouter_config_reloads_total
counts each outcome."""
import json
import re
import signal
import socket
import ssl
import subprocess
import time

from conftest import (QUIET_SCRAPE, CurlStream, Load, RawConn, assert_error, completion, curl,
                      get_metrics, http_request, make_config, metric, wait_for)


def reloads(router):
    text = get_metrics(router)
    return (metric(text, "pcrouter_config_reloads_total", result="ok"),
            metric(text, "pcrouter_config_reloads_total", result="error"))


def reload(router, config, expect="ok"):
    """Writes `config` over the router's file, sends SIGHUP and waits for the outcome to be
    counted; returns the index of the first log line after the signal."""
    ok, err = reloads(router)
    start = len(router.err.lines)
    with open(router.path, "w") as f:
        if isinstance(config, str):
            f.write(config)
        else:
            json.dump(config, f, indent=2)
    if not isinstance(config, str):
        router.config = config
    router.send_signal(signal.SIGHUP)
    want = (ok + 1, err) if expect == "ok" else (ok, err + 1)
    wait_for(lambda: reloads(router) == want, 15, 0.05, "reload counted as %s" % expect)
    return start


def since(router, start, regex):
    rx = re.compile(regex)
    with router.err.cond:
        return [l for l in router.err.lines[start:] if rx.search(l)]


def pod_requests(stub):
    return stub.stats()["requests"].get("/v1/completions", 0)


def test_pods_added_and_removed_under_load(stub_factory, router_factory):
    a, b, c = (stub_factory(n) for n in ("pod-a", "pod-b", "pod-c"))
    cfg = make_config([a, b], routing={"policy": "round_robin"})
    r = router_factory(cfg)
    wait_for(lambda: curl(r.url("/health")).status == 200, 15, what="/health 200")
    # Streams on pod-a that outlive its removal: it must drain them, not cut them.
    streams = []
    while len(streams) < 3 or a.stats()["active"] < 3:
        streams.append(CurlStream(r.url("/v1/completions"),
                                  completion("long%d" % len(streams), stream=True, gate="drain")))
        wait_for(lambda: sum(s.stats()["active"] for s in (a, b)) >= len(streams), 15,
                 what="stream %d started" % len(streams))
        assert len(streams) < 20
    load = Load(r.port, lambda n: completion("l%d" % n), threads=4)
    try:
        load.wait_count(100)
        start = reload(r, make_config([b, c], routing={"policy": "round_robin"}))
        assert since(r, start, r"1 backend\(s\) joined, 1 left"), r.err.tail()
        wait_for(lambda: pod_requests(c) >= 20, 15, what="pod-c taking requests")
        # Nothing new reaches pod-a once the reload is applied.
        n_a = pod_requests(a)
        mark = load.count()
        load.wait_count(mark + 200)
        assert pod_requests(a) == n_a
        assert metric(get_metrics(r), "pcrouter_backends") == 2
        assert not since(r, start, r"backend pod-a has drained"), "pod-a still has streams"
    finally:
        results = load.stop()
    bad = [x for x in results if x["status"] != 200]
    assert not bad, bad[:5]
    assert {x["backend"] for x in results[-100:]} == {"pod-b", "pod-c"}
    # pod-a's streams were untouched by its removal, and end whole.
    for s in (a, b):
        s.release("drain")
    for cs in streams:
        rc, out = cs.finish(30)
        assert rc == 0 and b"[DONE]" in out, out[-300:]
    wait_for(lambda: since(r, start, r"backend pod-a has drained and is gone"), 15,
             what="pod-a freed once drained")


def test_routing_limits_timeouts_and_log_level(cluster):
    c = cluster(2, policy="round_robin", timeouts={"response_ms": 5000, "drain_ms": 5000})
    body = completion("x" * 4000)
    resp = curl(c.url("/v1/completions"), body)
    assert resp.status == 200 and resp.header("x-pcrouter-route") == "round_robin", resp
    assert curl(c.url("/v1/completions"), completion("slow", delay_ms=800)).status == 200
    cfg = make_config(c.stubs, routing={"policy": "cache_aware"},
                      limits={"max_body_bytes": 2048},
                      timeouts={"response_ms": 300, "drain_ms": 5000},
                      log={"level": "warn"})
    start = reload(c.router, cfg)
    # Workers take the new config at their next command: poll until both have.
    wait_for(lambda: all(curl(c.url("/v1/completions"), completion("p%d" % i)).header(
        "x-pcrouter-route") in ("warm", "cold") for i in range(6)), 10,
        what="cache_aware routing on every worker")
    assert_error(curl(c.url("/v1/completions"), body), 413, "body_too_large")
    assert_error(curl(c.url("/v1/completions"), completion("slow", delay_ms=800)), 504,
                 "upstream_timeout")
    # Log level warn: no more info lines, warnings still come. Access lines are not part of
    # the level: log.access_log turns them on and off.
    mark = len(c.router.err.lines)
    for i in range(3):
        assert curl(c.url("/v1/completions"), completion("quiet%d" % i)).status == 200
    with c.router.err.cond:
        after = c.router.err.lines[mark:]
    assert not [l for l in after if " info " in l and " info access " not in l], after
    assert since(c.router, start, r"\binfo SIGHUP: reloading"), "logged at the old level"


def listen_ports(router, start):
    return [int(m.group(1)) for m in
            (re.search(r"listening on 127\.0\.0\.1:(\d+)", l)
             for l in since(router, start, r"listening on")) if m]


def test_listener_added_then_removed(cluster):
    c = cluster(1)
    cfg = dict(c.router.config)
    cfg["listen"] = [{"address": "127.0.0.1:0"}, {"address": "127.0.0.1:0"}]
    start = reload(c.router, cfg)
    new = listen_ports(c.router, start)
    assert len(new) == 1 and new[0] != c.router.port, new
    p2 = new[0]
    wait_for(lambda: curl("http://127.0.0.1:%d/health" % p2, timeout=5).status == 200, 10,
             what="the new listener answering")
    # A keep-alive connection accepted on it before it goes.
    conn = RawConn(p2)
    try:
        conn.send(http_request("POST", "/v1/completions", completion("before")))
        assert conn.read_response()[0] == 200
        cfg = dict(cfg)
        cfg["listen"] = [{"address": "127.0.0.1:0"}]
        reload(c.router, cfg)

        def refused():
            try:
                socket.create_connection(("127.0.0.1", p2), timeout=2).close()
                return False
            except ConnectionRefusedError:
                return True
        wait_for(refused, 10, what="the removed listener closed")
        # The connection it had accepted stays open and is served.
        conn.send(http_request("POST", "/v1/completions", completion("after")))
        assert conn.read_response()[0] == 200
    finally:
        conn.close()
    assert curl(c.url("/health")).status == 200


def make_cert(path_cert, path_key, cn):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", path_key, "-out",
                    path_cert, "-days", "2", "-subj", "/CN=%s" % cn,
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=30)


class TlsConn:
    """One TLS keep-alive HTTP/1.1 connection: the certificate it got, and requests on it."""

    def __init__(self, port):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["http/1.1"])
        raw = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.sock = ctx.wrap_socket(raw, server_hostname="localhost")
        self.cert = self.sock.getpeercert(binary_form=True)
        self.rc = RawConn.__new__(RawConn)
        self.rc.sock, self.rc.buf, self.rc.timeout = self.sock, b"", 15

    def post(self, body):
        self.rc.send(http_request("POST", "/v1/completions", body))
        return self.rc.read_response()[0]

    def close(self):
        self.sock.close()


def der_of(path):
    pem = open(path).read()
    return ssl.PEM_cert_to_DER_cert(pem)


def test_tls_certificate_rotation(cluster, tmp_path):
    cert, key = str(tmp_path / "c.pem"), str(tmp_path / "k.pem")
    make_cert(cert, key, "first")
    first = der_of(cert)
    c = cluster(1, tls=(cert, key))
    old = TlsConn(c.router.tls_port)
    try:
        assert old.cert == first
        assert old.post(completion("one")) == 200
        make_cert(cert, key, "second")
        second = der_of(cert)
        reload(c.router, c.router.config)

        def new_cert():
            t = TlsConn(c.router.tls_port)
            try:
                return t.cert == second and t.post(completion("new")) == 200
            finally:
                t.close()
        wait_for(new_cert, 10, what="new connections served the new certificate")
        # The connection opened before keeps its certificate and keeps working.
        assert old.post(completion("two")) == 200
        assert old.sock.getpeercert(binary_form=True) == first
    finally:
        old.close()


def test_config_with_errors_is_refused_and_old_one_kept(cluster):
    c = cluster(2, policy="round_robin")
    good = c.router.config
    text = json.dumps(good, indent=2)
    bad = text.replace('"round_robin"', '"fastest"').replace('"health": {', '"helth": 1, "health": {')
    assert bad != text
    start = reload(c.router, bad, expect="error")
    errors = since(c.router, start, r"error reload: .*:\d+:\d+: ")
    assert any("routing.policy" in l and "fastest" in l for l in errors), errors
    assert any('unknown key "helth"' in l for l in errors), errors
    assert since(c.router, start, r"reload refused, still running the previous config")
    # Still the old config: round robin over both pods.
    pods = {curl(c.url("/v1/completions"), completion("k%d" % i)).json()["stub"]["pod"]
            for i in range(6)}
    assert pods == {"pod-a", "pod-b"}
    # A listener that cannot be bound refuses the whole reload too.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        cfg = dict(good)
        cfg["listen"] = good["listen"] + [{"address": "127.0.0.1:%d" % taken.getsockname()[1]}]
        cfg["routing"] = {"policy": "cache_aware"}
        start = reload(c.router, cfg, expect="error")
        assert since(c.router, start, r"cannot listen on"), c.router.err.tail()
    finally:
        taken.close()
    resp = curl(c.url("/v1/completions"), completion("still"))
    assert resp.status == 200 and resp.header("x-pcrouter-route") == "round_robin", resp
    # And a good one after the bad ones goes through.
    reload(c.router, good)
    assert reloads(c.router) == (1, 2)


# Each pod's models read when it joins, not again during the test (0 would mean never).
MODELS_AT_JOIN = {"models_interval_ms": 3600000}


def test_backend_changed_in_place_or_replaced(stub_factory, router_factory):
    """A backend whose models change is updated in place; one whose url changes is replaced
    (the old pod drains, the new one takes its name)."""
    a, b, a2 = stub_factory("pod-a"), stub_factory("pod-b"), stub_factory("pod-a2")
    cfg = make_config([{"name": "pod-a", "url": a.url}, {"name": "pod-b", "url": b.url}],
                      routing={"policy": "round_robin"}, scrape=MODELS_AT_JOIN)
    r = router_factory(cfg)
    # Both pods have said what they serve (until then a pod may serve any model).
    wait_for(lambda: curl(r.url("/v1/completions"), completion("?", model="extra")).status == 404,
             15, what="both pods' model lists known")
    # pod-a's own list says stub-model only; the config adds "extra" to pod-b alone.
    cfg = make_config([{"name": "pod-a", "url": a.url},
                       {"name": "pod-b", "url": b.url, "models": ["extra"]}],
                      routing={"policy": "round_robin"}, scrape=MODELS_AT_JOIN)
    start = reload(r, cfg)
    assert since(r, start, r"backend pod-b changes in place"), r.err.tail()
    for i in range(4):
        resp = curl(r.url("/v1/completions"), completion("e%d" % i, model="extra"))
        assert resp.status == 200 and resp.header("x-pcrouter-backend") == "pod-b", resp
    # pod-a moves to another address: a new backend under the same name.
    cfg = make_config([{"name": "pod-a", "url": a2.url},
                       {"name": "pod-b", "url": b.url, "models": ["extra"]}],
                      routing={"policy": "round_robin"}, scrape=MODELS_AT_JOIN)
    stream = CurlStream(r.url("/v1/completions"), completion("held", stream=True, gate="move"))
    wait_for(lambda: a.stats()["active"] + b.stats()["active"] == 1, 15, what="a stream")
    start = reload(r, cfg)
    assert since(r, start, r"1 backend\(s\) joined, 1 left"), r.err.tail()
    n_a = pod_requests(a)
    got = {curl(r.url("/v1/completions"), completion("m%d" % i)).json()["stub"]["pod"]
           for i in range(6)}
    assert got == {"pod-a2", "pod-b"}, got
    assert pod_requests(a) == n_a
    for s in (a, b):
        s.release("move")
    rc, out = stream.finish(30)
    assert rc == 0 and b"[DONE]" in out, out[-300:]


def test_reload_removing_a_backend_and_changing_the_policy_keeps_routing(stub_factory,
                                                                       router_factory):
    """[p0, p1] with cache_aware, reloaded to [p1] with least_loaded: the workers' fresh
    policies are refilled from slot numbers with a hole at 0. They refused slot 1, and every
    completion got 404 model_not_found while p1 was up."""
    p0, p1 = stub_factory("p0"), stub_factory("p1")
    r = router_factory(make_config([p0, p1], routing={"policy": "cache_aware"}))
    wait_for(lambda: curl(r.url("/health")).status == 200, 15, what="/health 200")
    assert curl(r.url("/v1/completions"), completion("before")).status == 200
    reload(r, make_config([p1], routing={"policy": "least_loaded"}))
    # Every worker has the new config once each has answered with least_loaded's route.
    wait_for(lambda: all(curl(r.url("/v1/completions"), completion("after%d" % i)).header(
        "x-pcrouter-route") == "least_loaded" for i in range(6)), 10,
        what="least_loaded on every worker")
    for i in range(20):
        resp = curl(r.url("/v1/completions"), completion("steady%d" % i))
        assert resp.status == 200 and resp.header("x-pcrouter-backend") == "p1", resp
        resp = curl(r.url("/v1/embeddings"), {"model": "stub-model", "input": "x%d" % i})
        assert resp.status == 200 and resp.header("x-pcrouter-backend") == "p1", resp


def test_reload_storm_reorders_backends_and_policies_under_load(stub_factory, router_factory):
    """Reloads under load that add, remove and reorder backends while the policy, the block
    size and the prefix length change: every request is answered 200, by a pod of the config
    in force or the one before it."""
    pods = [stub_factory("s%d" % i) for i in range(4)]
    policies = ["cache_aware", "least_loaded", "consistent_hash", "round_robin"]
    r = router_factory(make_config(pods, routing={"policy": "cache_aware"}))
    wait_for(lambda: curl(r.url("/health")).status == 200, 15, what="/health 200")
    load = Load(r.port, lambda n: completion("storm %d %s" % (n % 7, "y" * (n % 300))),
                threads=4)
    plans = [[3, 1], [0, 2, 3], [2], [1, 0], [3, 2, 1, 0], [0], [2, 3]]
    try:
        load.wait_count(50)
        for k, plan in enumerate(plans):
            cfg = make_config([pods[i] for i in plan],
                              routing={"policy": policies[k % len(policies)],
                                       "block_bytes": 128 if k % 2 else 256,
                                       "max_prefix_bytes": 65536 if k % 3 else 131072})
            reload(r, cfg)
            mark = load.count()
            load.wait_count(mark + 40)
    finally:
        results = load.stop()
    bad = [x for x in results if x["status"] != 200]
    assert not bad, "%d of %d requests failed: %s" % (len(bad), len(results), bad[:5])
    assert {x["backend"] for x in results[-20:]} <= {"s2", "s3"}


def test_reload_turns_health_checks_on_with_scraping_off(stub_factory, router_factory):
    """A reload that turns health checks on starts them, scraping off or not: a pod that fails
    its checks is then marked down, and /health says no backend is up."""
    a = stub_factory("pod-a")
    a.configure(health_status=503)
    cfg = make_config([a], health={"interval_ms": 0}, scrape=QUIET_SCRAPE)
    r = router_factory(cfg)
    # With checks off the pod is taken to be up, and nothing asks it for /health.
    assert curl(r.url("/health")).status == 200
    assert a.stats()["requests"].get("/health", 0) == 0
    cfg = make_config([a], health={"interval_ms": 100, "timeout_ms": 1000, "fall": 2},
                      scrape=QUIET_SCRAPE)
    start = reload(r, cfg)
    wait_for(lambda: since(r, start, r"backend pod-a is down after"), 10,
             what="pod-a marked down by the checks the reload started")
    assert a.stats()["requests"].get("/health", 0) >= 2
    assert curl(r.url("/health")).status == 503


def test_reload_turns_health_checks_on_off_and_on_again(stub_factory, router_factory):
    """Checks turned on, off, then on again by reloads run again: the checks of the second
    turn find the pod failing and mark it down. Before the fix the timer of the first turn,
    left idle when the checks were turned off, was never armed again."""
    a = stub_factory("pod-a")
    on = dict(interval_ms=100, timeout_ms=1000, fall=2)
    r = router_factory(make_config([a], health=on, scrape=QUIET_SCRAPE))
    checks = lambda: a.stats()["requests"].get("/health", 0)
    wait_for(lambda: checks() >= 2, 10, what="the first turn's checks")
    reload(r, make_config([a], health={"interval_ms": 0}, scrape=QUIET_SCRAPE))
    # Off: the check in flight or due at the reload is the last. Seen once no check came for
    # ten intervals.
    last = {"n": -1, "at": 0.0}

    def quiet():
        n, now = checks(), time.monotonic()
        if n != last["n"]:
            last.update(n=n, at=now)
        return now - last["at"] >= 1.0
    wait_for(quiet, 15, 0.05, "no check while they are off")
    a.configure(health_status=503)
    start = reload(r, make_config([a], health=on, scrape=QUIET_SCRAPE))
    wait_for(lambda: since(r, start, r"backend pod-a is down after"), 10,
             what="pod-a marked down by the checks of the second turn")
    assert curl(r.url("/health")).status == 503
