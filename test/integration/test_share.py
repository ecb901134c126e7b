"""Several pcrouter replicas share one prefix index through a real Redis (router/share/share.c).

Each test starts its own redis-server from Debian on a free loopback port, data in memory only
(--save "" --appendonly no), and stub pods that say which one answered. Whether a replica
learned something from another is read from `x-pcrouter-route`: a prompt a replica has never
seen is "cold" unless the index it routes from was told about it ("warm"). Replicas are polled
(with a deadline) until the updates one sent have reached the other, never slept on."""
import json
import os
import random
import signal
import struct
import subprocess
import threading
import time

import pytest
import redis

from conftest import (BUILD, LineReader, chat, completion, curl, free_port, get_metrics,
                      make_config, metric, wait_for)
from test_discovery import backends, discovery_config, dns, start_pods  # noqa: F401 (dns: fixture)
from test_reload import reload, since
from test_resilience import backend_metric, restart_sim, routing
from test_routing import text

DEADLINE = 30.0   # sanitizer builds on a shared 2-core machine are slow


class RedisServer:
    """A redis-server on a free loopback port, in memory only; restartable on the same port."""

    def __init__(self, tmpdir, port=None):
        self.tmpdir = str(tmpdir)
        for _ in range(5):
            self.port = port or free_port()
            if self._start():
                break
            if port:
                raise AssertionError("redis-server did not start on port %d" % port)
        else:
            raise AssertionError("redis-server did not start")
        self.client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10)

    def _start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.tmpdir, "--daemonize", "no"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.out = LineReader(self.proc.stdout, "redis")
        if self.out.wait_line(r"Ready to accept connections", 15) is None:
            self.kill()
            return False
        return True

    def restart(self):
        self.kill()
        if not self._start():
            raise AssertionError("redis-server did not come back on %d:\n%s" % (self.port, self.out.tail()))

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def url(self, auth=""):
        return "redis://%s127.0.0.1:%d/0" % (auth, self.port)


@pytest.fixture
def redis_server(tmp_path):
    servers = []

    def make(port=None):
        s = RedisServer(tmp_path, port)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.kill()


def share_config(stubs, rs, channel, **redis_keys):
    # Reconnects are not hurried: every attempt opens sockets on the control thread, while a
    # worker's event base applies its epoll_ctl for a socket it closed one loop turn later (the
    # changelist of pcr_sock_base_new); a number reused in between is what ThreadSanitizer
    # reports as a race.
    r = {"url": rs.url(), "channel": channel, "snapshot_interval_ms": 200,
         "reconnect_min_ms": 100, "reconnect_max_ms": 500, "timeout_ms": 1000,
         "ready_timeout_ms": 15000}
    r.update(redis_keys)
    return make_config(stubs, routing={"policy": "cache_aware"}, redis=r)


def share(router, name):
    """pcrouter_share_<name> (or <name>_total, for counters); a series that is not there fails."""
    m = get_metrics(router)
    for n in ("pcrouter_share_" + name, "pcrouter_share_%s_total" % name):
        v = metric(m, n)
        if v is not None:
            return v
    raise AssertionError("no metric pcrouter_share_%s in:\n%s" % (name, m))


def send(router, body, path="/v1/chat/completions"):
    r = curl(router.url(path), body)
    assert r.status == 200, r
    pod = r.header("x-pcrouter-backend")
    assert pod == r.json()["stub"]["pod"], r
    return pod, r.header("x-pcrouter-route")


def wait_synced(src, dst):
    """Waits until what `src` learned (one commit per routed request) is acknowledged by Redis
    and applied by `dst`."""
    def published():
        m = get_metrics(src)
        routed = metric(m, "pcrouter_route_decisions_total") or 0
        return metric(m, "pcrouter_share_updates_sent_total") + \
            metric(m, "pcrouter_share_updates_dropped_total") >= routed
    wait_for(published, DEADLINE, 0.02, "the sender's updates acknowledged by Redis")
    sent = share(src, "updates_sent")
    wait_for(lambda: share(dst, "updates_received") >= sent, DEADLINE, 0.02,
             "the receiver applying %d updates" % sent)


def conversation(a, b, rng, nturns, send_fn):
    """A conversation whose turns alternate between replicas a and b, each turn shared before
    the next: it stays on one pod, cold at its first turn and warm at every other. Returns its
    messages and that pod."""
    msgs = [{"role": "system", "content": "conversation: " + text(rng, 2048)}]
    turns = []
    for turn in range(nturns):
        here, there = (a, b) if turn % 2 == 0 else (b, a)
        msgs.append({"role": "user", "content": text(rng, 1024)})
        turns.append(send_fn(here, chat(msgs, tag="t%d" % turn)))
        msgs.append({"role": "assistant", "content": text(rng, 256)})
        wait_synced(here, there)
    assert len({p for p, _ in turns}) == 1, turns
    assert turns[0][1] == "cold" and all(r == "warm" for _, r in turns[1:]), turns
    return msgs, turns[0][0]


def start_replicas(n, stub_factory, router_factory, redis_server, channel, **redis_keys):
    stubs = [stub_factory("pod-%s" % c) for c in "abcd"]
    rs = redis_server()
    routers = [router_factory(share_config(stubs, rs, channel, **redis_keys)) for _ in range(n)]
    for r in routers:
        wait_for(lambda: curl(r.url("/health")).status == 200, DEADLINE, 0.05, "/health 200")
        wait_for(lambda: share(r, "connected") == 1, DEADLINE, 0.05, "connected to redis")
    return stubs, rs, routers


def test_two_replicas_share_conversation_and_system_prompt(stub_factory, router_factory, redis_server):
    _, _, (a, b) = start_replicas(2, stub_factory, router_factory, redis_server, "t1")
    rng = random.Random(11)
    # A conversation whose turns alternate between the replicas stays on one pod: every turn
    # after the first is warm on whichever replica gets it.
    conversation(a, b, rng, 8, send)

    # A new system prompt learned through A is warm on B at B's first sight of it.
    system = {"role": "system", "content": "agent: " + text(rng, 6000)}
    home, route = send(a, chat([system, {"role": "user", "content": "first user"}]))
    assert route == "cold"
    wait_synced(a, b)
    again, route2 = send(b, chat([system, {"role": "user", "content": "another user entirely"}]))
    assert (again, route2) == (home, "warm")
    m = get_metrics(b)
    assert metric(m, "pcrouter_share_updates_received_total") >= 5, m
    assert metric(m, "pcrouter_share_updates_dropped_total") == 0, m
    assert metric(m, "pcrouter_share_rejected_total") == 0, m
    assert 0 <= metric(m, "pcrouter_share_lag_seconds") < 60, m


def test_late_replica_loads_the_snapshot_before_it_is_ready(stub_factory, router_factory, redis_server):
    stubs, rs, (a,) = start_replicas(1, stub_factory, router_factory, redis_server, "t2")
    rng = random.Random(12)
    systems = ["prompt %d: %s" % (i, text(rng, 5000)) for i in range(4)]
    homes = []
    for i, sp in enumerate(systems):
        homes.append(send(a, chat([{"role": "system", "content": sp},
                                   {"role": "user", "content": "question %d" % i}]))[0])
    wait_for(lambda: share(a, "updates_sent") >= 4, DEADLINE, 0.02, "A's updates sent")

    def snapshot_ops():
        keys = rs.client.keys("t2:snapshot:*")
        blob = rs.client.get(keys[0]) if len(keys) == 1 else None
        return struct.unpack_from("<I", blob, 12)[0] if blob and len(blob) >= 32 else 0
    wait_for(lambda: snapshot_ops() >= 4, DEADLINE, 0.05, "A's snapshot holding the 4 prompts")
    # Only the snapshot can tell the new replica: the stream is gone.
    rs.client.delete("t2:stream")

    c = router_factory(share_config(stubs, rs, "t2"))
    got = c.err.wait_line(r"share: ready: (\d+) update\(s\) from (\d+) snapshot", DEADLINE)
    assert got, c.err.tail()
    assert int(got[1].group(1)) >= 4 and int(got[1].group(2)) >= 1, got[1].group(0)
    wait_for(lambda: curl(c.url("/health")).status == 200, DEADLINE, 0.05, "/health 200")
    for i, sp in enumerate(systems):
        pod, route = send(c, chat([{"role": "system", "content": sp},
                                   {"role": "user", "content": "someone else %d" % i}]))
        assert (pod, route) == (homes[i], "warm"), (i, pod, route, homes)
    assert share(c, "snapshots_loaded") >= 1


def test_restart_starts_warm_from_the_predecessors_last_snapshot(stub_factory, router_factory,
                                                                 redis_server):
    """A replica stopped with SIGTERM writes its snapshot on the way out (no periodic one comes
    in time here); the replica that replaces it loads it and routes warm at once."""
    stubs = [stub_factory("pod-%s" % c) for c in "abcd"]
    rs = redis_server()
    cfg = share_config(stubs, rs, "t7", snapshot_interval_ms=600000)
    a = router_factory(cfg)
    wait_for(lambda: share(a, "connected") == 1, DEADLINE, 0.05, "connected to redis")
    rng = random.Random(15)
    system = {"role": "system", "content": text(rng, 6000)}
    home, _ = send(a, chat([system, {"role": "user", "content": "before the restart"}]))
    assert share(a, "snapshots_written") == 0
    a.stop()
    assert rs.client.keys("t7:snapshot:*"), "no snapshot written at the exit"
    rs.client.delete("t7:stream")
    b = router_factory(cfg)
    wait_for(lambda: curl(b.url("/health")).status == 200, DEADLINE, 0.05, "/health 200")
    assert send(b, chat([system, {"role": "user", "content": "after"}])) == (home, "warm")


def test_loading_is_bounded_when_redis_is_away(stub_factory, router_factory):
    """Nothing listens where Redis should be: /health says "loading" (503) for at most
    ready_timeout_ms, requests are routed meanwhile, then the replica is ready on its own."""
    stubs = [stub_factory("pod-a"), stub_factory("pod-b")]
    cfg = make_config(stubs, redis={"url": "redis://127.0.0.1:%d" % free_port(), "channel": "t3",
                                    "ready_timeout_ms": 2500, "reconnect_min_ms": 500,
                                    "reconnect_max_ms": 1000})
    r = router_factory(cfg)
    first = curl(r.url("/health"))
    t0 = time.monotonic()
    assert first.status == 503 and first.json()["status"] == "loading", first
    pod, route = send(r, completion("served while loading " * 50), "/v1/completions")
    assert route == "cold"
    wait_for(lambda: curl(r.url("/health")).status == 200, DEADLINE, 0.05, "/health 200")
    assert time.monotonic() - t0 < 2.5 + DEADLINE
    assert r.err.wait_line(r"not loaded within redis.ready_timeout_ms", 5)
    m = get_metrics(r)
    assert metric(m, "pcrouter_share_connected") == 0
    assert metric(m, "pcrouter_share_updates_dropped_total") >= 1, m


class Traffic(threading.Thread):
    """Requests alternating between replicas until stopped (at most `limit`), each checked."""

    def __init__(self, routers, limit=2000):
        super().__init__(daemon=True)
        self.routers, self.limit = routers, limit
        self.stop_flag = threading.Event()
        self.statuses = []

    def run(self):
        rng = random.Random(5)
        base = text(rng, 3000)
        for i in range(self.limit):
            if self.stop_flag.is_set():
                return
            r = self.routers[i % len(self.routers)]
            resp = curl(r.url("/v1/completions"), completion(base + " user %d" % (i % 17)), timeout=20)
            self.statuses.append(resp.status)

    def stop(self):
        self.stop_flag.set()
        self.join(60)


def test_redis_killed_mid_traffic(stub_factory, router_factory, redis_server):
    _, rs, (a, b) = start_replicas(2, stub_factory, router_factory, redis_server, "t4")
    traffic = Traffic([a, b])
    traffic.start()
    try:
        wait_for(lambda: len(traffic.statuses) >= 20, DEADLINE, 0.05, "traffic before the kill")
        rs.kill()
        wait_for(lambda: share(a, "connected") == 0 and share(b, "connected") == 0, DEADLINE, 0.05,
                 "both replicas see Redis gone")
        during = len(traffic.statuses)
        wait_for(lambda: len(traffic.statuses) >= during + 20, DEADLINE, 0.05, "traffic without Redis")
        # Stopped while Redis is away, so that what follows counts only the updates it sends.
        traffic.stop()
        # Learned by A while Redis is away: B cannot hear of it yet.
        rng = random.Random(13)
        system = {"role": "system", "content": "learned during the outage: " + text(rng, 6000)}
        home, route = send(a, chat([system, {"role": "user", "content": "q1"}]))
        assert route == "cold"
        wait_for(lambda: share(a, "updates_dropped") >= 1, DEADLINE, 0.05, "A's updates dropped")

        loaded = share(b, "snapshots_loaded")
        rs.restart()
        wait_for(lambda: share(a, "connected") == 1 and share(b, "connected") == 1, DEADLINE, 0.05,
                 "both replicas reconnected")
        assert share(a, "reconnects") >= 1 and share(b, "reconnects") >= 1
        # A dropped updates while away: it rewrites its snapshot and announces it; B loads it.
        wait_for(lambda: share(b, "snapshots_loaded") > loaded, DEADLINE, 0.05, "B loading A's snapshot")
        again, route2 = send(b, chat([system, {"role": "user", "content": "q2 from someone else"}]))
        assert (again, route2) == (home, "warm")
        # And live sharing resumes. (An update acknowledged just before the kill may never have
        # reached A, so this waits for one more update rather than for all of B's.)
        fresh = {"role": "system", "content": "after the outage: " + text(rng, 6000)}
        sent, received = share(b, "updates_sent"), share(a, "updates_received")
        home2, _ = send(b, chat([fresh, {"role": "user", "content": "x"}]))
        wait_for(lambda: share(b, "updates_sent") > sent, DEADLINE, 0.02, "B's update sent")
        wait_for(lambda: share(a, "updates_received") > received, DEADLINE, 0.02, "A applying it")
        # Known warm on home2 now: sent there, or passed over only for the share of recent
        # requests the traffic gave it (the bound names it: a prefix A did not know is "cold").
        pod, route3 = send(a, chat([fresh, {"role": "user", "content": "y"}]))
        assert (pod, route3) == (home2, "warm") or route3 == "overload_spill", (pod, route3)
    finally:
        traffic.stop()
    assert len(traffic.statuses) >= 40
    assert set(traffic.statuses) == {200}, [s for s in traffic.statuses if s != 200][:10]


# ---- garbage -------------------------------------------------------------------------------

def batch(ops=(), names=(b"pod-a",), flags=0, replica=0xfeedfacecafebeef, block_bytes=256,
          version=1, sent_ms=None):
    """A batch in the wire format of router/share/share_codec.h; ops: (op, name index, blocks,
    arg)."""
    sent_ms = int(time.time() * 1000) if sent_ms is None else sent_ms
    out = b"pcr" + bytes([version, flags, 0]) + struct.pack("<HII", len(names), block_bytes, len(ops))
    out += struct.pack("<QQ", replica, sent_ms)
    out += b"".join(bytes([len(n)]) + n for n in names)
    for op, name, blocks, arg in ops:
        out += struct.pack("<BHIIQ", op, name, 0, len(blocks), arg)
        out += b"".join(struct.pack("<Q", x) for x in blocks)
    return out


def test_garbage_in_stream_and_keys_is_rejected(stub_factory, router_factory, redis_server):
    stubs, rs, (a,) = start_replicas(1, stub_factory, router_factory, redis_server, "t5")
    c = rs.client
    rng = random.Random(14)
    good = batch([(1, 0, [1, 2, 3], 0)])
    garbage = [
        os.urandom(200),                                  # no magic
        good[:40],                                        # cut short
        batch([(1, 0, [1, 2, 3], 0)], version=9),         # a version we do not read
        batch([(7, 0, [1], 0)]),                          # unknown op
        batch([(1, 3, [1], 0)]),                          # a name index out of range
        batch([(2, 0, [1, 2], 5)]),                       # forget past the key
        batch([(1, 0, list(range(4097)), 0)]),             # longer than max_prefix_bytes allows
        batch([(1, 0, [1], 0)], names=(b"bad\nname",)),   # a control character in a name
        batch([(1, 0, [1], 0)], flags=1),                 # a snapshot in the stream
        good + b"\0",                                     # trailing bytes
    ]
    for g in garbage:
        c.xadd("t5:stream", {"b": g})
    c.xadd("t5:stream", {"x": "no b field"})
    # Well-formed but foreign: a backend this replica does not have, another block size.
    c.xadd("t5:stream", {"b": batch([(1, 0, [9, 9], 0)], names=(b"pod-zzz",))})
    c.xadd("t5:stream", {"b": batch([(1, 0, [9, 9], 0)], block_bytes=64)})
    # A snapshot key of garbage, announced; one of the wrong type; an index member not an id.
    c.set("t5:snapshot:00000000000000aa", os.urandom(64))
    c.rpush("t5:snapshot:00000000000000bb", "a list")
    c.zadd("t5:snapshots", {"00000000000000aa": 9e15, "00000000000000bb": 9e15, "nope": 9e15})
    c.xadd("t5:stream", {"b": batch(flags=2, names=(), replica=0xaa)})
    c.xadd("t5:stream", {"b": batch(flags=2, names=(), replica=0xbb)})

    want = len(garbage) + 1 + 2   # the stream entries, and the two snapshots announced
    wait_for(lambda: share(a, "rejected") >= want, DEADLINE, 0.05, "%d rejections" % want)
    wait_for(lambda: share(a, "updates_ignored") >= 2, DEADLINE, 0.05, "2 updates ignored")
    assert share(a, "connected") == 1
    assert curl(a.url("/health")).status == 200
    # Still routing and sharing: a replica started now walks the same garbage at its resync.
    b = router_factory(share_config(stubs, rs, "t5"))
    wait_for(lambda: curl(b.url("/health")).status == 200, DEADLINE, 0.05, "B ready")
    wait_for(lambda: share(b, "rejected") >= want + 1, DEADLINE, 0.05, "B's rejections")
    system = {"role": "system", "content": text(rng, 6000)}
    home, _ = send(a, chat([system, {"role": "user", "content": "a"}]))
    wait_synced(a, b)
    assert send(b, chat([system, {"role": "user", "content": "b"}])) == (home, "warm")
    # The stream key replaced by a string: sending and reading fail, routing does not.
    c.delete("t5:stream")
    c.set("t5:stream", "not a stream")
    for i in range(5):
        send(a, completion("after the stream broke %d " % i + text(rng, 600)), "/v1/completions")
    wait_for(lambda: share(a, "updates_dropped") >= 1, DEADLINE, 0.05, "updates dropped")
    c.delete("t5:stream")


def test_password_and_host_name(stub_factory, router_factory, redis_server, tmp_path):
    """AUTH with the url's password, a host name resolved without blocking (c-ares), and a
    wrong password refused and reported, not retried in a tight loop."""
    stubs = [stub_factory("pod-a")]
    rs = redis_server()
    rs.client.config_set("requirepass", "s3cr@t")
    url = "redis://:s3cr%%40t@localhost:%d" % rs.port
    r = router_factory(make_config(stubs, redis={"url": url, "channel": "t6"}))
    wait_for(lambda: share(r, "connected") == 1, DEADLINE, 0.05, "connected with the password")
    bad = router_factory(make_config(stubs, redis={"url": "redis://:wrong@127.0.0.1:%d" % rs.port,
                                                   "channel": "t6", "ready_timeout_ms": 500,
                                                   "reconnect_min_ms": 200, "reconnect_max_ms": 1000}))
    got = bad.err.wait_line(r"share: cannot reach redis .*AUTH refused", DEADLINE)
    assert got, bad.err.tail()
    assert "wrong" not in bad.err.text()
    assert share(bad, "connected") == 0


# ---- backends that come and go --------------------------------------------------------------

def test_reload_keeps_redis_and_names_map_to_todays_backends(stub_factory, router_factory,
                                                            redis_server):
    """B's reload replaces pod-b with pod-e, which takes pod-b's slot, and moves the channel.
    The channel change is refused (a restart is needed) while the backends change; what A
    learns about pod-b is then ignored by B, not taken for pod-e's, and what A learns about
    the pods both have still reaches B through the old channel."""
    stubs, rs, (a, b) = start_replicas(2, stub_factory, router_factory, redis_server, "t8")
    e = stub_factory("pod-e")
    rng = random.Random(16)
    # B's own entry for pod-b, in its slot: it must not outlive the slot's change.
    for i in range(60):
        pod, _ = send(b, chat([{"role": "system", "content": "b's %d: %s" % (i, text(rng, 3000))},
                               {"role": "user", "content": "x"}]))
        if pod == "pod-b":
            break
    assert pod == "pod-b"
    wait_for(lambda: rs.client.exists("t8:snapshot:" + replica_id(b)) and
             "pod-b" in snapshot_names(rs, "t8", replica_id(b)), DEADLINE, 0.05,
             "B's snapshot naming pod-b")
    cfg = share_config([stubs[0], e, stubs[2], stubs[3]], rs, "t8-moved")
    start = reload(b, cfg)
    wait_for(lambda: since(b, start, r"redis\.\* changes need a restart"), DEADLINE, 0.05,
             "the redis change refused")
    assert since(b, start, r"reload: backend pod-e joins") and since(b, start, r"backend pod-b leaves")
    wait_for(lambda: curl(b.url("/health")).status == 200, DEADLINE, 0.05, "/health 200")
    # Its snapshot is rewritten without pod-b's entry, which is not taken for pod-e's either.
    wait_for(lambda: "pod-b" not in snapshot_names(rs, "t8", replica_id(b)), DEADLINE, 0.05,
             "B's snapshot rewritten without pod-b")
    assert "pod-e" not in snapshot_names(rs, "t8", replica_id(b))

    on_b, elsewhere = None, []
    for i in range(60):
        system = {"role": "system", "content": "prompt %d: %s" % (i, text(rng, 3000))}
        pod, route = send(a, chat([system, {"role": "user", "content": "from A"}]))
        assert route == "cold"
        if pod == "pod-b" and on_b is None:
            on_b = system
        elif pod != "pod-b" and len(elsewhere) < 2:
            elsewhere.append((system, pod))
        if on_b is not None and len(elsewhere) == 2:
            break
    assert on_b is not None and len(elsewhere) == 2, "pod-b never chosen in 60 prompts"
    # Every update A sent reached B: applied, or ignored for naming a backend B no longer has.
    def published():
        m = get_metrics(a)
        return metric(m, "pcrouter_share_updates_sent_total") >= \
            metric(m, "pcrouter_route_decisions_total")
    wait_for(published, DEADLINE, 0.02, "A's updates acknowledged by Redis")
    sent = share(a, "updates_sent")
    wait_for(lambda: share(b, "updates_received") + share(b, "updates_ignored") >= sent,
             DEADLINE, 0.02, "B reading A's %d updates" % sent)
    assert share(b, "updates_ignored") >= 1
    pod, route = send(b, chat([on_b, {"role": "user", "content": "from B"}]))
    assert pod != "pod-b" and route == "cold", (pod, route)
    for system, home in elsewhere:
        assert send(b, chat([system, {"role": "user", "content": "from B"}])) == (home, "warm")
    # Still the channel B started with.
    assert rs.client.keys("t8-moved:*") == []
    assert share(b, "connected") == 1 and share(b, "rejected") == 0


def replica_id(router):
    got = router.err.wait_line(r"share: sharing the prefix index .* as replica ([0-9a-f]{16})", 5)
    assert got, router.err.tail()
    return got[1].group(1)


def snapshot_names(rs, channel, replica):
    """The backend names a replica's snapshot in Redis has entries for."""
    blob = rs.client.get("%s:snapshot:%s" % (channel, replica))
    assert blob and blob[:4] == b"pcr\x01" and blob[4] & 1, blob and blob[:8]
    nnames, _, nops = struct.unpack_from("<HII", blob, 6)
    at, names = 32, []
    for _ in range(nnames):
        names.append(blob[at + 1:at + 1 + blob[at]].decode())
        at += 1 + blob[at]
    used = set()
    for _ in range(nops):
        _, name, _, fresh, _ = struct.unpack_from("<BHIIQ", blob, at)
        used.add(names[name])
        at += 19 + 8 * fresh
    assert at == len(blob)
    return used


def send_any(router, body):
    """(backend, route) of a routed chat request to a pod named by discovery ("ADDR:PORT")."""
    r = curl(router.url("/v1/chat/completions"), body)
    assert r.status == 200, r
    return r.header("x-pcrouter-backend"), r.header("x-pcrouter-route")


def test_replicas_discovering_the_same_pods_share(stub_factory, router_factory, redis_server,
                                                  dns):
    """Two replicas follow one headless name through DNS (dnsmasq on loopback). Discovery names
    backends "ADDR:PORT", so replicas that see the same pods name them alike, whatever slots
    they gave them: A saw .3 first, B all three at once. A pod that leaves takes its entries
    along; back again, it starts empty."""
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    _, port = start_pods(stub_factory, hosts)
    names = {"%s:%d" % (h, port) for h in hosts}
    d = dns(["127.0.0.3"])
    rs = redis_server()

    def config():
        cfg = discovery_config(d.port, port, redis={
            "url": rs.url(), "channel": "t9", "snapshot_interval_ms": 200,
            "reconnect_min_ms": 100, "reconnect_max_ms": 500, "timeout_ms": 1000,
            "ready_timeout_ms": 15000})
        cfg["routing"] = {"policy": "cache_aware"}
        return cfg
    a = router_factory(config())
    wait_for(lambda: backends(a) == {"127.0.0.3:%d" % port}, DEADLINE, 0.05, "A finding .3")
    d.answer(hosts)
    wait_for(lambda: backends(a) == names, DEADLINE, 0.05, "A finding all three")
    b = router_factory(config())
    for r in (a, b):
        wait_for(lambda: backends(r) == names, DEADLINE, 0.05, "the three pods")
        wait_for(lambda: curl(r.url("/health")).status == 200, DEADLINE, 0.05, "/health 200")
        wait_for(lambda: share(r, "connected") == 1, DEADLINE, 0.05, "connected to redis")

    rng = random.Random(17)
    msgs, home = conversation(a, b, rng, 6, send_any)
    assert home in names

    # The conversation's pod leaves the name: both replicas drop it, and sharing goes on
    # between the two pods left.
    d.answer([h for h in hosts if not home.startswith(h + ":")])
    for r in (a, b):
        wait_for(lambda: backends(r) == names - {home}, DEADLINE, 0.05, "the pod gone")
    system = {"role": "system", "content": "after the pod left: " + text(rng, 6000)}
    pod, route = send_any(a, chat([system, {"role": "user", "content": "a"}]))
    assert route == "cold" and pod != home
    wait_synced(a, b)
    assert send_any(b, chat([system, {"role": "user", "content": "b"}])) == (pod, "warm")

    # Back again (a new backend under the old name): what it held was forgotten.
    d.answer(hosts)
    for r in (a, b):
        wait_for(lambda: metric(get_metrics(r), "pcrouter_backend_up", backend=home) == 1,
                 DEADLINE, 0.05, "the pod back and up")
    msgs.append({"role": "user", "content": "one more turn"})
    # Kept, the entries would make it warm on that pod, which is usable again.
    assert send_any(b, chat(msgs, tag="after"))[1] == "cold"
    for r in (a, b):
        m = get_metrics(r)
        assert metric(m, "pcrouter_share_rejected_total") == 0, m
        assert metric(m, "pcrouter_share_updates_dropped_total") == 0, m


@pytest.mark.parametrize("keep_ms", [300000, 0])
def test_down_is_not_forgotten_in_the_shared_table(stub_factory, router_factory, redis_server,
                                                   keep_ms):
    """A pod marked down keeps its entries in the table the snapshot is written from, as the
    workers keep theirs, for routing.unavailable_keep_ms; with 0 they go at once."""
    stubs = [stub_factory("pod-a"), stub_factory("pod-b")]
    rs = redis_server()
    cfg = share_config(stubs, rs, "t10")
    cfg["routing"]["unavailable_keep_ms"] = keep_ms
    cfg["health"] = {"interval_ms": 100, "fall": 1, "rise": 1}
    r = router_factory(cfg)
    wait_for(lambda: curl(r.url("/health")).status == 200, DEADLINE, 0.05, "/health 200")
    rng = random.Random(18)
    owner, _ = send(r, chat([{"role": "system", "content": text(rng, 3000)},
                             {"role": "user", "content": "kept?"}]))
    wait_for(lambda: share(r, "snapshot_entries") == 1, DEADLINE, 0.02, "the key in the table")
    next(x for x in stubs if x.name == owner).kill()
    wait_for(lambda: backend_metric(r, "pcrouter_backend_up", owner) == 0, DEADLINE, 0.05,
             "%s down" % owner)
    # One more key, on the other pod: once the table holds it, a flush has looked at the
    # backends since the owner went down.
    other, _ = send(r, chat([{"role": "system", "content": text(rng, 3000)},
                             {"role": "user", "content": "elsewhere"}]))
    assert other != owner
    if keep_ms:
        wait_for(lambda: share(r, "snapshot_entries") == 2, DEADLINE, 0.02, "both keys held")
    else:
        wait_for(lambda: share(r, "snapshot_entries") == 1, DEADLINE, 0.02,
                 "the owner's key dropped, the other's held")
    # The snapshot says the same.
    wait_for(lambda: rs.client.exists("t10:snapshot:" + replica_id(r)) and
             snapshot_names(rs, "t10", replica_id(r)) == ({owner, other} if keep_ms else {other}),
             DEADLINE, 0.05, "the snapshot holding what the table holds")


def test_pod_restart_drops_its_shared_entries(router_factory, redis_server):
    """A restart the scrape sees (vllm_sim killed and started again on its port) empties the
    pod's cache: its entries leave the shared table at once, though it was never down."""
    scale = 100
    sims = {n: routing.Sims(BUILD, [n], scale) for n in ("sim-a", "sim-b")}
    try:
        rs = redis_server()
        urls = sorted((n, s.urls[n]) for n, s in sims.items())
        r = router_factory(make_config(urls, routing={"policy": "cache_aware"},
                                       health={"interval_ms": 60000},
                                       scrape={"interval_ms": 100},
                                       redis={"url": rs.url(), "channel": "t11"}))
        wait_for(lambda: curl(r.url("/health")).status == 200, DEADLINE, 0.05, "/health 200")
        resp = curl(r.url("/v1/completions"),
                    completion("restart me: " + text(random.Random(19), 3000), model="sim-8b"))
        assert resp.status == 200, resp
        owner = resp.header("x-pcrouter-backend")
        wait_for(lambda: share(r, "snapshot_entries") == 1, DEADLINE, 0.02, "the key in the table")
        wait_for(lambda: (backend_metric(r, "pcrouter_backend_prefix_cache_queries_tokens_total",
                                         owner) or 0) > 0, DEADLINE, 0.05, "a scrape after it")
        port = int(sims[owner].urls[owner].rsplit(":", 1)[1])
        sims[owner], _, _ = restart_sim(sims[owner], owner, port, scale)
        wait_for(lambda: backend_metric(r, "pcrouter_backend_restarts_total", owner) == 1,
                 DEADLINE, 0.05, "the restart seen by the scrape")
        wait_for(lambda: share(r, "snapshot_entries") == 0, DEADLINE, 0.02, "its key dropped")
        assert backend_metric(r, "pcrouter_backend_up", owner) == 1
    finally:
        for sm in sims.values():
            sm.stop()


def test_sender_clock_zero_or_ahead_leaves_the_lag_sane(stub_factory, router_factory, redis_server):
    """Batches whose send time is 0 or a day ahead are applied, but the lag gauge does not
    believe them (a send time of 0 used to set it to 1.8e9 s)."""
    stubs, rs, (a,) = start_replicas(1, stub_factory, router_factory, redis_server, "t9")
    c = rs.client
    before = share(a, "updates_received")
    for i, sent_ms in enumerate([int(time.time() * 1000) + 86400000, 0]):
        c.xadd("t9:stream", {"b": batch([(1, 0, [1 + i, 2, 3], 0)], sent_ms=sent_ms, replica=0xa1 + i)})
        wait_for(lambda: share(a, "updates_received") >= before + 1 + i, DEADLINE, 0.05, "applied")
        assert 0 <= share(a, "lag_seconds") < 60, (sent_ms, share(a, "lag_seconds"))


def test_wrong_type_stream_key_backs_off(stub_factory, router_factory, redis_server):
    """The stream key replaced by a string: every XREAD is refused and the link starts over,
    with the back-off doubling as for any failure (it reconnected about ten times a second),
    and sharing resumes once the key is a stream again."""
    stubs, rs, (a,) = start_replicas(1, stub_factory, router_factory, redis_server, "t10",
                                     reconnect_min_ms=100, reconnect_max_ms=2000)
    c = rs.client
    c.delete("t10:stream")
    c.set("t10:stream", "not a stream")
    wait_for(lambda: share(a, "reconnects") >= 1, DEADLINE, 0.05, "the first reconnect")
    first = share(a, "reconnects")
    time.sleep(4)   # a window to count in, not synchronisation
    n = share(a, "reconnects") - first
    assert n <= 8, "%d reconnects in 4 s" % n
    c.delete("t10:stream")
    wait_for(lambda: share(a, "connected") == 1 and share(a, "reconnects") > first + n, DEADLINE, 0.05,
             "sharing back")


def test_oversize_snapshot_is_skipped_unread(stub_factory, router_factory, redis_server):
    """A snapshot over redis.snapshot_max_bytes (here 2 MiB against 64 KiB) is refused before
    it is read (STRLEN), counted, and skipped: the replica gets ready, and does not reconnect to
    read it again (it used to be read whole, time out, and be read again forever)."""
    stubs, rs, (a,) = start_replicas(1, stub_factory, router_factory, redis_server, "t11",
                                     snapshot_max_bytes=65536)
    c = rs.client
    c.set("t11:snapshot:00000000000000cc", b"x" * (2 << 20))
    c.zadd("t11:snapshots", {"00000000000000cc": 9e15})
    b = router_factory(share_config(stubs, rs, "t11", snapshot_max_bytes=65536))
    wait_for(lambda: curl(b.url("/health")).status == 200, DEADLINE, 0.05, "B ready")
    wait_for(lambda: share(b, "rejected") >= 1, DEADLINE, 0.05, "the snapshot refused")
    assert share(b, "connected") == 1 and share(b, "reconnects") == 0
    assert share(b, "replies_too_large") == 0   # never read


def test_oversize_stream_entry_is_refused_while_it_arrives(stub_factory, router_factory, redis_server):
    """A stream entry far over what one read may bring (8 MiB against batches of 4 KiB) is
    refused while it arrives, counted, and the link starts over with back-off; routing goes on."""
    stubs, rs, (a,) = start_replicas(1, stub_factory, router_factory, redis_server, "t12",
                                     batch_max_bytes=4096, reconnect_min_ms=100,
                                     reconnect_max_ms=2000)
    rs.client.xadd("t12:stream", {"b": b"x" * (8 << 20)})
    wait_for(lambda: share(a, "replies_too_large") >= 1, DEADLINE, 0.05, "the entry refused")
    assert curl(a.url("/health")).status == 200
    assert curl(a.url("/v1/completions"), completion("still routing")).status == 200


def test_oversize_stream_entry_is_skipped_and_sharing_goes_on(stub_factory, router_factory,
                                                             redis_server):
    """After a stream read refused for its size, entries are sized before they are read: the
    one too large is skipped unread (counted as rejected), the batches around it are applied,
    and the link does not read it again."""
    stubs, rs, (a,) = start_replicas(1, stub_factory, router_factory, redis_server, "t13",
                                     batch_max_bytes=4096, reconnect_min_ms=100,
                                     reconnect_max_ms=500)
    c = rs.client
    before = share(a, "updates_received")
    c.xadd("t13:stream", {"b": batch([(1, 0, [1, 2, 3], 0)], replica=0xb1)})
    c.xadd("t13:stream", {"b": b"x" * (8 << 20)})
    c.xadd("t13:stream", {"b": batch([(1, 0, [4, 5, 6], 0)], replica=0xb2)})
    wait_for(lambda: share(a, "updates_received") >= before + 2, DEADLINE, 0.05,
             "the batches on both sides of the large entry applied")
    assert share(a, "replies_too_large") >= 1 and share(a, "rejected") >= 1
    reconnects = share(a, "reconnects")
    c.xadd("t13:stream", {"b": batch([(1, 0, [7, 8, 9], 0)], replica=0xb3)})
    wait_for(lambda: share(a, "updates_received") >= before + 3, DEADLINE, 0.05, "a later batch")
    assert share(a, "reconnects") == reconnects and share(a, "connected") == 1
