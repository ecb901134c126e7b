"""HTTP/2 hibernation: an idle h2 session (no stream for a second, nothing to send) frees its
nghttp2 session and rebuilds it at the connection's next bytes (h2_server.c, hibernate and
wake). The client must not be able to tell: the same connection serves new requests, large
uploads and downloads within the windows and frame sizes it set before or after, a PING, a
reload, and a drain's GOAWAY; a stream id at or below the last one is still a connection
error. Each test waits for pcrouter_h2_sessions_hibernated (polling, with a deadline), so each
fails on a build without hibernation."""
import hashlib
import json
import signal
import socket
import ssl
import time

import pytest

from attack_h2 import PREFACE, bulk_sha, raw_frame, raw_h2_outcome
from conftest import get_metrics, make_config, metric, wait_for

PROTOCOL_ERROR = 0x1
NO_ERROR = 0x0


def hibernated(router):
    return metric(get_metrics(router), "pcrouter_h2_sessions_hibernated")


def hibernations(router):
    return metric(get_metrics(router), "pcrouter_h2_hibernations_total")


def wait_hibernated(router, n=1, after=None):
    """Waits until `n` sessions are hibernated (and, with `after`, the counter passed it)."""
    wait_for(lambda: hibernated(router) == n and (after is None or hibernations(router) > after),
             15, 0.1, "%d h2 session(s) hibernated" % n)


def connect(port, ca=None, timeout=20.0):
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if ca is not None:
        ctx = ssl.create_default_context(cafile=ca)
        ctx.set_alpn_protocols(["h2"])
        sock = ctx.wrap_socket(sock, server_hostname="localhost")
        assert sock.selected_alpn_protocol() == "h2"
    return sock


class Client:
    """A python-h2 client on one connection; `settings` go in its first SETTINGS. It gives the
    connection window back only as python-h2 decides (at half of it), so the router's window
    towards it is usually short of 65535 when it hibernates."""

    def __init__(self, port, ca=None, settings=None):
        import h2.config
        import h2.connection
        self.port = port
        self.sock = connect(port, ca)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        if settings:
            import h2.settings
            self.conn.local_settings = h2.settings.Settings(client=True, initial_values=settings)
        self.conn.initiate_connection()
        self.flush()
        self.max_frame = 0  # the largest DATA frame received

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def events(self, timeout=30.0):
        self.sock.settimeout(timeout)
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("closed by the router")
        evs = self.conn.receive_data(data)
        self.flush()
        return evs

    def request(self, body, timeout=60.0):
        """POST /v1/completions with `body` (sent within the windows); (status, response body)."""
        import h2.events
        sid = self.conn.get_next_available_stream_id()
        hdrs = [(":method", "POST"), (":path", "/v1/completions"), (":scheme", "https"),
                (":authority", "127.0.0.1:%d" % self.port), ("content-type", "application/json"),
                ("content-length", str(len(body)))]
        self.conn.send_headers(sid, hdrs, end_stream=not body)
        self.flush()
        sent, status, out, ended = 0, None, [], False
        deadline = time.monotonic() + timeout
        while not ended:
            while sent < len(body):
                n = min(len(body) - sent, self.conn.max_outbound_frame_size,
                        self.conn.local_flow_control_window(sid))
                if n <= 0:
                    break
                self.conn.send_data(sid, body[sent:sent + n], end_stream=sent + n == len(body))
                sent += n
                self.flush()
            assert time.monotonic() < deadline, "no answer on stream %d in %.0f s" % (sid, timeout)
            for e in self.events(max(0.1, deadline - time.monotonic())):
                if isinstance(e, h2.events.ResponseReceived) and e.stream_id == sid:
                    status = dict(e.headers)[b":status"].decode()
                elif isinstance(e, h2.events.DataReceived):
                    self.max_frame = max(self.max_frame, e.flow_controlled_length)
                    if e.stream_id == sid:
                        out.append(e.data)
                    self.conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                    self.flush()
                elif isinstance(e, h2.events.StreamEnded) and e.stream_id == sid:
                    ended = True
                elif isinstance(e, h2.events.StreamReset) and e.stream_id == sid:
                    raise AssertionError("stream %d reset: %r" % (sid, e))
                elif isinstance(e, h2.events.ConnectionTerminated):
                    raise AssertionError("GOAWAY: %r" % e)
        return status, b"".join(out)

    def completion(self, tag="idle", nbytes=None, prompt_bytes=0):
        obj = {"model": "stub-model", "prompt": "hibernation %s " % tag + "x" * prompt_bytes,
               "max_tokens": 8}
        if nbytes is not None:
            obj["stub"] = {"bytes": nbytes}
        return self.request(json.dumps(obj).encode())

    def until(self, pred, what, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events(deadline - time.monotonic()):
                if pred(e):
                    return e
        raise AssertionError("no %s" % what)

    def close(self):
        self.sock.close()


def ports(c, listener, tls_cert):
    return (c.router.tls_port, tls_cert[0]) if listener == "tls" else (c.router.port, None)


@pytest.fixture
def h2cluster(cluster, tls_cert):
    def make(listener):
        c = cluster(1, tls=tls_cert, timeouts={"client_idle_ms": 60000})
        return c, ports(c, listener, tls_cert)
    return make


@pytest.mark.parametrize("listener", ["h2c", "tls"])
def test_idle_session_hibernates_then_serves(h2cluster, tls_cert, listener):
    """An idle session hibernates; the same connection then serves requests, a PING (answered,
    and the session hibernates again at once), a large upload over several windows and a large
    download."""
    import h2.events
    c, (port, ca) = h2cluster(listener)
    cl = Client(port, ca)
    try:
        assert cl.completion("first")[0] == "200"
        before = hibernations(c.router)
        wait_hibernated(c.router, after=before)
        assert cl.completion("second")[0] == "200"
        wait_hibernated(c.router, after=before + 1)
        n = hibernations(c.router)
        cl.conn.ping(b"hibernat")
        cl.flush()
        cl.until(lambda e: isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"hibernat",
                 "PING ACK")
        wait_hibernated(c.router, after=n)
        # Several windows of request body (the router's allowance is 64 KiB), after waking.
        st, body = cl.completion("upload", prompt_bytes=300000)
        assert st == "200", body
        assert json.loads(body)["stub"]["body_bytes"] > 300000
        wait_hibernated(c.router)
        st, body = cl.completion("download", nbytes=1 << 20)
        assert st == "200" and len(body) == 1 << 20 and \
            hashlib.sha256(body).hexdigest() == bulk_sha(1 << 20)
    finally:
        cl.close()


@pytest.mark.parametrize("listener", ["h2c", "tls"])
def test_client_settings_kept_across_hibernation(h2cluster, tls_cert, listener):
    """The client's SETTINGS from before hibernation hold after it (a small stream window: a
    session rebuilt with the default 65535 would overrun it, and python-h2 would fail the
    connection), and SETTINGS changed while hibernated hold too."""
    import h2.events
    import h2.settings
    c, (port, ca) = h2cluster(listener)
    sc = h2.settings.SettingCodes
    cl = Client(port, ca, settings={sc.INITIAL_WINDOW_SIZE: 20000, sc.MAX_FRAME_SIZE: 20000})
    try:
        assert cl.completion("first")[0] == "200"
        wait_hibernated(c.router)
        st, body = cl.completion("small window", nbytes=200000)
        assert st == "200" and len(body) == 200000
        assert cl.max_frame <= 16384, cl.max_frame
        wait_hibernated(c.router)
        # Changed while hibernated: acknowledged, and the session hibernates again; a session
        # that kept the 20000 would overrun the new 17000.
        n = hibernations(c.router)
        cl.conn.update_settings({sc.INITIAL_WINDOW_SIZE: 17000, sc.MAX_FRAME_SIZE: 16384})
        cl.flush()
        cl.until(lambda e: isinstance(e, h2.events.SettingsAcknowledged), "SETTINGS ACK")
        wait_hibernated(c.router, after=n)
        st, body = cl.completion("smaller window", nbytes=500000)
        assert st == "200" and len(body) == 500000
    finally:
        cl.close()


def raw_open(port, ca):
    """A raw h2 connection that acknowledges the router's SETTINGS (as a client must before it
    hibernates); returns (sock, read buffer)."""
    sock = connect(port, ca, timeout=10)
    sock.sendall(PREFACE + raw_frame(0x4, 0, 0, b""))
    buf = b""
    while True:
        buf += sock.recv(65536)
        if len(buf) >= 9 and buf[3] == 0x4 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            break
    sock.sendall(raw_frame(0x4, 0x1, 0, b""))
    return sock


def block(port, enc=None):
    """A GET /health header block; a fresh encoder opens with the table size update to 0 that a
    client owes once the router's HEADER_TABLE_SIZE 0 is acknowledged."""
    import hpack
    if enc is None:
        enc = hpack.Encoder()
        enc.header_table_size = 0
    return enc.encode([(":method", "GET"), (":path", "/health"), (":scheme", "http"),
                       (":authority", "127.0.0.1:%d" % port), ("user-agent", "hibernation")])


def read_headers(sock, want, timeout=10.0):
    """Reads frames until HEADERS arrived on every stream in `want`."""
    buf, got = b"", set()
    deadline = time.monotonic() + timeout
    while not want <= got:
        assert time.monotonic() < deadline, "HEADERS on %s, got %s" % (want, got)
        sock.settimeout(deadline - time.monotonic())
        d = sock.recv(65536)
        assert d, "closed"
        buf += d
        while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            n = int.from_bytes(buf[:3], "big")
            if buf[3] == 0x1:
                got.add(int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF)
            assert buf[3] != 0x7, "GOAWAY %r" % buf[9:9 + n]
            buf = buf[9 + n:]


@pytest.mark.parametrize("listener", ["h2c", "tls"])
@pytest.mark.parametrize("next_id", [3, 5])
def test_lower_stream_id_after_wake_is_connection_error(h2cluster, tls_cert, listener, next_id):
    """Streams 1 and 5, hibernation, then HEADERS on stream 3 (below the last) or 5 (the last
    again): a connection error PROTOCOL_ERROR, GOAWAY and the connection closed, as without
    hibernation (RFC 9113 5.1.1, h2spec 5.1.1/2)."""
    c, (port, ca) = h2cluster(listener)
    sock = raw_open(port, ca)
    sock.sendall(raw_frame(0x1, 0x5, 1, block(port)) + raw_frame(0x1, 0x5, 5, block(port)))
    read_headers(sock, {1, 5})
    wait_hibernated(c.router)
    sock.sendall(raw_frame(0x1, 0x5, next_id, block(port)))
    res = raw_h2_outcome(sock, timeout=5)
    assert res["goaway"] == PROTOCOL_ERROR and res["closed"], res
    assert next_id not in res["headers"], res


@pytest.mark.parametrize("listener", ["h2c", "tls"])
def test_dynamic_table_used_before_settings_ack(h2cluster, tls_cert, listener):
    """A client that indexed headers in HPACK's dynamic table before it acknowledged the
    router's SETTINGS (stream 1, then stream 3 referring to the entries), then acknowledged
    them: the router's table is emptied by its HEADER_TABLE_SIZE 0, the session hibernates,
    and a request after the wake, opening with the table size update the client owes, is
    answered."""
    import hpack
    c, (port, ca) = h2cluster(listener)
    sock = connect(port, ca, timeout=10)
    enc = hpack.Encoder()  # 4096 bytes of table: the default before SETTINGS apply
    sock.sendall(PREFACE + raw_frame(0x4, 0, 0, b"") + raw_frame(0x1, 0x5, 1, block(port, enc)) +
                 raw_frame(0x1, 0x5, 3, block(port, enc)))
    read_headers(sock, {1, 3})
    sock.sendall(raw_frame(0x4, 0x1, 0, b""))
    wait_hibernated(c.router)
    enc.header_table_size = 0
    sock.sendall(raw_frame(0x1, 0x5, 7, block(port, enc)))
    read_headers(sock, {7})
    sock.close()


@pytest.mark.parametrize("listener", ["h2c", "tls"])
def test_reload_and_drain_while_hibernated(h2cluster, tls_cert, listener):
    """A reload (SIGHUP) while the session is hibernated: it serves the next request. Then a
    drain (SIGTERM) while hibernated: a GOAWAY NO_ERROR naming the last stream, then the end of
    the connection."""
    import h2.events
    c, (port, ca) = h2cluster(listener)
    cl = Client(port, ca)
    try:
        assert cl.completion("first")[0] == "200"
        wait_hibernated(c.router)
        ok = metric(get_metrics(c.router), "pcrouter_config_reloads_total", result="ok")
        with open(c.router.path, "w") as f:
            json.dump(c.router.config, f)
        c.router.send_signal(signal.SIGHUP)
        wait_for(lambda: metric(get_metrics(c.router), "pcrouter_config_reloads_total",
                                result="ok") == ok + 1, 15, 0.05, "the reload")
        assert hibernated(c.router) == 1
        assert cl.completion("after reload")[0] == "200"
        wait_hibernated(c.router)
        c.router.send_signal(signal.SIGTERM)
        e = cl.until(lambda e: isinstance(e, h2.events.ConnectionTerminated), "GOAWAY")
        assert e.error_code == NO_ERROR and e.last_stream_id == 3, e
        cl.sock.settimeout(10)
        while cl.sock.recv(65536):
            pass
    finally:
        cl.close()


@pytest.mark.parametrize("listener", ["h2c", "tls"])
def test_no_hibernation_mid_frame(h2cluster, tls_cert, listener):
    """A client that stops for longer than the idle trim in the middle of a frame (5 bytes of
    a PING's 17): the session is not rebuilt there (it would lose the frame's start and read
    the rest as a new frame); the rest of the PING is answered, then the session hibernates."""
    import h2.events
    c, (port, ca) = h2cluster(listener)
    cl = Client(port, ca)
    try:
        assert cl.completion("first")[0] == "200"
        ping = raw_frame(0x6, 0, 0, b"midframe")
        cl.sock.sendall(ping[:5])
        time.sleep(2.5)  # the client's stall itself, past the one-second idle trim
        assert hibernated(c.router) == 0
        cl.sock.sendall(ping[5:])
        cl.until(lambda e: isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"midframe",
                 "PING ACK")
        wait_hibernated(c.router)
        assert cl.completion("second")[0] == "200"
    finally:
        cl.close()
