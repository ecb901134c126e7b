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
