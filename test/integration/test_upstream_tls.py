"""TLS to the pods: `https://` backends and discovery entries with a "tls" object. The stub
pod serves HTTPS with certificates made here: a CA, a pod certificate for 127.0.0.1 and
pod.test, a client certificate for mutual TLS, and a CA that signed none of them."""
import json
import os
import re
import signal
import subprocess
import threading

import pytest

from conftest import (PCROUTER, completion, curl, get_metrics, make_config, wait_for)


def _openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pki"))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", *ec, "-keyout", ca + ".key", "-out", ca + ".pem", "-days", "2",
                 "-subj", "/CN=" + ca, cwd=d)
    for leaf, san in (("pod", "IP:127.0.0.1,DNS:pod.test"), ("client", "DNS:pcrouter.test")):
        _openssl("req", *ec, "-keyout", leaf + ".key", "-out", leaf + ".csr", "-subj", "/CN=" + leaf, cwd=d)
        with open(os.path.join(d, leaf + ".ext"), "w") as f:
            f.write("subjectAltName=%s\n" % san)
        _openssl("x509", "-req", "-in", leaf + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", leaf + ".pem", "-days", "2", "-extfile", leaf + ".ext", cwd=d)
    return {k: os.path.join(d, k) for k in
            ("ca.pem", "other-ca.pem", "pod.pem", "pod.key", "client.pem", "client.key")}


def _pod(stub_factory, pki, name="p0", mutual=False):
    tls = {"cert": pki["pod.pem"], "key": pki["pod.key"], "ca": pki["ca.pem"]}
    if mutual:
        tls.update(client_ca=pki["ca.pem"], client_cert=pki["client.pem"], client_key=pki["client.key"])
    return stub_factory(name, tls=tls)


def _backend(stub, **tls):
    b = {"name": stub.name, "url": "https://127.0.0.1:%d" % stub.port}
    if tls:
        b["tls"] = tls
    return b


def _tls_errors(router, name):
    m = re.search(r'^pcrouter_upstream_tls_errors_total\{backend="%s"\} (\d+)$' % re.escape(name),
                  get_metrics(router), re.M)
    return int(m.group(1)) if m else None


def test_completions_reach_an_https_pod(pki, stub_factory, router_factory):
    pod = _pod(stub_factory, pki)
    r = router_factory(make_config([_backend(pod, ca_file=pki["ca.pem"])]))
    for i in range(3):
        resp = curl(r.url("/v1/completions"), completion("hello %d" % i))
        assert resp.status == 200, resp
        assert resp.json()["stub"]["pod"] == "p0"
    st = pod.stats()
    assert st["tls_handshakes"] >= 1 and st["requests"].get("/v1/completions") == 3
    # Health checks go over the same TLS: the pod has answered them.
    wait_for(lambda: pod.stats()["requests"].get("/health", 0) >= 1, 10, what="a health check over TLS")
    assert _tls_errors(r, "p0") == 0


def test_a_certificate_that_does_not_verify_fails_and_says_why(pki, stub_factory, router_factory):
    pod = _pod(stub_factory, pki)
    r = router_factory(make_config([_backend(pod, ca_file=pki["other-ca.pem"])]))
    resp = curl(r.url("/v1/completions"), completion("hello"))
    assert resp.status in (502, 503), resp
    assert "error" in resp.json()
    wait_for(lambda: "TLS to the pod failed: certificate verify failed" in r.stderr_text(), 10,
             what="the log line naming the reason")
    assert re.search(r"backend p0: TLS to the pod failed: certificate verify failed", r.stderr_text())
    assert _tls_errors(r, "p0") >= 1
    # Never a fallback to plain text: the pod saw no request, only failed handshakes.
    assert pod.stats()["requests"].get("/v1/completions", 0) == 0


def test_the_name_is_checked_and_sent(pki, stub_factory, router_factory):
    pod = _pod(stub_factory, pki)
    good = router_factory(make_config([_backend(pod, ca_file=pki["ca.pem"], server_name="pod.test")]))
    assert curl(good.url("/v1/completions"), completion("a")).status == 200
    bad = router_factory(make_config([_backend(pod, ca_file=pki["ca.pem"], server_name="other.test")]))
    assert curl(bad.url("/v1/completions"), completion("a")).status in (502, 503)
    wait_for(lambda: "certificate verify failed" in bad.stderr_text(), 10, what="a name mismatch")


def test_verify_off_accepts_any_certificate(pki, stub_factory, router_factory):
    pod = _pod(stub_factory, pki)
    r = router_factory(make_config([_backend(pod, ca_file=pki["other-ca.pem"], verify=False)]))
    assert curl(r.url("/v1/completions"), completion("a")).status == 200


def test_mutual_tls(pki, stub_factory, router_factory):
    pod = _pod(stub_factory, pki, mutual=True)
    without = router_factory(make_config([_backend(pod, ca_file=pki["ca.pem"])]))
    assert curl(without.url("/v1/completions"), completion("a")).status in (502, 503)
    wait_for(lambda: (_tls_errors(without, "p0") or 0) >= 1, 10, what="a refused client")
    with_cert = router_factory(make_config([_backend(pod, ca_file=pki["ca.pem"], cert=pki["client.pem"],
                                                     key=pki["client.key"])]))
    assert curl(with_cert.url("/v1/completions"), completion("a")).status == 200


def test_new_connections_resume_the_session(pki, stub_factory, router_factory):
    pod = _pod(stub_factory, pki)
    r = router_factory(make_config([_backend(pod, ca_file=pki["ca.pem"])],
                                   health={"interval_ms": 0},
                                   scrape={"interval_ms": 0, "models_interval_ms": 0}))
    assert curl(r.url("/v1/completions"), completion("first")).status == 200
    before = pod.stats()
    # Eight at once, held by the pod until all arrived: at least seven more connections (the
    # first request's connection, idle in one worker's pool, may carry one of them), whose
    # handshakes overlap. A session shared between them was once marked spent by the first to
    # finish, and the others made full handshakes.
    n = 8
    results = []
    ts = [threading.Thread(target=lambda i=i: results.append(
        curl(r.url("/v1/completions"), completion("held %d" % i, gate="g")).status)) for i in range(n)]
    for t in ts:
        t.start()
    wait_for(lambda: pod.stats()["active"] >= n, 15, what="%d requests at the pod" % n)
    pod.release("g")
    for t in ts:
        t.join(30)
    assert results == [200] * n
    st = pod.stats()
    # The connections pcrouter opened for them (the test's own calls to the stub make
    # connections too, but never resume): every one resumed the session the first was given.
    first = {e["conn"] for e in before["log"] if e["path"] == "/v1/completions"}
    opened = {e["conn"] for e in st["log"] if e["path"] == "/v1/completions"} - first
    assert len(opened) >= n - 1, st["log"]
    assert st["tls_resumed"] - before["tls_resumed"] == len(opened), (before, st)


def test_sighup_reads_the_ca_again(pki, stub_factory, router_factory, tmp_path):
    pod = _pod(stub_factory, pki)
    ca = str(tmp_path / "ca-in-use.pem")
    with open(pki["other-ca.pem"]) as f, open(ca, "w") as g:
        g.write(f.read())
    r = router_factory(make_config([_backend(pod, ca_file=ca)], health={"interval_ms": 0}))
    assert curl(r.url("/v1/completions"), completion("a")).status in (502, 503)
    with open(pki["ca.pem"]) as f, open(ca, "w") as g:
        g.write(f.read())
    r.send_signal(signal.SIGHUP)
    wait_for(lambda: "config reloaded from" in r.stderr_text(), 15,
             what="the reload")

    def served():
        return curl(r.url("/v1/completions"), completion("b")).status == 200
    wait_for(served, 15, interval=0.2, what="a request with the new CA")


def test_a_reload_with_an_unusable_key_is_refused(pki, stub_factory, router_factory, tmp_path):
    pod = _pod(stub_factory, pki, mutual=True)
    key = str(tmp_path / "client.key")
    with open(pki["client.key"]) as f, open(key, "w") as g:
        g.write(f.read())
    r = router_factory(make_config([_backend(pod, ca_file=pki["ca.pem"], cert=pki["client.pem"], key=key)]))
    assert curl(r.url("/v1/completions"), completion("a")).status == 200
    with open(key, "w") as g:
        g.write("not a key\n")
    r.send_signal(signal.SIGHUP)
    wait_for(lambda: "reload refused" in r.stderr_text(), 15, what="the refusal")
    assert re.search(r"reload refused.*backends\[0\]\.tls: cannot use the client key", r.stderr_text())
    assert curl(r.url("/v1/completions"), completion("b")).status == 200


@pytest.mark.parametrize("backend,why", [
    ({"name": "p", "url": "http://127.0.0.1:1", "tls": {"verify": False}}, "needs an https:// url"),
    ({"name": "p", "url": "https://127.0.0.1:1", "tls": {"cert": "/etc/hostname"}}, '"cert" and "key" go together'),
    ({"name": "p", "url": "https://127.0.0.1:1", "tls": {"ca_file": "/nonexistent/ca.pem"}}, "cannot read"),
    ({"name": "p", "url": "https://127.0.0.1:1", "tls": {"verify": "yes"}}, "verify"),
])
def test_config_errors(tmp_path, backend, why):
    path = str(tmp_path / "c.json")
    with open(path, "w") as f:
        json.dump(make_config([backend]), f)
    out = subprocess.run([PCROUTER, "--check-config", path], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert why in out.stdout + out.stderr, out.stdout + out.stderr


def test_discovered_pods_speak_tls(pki, stub_factory, router_factory, tmp_path):
    from test_discovery import Dnsmasq, discovery_config, backends
    pod = _pod(stub_factory, pki)
    d = Dnsmasq(tmp_path, ["127.0.0.1"], None, ())
    try:
        cfg = discovery_config(d.port, pod.port)
        cfg["discovery"][0]["tls"] = {"ca_file": pki["ca.pem"]}
        r = router_factory(cfg)
        wait_for(lambda: backends(r) == {"127.0.0.1:%d" % pod.port}, 15, 0.05, "the pod")
        resp = curl(r.url("/v1/completions"), completion("a"))
        assert resp.status == 200, resp
        assert pod.stats()["tls_handshakes"] >= 1
        assert _tls_errors(r, "127.0.0.1:%d" % pod.port) == 0
    finally:
        d.stop()
