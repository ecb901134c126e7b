"""attack_pod.py: a pod that misbehaves on purpose, for the attack tests and bench/attacks.py.

  RawPod(respond)
      a TCP pod that records every byte it receives and answers each request with the bytes
      respond(request) returns; pcrouter's health checks should be off (health.interval_ms 0)
      so that only the requests under test reach it.
"""
import socket
import threading



class RawPod:
    """A TCP pod on loopback: every byte any connection sends it is kept (`received`), each
    request (head + Content-Length body) is parsed just enough to call respond(req), whose
    bytes are written back; respond may return (bytes, close) to close after writing.
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
