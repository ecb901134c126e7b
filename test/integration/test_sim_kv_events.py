"""test_sim_kv_events.py: vllm_sim's side of precise mode.

vllm_sim --kv-events 0 publishes each pod's KV events as vLLM does: ZMQ PUB frames [topic,
8-byte big-endian seq, msgpack [ts, events, dp_rank]], a replay ROUTER, events as positional
arrays or (--kv-events-encoding map) maps with "type". Its toy tokenizer (/tokenize, the two
render endpoints) gives the token ids its events carry.

No test depends on timing. Every HTTP request here answers after its admission, and a batch is
published in the loop turn of the admission, so once a completion has answered, a replay from
0 holds its events. The live stream is checked against the replay: a subscriber joins, then
requests go out one at a time until a live batch arrives (each wait bounded), and from then on
every live batch must equal the replayed batch of the same sequence. Decoding uses
python3-msgpack, sockets python3-zmq.
"""
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import msgpack
import pytest
import zmq

from conftest import BUILD, SANITIZER_MARKERS, LineReader

SIM = os.path.join(BUILD, "bench", "sim", "vllm_sim")
END = b"\xff" * 8
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
STORED_KEYS = ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
               "lora_id", "medium"]


class Sim:
    """One vllm_sim with one pod (or `pods`: p0, p1, ...), --kv-events on ports the OS picks."""

    def __init__(self, *extra, kv=True, pods=1):
        argv = [SIM, "--time-scale", "100"] + list(extra)
        for i in range(pods):
            argv += ["--port", "0", "--name", "p%d" % i]
        if kv:
            argv += ["--kv-events", "0"]
        self.p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.err = LineReader(self.p.stderr, "vllm_sim")
        self.ctx = zmq.Context()
        self.socks = []
        try:
            self.urls = []
            for i in range(pods):
                m = self.err.wait_line(r"pod p%d listening on ([\d.]+):(\d+)" % i, 30)
                assert m, self.err.text()
                self.urls.append("http://%s:%s" % (m[1].group(1), m[1].group(2)))
            self.url = self.urls[0]
            if kv:
                m = self.err.wait_line(r"pod p0 kv-events (tcp://\S+) replay (tcp://\S+)", 30)
                assert m, self.err.text()
                self.pub, self.replay_ep = m[1].group(1), m[1].group(2)
            assert self.err.wait_line(r"vllm-sim: ready", 30), self.err.text()
        except BaseException:
            self.stop()
            raise

    def post(self, path, body, timeout=30):
        """(status, decoded JSON body)."""
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with _direct.open(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def complete(self, prompt, max_tokens=2):
        st, body = self.post("/v1/completions", {"model": "sim-8b", "prompt": prompt,
                                                 "max_tokens": max_tokens})
        assert st == 200, body
        return body

    def metrics(self):
        with _direct.open(self.url + "/metrics", timeout=10) as r:
            return r.read().decode()

    def socket(self, kind):
        s = self.ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        self.socks.append(s)
        return s

    def subscriber(self):
        s = self.socket(zmq.SUB)
        s.setsockopt(zmq.SUBSCRIBE, b"kv@p0")
        s.connect(self.pub)
        return s

    def replay(self, start=0, timeout=10):
        """[(seq, frames before seq, payload)] from the replay socket, up to the end marker."""
        d = self.socket(zmq.DEALER)
        d.connect(self.replay_ep)
        d.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0 and d.poll(int(left * 1000)), "replay: no end marker in time"
            f = d.recv_multipart()
            assert f[0] == b"", f
            if f[-2] == END:
                assert f[1:] == [END, b""], f
                d.close()
                return out
            assert len(f[-2]) == 8, f
            out.append((int.from_bytes(f[-2], "big"), f[1:-2], f[-1]))

    def stop(self):
        for s in self.socks:
            s.close(0)
        self.ctx.term()
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(30)
        self.err.thread.join(10)
        text = self.err.text()
        assert rc == 0, text[-2000:]
        for marker in SANITIZER_MARKERS:
            assert marker not in text, text[-4000:]


@pytest.fixture
def sims():
    started = []

    def make(*extra, kv=True, pods=1):
        s = Sim(*extra, kv=kv, pods=pods)
        started.append(s)
        return s
    yield make
    for s in started:
        s.stop()


def events_of(payload, encoding="array"):
    """The payload's events as dicts, after checking the exact shape of each encoding."""
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if encoding == "map-batch":     # the batch a map too, its rank filled in
        assert isinstance(batch, dict), batch
        assert list(batch) == ["ts", "events", "data_parallel_rank"], batch
        ts, events, rank = batch["ts"], batch["events"], batch["data_parallel_rank"]
        assert rank == 0, batch
    else:
        assert isinstance(batch, list) and len(batch) == 3, batch
        ts, events, rank = batch
        assert rank is None, batch
    assert isinstance(ts, float) and ts > 0, batch
    out = []
    for e in events:
        if encoding in ("map", "map-batch"):
            assert isinstance(e, dict), e
            stored = STORED_KEYS + (["lora_name"] if encoding == "map-batch" else [])
            keys = {"BlockStored": stored, "BlockRemoved": ["type", "block_hashes", "medium"],
                    "AllBlocksCleared": ["type"]}[e["type"]]
            assert list(e) == keys, e
            assert e.get("lora_name") is None, e
            d = dict(e)
        else:
            assert isinstance(e, list), e
            n = {"BlockStored": 7, "BlockRemoved": 3, "AllBlocksCleared": 1}[e[0]]
            assert len(e) == n, e
            names = STORED_KEYS if e[0] == "BlockStored" else ["type", "block_hashes", "medium"]
            d = dict(zip(names, e))
        if d["type"] == "BlockStored":
            assert d["block_size"] == 16 and d["lora_id"] is None and d["medium"] == "GPU", d
            assert len(d["token_ids"]) == 16 * len(d["block_hashes"]), d
        if d["type"] == "BlockRemoved":
            assert d["medium"] == "GPU", d
        for h in d.get("block_hashes", []):
            assert isinstance(h, int) and 0 <= h < 2 ** 64, d
        out.append(d)
    return out


def all_events(sim, encoding="array", start=0):
    """Every buffered event from `start`, in order, with its batch's sequence."""
    got = []
    for seq, _, payload in sim.replay(start):
        got += [(seq, e) for e in events_of(payload, encoding)]
    return got


def tokenize(sim, prompt):
    st, body = sim.post("/tokenize", {"model": "sim-8b", "prompt": prompt})
    assert st == 200, body
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 131072, body
    return body["tokens"]


def stored_chain(events):
    """[(hash, parent, tokens of that block)] of every stored block, in order."""
    out = []
    for _, e in events:
        if e["type"] != "BlockStored":
            continue
        parent = e["parent_block_hash"]
        for i, h in enumerate(e["block_hashes"]):
            out.append((h, parent, e["token_ids"][16 * i:16 * i + 16]))
            parent = h
    return out


def join_live(sim, sub, timeout=20):
    """Sends requests, one at a time, until the subscriber gets a live batch: from then on the
    subscription is in place. Returns that batch (seq, payload)."""
    deadline = time.monotonic() + timeout
    k = 0
    while time.monotonic() < deadline:
        sim.complete("join %d " % k + "j" * 64)
        k += 1
        if sub.poll(500):
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"kv@p0" and len(seq) == 8, (topic, seq)
            return int.from_bytes(seq, "big"), payload
    raise AssertionError("no live batch within %ds" % timeout)


@pytest.mark.parametrize("encoding,engine", [("array", "latency"), ("map", "latency"),
                                             ("map-batch", "latency"), ("array", "step")])
def test_stored_blocks_carry_the_tokens_tokenize_gives_and_chain(sims, encoding, engine):
    sim = sims("--kv-events-encoding", encoding, "--engine", engine)
    prompt = "The system prompt of a shared agent. " * 9          # 333 bytes: 5 full blocks
    tokens = tokenize(sim, prompt)
    assert len(tokens) == (len(prompt) + 3) // 4
    assert tokens[0] == int.from_bytes(prompt[:4].encode(), "little")
    sim.complete(prompt)
    evs = all_events(sim, encoding)
    chain = stored_chain(evs)
    assert len(chain) == 5, evs
    assert [t for _, _, t in chain] == [tokens[16 * i:16 * i + 16] for i in range(5)]
    assert chain[0][1] is None
    assert all(chain[i][1] == chain[i - 1][0] for i in range(1, 5))
    assert len({h for h, _, _ in chain}) == 5
    # A longer prompt sharing the first 5 blocks stores only its new blocks, linked to block 4.
    longer = prompt + "and a question that goes on for a while. " * 3
    tokens2 = tokenize(sim, longer)
    assert tokens2[:80] == tokens[:80]
    last = evs[-1][0]
    sim.complete(longer)
    new = stored_chain(all_events(sim, encoding, last + 1))
    assert new[0][1] == chain[4][0], new
    nfull = len(longer) // 64
    assert [t for _, _, t in new] == [tokens2[16 * i:16 * i + 16] for i in range(5, nfull)]
    # A chat: /tokenize with messages, and the chat render, give the tokens that are stored.
    msgs = [{"role": "system", "content": "You are terse. " * 10},
            {"role": "user", "content": "Say it again, with feeling."}]
    st, tok = sim.post("/tokenize", {"model": "sim-8b", "messages": msgs,
                                     "add_generation_prompt": True})
    assert st == 200, tok
    st, rend = sim.post("/v1/chat/completions/render", {"model": "sim-8b", "messages": msgs})
    assert st == 200 and rend["token_ids"] == tok["tokens"], rend
    before = sim.replay()[-1][0]
    st, body = sim.post("/v1/chat/completions", {"model": "sim-8b", "messages": msgs,
                                                 "max_tokens": 2})
    assert st == 200, body
    chat = stored_chain(all_events(sim, encoding, before + 1))
    n = body["usage"]["prompt_tokens"] // 16
    assert n >= 2 and [t for _, _, t in chat] == [tok["tokens"][16 * i:16 * i + 16]
                                                  for i in range(n)]
    assert 'vllm_sim:kv_event_orphan_blocks_total{pod="p0"} 0' in sim.metrics()


def test_tokenize_and_render_answers(sims):
    sim = sims(kv=False)
    st, t = sim.post("/tokenize", {"model": "sim-8b", "prompt": "abcdefghij"})
    assert st == 200 and t["count"] == 3 and t["token_strs"] is None, t
    assert t["tokens"] == [int.from_bytes(b"abcd", "little"), int.from_bytes(b"efgh", "little"),
                           int.from_bytes(b"ij\0\0", "little")]
    # As vLLM: the completion render answers a list of GenerateRequest, the chat render one.
    st, r = sim.post("/v1/completions/render", {"model": "sim-8b", "prompt": "abcdefghij",
                                                "max_tokens": 7})
    assert st == 200 and isinstance(r, list) and len(r) == 1, r
    assert r[0]["token_ids"] == t["tokens"] and r[0]["sampling_params"]["max_tokens"] == 7, r
    assert r[0]["model"] == "sim-8b" and r[0]["request_id"], r
    st, r = sim.post("/v1/chat/completions/render",
                     {"model": "sim-8b", "messages": [{"role": "user", "content": "hi"}]})
    assert st == 200 and isinstance(r, dict), r
    assert r["token_ids"] == [int.from_bytes(b"<|us", "little"), int.from_bytes(b"er|>", "little"),
                              int.from_bytes(b"hi\0\0", "little")], r
    # Errors in OpenAI's shape.
    for path, body, status in [
            ("/tokenize", {"model": "other", "prompt": "x"}, 404),
            ("/v1/chat/completions/render", {"model": "other", "messages": []}, 404),
            ("/tokenize", {"model": "sim-8b", "prompt": 5}, 400),
            ("/tokenize", {"model": "sim-8b"}, 400),
            ("/v1/chat/completions/render", {"model": "sim-8b", "messages": "no"}, 400),
            ("/v1/completions/render", [1, 2], 400)]:
        st, e = sim.post(path, body)
        assert st == status and e["error"]["code"] == status and e["error"]["message"], (path, e)


def _toy_ids(text):
    """The toy tokenizer's ids: 4 bytes of UTF-8 a token, little-endian, the last zero-padded."""
    b = text.encode()
    b += b"\0" * (-len(b) % 4)
    return [int.from_bytes(b[i:i + 4], "little") for i in range(0, len(b), 4)]


def test_toy_tokenizer_gives_the_same_ids_as_before(sims):
    """The ids are pinned: literal lists taken from the tokenizer as it was before its answers
    were written in one pass (empty, non-ASCII, a chat with a part list, a one-digit id), and
    a long prompt (every id width) against the rule; the three endpoints agree."""
    sim = sims(kv=False)
    chat = [{"role": "system", "content": "h\u00e9llo w\u00f6rld \u2014 \u65e5\u672c\u8a9e \U0001f642"},
            {"role": "user", "content": [{"type": "text", "text": "ok?"}]}]
    pinned = [
        ({"prompt": ""}, []),
        ({"prompt": "\u0001"}, [1]),
        ({"prompt": "h\u00e9llo w\u00f6rld \u2014 \u65e5\u672c\u8a9e \U0001f642"},
         [1823064936, 1998614380, 1819457219, 2162303076, 2548441236, 2895963813, 547269352,
          2191106032]),
        ({"messages": chat},
         [2037611580, 1835365491, 3278388860, 1869376681, 3066263328, 543452274, 546603234,
          3869612006, 2867375260, 2683314334, 2084340377, 1919251317, 1802452604, 63]),
    ]
    rng = __import__("random").Random(7)
    long = "".join(chr(rng.choice([rng.randrange(1, 128), rng.randrange(128, 0x800),
                                   rng.randrange(0x800, 0xd800), rng.randrange(0x10000, 0x10ffff)]))
                   for _ in range(30000))
    pinned.append(({"prompt": long}, _toy_ids(long)))
    for body, want in pinned:
        st, t = sim.post("/tokenize", dict(body, model="sim-8b"))
        assert st == 200 and t["tokens"] == want and t["count"] == len(want), (body, t)
        if "prompt" in body:
            st, r = sim.post("/v1/completions/render", dict(body, model="sim-8b"))
            assert st == 200 and r[0]["token_ids"] == want, r
        else:
            st, r = sim.post("/v1/chat/completions/render", dict(body, model="sim-8b"))
            assert st == 200 and r["token_ids"] == want, r


def _tokenize_on(url, text, timeout=30):
    host, port = url[len("http://"):].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        return _keepalive_post(conn, "/tokenize", {"model": "sim-8b", "prompt": text})
    finally:
        conn.close()


def test_concurrent_tokenizations_on_every_pod_are_answered(sims):
    """Eight pods, a client per pod sending long prompts at once: every answer comes back,
    right, within the clients' bounded wait."""
    sim = sims(kv=False, pods=8)
    text = "".join(chr(0x41 + i % 26) for i in range(24000))
    want = _toy_ids(text)
    results, errors = [], []

    def client(url):
        try:
            for _ in range(10):
                results.append(_tokenize_on(url, text) == (200, {
                    "count": len(want), "max_model_len": 131072, "tokens": want,
                    "token_strs": None}))
        except Exception as e:   # reported below, with the rest
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(u,)) for u in sim.urls]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(max(0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "tokenizations still unanswered after 60 s"
    assert not errors and len(results) == 80 and all(results), (errors, results.count(False))


@pytest.mark.parametrize("threads", [None, "1"])
def test_a_held_tokenizer_holds_back_only_its_own_pods(sims, threads):
    """POST /sim/tokenizer/stall holds pod p0's tokenizer thread for 2 s, as a long prompt
    would. With a thread per pod (the default for 4 pods), p1..p3 keep answering meanwhile,
    each at once; with --tokenize-threads 1 every pod waits behind p0: some tokenization sent
    during the stall takes most of it. Counted against the stall's own answer, not timed
    against a sleep."""
    extra = ("--tokenize-threads", threads) if threads else ()
    sim = sims(*extra, kv=False, pods=4)
    assert "%s tokenizer thread" % (threads or 4) in sim.err.text(), sim.err.text()
    want = _toy_ids("abcdefgh")
    for u in sim.urls:
        assert _tokenize_on(u, "abcdefgh")[1]["tokens"] == want
    done = threading.Event()
    result = {}

    def stall():
        result["stall"] = sim.post("/sim/tokenizer/stall?ms=2000", {})
        done.set()

    t = threading.Thread(target=stall)
    t.start()
    answered, slowest = 0, 0.0
    while not done.is_set():
        for u in sim.urls[1:]:
            t0 = time.monotonic()
            st, body = _tokenize_on(u, "abcdefgh")
            slowest = max(slowest, time.monotonic() - t0)
            assert st == 200 and body["tokens"] == want, body
            answered += not done.is_set()
    t.join(30)
    assert result["stall"] == (200, {"stalled": True})
    if threads == "1":
        assert slowest >= 1.0, "the slowest tokenization took %.2f s" % slowest
    else:
        assert answered >= 20, "%d tokenizations answered during a 2 s stall" % answered
    # p0 answers again once its thread is free.
    assert _tokenize_on(sim.urls[0], "abcdefgh")[1]["tokens"] == want


def test_tokenize_delay_holds_the_answer_back(sims):
    """--tokenize-delay-ms 800 at time scale 1: the answer comes no sooner (a lower bound, the
    delay itself), and the pod answers other requests meanwhile."""
    sim = sims("--time-scale", "1", "--tokenize-delay-ms", "800", kv=False)
    t0 = time.monotonic()
    st, t = sim.post("/tokenize", {"model": "sim-8b", "prompt": "abcd"})
    assert st == 200 and t["tokens"] == [int.from_bytes(b"abcd", "little")], t
    assert time.monotonic() - t0 >= 0.8
    with _direct.open(sim.url + "/health", timeout=10) as r:
        assert r.status == 200


def _keepalive_post(conn, path, body):
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, json.loads(r.read())


def test_tokenizer_answers_while_the_main_loop_is_busy(sims):
    """The tokenizer has a thread of its own, with the listeners: while the main loop (every
    pod's streams) is held by POST /sim/stall, tokenizations keep getting answers, on a kept
    connection and on new ones. Counted, not timed: were either on the main loop, none would
    come back until the stall ended."""
    sim = sims(kv=False)
    host, port = sim.url[len("http://"):].split(":")
    tok = http.client.HTTPConnection(host, int(port), timeout=30)
    want = [int.from_bytes(b"abcd", "little"), int.from_bytes(b"efgh", "little")]
    assert _keepalive_post(tok, "/tokenize", {"model": "sim-8b", "prompt": "abcdefgh"}) == \
        (200, {"count": 2, "max_model_len": 131072, "tokens": want, "token_strs": None})
    done = threading.Event()
    result = {}

    def stall():
        result["stall"] = sim.post("/sim/stall?ms=2000", {})
        done.set()

    t = threading.Thread(target=stall)
    t.start()
    answered = fresh = 0
    while not done.is_set():
        st, body = _keepalive_post(tok, "/tokenize", {"model": "sim-8b", "prompt": "abcdefgh"})
        assert st == 200 and body["tokens"] == want, body
        answered += not done.is_set()
        # A new connection too: the listeners are the tokenizer's, not the busy loop's.
        new = http.client.HTTPConnection(host, int(port), timeout=30)
        st, body = _keepalive_post(new, "/tokenize", {"model": "sim-8b", "prompt": "abcdefgh"})
        new.close()
        assert st == 200 and body["tokens"] == want, body
        fresh += not done.is_set()
    t.join(30)
    assert result["stall"] == (200, {"stalled": True})
    assert answered >= 30 and fresh >= 30, \
        "%d (%d on new connections) tokenizations answered during a 2 s stall" % (answered, fresh)
    # The same connection moves back for anything else, and again for the tokenizer.
    st, body = _keepalive_post(tok, "/v1/completions", {"model": "sim-8b", "prompt": "abcdefgh",
                                                       "max_tokens": 2})
    assert st == 200 and body["usage"]["completion_tokens"] == 2, body
    st, r = _keepalive_post(tok, "/v1/completions/render", {"model": "sim-8b", "prompt": "abcd"})
    assert st == 200 and r[0]["token_ids"] == want[:1], r
    tok.request("GET", "/health")
    assert tok.getresponse().status == 200
    tok.close()


@pytest.mark.parametrize("engine", ["latency", "step"])
def test_evictions_follow_the_pods_lru_order(sims, engine):
    """A cache of 16 blocks and prompts of 4 distinct blocks: from the fourth prompt on,
    admissions evict, oldest prompt first and each prompt's tail before its head."""
    sim = sims("--capacity-tokens", "256", "--engine", engine)
    prompts = [chr(ord("a") + k) * 256 for k in range(7)]
    for p in prompts:
        sim.complete(p, max_tokens=1)
    evs = all_events(sim)
    live = set()
    order = []
    for _, e in evs:
        if e["type"] == "BlockStored":
            assert not live & set(e["block_hashes"]), e
            live |= set(e["block_hashes"])
        elif e["type"] == "BlockRemoved":
            assert set(e["block_hashes"]) <= live, e
            live -= set(e["block_hashes"])
            order += e["block_hashes"]
        assert len(live) <= 16
    chains = {}
    for h, _, t in stored_chain(evs):
        chains.setdefault(t[0], []).append(h)
    first = [chains[int.from_bytes(p[:4].encode(), "little")] for p in prompts]
    assert len(order) >= 8, order
    # The first prompts to go are the oldest, tail first.
    assert order[:8] == first[0][::-1] + first[1][::-1], (order, first)
    st = sim.metrics()
    assert 'vllm_sim:kv_event_batches_total{kind="made",pod="p0"} %d' % (evs[-1][0] + 1) in st


def test_live_batches_equal_the_replayed_ones(sims):
    sim = sims()
    sub = sim.subscriber()
    seq, payload = join_live(sim, sub)
    got = {seq: payload}
    for k in range(5):
        sim.complete("live %d " % k + "x" * 100)
    last = sim.replay()[-1][0]
    deadline = time.monotonic() + 20
    while max(got) < last:
        left = deadline - time.monotonic()
        assert left > 0 and sub.poll(int(left * 1000)), (sorted(got), last)
        _, s, p = sub.recv_multipart()
        got[int.from_bytes(s, "big")] = p
    assert sorted(got) == list(range(seq, last + 1))   # in order, no gap
    for s, frames, p in sim.replay(seq):
        assert frames == [] and got[s] == p, s            # array encoding: [seq, payload]


@pytest.mark.parametrize("encoding", ["map", "map-batch"])
def test_replay_from_a_start_and_the_end_marker(sims, encoding):
    sim = sims("--kv-events-encoding", encoding)
    for k in range(6):
        sim.complete("replay %d " % k + "r" * 80)
    allb = sim.replay(0)
    assert [s for s, _, _ in allb] == list(range(len(allb))) and len(allb) >= 6
    # map: [topic, seq, payload] as the issue says of vLLM 0.26; map-batch: [seq, payload]
    topic = [b"kv@p0"] if encoding == "map" else []
    assert all(f == topic for _, f, _ in allb)
    assert all(events_of(p, encoding) for _, _, p in allb)
    part = sim.replay(3)
    assert [s for s, _, _ in part] == list(range(3, len(allb)))
    assert [p for _, _, p in part] == [p for _, _, p in allb[3:]]
    assert sim.replay(len(allb) + 10) == []                # nothing from there: the end only
    # A malformed request is ignored; the next good one is answered.
    d = sim.socket(zmq.DEALER)
    d.connect(sim.replay_ep)
    d.send_multipart([b"", b"\x00\x01"])
    d.send_multipart([b"", (5).to_bytes(8, "big")])
    assert d.poll(10000)
    f = d.recv_multipart()
    assert f[:2 + len(topic)] == [b""] + topic + [(5).to_bytes(8, "big")], f
    assert 'vllm_sim:kv_event_replays_total{pod="p0"} 4' in sim.metrics()
    # A peer that sends a frame over the replay socket's size limit is cut; others go on.
    bad = sim.socket(zmq.DEALER)
    bad.connect(sim.replay_ep)
    bad.send_multipart([b"", b"\0" * 4096])
    assert [s for s, _, _ in sim.replay(4)] == list(range(4, len(allb)))


def test_restart_clears_and_starts_again_at_zero(sims):
    sim = sims()
    sub = sim.subscriber()
    join_live(sim, sub)
    prompt = "remember me " * 20
    sim.complete(prompt)
    assert sim.complete(prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    before = sim.metrics()
    st, body = sim.post("/sim/restart", {})
    assert st == 200 and body == {"restarted": True}, body
    # /metrics looks like a new process: a later start time, counters from zero.
    after = sim.metrics()
    start = re.compile(r"^process_start_time_seconds (\S+)$", re.M)
    assert float(start.search(after).group(1)) > float(start.search(before).group(1))
    queries = r'vllm:prefix_cache_queries_total\{model_name="sim-8b"\} (\S+)'
    assert float(re.search(queries, before).group(1)) > 0
    assert float(re.search(queries, after).group(1)) == 0
    b = sim.replay()
    assert len(b) == 1 and b[0][0] == 0, b
    assert events_of(b[0][2]) == [{"type": "AllBlocksCleared"}]
    # Live: the old life's batches, then AllBlocksCleared with sequence 0.
    deadline = time.monotonic() + 20
    while True:
        left = deadline - time.monotonic()
        assert left > 0 and sub.poll(int(left * 1000)), "no AllBlocksCleared"
        _, s, p = sub.recv_multipart()
        if events_of(p) == [{"type": "AllBlocksCleared"}]:
            assert int.from_bytes(s, "big") == 0
            break
    # The cache is empty: the same prompt hits nothing and is stored again, as batch 1.
    assert sim.complete(prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    evs = all_events(sim)
    assert [s for s, _ in evs][:2] == [0, 1] and evs[1][1]["type"] == "BlockStored", evs


def test_dropped_batches_leave_gaps_that_the_replay_fills(sims):
    sim = sims("--kv-events-drop", "0.5", "--seed", "7")
    sub = sim.subscriber()
    first, payload = join_live(sim, sub)
    live = {first: payload}
    for k in range(30):
        sim.complete("drop %d " % k + "d" * 70)
    last = sim.replay()[-1][0]
    # Requests, one at a time, until a live batch at or past `last` shows up: the ones before
    # it came first on the same connection.
    deadline = time.monotonic() + 30
    k = 0
    while max(live) < last:
        assert time.monotonic() < deadline, (sorted(live), last)
        sim.complete("marker %d " % k + "m" * 70)
        k += 1
        while sub.poll(200):
            _, s, p = sub.recv_multipart()
            live[int.from_bytes(s, "big")] = p
    seqs = sorted(s for s in live if s <= last)
    missing = sorted(set(range(first, last + 1)) - set(seqs))
    assert missing, "no gap: --kv-events-drop did nothing"
    assert len(seqs) > 3, "nothing published"
    replayed = {s: p for s, _, p in sim.replay(missing[0])}
    for s in missing:
        assert s in replayed and events_of(replayed[s]), s
    for s in seqs:
        if s >= missing[0]:
            assert replayed[s] == live[s], s
    m = re.search(r'kv_event_batches_total\{kind="dropped",pod="p0"\} (\d+)', sim.metrics())
    assert m and int(m.group(1)) >= len(missing), m


def test_foreign_load_evicts_what_the_router_sent(sims):
    """--foreign-load: requests nobody sent push the router's prompt out of the pod's cache;
    the events say so, with stores of prompts the router never saw."""
    sim = sims("--capacity-tokens", "1024", "--foreign-load", "50", "--foreign-tokens", "128",
               "--time-scale", "1")
    prompt = "mine " * 60
    tokens = tokenize(sim, prompt)
    ours = [tokens[16 * i:16 * i + 16] for i in range(len(prompt) // 64)]
    sim.complete(prompt)
    mine = None
    deadline = time.monotonic() + 30
    while True:
        evs = all_events(sim)
        chain = stored_chain(evs)
        if mine is None:
            mine = [h for h, _, t in chain if t in ours]
            assert len(mine) == len(ours), chain
        removed = {h for _, e in evs if e["type"] == "BlockRemoved" for h in e["block_hashes"]}
        if mine and set(mine) <= removed:
            break
        assert time.monotonic() < deadline, "the foreign load never evicted the prompt"
        time.sleep(0.1)   # polling the pod's state, with a deadline
    foreign = [t for _, _, t in chain if t not in ours]
    assert foreign and all(all(ord("a") <= (x >> s) & 255 <= ord("z") for s in (0, 8, 16, 24))
                           for t in foreign for x in t)
    assert sim.complete(prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    m = re.search(r'foreign_requests_total\{outcome="admitted",pod="p0"\} (\d+)', sim.metrics())
    assert m and int(m.group(1)) > 0
    assert 'vllm_sim:kv_event_orphan_blocks_total{pod="p0"} 0' in sim.metrics()


def test_defaults_publish_nothing(sims):
    sim = sims(kv=False)
    sim.complete("plain " * 20)
    text = sim.metrics()
    assert "kv_event" not in text and "foreign" not in text
    assert "kv-events" not in sim.err.text()


def withheld(sim):
    m = re.search(r'vllm_sim:kv_blocks_withheld\{pod="p0"\} (\d+)', sim.metrics())
    assert m, sim.metrics()[-800:]
    return int(m.group(1))


def wait_until(pred, timeout, what):
    """Polls the pod's state until pred() holds, with a deadline."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.05)


def test_capacity_schedule_evicts_on_its_own_and_gives_back(sims):
    """--capacity-schedule 2:1,2:0.25 on 64 blocks: 12 prompts of 4 blocks fit while the whole
    cache is there; when a quarter is left the pod evicts down to 16 blocks with no request
    from anyone, oldest prompt first and tail first; then the blocks come back."""
    sim = sims("--capacity-tokens", "1024", "--capacity-schedule", "2:1,2:0.25",
               "--time-scale", "1")
    prompts = [chr(ord("a") + k) * 256 for k in range(12)]
    for p in prompts:
        sim.complete(p, max_tokens=1)
    wait_until(lambda: withheld(sim) == 48, 20, "the pod to withhold 48 blocks")
    evs = all_events(sim)
    live, order = set(), []
    for _, e in evs:
        if e["type"] == "BlockStored":
            live |= set(e["block_hashes"])
        elif e["type"] == "BlockRemoved":
            assert set(e["block_hashes"]) <= live, e
            live -= set(e["block_hashes"])
            order += e["block_hashes"]
    assert len(live) == 16 and len(order) == 48 - 16, (len(live), len(order))
    chains = {}
    for h, _, t in stored_chain(evs):
        chains.setdefault(t[0], []).append(h)
    lru = [h for p in prompts for h in chains[int.from_bytes(p[:4].encode(), "little")][::-1]]
    assert order == lru[:len(order)]
    wait_until(lambda: withheld(sim) == 0, 20, "the blocks to come back")
    # The last 4 prompts are still there; the first is not.
    assert sim.complete(prompts[-1])["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert sim.complete(prompts[0])["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_capacity_schedule_starts_with_the_first_request(sims):
    """The cycle starts with the first request, not the process: a replay's ceiling follows
    the same phases from its first row. "0.2:1,100:0.25": a pod up for a second without a
    request still holds its whole cache; 0.2 s after its first request it gives up 3/4."""
    sim = sims("--capacity-tokens", "1024", "--capacity-schedule", "0.2:1,100:0.25",
               "--time-scale", "1")
    up = time.monotonic()
    while time.monotonic() < up + 1.0:   # five first phases' time, with no request
        assert withheld(sim) == 0
        time.sleep(0.05)
    sim.complete("x" * 64, max_tokens=1)
    wait_until(lambda: withheld(sim) == 48, 20, "the pod to withhold 48 blocks")


def test_each_pod_publishes_its_own_events(sims):
    """Two pods in one process: each has its own sockets, topic and sequence."""
    sim = sims("--port", "0", "--name", "p1")
    m = sim.err.wait_line(r"pod p1 listening on ([\d.]+):(\d+)", 10)
    k = sim.err.wait_line(r"pod p1 kv-events (tcp://\S+) replay (tcp://\S+)", 10)
    assert m and k, sim.err.text()
    assert {k[1].group(1), k[1].group(2)}.isdisjoint({sim.pub, sim.replay_ep})
    other = Sim.__new__(Sim)            # the same helpers, aimed at pod p1
    other.url = "http://%s:%s" % (m[1].group(1), m[1].group(2))
    other.replay_ep = k[1].group(2)
    other.ctx, other.socks = sim.ctx, sim.socks
    other.complete("for p1 only " * 10)
    mine = other.replay()
    assert len(mine) == 1 and mine[0][0] == 0
    assert stored_chain([(0, e) for e in events_of(mine[0][2])])
    assert sim.replay() == []          # p0 saw nothing
    sub = sim.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@p1")
    sub.connect(k[1].group(1))
    # Live too, on p1's topic: requests until one is seen (each wait bounded).
    deadline = time.monotonic() + 20
    while not sub.poll(300):
        assert time.monotonic() < deadline, "nothing live from p1"
        other.complete("again %f " % time.monotonic() + "z" * 64)
    assert sub.recv_multipart()[0] == b"kv@p1"
