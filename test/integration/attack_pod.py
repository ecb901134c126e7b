"""attack_pod.py: a pod that misbehaves on purpose, for the attack tests and bench/attacks.py.

  RawPod(respond)
      a TCP pod that records every byte it receives and answers each request with the bytes
      respond(request) returns; pcrouter's health checks should be off (health.interval_ms 0)
      so that only the requests under test reach it.
"""
import socket
import threading
import time



class RawPod:
    """A TCP pod on loopback: every byte any connection sends it is kept (`received`), each
    request (head + Content-Length body) is parsed just enough to call respond(req), whose
    bytes are written back; respond may return (bytes, close) to close after writing, or a
    function of the socket that writes as it likes (the connection ends when it returns).
    req: {"method", "target", "head" (bytes), "body" (bytes)}."""

    def __init__(self, respond, name="pod-raw"):
        self.name = name
        self.respond = respond
        self.lock = threading.Lock()
        self.received = bytearray()
        self.requests = []
        self.connections = 0
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(256)
        self.port = self.lsock.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.closed = False
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _recv_until(self, c, buf, done):
        """Reads (keeping every byte) until done(buf); None when the peer closed first."""
        while not done(buf):
            chunk = c.recv(65536)
            if not chunk:
                return None
            with self.lock:
                self.received += chunk
            buf += chunk
        return buf

    def _serve(self, c):
        c.settimeout(30)
        buf = b""
        try:
            while True:
                buf = self._recv_until(c, buf, lambda b: b"\r\n\r\n" in b)
                if buf is None:
                    return
                head, _, buf = buf.partition(b"\r\n\r\n")
                n = 0
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        n = int(v.strip() or b"0")
                buf = self._recv_until(c, buf, lambda b: len(b) >= n)
                if buf is None:
                    return
                body, buf = buf[:n], buf[n:]
                first = head.split(b"\r\n", 1)[0].split(b" ")
                req = {"method": first[0].decode("latin-1"),
                       "target": first[1].decode("latin-1") if len(first) > 1 else "",
                       "head": head, "body": body}
                with self.lock:
                    self.requests.append(req)
                answer = self.respond(req)
                if callable(answer):
                    answer(c)  # writes what it likes on the socket; the connection then ends
                    return
                close = False
                if isinstance(answer, tuple):
                    answer, close = answer
                c.sendall(answer)
                if close:
                    return
        except OSError:
            return
        finally:
            c.close()

    def snapshot(self):
        with self.lock:
            return {"connections": self.connections, "bytes": bytes(self.received),
                    "requests": list(self.requests)}

    def close(self):
        self.closed = True
        try:
            self.lsock.close()
        except OSError:
            pass
        with self.lock:
            conns, self.conns = self.conns, []
        for c in conns:
            try:
                c.close()
            except OSError:
                pass


def ok_response(body=b'{"choices":[{"text":"ok"}]}'):
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % len(body)) + body


def stall_until_closed(c):
    """An answer that never comes: waits (bounded) until the router closes the connection."""
    c.settimeout(60)
    try:
        while c.recv(65536):
            pass
    except OSError:
        pass


class EndlessBody:
    """An answer whose chunked body never ends: `head`, then 64 KiB chunks until the peer stops
    the connection (or 60 s pass). `sent` counts the body bytes the kernel took; `ended` is set
    when the writer gave up."""

    def __init__(self, head=b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                           b"Transfer-Encoding: chunked\r\n\r\n", first=b'{"data":[', piece=None):
        self.head = head
        self.first = first
        self.piece = piece or (b'{"id":"endless"},' * 4096)[:65536]
        self.sent = 0
        self.error = None          # what ended the writing: a reset, a broken pipe, a timeout
        self.ended = threading.Event()

    def __call__(self, c):
        c.settimeout(5)
        deadline = time.monotonic() + 60
        try:
            c.sendall(self.head + b"%x\r\n%s\r\n" % (len(self.first), self.first))
            while time.monotonic() < deadline:
                c.sendall(b"%x\r\n%s\r\n" % (len(self.piece), self.piece))
                self.sent += len(self.piece)
        except OSError as e:
            self.error = type(e).__name__
        finally:
            self.ended.set()
