"""attack_h2.py: HTTP/2 clients that misbehave, for the attack tests and bench/attacks.py: a
reader whose windows hold a whole large response, streams whose windows stay shut, slow uploads
against the body budget, and frame floods (raw frames from hyperframe and hpack, python3-h2's
own dependencies)."""
import json
import select
import socket
import threading
import time

from attack import small_completion


BULK_PATTERN = b"0123456789abcdef"   # what the stub pod's `bytes` answer repeats


def bulk_sha(n):
    import hashlib
    h = hashlib.sha256()
    piece = BULK_PATTERN * 4096
    while n > 0:
        h.update(piece[:n])
        n -= len(piece)
    return h.hexdigest()


def h2_connect(port, window=65535, timeout=30.0):
    """A python-h2 client connection announcing `window` as its streams' initial window; a
    window above the default also opens the connection's window that far. (sock, conn)."""
    import h2.config
    import h2.connection
    import h2.settings
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.local_settings = h2.settings.Settings(
        client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
    conn.initiate_connection()
    if window > 65535:
        conn.increment_flow_control_window(min(window, 2 ** 31 - 1) - 65535)
    sock.sendall(conn.data_to_send())
    return sock, conn


def post_headers(port, path, length, extra=()):
    return [(":method", "POST"), (":path", path), (":scheme", "http"),
            (":authority", "127.0.0.1:%d" % port), ("content-type", "application/json"),
            ("content-length", str(length))] + list(extra)


def note_event(rec, e):
    """Updates a stream's record (status, bytes, ended, reset) from a python-h2 event; returns
    the DATA the event carried (b"" for any other)."""
    import h2.events
    if isinstance(e, h2.events.ResponseReceived):
        rec["status"] = dict(e.headers).get(b":status", b"").decode()
    elif isinstance(e, h2.events.DataReceived):
        rec["bytes"] += len(e.data)
        return e.data
    elif isinstance(e, h2.events.StreamEnded):
        rec["ended"] = True
    elif isinstance(e, h2.events.StreamReset):
        rec["reset"] = e.error_code
    return b""


def big_window_read(port, nbytes, timeout=60.0):
    """One h2c stream asking the stub pod for `nbytes`, with windows large enough for all of it
    so that the client never has to send a frame once the response flows (a WINDOW_UPDATE or a
    PING would wake a server that stopped writing). Returns status, bytes, sha256, whether the
    stream ended, and how many bytes the client sent after the first DATA frame."""
    import hashlib
    import h2.events
    sock, conn = h2_connect(port, window=2 ** 31 - 1, timeout=timeout)
    # The router's SETTINGS first, and our ACK, so that nothing is owed once DATA flows.
    settled = False
    while not settled:
        data = sock.recv(65536)
        if not data:
            raise AssertionError("the router closed the connection before its SETTINGS")
        settled = any(isinstance(e, h2.events.RemoteSettingsChanged) for e in conn.receive_data(data))
        sock.sendall(conn.data_to_send())
    body = json.dumps({"model": "stub-model", "prompt": "big window", "max_tokens": 8,
                       "stub": {"bytes": nbytes}}).encode()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, post_headers(port, "/v1/completions", len(body)))
    conn.send_data(sid, body, end_stream=True)
    sock.sendall(conn.data_to_send())
    res = {"status": None, "bytes": 0, "ended": False, "reset": None, "sent_during": 0}
    h = hashlib.sha256()
    deadline = time.monotonic() + timeout
    try:
        while not res["ended"] and res["reset"] is None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                data = sock.recv(1 << 20)
            except socket.timeout:
                break
            if not data:
                break
            for e in conn.receive_data(data):
                if getattr(e, "stream_id", None) == sid:
                    h.update(note_event(res, e))
            out = conn.data_to_send()
            if out:
                if res["bytes"] > 0:
                    res["sent_during"] += len(out)
                sock.sendall(out)
    finally:
        sock.close()
    res["sha256"] = h.hexdigest()
    return res


class H2Streams:
    """Streams on h2c connections (at most `per_conn` each), a reader thread per connection
    recording, per stream: status, DATA bytes, end, reset code. The client's windows are given
    back only when `ack` is true: with window=0 and ack=False no DATA can ever arrive."""

    def __init__(self, port, window=65535, ack=True, per_conn=200, timeout=30.0):
        self.port = port
        self.window = window
        self.ack = ack
        self.per_conn = per_conn
        self.timeout = timeout
        self.lock = threading.Lock()
        self.conns = []             # [sock, conn, nstreams, alive]
        self.streams = {}           # (conn index, sid) -> record
        self.closing = False

    def _conn(self):
        if not self.conns or self.conns[-1][2] >= self.per_conn or not self.conns[-1][3]:
            sock, conn = h2_connect(self.port, self.window, self.timeout)
            entry = [sock, conn, 0, True]
            self.conns.append(entry)
            threading.Thread(target=self._read, args=(len(self.conns) - 1,), daemon=True).start()
        return len(self.conns) - 1

    def open(self, path, body, end_stream=True, extra=(), length=None):
        """Opens a stream announcing `length` bytes of body (default len(body)) and sends what
        the window allows of `body` (the rest is the caller's, with send()). Returns its key."""
        ci = self._conn()
        sock, conn = self.conns[ci][0], self.conns[ci][1]
        with self.lock:
            sid = conn.get_next_available_stream_id()
            self.streams[(ci, sid)] = {"status": None, "bytes": 0, "ended": False, "reset": None,
                                       "sent": 0}
            conn.send_headers(sid, post_headers(self.port, path,
                                                len(body) if length is None else length, extra))
            n = min(len(body), conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
            if n > 0 or end_stream:
                conn.send_data(sid, body[:n], end_stream=end_stream and n == len(body))
            self.streams[(ci, sid)]["sent"] = n
            self.conns[ci][2] += 1
            # Sent under the lock: bytes must leave in the order the HPACK encoder made them (a
            # SETTINGS ACK the reader sends changes what the next header block must start with).
            sock.sendall(conn.data_to_send())
        return (ci, sid)

    def send(self, key, data, end_stream=False):
        """Sends what the windows allow of `data` now; returns the bytes sent (0: blocked)."""
        ci, sid = key
        sock, conn = self.conns[ci][0], self.conns[ci][1]
        with self.lock:
            st = self.streams[key]
            if st["reset"] is not None or st["ended"] or not self.conns[ci][3]:
                return -1
            n = min(len(data), conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
            if n <= 0:
                return 0
            try:
                conn.send_data(sid, data[:n], end_stream=end_stream and n == len(data))
            except Exception:
                return -1  # the stream closed meanwhile (an early answer, a reset)
            st["sent"] += n
            sock.sendall(conn.data_to_send())
        return n

    def _read(self, ci):
        import h2.events
        sock, conn = self.conns[ci][0], self.conns[ci][1]
        sock.settimeout(None)
        try:
            while not self.closing:
                r, _, _ = select.select([sock], [], [], 0.2)
                if not r:
                    continue
                data = sock.recv(1 << 20)
                if not data:
                    break
                with self.lock:
                    for e in conn.receive_data(data):
                        if isinstance(e, h2.events.ConnectionTerminated):
                            self.conns[ci][3] = False
                        st = self.streams.get((ci, getattr(e, "stream_id", None)))
                        if st is None:
                            continue
                        note_event(st, e)
                        if self.ack and isinstance(e, h2.events.DataReceived):
                            conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                    out = conn.data_to_send()
                    if out:
                        sock.sendall(out)
        except (OSError, ValueError, Exception):  # noqa: B902 - the router may cut us off
            pass
        with self.lock:
            self.conns[ci][3] = False

    def snapshot(self):
        with self.lock:
            return {k: dict(v) for k, v in self.streams.items()}

    def wait(self, pred, timeout, what):
        deadline = time.monotonic() + timeout
        while True:
            snap = self.snapshot()
            if pred(snap):
                return snap
            if time.monotonic() > deadline:
                raise AssertionError("timed out after %.0fs waiting for %s" % (timeout, what))
            time.sleep(0.05)

    def close(self):
        self.closing = True
        for c in self.conns:
            try:
                c[0].close()
            except OSError:
                pass


def upload_body(size):
    """A completion request of `size` bytes: JSON whose prompt fills it."""
    head = b'{"model":"stub-model","max_tokens":8,"prompt":"'
    tail = b'"}'
    return head + b"u" * max(0, size - len(head) - len(tail)) + tail


def slow_uploads(port, streams, size, rate, duration, window=65535, stop_after=None):
    """`streams` POSTs of `size` bytes each on one h2c connection, sent in turn (the stream
    that sent last goes to the back, so the connection window is shared) in 16 KiB
    pieces at most `rate` bytes a second in all, as flow control allows, for at most
    `duration` seconds or until `stop_after` bytes are sent (the uploads then stall). Returns
    the H2Streams (whose snapshot tells each stream's fate) and the bytes sent."""
    body = upload_body(size)
    hs = H2Streams(port, window=window, per_conn=streams)
    keys = [hs.open("/v1/completions", b"", end_stream=False, length=len(body))
            for _ in range(streams)]
    offs = {k: 0 for k in keys}  # in turn order: a stream that sent goes to the back
    sent_total = 0
    t0 = time.monotonic()
    end = t0 + duration
    while time.monotonic() < end and offs and (stop_after is None or sent_total < stop_after):
        progressed = False
        for k in list(offs):
            if k not in offs:
                continue
            allowed = rate * (time.monotonic() - t0) - sent_total
            if allowed < 16384:
                break
            off = offs[k]
            n = hs.send(k, body[off:off + 16384], end_stream=off + 16384 >= len(body))
            if n < 0:
                del offs[k]
                continue
            if n > 0:
                progressed = True
                sent_total += n
                del offs[k]
                if off + n < len(body):
                    offs[k] = off + n  # to the back of the turn
        if not progressed:
            time.sleep(0.01)  # pacing: windows closed or the rate reached
    return hs, sent_total


# ------------------------------------------------------------------------------------------
# HTTP/2 frame floods

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FLOODS = ("ping", "settings", "empty_data", "continuation", "rapid_reset")


class _FloodConn:
    """One raw h2c connection of a flood: frames built with hyperframe, headers with hpack."""

    def __init__(self, port, read):
        import hpack
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.read = read
        self.enc = hpack.Encoder()
        self.port = port
        self.sid = 1
        self.sock.sendall(H2_PREFACE + self.frame("SettingsFrame", 0))

    @staticmethod
    def frame(kind, sid, **kw):
        import hyperframe.frame as F
        return getattr(F, kind)(sid, **kw).serialize()

    def headers(self, path, method="POST", length=None, end_headers=True, end_stream=False):
        h = [(":method", method), (":path", path), (":scheme", "http"),
             (":authority", "127.0.0.1:%d" % self.port)]
        if length is not None:
            h += [("content-type", "application/json"), ("content-length", str(length))]
        flags = (["END_HEADERS"] if end_headers else []) + (["END_STREAM"] if end_stream else [])
        sid = self.sid
        self.sid += 2
        return sid, self.frame("HeadersFrame", sid, data=self.enc.encode(h), flags=flags)

    def send(self, data):
        self.sock.sendall(data)
        if self.read:
            while select.select([self.sock], [], [], 0)[0]:
                if not self.sock.recv(1 << 20):
                    raise ConnectionResetError("closed by the router")

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def h2_flood(port, kind, duration, batch=256):
    """Floods h2c connections with `kind` frames for `duration` seconds, reconnecting whenever
    the router closes one (or stops reading it for 5 s). Returns frames sent and connections.
      ping, settings   PING / empty SETTINGS frames, the replies never read
      empty_data       a POST whose body is endless empty DATA frames
      continuation     a HEADERS frame followed by endless CONTINUATION frames
      rapid_reset      POST /v1/completions (HEADERS, DATA with END_STREAM) then RST_STREAM"""
    assert kind in FLOODS, kind
    body = small_completion("rapid reset")
    frames = conns = 0
    end = time.monotonic() + duration
    while time.monotonic() < end:
        try:
            c = _FloodConn(port, read=kind not in ("ping", "settings"))
        except OSError:
            time.sleep(0.05)  # pacing: the router is refusing or at its limit
            continue
        conns += 1
        try:
            if kind == "empty_data":
                sid, hdr = c.headers("/v1/completions", length=1 << 20)
                c.send(hdr)
            elif kind == "continuation":
                sid, hdr = c.headers("/v1/completions", length=10, end_headers=False)
                c.send(hdr)
                piece = c.enc.encode([("x-flood", "a" * 64)])
            while time.monotonic() < end:
                if kind == "ping":
                    data = c.frame("PingFrame", 0, opaque_data=b"12345678") * batch
                elif kind == "settings":
                    data = c.frame("SettingsFrame", 0) * batch
                elif kind == "empty_data":
                    data = c.frame("DataFrame", sid, data=b"") * batch
                elif kind == "continuation":
                    data = c.frame("ContinuationFrame", sid, data=piece) * batch
                else:
                    parts = []
                    for _ in range(batch // 4):
                        s, hdr = c.headers("/v1/completions", length=len(body))
                        parts += [hdr, c.frame("DataFrame", s, data=body, flags=["END_STREAM"]),
                                  c.frame("RstStreamFrame", s, error_code=8)]
                    data = b"".join(parts)
                c.send(data)
                frames += batch
        except (OSError, ValueError):
            pass  # the router closed it or stopped reading: a new connection
        finally:
            c.close()
    return {"frames": frames, "connections": conns}


# ---- raw frames, for protocol violations python-h2 refuses to send itself -------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def raw_frame(ftype, flags, stream_id, payload):
    """One HTTP/2 frame as bytes, whatever its validity (type and flags as integers)."""
    n = len(payload)
    return bytes([n >> 16 & 0xFF, n >> 8 & 0xFF, n & 0xFF, ftype, flags]) + \
        (stream_id & 0x7FFFFFFF).to_bytes(4, "big") + payload


def flood_script(kind, port, batch=64):
    """The same floods as raw bytes for attack_conn.ManyConns, many connections at once: returns
    (first, more), the bytes each connection sends first (the preface and, for a flood on one
    stream, its HEADERS) and a function giving its next batch of frames. Header blocks are
    encoded once (literals only, so each block stands alone)."""
    import hpack
    assert kind in FLOODS, kind
    base = [(":method", "POST"), (":path", "/v1/completions"), (":scheme", "http"),
            (":authority", "127.0.0.1:%d" % port), ("content-type", "application/json")]
    body = small_completion("rapid reset")

    def block(length):
        return hpack.Encoder().encode(base + [("content-length", str(length))])
    preface = PREFACE + raw_frame(0x4, 0, 0, b"")
    first = {"ping": preface, "settings": preface, "rapid_reset": preface,
             "empty_data": preface + raw_frame(0x1, 0x4, 1, block(1 << 20)),
             "continuation": preface + raw_frame(0x1, 0, 1, block(10))}[kind]
    piece = {"ping": raw_frame(0x6, 0, 0, b"12345678"), "settings": raw_frame(0x4, 0, 0, b""),
             "empty_data": raw_frame(0x0, 0, 1, b""),
             "continuation": raw_frame(0x9, 0, 1, hpack.Encoder().encode([("x-flood", "a" * 64)]))}
    if kind != "rapid_reset":
        data = piece[kind] * batch
        return (lambda i: first), (lambda i: data)
    hdr, sids = block(len(body)), {}

    def more(i):
        s = sids.get(i, 1)
        sids[i] = s + 2 * (batch // 4)
        return b"".join(raw_frame(0x1, 0x4, sid, hdr) + raw_frame(0x0, 0x1, sid, body) +
                        raw_frame(0x3, 0, sid, (8).to_bytes(4, "big"))
                        for sid in range(s, s + 2 * (batch // 4), 2))

    def opening(i):
        sids.pop(i, None)  # a connection opened again starts at stream 1
        return first
    return opening, more



def raw_headers(stream_id, port, path="/health", end_stream=True):
    """A HEADERS frame carrying a GET of `path` (HPACK from python-h2's own dependency)."""
    import hpack
    block = hpack.Encoder().encode([(":method", "GET"), (":path", path), (":scheme", "http"),
                                    (":authority", "127.0.0.1:%d" % port)])
    return raw_frame(0x1, 0x4 | (0x1 if end_stream else 0), stream_id, block)


def raw_h2_open(port, tls_cafile=None, timeout=10.0):
    """A connection that has sent the preface and an empty SETTINGS: plain h2c, or TLS with
    ALPN h2 when `tls_cafile` is given."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if tls_cafile is not None:
        import ssl
        ctx = ssl.create_default_context(cafile=tls_cafile)
        ctx.set_alpn_protocols(["h2"])
        sock = ctx.wrap_socket(sock, server_hostname="localhost")
        assert sock.selected_alpn_protocol() == "h2", sock.selected_alpn_protocol()
    sock.sendall(PREFACE + raw_frame(0x4, 0, 0, b""))
    return sock


def raw_h2_outcome(sock, timeout=5.0):
    """Reads frames until the server closes the connection or `timeout` passes. Returns
    {"closed": bool, "goaway": error code or None, "headers": [stream ids answered]}."""
    import ssl
    buf = b""
    res = {"closed": False, "goaway": None, "headers": []}
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except (socket.timeout, TimeoutError):
            break
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
            res["closed"] = True
            break
        if not data:
            res["closed"] = True
            break
        buf += data
        while len(buf) >= 9:
            n = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + n:
                break
            ftype, sid, payload = buf[3], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9:9 + n]
            buf = buf[9 + n:]
            if ftype == 0x7 and len(payload) >= 8:
                res["goaway"] = int.from_bytes(payload[4:8], "big")
            elif ftype == 0x1:
                res["headers"].append(sid)
    sock.close()
    return res
