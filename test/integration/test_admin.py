"""test_admin.py: the admin listener (admin.address). With it, /metrics and /health are served
there and only there: the public listener answers them 404, the admin listener answers anything
else 404, and a reload (SIGHUP) keeps it where it is, or moves it."""
import json
import signal

from conftest import completion, curl, free_port, make_config, metric, wait_for


def admin_url(router, path, port=None):
    return "http://127.0.0.1:%d%s" % (port or router.ports[-1], path)


def test_metrics_and_health_move_to_the_admin_listener(stub_factory, router_factory):
    stub = stub_factory("pod-a")
    r = router_factory(make_config([stub], admin={"address": "127.0.0.1:0"}))
    assert len(r.ports) == 2 and r.ports[0] != r.ports[1], r.ports
    assert "admin: /metrics" in r.stderr_text()

    # Public: the proxy works, the router's own endpoints are not there.
    assert curl(r.url("/v1/completions"), completion("hello")).status == 200
    for path in ("/metrics", "/health"):
        resp = curl(r.url(path))
        assert resp.status == 404, resp
        assert "admin" in resp.json()["error"]["message"]

    # Admin: both are there, over HTTP/1.1 and h2c, and nothing else is.
    for proto in ("h1", "h2c"):
        m = curl(admin_url(r, "/metrics"), proto=proto)
        assert m.status == 200, m
        assert metric(m.body.decode(), "pcrouter_requests_total", code=200) >= 1
        h = curl(admin_url(r, "/health"), proto=proto)
        assert h.status == 200 and h.json()["status"] == "ok", h
    for path, data in (("/v1/completions", completion("x")), ("/v1/models", None), ("/", None)):
        resp = curl(admin_url(r, path), data)
        assert resp.status == 404, resp
        assert resp.json()["error"]["code"] == "not_found"
    assert stub.stats()["requests"].get("/v1/completions") == 1  # the admin one never reached it


def test_without_admin_the_public_listener_serves_metrics(cluster):
    c = cluster(1)
    assert curl(c.url("/metrics")).status == 200
    assert curl(c.url("/health")).status == 200


def reload(router, config, timeout=15):
    with open(router.path, "w") as f:
        json.dump(config, f)
    before = router.stderr_text().count("config reloaded")
    router.send_signal(signal.SIGHUP)
    wait_for(lambda: router.stderr_text().count("config reloaded") > before, timeout,
             what="the reload:\n" + router.err.tail())


def test_admin_listener_survives_and_moves_with_a_reload(stub_factory, router_factory):
    stub = stub_factory("pod-a")
    cfg = make_config([stub], admin={"address": "127.0.0.1:0"})
    r = router_factory(cfg)
    port = r.ports[-1]
    # Port 0 again: the running socket is kept (the same address as written).
    reload(r, cfg)
    assert curl(admin_url(r, "/metrics", port)).status == 200
    text = get_metrics_at(port)
    assert metric(text, "pcrouter_config_reloads_total", result="ok") == 1

    # A fixed port: the admin listener moves there, the old one closes.
    new_port = free_port()
    cfg2 = make_config([stub], admin={"address": "127.0.0.1:%d" % new_port})
    reload(r, cfg2)
    wait_for(lambda: curl(admin_url(r, "/metrics", new_port), timeout=5).status == 200, 10,
             what="the admin listener on its new port")
    assert curl(admin_url(r, "/metrics", port), timeout=5).status == 0  # nobody listens there

    # No admin at all: the public listener serves /metrics again.
    reload(r, make_config([stub]))
    wait_for(lambda: curl(r.url("/metrics"), timeout=5).status == 200, 10,
             what="/metrics back on the public listener")
    assert curl(r.url("/v1/completions"), completion("after")).status == 200


def get_metrics_at(port):
    resp = curl("http://127.0.0.1:%d/metrics" % port)
    assert resp.status == 200, resp
    return resp.body.decode()
