"""test_replay.py: a real trace through pcrouter raises the hit rate the pods deliver.

Replays a slice of mooncake_trace_1000.jsonl (tool/agent prompts sharing system-prompt
prefixes, plus multi-turn conversations) at high speed through pcrouter in front of eight
simulated vLLM pods with small caches, once with cache_aware and once with round_robin, each
on cold pods, and compares the delivered hit rate read from the pods' /metrics
(vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total).

Binaries come from $PCR_BUILD (default build/): pcrouter, bench/sim/vllm_sim, bench/sim/replay.
Ports come from the OS; readiness is read from the processes' stderr; every process is
stopped in teardown; every wait has a deadline.
"""
import os
import re
import subprocess
import sys
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import routing  # noqa: E402
from conftest import wait_for  # noqa: E402

BUILD = os.path.abspath(os.environ.get("PCR_BUILD") or os.path.join(ROOT, "build"))
PODS = ["pod-%d" % i for i in range(8)]
LIMIT = 300            # rows of the trace (about 50 s of trace time)
TIME_SCALE = 20        # about three seconds of wall time per replay
CAPACITY = 32768       # tokens per pod: the slice's working set does not fit one pod
MAX_INPUT = 16384      # prompts cut to this (prefixes kept), so any one fits a pod
SIM_EXTRA = ["--prefill-us-per-token", "5", "--itl-ms", "2"]   # keep the pods unsaturated


def trace_path():
    return os.path.join(routing.traces_dir(), "mooncake_trace_1000.jsonl")


def replay_through(policy, tmp_path):
    sims = router = None
    try:
        sims = routing.Sims(BUILD, PODS, TIME_SCALE, CAPACITY, extra=SIM_EXTRA)
        router = routing.Router(BUILD, routing.router_config(sims.urls, policy, CAPACITY),
                                str(tmp_path))
        return routing.run_replay(BUILD, trace_path(), router.url, list(sims.urls.values()),
                                  TIME_SCALE, LIMIT, str(tmp_path / ("%s.json" % policy)),
                                  policy, cap=16, timeout=120, progress=False,
                                  extra=["--timeout-s", "30", "--max-input-tokens",
                                         str(MAX_INPUT)])
    finally:
        if router:
            router.stop()
        if sims:
            sims.stop()


def test_binaries_exist():
    for exe in ("pcrouter", "bench/sim/vllm_sim", "bench/sim/replay"):
        path = os.path.join(BUILD, exe)
        assert os.path.exists(path), "%s is not built (PCR_BUILD=%s)" % (path, BUILD)


def test_cache_aware_delivers_more_hits_than_round_robin(tmp_path):
    if not os.path.exists(os.path.join(BUILD, "pcrouter")):
        pytest.fail("pcrouter is not built yet: %s/pcrouter is missing" % BUILD)
    rr = replay_through("round_robin", tmp_path)
    ca = replay_through("cache_aware", tmp_path)
    for r in (rr, ca):
        assert r["requests"] == LIMIT
        assert r["errors"] == 0, r["error_kinds"]
        assert r["completed"] == LIMIT
        assert r["prefix_queries_tokens"] > 0
        assert 0 <= r["hit_rate"] <= 1
    # Every request was counted by exactly one pod.
    assert sum(p["requests"] for p in ca["pods"]) == LIMIT
    assert ca["hit_rate"] > rr["hit_rate"], (
        "cache_aware %.4f <= round_robin %.4f (ceiling %.4f)" % (
            ca["hit_rate"], rr["hit_rate"], ca.get("ceiling", float("nan"))))


def test_unstreamed_rows_ask_for_whole_answers_and_count_everywhere_but_ttft(tmp_path):
    """--unstreamed 0.5: about half the rows, the same ones each run, ask for a whole answer.
    Each of those is read to its end and counts as complete only if it is a JSON completion
    with its usage; those rows count at the pods (hit rate, shares) and not in TTFT."""
    sims = None
    runs = []
    try:
        sims = routing.Sims(BUILD, PODS[:2], TIME_SCALE, CAPACITY, extra=SIM_EXTRA)
        for k in range(2):
            runs.append(routing.run_replay(
                BUILD, trace_path(), list(sims.urls.values())[0], list(sims.urls.values()),
                TIME_SCALE, 100, str(tmp_path / ("u%d.json" % k)), "u%d" % k, cap=16,
                timeout=120, progress=False,
                extra=["--timeout-s", "30", "--max-input-tokens", str(MAX_INPUT),
                       "--unstreamed", "0.5"]))
    finally:
        if sims:
            sims.stop()
    for r in runs:
        assert r["errors"] == 0, r["error_kinds"]
        assert r["completed"] == 100
        assert 30 <= r["completed_streams"] <= 70, r["completed_streams"]
        assert len(r["ttft_ms_model_sorted"]) == r["completed_streams"]
    assert runs[0]["completed_streams"] == runs[1]["completed_streams"]
    assert sum(p["requests"] for p in runs[0]["pods"]) == 100


def test_step_engine_streams_every_token_and_replay_reports_itl(tmp_path):
    """vllm_sim --engine step writes each stream's token at the end of every engine step, one
    event per token, and replay reports inter-token latency, time per output token, output
    tokens and throughput; pcrouter takes routing.policy "random" and spreads the requests over
    both pods. The checks are counts and orderings, not times."""
    trace = tmp_path / "short.jsonl"
    with open(trace, "w") as f:
        for k in range(40):
            f.write('{"timestamp": %d, "input_length": 1024, "output_length": 24, '
                    '"hash_ids": [%d, %d]}\n' % (100 * k, 1 + k % 4, 100 + k))
    sims = router = None
    try:
        sims = routing.Sims(BUILD, PODS[:2], 10, CAPACITY, extra=["--engine", "step"])
        assert any("step engine" in line for line in sims.proc.lines), sims.proc.lines
        router = routing.Router(BUILD, routing.router_config(sims.urls, "random", CAPACITY),
                                str(tmp_path))
        r = routing.run_replay(BUILD, str(trace), router.url, list(sims.urls.values()), 10, 0,
                               str(tmp_path / "step.json"), "random", timeout=120,
                               progress=False, extra=["--timeout-s", "30"])
    finally:
        if router:
            router.stop()
        if sims:
            sims.stop()
    assert r["completed"] == 40 and r["errors"] == 0, r
    # One event per token: 23 gaps per stream of 24 tokens.
    assert r["itl_gaps"] == 40 * 23, r["itl_gaps"]
    assert r["output_tokens_total"] == 40 * 24, r
    assert r["output_tokens"]["mean"] == 24 and r["output_tokens"]["p99"] == 24, r
    for k in ("itl_ms_model", "tpot_ms_model", "ttft_ms_model", "e2e_ms_model"):
        s = r[k]
        assert 0 < s["p50"] <= s["p90"] <= s["p99"], (k, s)
        assert s["mean"] > 0, (k, s)
    assert r["output_tokens_per_s_model"] > 0 and r["requests_per_s_model"] > 0, r
    flat = routing.flat_figures(r)
    assert flat["itl_mean_ms"] == r["itl_ms_model"]["mean"], flat
    assert flat["ttft_p99_ms"] == r["ttft_ms_model"]["p99"], flat
    assert flat["output_tokens_per_s"] == r["output_tokens_per_s_model"], flat
    assert all(p["requests"] > 0 for p in r["pods"]), r["pods"]   # random used both pods


def test_pods_in_another_zone_answer_a_round_trip_later(tmp_path):
    """vllm_sim --rtt-ms: each request reaches the pod's engine one round trip (model time)
    later, so no first token comes sooner than that; replay --far-pods counts the requests and
    bytes that went to those pods; a client that leaves while its request crosses zones costs
    the pod nothing. Lower bounds and counts, not times."""
    trace = tmp_path / "few.jsonl"
    with open(trace, "w") as f:
        for k in range(12):
            f.write('{"timestamp": %d, "input_length": 512, "output_length": 8, '
                    '"hash_ids": [%d]}\n' % (50 * k, 1 + k))
    sims = None
    try:
        sims = routing.Sims(BUILD, ["far-0"], 10, CAPACITY,
                            extra=["--engine", "step", "--rtt-ms", "2000"])
        url = sims.urls["far-0"]
        r = routing.run_replay(BUILD, str(trace), url, [url], 10, 0,
                               str(tmp_path / "far.json"), "far", timeout=60, progress=False,
                               extra=["--far-pods", "near-0,far-0"])
        assert r["completed"] == 12 and r["errors"] == 0, r
        assert r["ttft_ms_model"]["p50"] >= 2000, r["ttft_ms_model"]
        assert r["cross_zone_requests"] == 12 and r["cross_zone_request_share"] == 1, r
        assert r["cross_zone_byte_share"] == 1 and r["body_bytes"] > 12 * 2048, r
        near = routing.run_replay(BUILD, str(trace), url, [url], 10, 0,
                                  str(tmp_path / "near.json"), "near", timeout=60,
                                  progress=False, extra=["--far-pods", "near-0"])
        assert near["cross_zone_request_share"] == 0 and near["cross_zone_byte_share"] == 0
        # Clients that give up after 50 ms of wall clock, inside the 200 ms crossing.
        gone = tmp_path / "gone.json"
        exe = os.path.join(BUILD, "bench", "sim", "replay")
        subprocess.run([exe, "--trace", str(trace), "--target", url, "--time-scale", "10",
                        "--timeout-s", "0.05", "--no-progress", "--json", str(gone)],
                       capture_output=True, timeout=60)
        # The pod counts a client that left while its request crossed. A slow build (ASan)
        # may let a crossing end before the client notices its own timeout, so not all twelve
        # need be counted; without the feature none would be.
        def cancelled():
            with urllib.request.urlopen(url + "/metrics", timeout=10) as m:
                text = m.read().decode()
            c = re.search(r'kind="cancelled",pod="far-0"\} (\d+)', text)
            return int(c.group(1)) if c else 0
        wait_for(lambda: cancelled() >= 6, 20, 0.05, "the pod seeing clients leave")
        assert cancelled() <= 12
        after = routing.run_replay(BUILD, str(trace), url, [url], 10, 0,
                                   str(tmp_path / "after.json"), "after", timeout=60,
                                   progress=False)
        assert after["completed"] == 12 and after["errors"] == 0, after
        assert sims.proc.p.poll() is None   # still up
    finally:
        if sims:
            sims.stop()
