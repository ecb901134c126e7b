#!/usr/bin/python3
"""bench/demo.py: `make run`: simulated vLLM pods plus pcrouter on conf/pcrouter.json.

Reads the config, starts one simulated pod (bench/sim/vllm_sim) per backend on the backend's
own port, starts build/pcrouter -c conf/pcrouter.json, waits until it prints `ready`, prints a
few curl commands to try, then forwards the router's log until Ctrl-C and stops everything.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from routing import ROOT, Router, Sims  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default=os.path.join(ROOT, "conf", "pcrouter.json"))
    ap.add_argument("--time-scale", type=float, default=4,
                    help="pods run this many times faster than a real GPU (default 4)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    with open(args.config) as f:
        cfg = json.load(f)
    names, ports = [], []
    for b in cfg.get("backends", []):
        u = urllib.parse.urlsplit(b["url"])
        names.append(b["name"])
        ports.append(u.port or 80)

    sims = router = None
    stop = {"now": False}

    def on_signal(signum, frame):
        stop["now"] = True
    try:
        print("demo: starting %d simulated vLLM pods (time scale %g)..." % (
            len(names), args.time_scale), flush=True)
        sims = Sims(build, names, args.time_scale, ports=ports)
        for n in names:
            print("  %s  %s" % (n, sims.urls[n]))
        print("demo: starting pcrouter -c %s ..." % os.path.relpath(args.config, ROOT),
              flush=True)
        router = Router(build, None, None, config_path=args.config)
        url = router.url
        print("""
pcrouter is ready on %(u)s. Try, in another terminal:

  # a completion (run it twice: the second answer shows usage.prompt_tokens_details.cached_tokens)
  curl -s %(u)s/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model":"sim-8b","prompt":"You are a helpful assistant. Answer briefly and precisely. Q: what is a KV cache? A:","max_tokens":16}'

  # a streaming chat completion (Server-Sent Events, token by token)
  curl -sN %(u)s/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model":"sim-8b","messages":[{"role":"user","content":"Tell me a story about routers."}],"max_tokens":48,"stream":true}'

  # the router's metrics (Prometheus text), and one pod's own
  curl -s %(u)s/metrics
  curl -s %(p)s/metrics

Router log follows. Ctrl-C stops the router and the pods.
""" % {"u": url, "p": sims.urls[names[0]]}, flush=True)
        # From here the router's stderr is echoed as it arrives.
        seen = len(router.proc.lines)
        router.proc.echo = True
        for line in router.proc.lines[:seen]:
            print(line, file=sys.stderr)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        while not stop["now"] and router.proc.p.poll() is None:
            _wait(router, 0.5)
        if router.proc.p.poll() is not None and not stop["now"]:
            print("demo: pcrouter exited with %s" % router.proc.p.returncode, file=sys.stderr)
            return 1
        return 0
    except KeyboardInterrupt:
        return 0
    except Exception as e:
        print("demo: %s" % e, file=sys.stderr)
        return 1
    finally:
        print("\ndemo: stopping...", file=sys.stderr, flush=True)
        if router:
            router.stop()
        if sims:
            sims.stop()
        print("demo: stopped", file=sys.stderr, flush=True)


def _wait(router, seconds):
    try:
        router.proc.p.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pass


if __name__ == "__main__":
    sys.exit(main())
