#!/usr/bin/python3
"""Idle keep-alive connections for bench/proxies.py's memory rows.

Opens N connections to 127.0.0.1:PORT (TLS with --tls, h2 by ALPN with --h2), makes one POST
on each so that the proxy has set up everything a served connection keeps, then prints
"OPEN n" and holds them, idle, until a line arrives on stdin (or --hold seconds pass); then
closes them all and exits. Every wait has a deadline (--deadline bounds the opening phase: the
connections opened by then are the ones held). Standard library, plus the h2 package for --h2.

    idle_conns.py --port P --count 10000 [--tls] [--h2] [--body FILE] [--deadline S]

A line "again" on stdin makes one more request on every held connection (the same h2
session, its next stream) and prints "AGAIN n FAILED m"; they are held again after it.
"""

import argparse
import socket
import ssl
import sys
import time


def recv_response_h1(s, deadline):
    """Reads one HTTP/1.1 response with a Content-Length; returns its status."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        if time.monotonic() > deadline:
            raise TimeoutError("no response headers")
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the response")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for ln in lines[1:]:
        k, _, v = ln.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    while len(rest) < length:
        if time.monotonic() > deadline:
            raise TimeoutError("response body")
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-body")
        rest += chunk
    return status


def one_h1(s, body, deadline):
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return recv_response_h1(s, deadline)


def one_h2(s, body, deadline, c=None):
    """One POST on a new h2 connection, or on `c` (the same socket's, from an earlier call)
    with the next stream id. Returns (status, c)."""
    import h2.config
    import h2.connection
    import h2.events
    if c is None:
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        c.initiate_connection()
    sid = c.get_next_available_stream_id()
    c.send_headers(sid, [(":method", "POST"), (":path", "/v1/completions"), (":scheme", "https"),
                       (":authority", "bench"), ("content-type", "application/json"),
                       ("content-length", str(len(body)))])
    s.sendall(c.data_to_send())
    # The body in frames the peer's SETTINGS and windows allow (a 32 KiB body exceeds both the
    # default frame size and, on some proxies, the first window).
    status, sent = None, 0
    while True:
        while sent < len(body):
            n = min(len(body) - sent, c.max_outbound_frame_size, c.local_flow_control_window(sid))
            if n <= 0:
                break
            c.send_data(sid, body[sent:sent + n], end_stream=sent + n == len(body))
            sent += n
        if not body and sent == 0:
            c.end_stream(sid)
            sent = -1
        s.sendall(c.data_to_send())
        if time.monotonic() > deadline:
            raise TimeoutError("h2 response")
        data = s.recv(65536)
        if not data:
            raise ConnectionError("closed before the response")
        for ev in c.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                status = int(dict(ev.headers)[b":status"])
            elif isinstance(ev, h2.events.DataReceived):
                c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)) and \
                    ev.stream_id == sid:
                s.sendall(c.data_to_send())
                return status or 0, c
        s.sendall(c.data_to_send())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--count", type=int, default=10000)
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--h2", action="store_true")
    ap.add_argument("--body", help="request body file (default: a small JSON completion)")
    ap.add_argument("--deadline", type=float, default=120.0, help="seconds to open them all")
    ap.add_argument("--hold", type=float, default=300.0, help="seconds to hold at most")
    a = ap.parse_args()
    body = open(a.body, "rb").read() if a.body else b'{"model":"m","prompt":"hi","max_tokens":1}'
    ctx = None
    if a.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"] if a.h2 else ["http/1.1"])
    elif a.h2:
        sys.exit("idle_conns.py: --h2 needs --tls (h2 by ALPN)")
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    socks, conns, bad, err = [], [], 0, ""
    end = time.monotonic() + a.deadline
    while len(socks) < a.count and time.monotonic() < end:
        try:
            s = socket.create_connection(("127.0.0.1", a.port), timeout=10)
            if ctx:
                s = ctx.wrap_socket(s)
            dl = min(end, time.monotonic() + 10)
            st, c = one_h2(s, body, dl) if a.h2 else (one_h1(s, body, dl), None)
            if st != 200:
                bad += 1
            socks.append(s)
            conns.append(c)
        except (OSError, ValueError, TimeoutError) as e:
            if time.monotonic() >= end:
                break  # cut by the deadline: not a failure of the proxy
            bad += 1
            err = str(e)
            if bad > 50 and bad > len(socks):
                break
    print("OPEN %d FAILED %d %s" % (len(socks), bad, err[:200]), flush=True)
    # Held until the harness has measured: a line on stdin (or EOF), or --hold seconds.
    import select
    hold_end = time.monotonic() + a.hold
    while select.select([sys.stdin], [], [], max(0.0, hold_end - time.monotonic()))[0]:
        if sys.stdin.readline().strip() != "again":
            break
        ok = failed = 0
        for s, c in zip(socks, conns):
            try:
                dl = time.monotonic() + 10
                st = one_h2(s, body, dl, c)[0] if c is not None else one_h1(s, body, dl)
                ok, failed = ok + (st == 200), failed + (st != 200)
            except (OSError, ValueError, TimeoutError):
                failed += 1
        print("AGAIN %d FAILED %d" % (ok, failed), flush=True)
    for s in socks:
        try:
            s.close()
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
