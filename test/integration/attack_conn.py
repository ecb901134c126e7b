"""attack_conn.py: clients that hold connections they should not, for the attack tests and
bench/attacks.py: slowloris and silent connections."""
import select
import socket
import threading
import time


SLOW_HEAD = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"X-Padding: " + b"p" * 4000)   # never ends: the head is never complete


class Slowloris:
    """`n` HTTP/1.1 connections, each sending one more byte of a request head every
    `interval` seconds from one thread; while `reconnect`, the connections the router closed
    are re-opened at each tick. Counts what the router did to them: 408 answers, closes without
    an answer (evictions), anything else."""

    def __init__(self, port, n, interval, reconnect=True):
        self.port = port
        self.n = n
        self.interval = interval
        self.reconnect = reconnect
        self.lock = threading.Lock()
        self.counts = {"opened": 0, "open_failed": 0, "answered_408": 0, "closed_silently": 0,
                       "answered_other": 0}
        self.socks = {}          # fd -> [sock, bytes sent, bytes received]
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._fill()
        self.thread.start()
        return self

    def _open(self):
        try:
            sk = socket.create_connection(("127.0.0.1", self.port), timeout=2)
        except OSError:
            self.counts["open_failed"] += 1
            return
        sk.setblocking(False)
        sk.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.socks[sk.fileno()] = [sk, 0, b""]
        self.counts["opened"] += 1

    def _fill(self):
        with self.lock:
            while len(self.socks) < self.n and not self.stop_ev.is_set():
                before = self.counts["open_failed"]
                self._open()
                if self.counts["open_failed"] > before:
                    break

    def _ended(self, fd):
        sk, _, got = self.socks.pop(fd)
        if got.startswith(b"HTTP/1.1 408"):
            self.counts["answered_408"] += 1
        elif got:
            self.counts["answered_other"] += 1
        else:
            self.counts["closed_silently"] += 1
        sk.close()

    def _run(self):
        next_tick = time.monotonic()
        while not self.stop_ev.is_set():
            poller = select.poll()   # select() stops at fd 1024
            with self.lock:
                for fd in self.socks:
                    poller.register(fd, select.POLLIN)
            wait_ms = 1000 * max(0.0, min(0.05, next_tick - time.monotonic()))
            readable = [fd for fd, _ in poller.poll(wait_ms)]
            with self.lock:
                for fd in readable:
                    ent = self.socks.get(fd)
                    if ent is None:
                        continue
                    try:
                        data = ent[0].recv(65536)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if data:
                        ent[2] += data
                    else:
                        self._ended(fd)
                if time.monotonic() >= next_tick:
                    next_tick += self.interval
                    for fd in list(self.socks):
                        ent = self.socks[fd]
                        if ent[1] >= len(SLOW_HEAD):
                            continue
                        try:
                            ent[0].send(SLOW_HEAD[ent[1]:ent[1] + 1])
                            ent[1] += 1
                        except (BlockingIOError, InterruptedError):
                            pass
                        except OSError:
                            self._ended(fd)
                    ticked = True
                else:
                    ticked = False
            if self.reconnect and ticked:
                self._fill()

    def stats(self):
        with self.lock:
            out = dict(self.counts)
            out["open_now"] = len(self.socks)
        return out

    def stop(self):
        self.stop_ev.set()
        self.thread.join(10)
        with self.lock:
            for ent in self.socks.values():
                ent[0].close()
            self.socks.clear()
        return self.stats()


class HeldConns:
    """Plain TCP connections to the router, opened and held silent (for EMFILE)."""

    def __init__(self, port, n, timeout=2.0):
        self.socks = []
        self.failed = 0
        for _ in range(n):
            try:
                self.socks.append(socket.create_connection(("127.0.0.1", port), timeout=timeout))
            except OSError:
                self.failed += 1

    def close(self):
        for sk in self.socks:
            sk.close()
        self.socks = []


class ManyConns:
    """`n` client connections driven from one thread by epoll, for attacks at 10,000
    connections where a thread each would cost more than the router. Each connection sends
    `first(i)` once, then, whenever its socket takes more, `more(i)` (None: nothing more; it
    then only reads); with `read` it reads and drops what the router sends, else never reads.
    A connection the router closes is opened again while `reconnect`. Counts opens, failed
    opens, closes by the router and bytes sent."""

    def __init__(self, port, n, first, more=None, read=True, reconnect=False):
        self.port = port
        self.n = n
        self.first = first
        self.more = more
        self.read = read
        self.reconnect = reconnect
        self.counts = {"opened": 0, "open_failed": 0, "closed": 0, "sent": 0}
        self.conns = {}          # fd -> [sock, index, pending bytes]
        self.ep = select.epoll()
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        for i in range(self.n):
            if not self._open(i) and self.counts["open_failed"] > self.n // 10 + 10:
                break            # the router refuses: no point in hammering its backlog
        self.thread.start()
        return self

    def _open(self, i):
        try:
            sk = socket.create_connection(("127.0.0.1", self.port), timeout=2)
        except OSError:
            self.counts["open_failed"] += 1
            return False
        sk.setblocking(False)
        sk.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conns[sk.fileno()] = [sk, i, self.first(i)]
        self.ep.register(sk.fileno(), (select.EPOLLIN if self.read else 0) | select.EPOLLOUT)
        self.counts["opened"] += 1
        return True

    def _close(self, fd):
        sk, i, _ = self.conns.pop(fd)
        self.ep.unregister(fd)
        sk.close()
        self.counts["closed"] += 1
        if self.reconnect and not self.stop_ev.is_set():
            self._open(i)

    def _write(self, fd, ent):
        if not ent[2] and self.more is not None:
            ent[2] = self.more(ent[1]) or b""
        if not ent[2]:
            self.ep.modify(fd, select.EPOLLIN if self.read else 0)  # nothing more to send
            return
        n = ent[0].send(ent[2])
        self.counts["sent"] += n
        ent[2] = ent[2][n:]

    def _run(self):
        while not self.stop_ev.is_set():
            for fd, ev in self.ep.poll(0.05):
                ent = self.conns.get(fd)
                if ent is None:
                    continue
                try:
                    if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                        if self.read or not ev & select.EPOLLIN:
                            if not ent[0].recv(1 << 16):
                                raise ConnectionResetError
                    if ev & select.EPOLLOUT:
                        self._write(fd, ent)
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    self._close(fd)

    def stats(self):
        return dict(self.counts, open_now=len(self.conns))

    def stop(self):
        self.stop_ev.set()
        self.thread.join(10)
        for ent in self.conns.values():
            ent[0].close()
        self.conns.clear()
        self.ep.close()
        return self.stats()
