#!/usr/bin/python3
"""Writes the hand-made seeds of the h2_request fuzz target into test/fuzz/corpus/h2_request/.

    test/fuzz/h2_seeds.py

Each seed is the target's four control bytes (fuzz_h2_request.c says what they pick) and the
frames a client sends after the connection preface, which the harness sends itself (unless
the seed's control byte 1 has bit 5 set). Header blocks are encoded with python3-h2's HPACK
encoder (hpack), without Huffman coding, so that the fuzzer's mutations see the paths and
field names as they are. The frames are laid out by hand: several seeds are not what a
correct client would send (a stream id going backwards, a PING of the wrong length).
Running it again rewrites the same files; the fuzzer's finds kept in the folder stay.
"""
import os
import struct

import hpack

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "h2_request")
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIO = 0x1, 0x1, 0x4, 0x8, 0x20


def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


def settings(*pairs):
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


SETTINGS_ACK = frame(SETTINGS, ACK, 0)
BODY = b'{"model":"m","prompt":"hello"}'
BODY_STREAM = b'{"model":"m","prompt":"hello","stream":true}'
CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


class Client:
    """One connection's HPACK state: header blocks are encoded in the order they are sent."""

    def __init__(self):
        self.enc = hpack.Encoder()

    def block(self, method, path, *extra, body=None):
        h = [(":method", method), (":scheme", "http"), (":path", path), (":authority", "x")]
        if body is not None:
            h += [("content-type", "application/json"), ("content-length", str(len(body)))]
        h += list(extra)
        return self.enc.encode(h, huffman=False)

    def headers(self, sid, method, path, *extra, body=None, end=None, flags=0):
        if end is None:
            end = body is None
        blk = self.block(method, path, *extra, body=body)
        return frame(HEADERS, flags | END_HEADERS | (END_STREAM if end else 0), sid, blk)

    def request(self, sid, method, path, body=None, pieces=1):
        out = self.headers(sid, method, path, body=body)
        if body is not None:
            step = max(1, (len(body) + pieces - 1) // pieces)
            chunks = [body[i:i + step] for i in range(0, len(body), step)]
            for i, c in enumerate(chunks):
                out += frame(DATA, END_STREAM if i == len(chunks) - 1 else 0, sid, c)
        return out


def ctl(answers=0, end=0, gap=0, own_preface=0, small=0, cut=0, longest=0):
    return bytes([answers, end | gap << 2 | own_preface << 5 | small << 6, cut, longest])


def seeds():
    s = {}
    c = Client()
    s["post-completions"] = ctl() + settings() + SETTINGS_ACK + c.request(1, "POST", "/v1/completions", BODY)
    c = Client()
    s["post-completions-data-in-pieces-cut"] = ctl(cut=7, longest=4) + settings() + \
        c.request(1, "POST", "/v1/completions", BODY, pieces=4)
    c = Client()
    s["post-chat"] = ctl() + settings() + c.request(1, "POST", "/v1/chat/completions", CHAT)
    c = Client()
    s["get-health"] = ctl() + settings() + c.request(1, "GET", "/health")
    c = Client()
    s["head-health"] = ctl() + settings() + c.request(1, "HEAD", "/health")
    c = Client()
    s["get-models-fanout"] = ctl() + settings() + c.request(1, "GET", "/v1/models")
    c = Client()
    s["get-metrics"] = ctl() + settings() + c.request(1, "GET", "/metrics")
    c = Client()
    s["post-unknown-path"] = ctl() + settings() + c.request(1, "POST", "/v1/nothing", BODY)
    c = Client()
    s["post-invalid-json"] = ctl() + settings() + c.request(1, "POST", "/v1/completions", b'{"model":')
    c = Client()
    s["stream-sse"] = ctl(answers=1) + settings() + c.request(1, "POST", "/v1/completions", BODY_STREAM)
    c = Client()
    s["pod-500"] = ctl(answers=2) + settings() + c.request(1, "POST", "/v1/completions", BODY)
    c = Client()
    s["pod-closes-502"] = ctl(answers=3) + settings() + c.request(1, "POST", "/v1/completions", BODY)
    c = Client()
    s["pod-silent-504-client-never-ends"] = ctl(answers=4, end=1) + settings() + \
        c.request(1, "POST", "/v1/completions", BODY)
    c = Client()
    s["pod-big-body-window-updates"] = ctl(answers=5, end=1) + \
        settings((4, 100)) + SETTINGS_ACK + c.request(1, "POST", "/v1/completions", BODY) + \
        frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 30000)) + \
        frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 30000))
    c = Client()
    s["pod-big-body-zero-window"] = ctl(answers=5, end=1) + settings((4, 0)) + \
        c.request(1, "POST", "/v1/completions", BODY)
    c = Client()
    s["pod-cuts-stream"] = ctl(answers=6, end=1) + settings() + c.request(1, "POST", "/v1/completions", BODY_STREAM)
    c = Client()
    s["pod-204-hop-by-hop"] = ctl(answers=7) + settings() + c.request(1, "POST", "/v1/completions", BODY)
    c = Client()
    # Three streams at once, their DATA interleaved; the pod answers JSON, SSE, then its 500.
    s["three-streams-interleaved"] = ctl(answers=0x10, end=1) + settings() + \
        c.headers(1, "POST", "/v1/completions", body=BODY) + \
        c.headers(3, "POST", "/v1/completions", body=BODY_STREAM) + \
        c.headers(5, "POST", "/v1/chat/completions", body=CHAT) + \
        frame(DATA, 0, 3, BODY_STREAM[:10]) + frame(DATA, 0, 1, BODY[:5]) + \
        frame(DATA, END_STREAM, 5, CHAT) + frame(DATA, END_STREAM, 1, BODY[5:]) + \
        frame(DATA, END_STREAM, 3, BODY_STREAM[10:])
    c = Client()
    blk = c.block("POST", "/v1/completions", ("x-long", "v" * 40), body=BODY)
    s["headers-continuation"] = ctl() + settings() + frame(HEADERS, 0, 1, blk[:7]) + \
        frame(CONTINUATION, 0, 1, blk[7:20]) + frame(CONTINUATION, END_HEADERS, 1, blk[20:]) + \
        frame(DATA, END_STREAM, 1, BODY)
    c = Client()
    blk = c.block("GET", "/health")
    s["continuation-interleaved"] = ctl() + settings() + frame(HEADERS, 0, 1, blk[:3]) + \
        frame(PING, 0, 0, b"12345678") + frame(CONTINUATION, END_HEADERS, 1, blk[3:])
    c = Client()
    blk = c.block("GET", "/health")
    s["header-block-never-ends"] = ctl(end=1) + settings() + frame(HEADERS, 0, 1, blk[:5])
    c = Client()
    s["ping"] = ctl() + settings() + frame(PING, 0, 0, b"abcdefgh") + \
        frame(PING, ACK, 0, b"abcdefgh") + c.request(1, "GET", "/health") + frame(PING, 0, 0, b"ABCDEFGH")
    c = Client()
    s["ping-invalid-length"] = ctl() + settings() + frame(PING, 0, 0, b"abcdef") + c.request(1, "GET", "/health")
    c = Client()
    s["ping-on-stream"] = ctl() + settings() + c.request(1, "GET", "/health") + frame(PING, 0, 1, b"abcdefgh")
    c = Client()
    s["settings-odd-values"] = ctl(end=1) + \
        settings((1, 0), (2, 0), (3, 0), (4, 0x7fffffff), (5, 16777215), (6, 10), (0x99, 7)) + \
        c.request(1, "POST", "/v1/completions", BODY)
    c = Client()
    s["settings-bad-window"] = ctl() + settings((4, 0x80000000)) + c.request(1, "GET", "/health")
    c = Client()
    s["settings-bad-frame-size"] = ctl() + settings((5, 100)) + c.request(1, "GET", "/health")
    c = Client()
    s["settings-ack-with-payload"] = ctl() + settings() + frame(SETTINGS, ACK, 0, b"\x00\x01\x00\x00\x00\x00") + \
        c.request(1, "GET", "/health")
    c = Client()
    s["settings-header-table-size-0"] = ctl(answers=1) + settings((1, 0)) + c.request(1, "POST", "/v1/completions", BODY_STREAM) + \
        c.request(3, "GET", "/health")
    c = Client()
    s["window-update-overflow"] = ctl() + settings() + c.request(1, "GET", "/health") + \
        frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7fffffff)) + \
        frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7fffffff))
    c = Client()
    s["window-update-zero"] = ctl() + settings() + c.request(1, "GET", "/health") + \
        frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 0))
    c = Client()
    s["rst-stream-mid-body"] = ctl(end=1) + settings() + c.headers(1, "POST", "/v1/completions", body=BODY) + \
        frame(DATA, 0, 1, BODY[:10]) + frame(RST_STREAM, 0, 1, struct.pack(">I", 8)) + \
        c.request(3, "GET", "/health")
    c = Client()
    s["rst-stream-while-pod-answers"] = ctl(answers=4, end=1, gap=5, cut=3, longest=8) + settings() + \
        c.request(1, "POST", "/v1/completions", BODY) + frame(RST_STREAM, 0, 1, struct.pack(">I", 8))
    c = Client()
    rapid = b""
    for sid in range(1, 40, 2):
        rapid += c.request(sid, "POST", "/v1/completions", BODY) + frame(RST_STREAM, 0, sid, struct.pack(">I", 8))
    s["rapid-reset"] = ctl() + settings() + rapid
    c = Client()
    prio = struct.pack(">IB", 0x80000003, 200)   # exclusive, on stream 3, weight 201
    blk = c.block("GET", "/health")
    s["priority"] = ctl() + settings() + frame(PRIORITY, 0, 3, struct.pack(">IB", 0, 15)) + \
        frame(PRIORITY, 0, 1, prio) + \
        frame(HEADERS, END_HEADERS | END_STREAM | PRIO | PADDED, 1, bytes([4]) + prio + blk + b"\0" * 4) + \
        frame(PRIORITY, 0, 5, struct.pack(">IB", 1, 1))
    c = Client()
    s["stream-id-backwards"] = ctl() + settings() + c.request(5, "GET", "/health") + c.request(3, "GET", "/health")
    c = Client()
    s["stream-id-even"] = ctl() + settings() + c.request(2, "GET", "/health")
    c = Client()
    s["stream-id-reused"] = ctl() + settings() + c.request(1, "GET", "/health") + c.request(1, "GET", "/health")
    c = Client()
    s["data-on-stream-0"] = ctl() + settings() + frame(DATA, 0, 0, b"x") + c.request(1, "GET", "/health")
    c = Client()
    s["data-padded"] = ctl() + settings() + c.headers(1, "POST", "/v1/completions", body=BODY) + \
        frame(DATA, END_STREAM | PADDED, 1, bytes([3]) + BODY + b"\0\0\0")
    c = Client()
    s["data-padding-too-long"] = ctl() + settings() + c.headers(1, "POST", "/v1/completions", body=BODY) + \
        frame(DATA, END_STREAM | PADDED, 1, bytes([200]) + BODY)
    c = Client()
    s["trailers"] = ctl() + settings() + c.headers(1, "POST", "/v1/completions", body=BODY, end=False) + \
        frame(DATA, 0, 1, BODY) + frame(HEADERS, END_HEADERS | END_STREAM, 1, c.enc.encode([("x-t", "1")], huffman=False))
    c = Client()
    s["body-stalls-408"] = ctl(end=1) + settings() + c.headers(1, "POST", "/v1/completions", body=BODY) + \
        frame(DATA, 0, 1, BODY[:5])
    c = Client()
    s["content-length-mismatch"] = ctl() + settings() + \
        c.headers(1, "POST", "/v1/completions", ("content-length", "3"), end=False) + frame(DATA, END_STREAM, 1, BODY)
    c = Client()
    s["small-limits-body-too-large-413"] = ctl(small=1) + settings() + \
        c.request(1, "POST", "/v1/completions", b'{"prompt":"' + b"y" * 1100 + b'"}', pieces=2)
    c = Client()
    s["small-limits-headers-too-large-431"] = ctl(small=1) + settings() + \
        c.headers(1, "GET", "/health", ("x-big", "z" * 1100))
    c = Client()
    s["small-limits-streams-refused"] = ctl(small=1, end=1) + settings() + \
        b"".join(c.headers(sid, "POST", "/v1/completions", body=BODY) for sid in range(1, 12, 2))
    c = Client()
    s["connection-specific-field"] = ctl() + settings() + c.headers(1, "GET", "/health", ("connection", "close"))
    c = Client()
    s["te-trailers-and-hop-by-hop"] = ctl() + settings() + \
        c.request(1, "POST", "/v1/completions", BODY) + c.headers(3, "GET", "/health", ("te", "trailers"), ("x-a", "1"))
    c = Client()
    s["uppercase-field-name"] = ctl() + settings() + frame(HEADERS, END_HEADERS | END_STREAM, 1,
        c.block("GET", "/health") + b"\x00\x05X-Big\x01v")
    c = Client()
    s["goaway-from-client"] = ctl(end=1) + settings() + c.request(1, "GET", "/health") + \
        frame(GOAWAY, 0, 0, struct.pack(">II", 1, 0))
    c = Client()
    s["push-promise-from-client"] = ctl() + settings() + frame(PUSH_PROMISE, END_HEADERS, 1, struct.pack(">I", 2))
    c = Client()
    s["unknown-frame-type"] = ctl() + settings() + frame(0x42, 0xff, 7, b"whatever") + c.request(1, "GET", "/health")
    c = Client()
    s["hpack-bad-index"] = ctl() + settings() + frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\xff\xff\xff\x0f")
    c = Client()
    s["gaps-between-writes"] = ctl(gap=6, cut=5, longest=3, end=1) + settings() + \
        c.request(1, "POST", "/v1/completions", BODY, pieces=3)
    c = Client()
    s["client-closes-early"] = ctl(answers=4, end=2) + settings() + c.request(1, "POST", "/v1/completions", BODY)
    c = Client()
    s["client-half-closes-after-writes"] = ctl(answers=1, end=3) + settings() + \
        c.request(1, "POST", "/v1/completions", BODY_STREAM)
    c = Client()
    s["own-preface"] = ctl(own_preface=1) + PREFACE + settings() + c.request(1, "GET", "/health")
    s["own-preface-wrong"] = ctl(own_preface=1) + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    s["idle-no-frames"] = ctl(end=1)
    return s


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in seeds().items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"{len(seeds())} seeds in {os.path.relpath(OUT)}")


if __name__ == "__main__":
    main()
