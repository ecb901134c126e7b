"""DNS discovery against a resolver the test controls: dnsmasq on a loopback port, answering
pods.test from a hosts file the test rewrites (SIGHUP makes dnsmasq read it again), never the
machine's resolver. The pods are stubs on 127.0.0.2, .3, .4 (Linux routes all of 127/8 to
loopback), all on one port, as the pods of a Kubernetes headless Service are.

pcrouter resolves the name every discovery[].interval_ms and keeps one backend per address,
named "ADDRESS:PORT": pods join and leave as the answer changes, a pod that leaves drains what
it has, and a lookup that fails keeps the pool as it is."""
import os
import pwd
import signal
import socket
import subprocess

import pytest

from conftest import (CurlStream, LineReader, Load, completion, curl, get_metrics, make_config,
                      parse_metrics, wait_for)

NAME = "pods.test"


def free_dns_port():
    """A loopback port free for both UDP and TCP (dnsmasq binds both)."""
    for _ in range(50):
        t = socket.socket()
        t.bind(("127.0.0.1", 0))
        port = t.getsockname()[1]
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            u.close()
            t.close()
    raise AssertionError("no port free for both UDP and TCP")


class Dnsmasq:
    """dnsmasq in the foreground on 127.0.0.1:port, answering only from its hosts file."""

    def __init__(self, tmpdir, addrs, port=None, extra=()):
        self.hosts = os.path.join(str(tmpdir), "hosts")
        self.port = port or free_dns_port()
        self.reads = 0
        self.extra = list(extra)  # (address, name) lines besides pods.test
        self._write(addrs)
        user = pwd.getpwuid(os.geteuid()).pw_name  # as root it would switch to nobody
        self.proc = subprocess.Popen(
            ["dnsmasq", "--no-daemon", "--keep-in-foreground", "--conf-file=/dev/null",
             "--port=%d" % self.port, "--listen-address=127.0.0.1", "--bind-interfaces",
             "--no-resolv", "--no-hosts", "--addn-hosts=" + self.hosts, "--local-ttl=0",
             "--pid-file=", "--user=" + user],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.err = LineReader(self.proc.stderr, "dnsmasq")
        self._await_read(len(addrs) + len(self.extra))

    def _write(self, addrs):
        with open(self.hosts, "w") as f:
            for a in addrs:
                f.write("%s %s\n" % (a, NAME))
            for a, name in self.extra:
                f.write("%s %s\n" % (a, name))

    def _await_read(self, n):
        got = self.err.wait_line(r"read %s - %d names?" % (self.hosts, n), 15, self.reads)
        if got is None:
            self.stop()
            raise AssertionError("dnsmasq did not read its hosts file: " + self.err.tail())
        self.reads = got[0] + 1

    def answer(self, addrs):
        """From now on pods.test resolves to addrs."""
        self._write(addrs)
        self.proc.send_signal(signal.SIGHUP)
        self._await_read(len(addrs) + len(self.extra))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def dns(tmp_path):
    made = []

    def make(addrs, port=None, extra=()):
        d = Dnsmasq(tmp_path, addrs, port, extra)
        made.append(d)
        return d
    yield make
    for d in made:
        d.stop()


def discovery_config(dns_port, pod_port, **sections):
    cfg = make_config([], routing={"policy": "round_robin"},
                      dns={"nameservers": ["127.0.0.1:%d" % dns_port], "timeout_ms": 300},
                      discovery=[{"dns": NAME, "port": pod_port, "interval_ms": 200}],
                      **sections)
    del cfg["backends"]
    return cfg


def backends(router):
    """Names of the backends in the pool now, from pcrouter_backend_up."""
    return {l["backend"] for n, l, v in parse_metrics(get_metrics(router))
            if n == "pcrouter_backend_up"}


def start_pods(stub_factory, hosts):
    """Stubs on each 127.0.0.x address, all on the port the first one got."""
    first = stub_factory("pod-" + hosts[0].rsplit(".", 1)[1], host=hosts[0])
    pods = {hosts[0]: first}
    for h in hosts[1:]:
        pods[h] = stub_factory("pod-" + h.rsplit(".", 1)[1], host=h, port=first.port)
    return pods, first.port


def test_pool_follows_dns_under_load(stub_factory, router_factory, dns):
    pods, port = start_pods(stub_factory, ["127.0.0.2", "127.0.0.3", "127.0.0.4"])
    d = dns(["127.0.0.2", "127.0.0.3"])
    r = router_factory(discovery_config(d.port, port))
    want = {"127.0.0.2:%d" % port, "127.0.0.3:%d" % port}
    wait_for(lambda: backends(r) == want, 15, 0.05, "the two pods the name gives")
    wait_for(lambda: curl(r.url("/health")).status == 200, 10, what="/health 200")
    # A stream on .2 that outlives its removal from DNS.
    stream = None
    for i in range(8):
        cs = CurlStream(r.url("/v1/completions"), completion("s%d" % i, stream=True, gate="dns"))
        try:
            cs.wait_output(b"data: {", 15)
        except AssertionError:
            cs.kill()
            raise
        if b"x-pcrouter-backend: 127.0.0.2:" in cs.output().lower():
            stream = cs
            break
        pods["127.0.0.3"].release("dns")
        assert cs.finish(15)[0] == 0
    assert stream is not None, "round robin never sent a stream to 127.0.0.2"
    load = Load(r.port, lambda n: completion("d%d" % n), threads=4)
    try:
        load.wait_count(100)
        d.answer(["127.0.0.3", "127.0.0.4"])
        want = {"127.0.0.3:%d" % port, "127.0.0.4:%d" % port}
        wait_for(lambda: backends(r) == want, 15, 0.05, "the pool after the change")
        wait_for(lambda: pods["127.0.0.4"].stats()["requests"].get("/v1/completions", 0) >= 20,
                 15, what="the new pod taking requests")
        gone = pods["127.0.0.2"].stats()["requests"].get("/v1/completions", 0)
        mark = load.count()
        load.wait_count(mark + 200)
        assert pods["127.0.0.2"].stats()["requests"].get("/v1/completions", 0) == gone
    finally:
        results = load.stop()
    bad = [x for x in results if x["status"] != 200]
    assert not bad, bad[:5]
    assert {x["backend"] for x in results[-100:]} == want
    # The pod that left drained its stream: it ends whole.
    pods["127.0.0.2"].release("dns")
    rc, out = stream.finish(30)
    assert rc == 0 and b"[DONE]" in out, out[-300:]
    wait_for(lambda: "backend 127.0.0.2:%d has drained and is gone" % port in r.stderr_text(), 10,
             what="the pod that left freed")
    text = get_metrics(r)
    assert "pcrouter_discovery_lookups_total" in text


def test_failed_lookups_keep_the_pool(stub_factory, router_factory, dns):
    pods, port = start_pods(stub_factory, ["127.0.0.2", "127.0.0.3"])
    d = dns(["127.0.0.2", "127.0.0.3"])
    r = router_factory(discovery_config(d.port, port))
    want = {"127.0.0.2:%d" % port, "127.0.0.3:%d" % port}
    wait_for(lambda: backends(r) == want, 15, 0.05, "the two pods the name gives")

    def failures():
        from conftest import metric
        return metric(get_metrics(r), "pcrouter_discovery_failures_total")
    before = failures()
    d.stop()
    wait_for(lambda: failures() >= before + 3, 15, 0.05, "lookups failing")
    assert backends(r) == want
    got = {curl(r.url("/v1/completions"), completion("k%d" % i)).header("x-pcrouter-backend")
           for i in range(6)}
    assert got == want
    assert "lookup failed" in r.stderr_text()
    # The resolver comes back with another answer: the pool follows it again.
    dns(["127.0.0.3"], port=d.port)
    wait_for(lambda: backends(r) == {"127.0.0.3:%d" % port}, 15, 0.05, "the pool after recovery")


class SilentResolver:
    """A UDP port that takes DNS queries and never answers: every lookup stays in flight."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def queries(self):
        self.sock.settimeout(0)
        n = 0
        try:
            while True:
                self.sock.recv(4096)
                n += 1
        except (BlockingIOError, socket.timeout):
            return n

    def close(self):
        self.sock.close()


def test_resolver_changed_and_stopped_with_lookups_in_flight(stub_factory, router_factory, dns):
    """A reload that changes dns.nameservers while a lookup is waiting on the old resolver, and
    a stop while one waits on the new: the lookups are abandoned cleanly (the sanitizer builds
    check for use after free and leaks), and discovery goes on with the new resolver."""
    pods, port = start_pods(stub_factory, ["127.0.0.2"])
    silent = SilentResolver()
    try:
        cfg = discovery_config(silent.port, port)
        cfg["dns"]["timeout_ms"] = 10000
        r = router_factory(cfg)
        wait_for(lambda: silent.queries() > 0, 10, what="a lookup sent to the silent resolver")
        d = dns(["127.0.0.2"])
        cfg = discovery_config(d.port, port)
        r.config = cfg
        with open(r.path, "w") as f:
            import json
            json.dump(cfg, f)
        r.send_signal(signal.SIGHUP)
        wait_for(lambda: backends(r) == {"127.0.0.2:%d" % port}, 15, 0.05,
                 "the pod found through the new resolver")
        assert curl(r.url("/v1/completions"), completion("x")).status == 200
        # Back to the silent one, then stop while its lookup waits.
        cfg = discovery_config(silent.port, port)
        cfg["dns"]["timeout_ms"] = 10000
        r.config = cfg
        with open(r.path, "w") as f:
            json.dump(cfg, f)
        silent.queries()
        r.send_signal(signal.SIGHUP)
        wait_for(lambda: silent.queries() > 0, 10, what="a lookup waiting again")
        assert backends(r) == {"127.0.0.2:%d" % port}
        r.stop()
    finally:
        silent.close()


def test_backend_host_names_resolved_through_dns_nameservers(stub_factory, router_factory,
                                                             dns):
    """Backends named by host name are resolved through dns.nameservers, at start as at a
    reload; a name that does not resolve refuses the reload and the old config stays."""
    from conftest import metric
    pods, port = start_pods(stub_factory, ["127.0.0.2", "127.0.0.3"])
    d = dns(["127.0.0.3"], extra=[("127.0.0.2", "two.test")])

    def config(backends):
        return make_config(backends, routing={"policy": "round_robin"},
                           dns={"nameservers": ["127.0.0.1:%d" % d.port], "timeout_ms": 500})
    # The machine's resolver knows no pods.test: only the configured one can answer.
    r = router_factory(config([("pod-3", "http://%s:%d" % (NAME, port))]))
    assert backends(r) == {"pod-3"}
    assert curl(r.url("/v1/completions"), completion("s")).json()["stub"]["pod"] == "pod-3"

    def reload_to(backends, result):
        import json
        cfg = config(backends)
        before = metric(get_metrics(r), "pcrouter_config_reloads_total", result=result)
        with open(r.path, "w") as f:
            json.dump(cfg, f)
        r.config = cfg
        r.send_signal(signal.SIGHUP)
        wait_for(lambda: metric(get_metrics(r), "pcrouter_config_reloads_total",
                                result=result) == before + 1, 15, 0.05, "reload " + result)
    reload_to([("pod-3", "http://%s:%d" % (NAME, port)), ("pod-2", "http://two.test:%d" % port)],
              "ok")
    assert backends(r) == {"pod-2", "pod-3"}
    got = {curl(r.url("/v1/completions"), completion("h%d" % i)).json()["stub"]["pod"]
           for i in range(4)}
    assert got == {"pod-2", "pod-3"}, got
    reload_to([("pod-3", "http://%s:%d" % (NAME, port)), ("pod-4", "http://nothere.test:%d" % port)],
              "error")
    assert 'cannot resolve host "nothere.test"' in r.stderr_text()
    assert backends(r) == {"pod-2", "pod-3"}


def test_lookups_carry_edns0(router_factory):
    """Every query offers a 1232-byte UDP payload (an OPT record, RFC 6891), so a server can
    answer dozens of pods in one datagram; evdns sent none and answers past 512 bytes were cut."""
    silent = SilentResolver()
    try:
        silent.sock.settimeout(10)
        router_factory(discovery_config(silent.port, 9))
        query = silent.sock.recv(4096)
    finally:
        silent.close()
    arcount = int.from_bytes(query[10:12], "big")
    assert arcount == 1, query
    # The OPT pseudo-record closes the query: root name, type 41, then the payload size.
    assert query[-11:-8] == b"\x00\x00\x29", query[-11:]
    assert int.from_bytes(query[-8:-6], "big") == 1232


def test_discovery_follows_256_pods_behind_one_name(stub_factory, router_factory, dns):
    """A headless Service of 256 pods: the answer is far past one UDP datagram, so the server
    truncates it and the lookup goes again over TCP. Every pod joins, the pool stays the same
    lookup after lookup, and it follows the name when pods leave."""
    from conftest import metric
    pods, port = start_pods(stub_factory, ["127.0.0.2"])
    # 255 addresses where nothing listens (they go down at their health checks), and one pod.
    idle = ["127.0.%d.%d" % (1 + i // 200, 1 + i % 200) for i in range(255)]
    d = dns(["127.0.0.2"] + idle)
    cfg = discovery_config(d.port, port, health={"interval_ms": 1000, "fall": 1, "rise": 1})
    r = router_factory(cfg)
    want = {"%s:%d" % (a, port) for a in ["127.0.0.2"] + idle}
    wait_for(lambda: backends(r) == want, 20, 0.1, "the 256 pods the name gives")

    def lookups():
        return metric(get_metrics(r), "pcrouter_discovery_lookups_total")
    n = lookups()
    wait_for(lambda: lookups() >= n + 5, 15, 0.1, "five more lookups")
    assert backends(r) == want, "the pool changed between lookups of the same answer"
    assert metric(get_metrics(r), "pcrouter_discovery_failures_total") == 0
    wait_for(lambda: curl(r.url("/v1/completions"), completion("k")).status == 200, 15, 0.1,
             "a completion answered by the one pod that listens")
    # 40 pods leave: the pool follows.
    d.answer(["127.0.0.2"] + idle[40:])
    want = {"%s:%d" % (a, port) for a in ["127.0.0.2"] + idle[40:]}
    wait_for(lambda: backends(r) == want, 20, 0.1, "the 216 pods left")
