"""test_tls_transport.py: the TLS transport rides on the plain one (router/net/sock_tls.c): its
ciphertext is read and written by plain sockets, so TLS connections, to the clients and to the
pods, go through the worker's io_uring batch and are counted when a worker gathers events.
Several records in one read are all delivered at once, with no further bytes to wake the
socket; close_notify ends a stream like an end of stream; garbage instead of a ClientHello is
refused at once; a pod that stalls the handshake fails within the connect deadline."""
import json
import socket
import ssl
import time

import pytest

from conftest import (RawConn, completion, curl, get_metrics, http_request, make_config, metric,
                      wait_for)
from test_io_uring import assert_all_answered, burst
from test_upstream_tls import _backend, _pod, pki  # noqa: F401 - pki is a fixture


def client_ctx(alpn=("http/1.1",)):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(list(alpn))
    return ctx


class TlsRaw(RawConn):
    """RawConn over TLS with the records in the test's hands: OpenSSL's output through memory
    BIOs, so that several records (or the handshake's last flight and a request) go out in one
    send. Reading parses responses as RawConn does; `close_notify` tells whether the router
    ended with one."""

    def __init__(self, port, timeout=15, finish=True):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.timeout = timeout
        self.close_notify = False
        self.inc, self.outg = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = client_ctx().wrap_bio(self.inc, self.outg)
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.send(self.outg.read())
                self._recv()
        if finish:
            self.send(self.outg.read())  # the client's Finished

    def _recv(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("closed without close_notify; buffered %r" % self.buf[:500])
        self.inc.write(data)

    def records(self, *payloads):
        """Bytes to send: what is pending (the Finished, when held back), then one record per
        payload."""
        out = self.outg.read()
        for p in payloads:
            self.obj.write(p)
            out += self.outg.read()
        return out

    def _fill(self):
        while True:
            try:
                chunk = self.obj.read(65536)
            except ssl.SSLWantReadError:
                self._recv()
                continue
            except ssl.SSLZeroReturnError:
                self.close_notify = True
                raise EOFError("close_notify")
            if not chunk:
                raise EOFError("closed")
            self.buf += chunk
            return

    def send_close_notify(self):
        try:
            self.obj.unwrap()
        except ssl.SSLWantReadError:
            pass
        self.send(self.outg.read())

    def wait_close(self):
        """Reads to the end: True when it came with close_notify."""
        try:
            while True:
                self._fill()
        except EOFError:
            return self.close_notify


@pytest.fixture
def tls_cluster(cluster, tls_cert):
    return cluster(2, tls=tls_cert, workers=1)


def test_records_sharing_a_segment_are_all_answered(tls_cluster):
    """Two requests in two records, and a third behind the handshake's last flight, each group in
    one send: every request is answered without the client sending anything more (a transport
    that decrypted one record per read would leave the rest in its buffer, unread, for good)."""
    c = tls_cluster
    conn = TlsRaw(c.router.tls_port)
    conn.send(conn.records(http_request("POST", "/v1/completions", completion("one", tag="1")),
                           http_request("POST", "/v1/completions", completion("two", tag="2"))))
    got = [conn.read_response() for _ in range(2)]
    assert [s for s, _, _ in got] == [200, 200], got
    assert [json.loads(b)["stub"]["tag"] for _, _, b in got] == ["1", "2"]
    conn.close()

    late = TlsRaw(c.router.tls_port, finish=False)
    late.send(late.records(http_request("GET", "/health")))  # Finished + request, one send
    status, _, _ = late.read_response()
    assert status == 200
    late.close()


def test_close_notify_ends_the_stream(tls_cluster):
    """A client that says close_notify after its answer: the router closes with a close_notify
    of its own. One that sends a request and close_notify together has ended its side: the
    router hears an end of stream, as from a plain client's half-close (the request is
    abandoned), and closes. A client that just closes its socket (no close_notify, as most do)
    leaves nothing behind either."""
    c = tls_cluster
    conn = TlsRaw(c.router.tls_port)
    conn.send(conn.records(http_request("POST", "/v1/completions", completion("last words"))))
    status, _, body = conn.read_response()
    assert status == 200 and b'"choices"' in body
    conn.send_close_notify()
    assert conn.wait_close(), "the router closed without close_notify"
    conn.close()

    both = TlsRaw(c.router.tls_port)
    both.obj.write(http_request("GET", "/health"))
    both.send_close_notify()  # the request's record and the alert, in one send
    both.wait_close()
    both.close()

    for _ in range(3):
        dirty = TlsRaw(c.router.tls_port)
        dirty.send(dirty.records(http_request("GET", "/health")))
        assert dirty.read_response()[0] == 200
        dirty.sock.close()  # no close_notify
    # Only the admin's own connection is left open once the router has seen the ends.
    wait_for(lambda: metric(get_metrics(c.router), "pcrouter_client_connections") <= 1, 10,
             what="the closed TLS connections freed")


def test_garbage_instead_of_a_client_hello_is_refused_at_once(cluster, tls_cert):
    c = cluster(1, tls=tls_cert, timeouts={"request_header_ms": 30000})
    conn = RawConn(c.router.tls_port)
    t0 = time.monotonic()
    conn.send(http_request("GET", "/health"))
    got, closed = conn.read_until_close_or_data(10)
    conn.close()
    assert closed and time.monotonic() - t0 < 10, got
    assert got == b"" or got[0] == 0x15, got  # nothing, or a TLS alert
    assert curl(c.url("/health")).status == 200


def test_a_pod_that_stalls_the_handshake_fails_within_the_connect_deadline(router_factory):
    """A pod that accepts the TCP connection and never answers the ClientHello: one deadline for
    the connect and the handshake (timeouts.connect_ms), then the reason in the log."""
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(64)  # the kernel completes the connects; nobody reads or answers
    try:
        port = mute.getsockname()[1]
        r = router_factory(make_config([{"name": "mute", "url": "https://127.0.0.1:%d" % port,
                                         "tls": {"verify": False}}],
                                       timeouts={"connect_ms": 300}, health={"interval_ms": 60000}))
        t0 = time.monotonic()
        resp = curl(r.url("/v1/completions"), completion("anyone?"))
        assert resp.status in (502, 503, 504), resp
        assert time.monotonic() - t0 < 10
        wait_for(lambda: "backend mute: TLS to the pod failed: connect or handshake timed out"
                 in r.stderr_text(), 10, what="the timed-out handshake logged")
    finally:
        mute.close()


def test_tls_sockets_are_batched_and_counted(pki, stub_factory, router_factory):  # noqa: F811
    """Every socket TLS (clients to the router, the router to its pods): concurrent clients
    share the io_uring submits of a loop turn, and a busy worker sees its TLS sockets readable
    together and lets them gather (batch_wait_us). With TLS outside the plain sockets' path
    neither counter moved."""
    pods = [_pod(stub_factory, pki, name) for name in ("p0", "p1")]
    r = router_factory(make_config([_backend(p, ca_file=pki["ca.pem"]) for p in pods],
                                   tls=(pki["pod.pem"], pki["pod.key"]), workers=1,
                                   batch_wait_us=1000, batch_wait_busy=0,
                                   health={"interval_ms": 60000},
                                   log={"access_log": False}))
    ctx = client_ctx()
    text = get_metrics(r)
    assert metric(text, "pcrouter_io_uring_workers") == 1, "the worker has no ring"
    for _ in range(10):  # bounded: a burst almost always gives turns with several sockets ready
        assert_all_answered(burst(r, clients=16, each=4, tls=ctx))
        text = get_metrics(r)
        ops = metric(text, "pcrouter_io_uring_ops_total")
        submits = metric(text, "pcrouter_io_uring_submits_total")
        if ops > submits * 1.5 and metric(text, "pcrouter_batch_waits_total") > 0:
            break
    assert ops > submits * 1.5, "no turn batched several TLS sockets: %s ops in %s submits" % (ops, submits)
    assert metric(text, "pcrouter_batch_waits_total") > 0, "TLS sockets were never counted as ready"
