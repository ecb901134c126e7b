# pcrouter: the two commands a user needs are `make run` and `make test`.
# Every target installs what is missing first (Debian 12 packages, apt-get, only when missing).

BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
FUZZ_S     ?= 60
FUZZ_RUNS  ?= 0
PY         := /usr/bin/python3
ATTACK_CONNS ?= 1,100,10000
PREFIX     ?= /usr/local
# DESTDIR (empty by default) stages an install under another root, as packagers do.

# Build: compilers, meson, and the libraries found through pkg-config.
BUILD_PKGS := gcc g++ pkg-config meson ninja-build libevent-dev libnghttp2-dev libssl-dev \
              libxxhash-dev libjansson-dev libcjson-dev libyajl-dev libsimdjson-dev libhiredis-dev \
              libhttp-parser-dev liburing-dev libc-ares-dev \
              libmsgpack-dev libmsgpack-cxx-dev libzmq3-dev
# Run and test: real clients and servers the tests start themselves (redis-server and its
# Python client for the index sharing; dnsmasq-base: a DNS server the discovery tests control,
# without a system service), groff for the manual page, YAML and the Kubernetes object models
# for the manifests' offline check, promtool (prometheus) for the metrics, the alert rules and
# their unit tests, libseccomp's Python binding to refuse pcrouter the io_uring system calls
# as a container runtime's profile does, binutils' nm for the calls between router/'s folders,
# ZMQ and msgpack for Python to read the simulator's KV events as a router would.
TEST_PKGS  := curl openssl nghttp2-client redis-server python3 python3-pytest python3-h2 \
              python3-hpack python3-hyperframe python3-redis dnsmasq-base \
              groff-base python3-yaml python3-kubernetes prometheus python3-seccomp binutils \
              python3-zmq python3-msgpack
# Benchmarks: the proxies we compare with, the load generators, the plots.
BENCH_PKGS := wrk haproxy nginx-light gnuplot-nox linux-perf
# Fuzzing: clang with libFuzzer and the sanitizer runtimes; llvm for llvm-symbolizer, so crash
# reports name functions and lines.
FUZZ_PKGS  := clang-14 libclang-rt-14-dev llvm-14

.PHONY: all build build-asan build-tsan build-fuzz deps deps-test deps-bench deps-fuzz run test \
        install fuzz bench bench-routing bench-sweep bench-proxies bench-proxies-tls bench-hashring bench-kv bench-attacks bench-metrics \
        bench-resilience bench-tenancy clean

all: build

# Install only the packages dpkg does not already have; `apt-get update` runs only then.
define ensure_pkgs
	@missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
endef

deps:
	$(call ensure_pkgs,$(BUILD_PKGS))

deps-test: deps
	$(call ensure_pkgs,$(TEST_PKGS))

deps-bench: deps-test
	$(call ensure_pkgs,$(BENCH_PKGS))

deps-fuzz: deps
	$(call ensure_pkgs,$(FUZZ_PKGS))

$(BUILD)/build.ninja:
	meson setup $(BUILD) --buildtype=release

$(ASAN_BUILD)/build.ninja:
	meson setup $(ASAN_BUILD) --buildtype=debug -Db_sanitize=address,undefined -Db_lundef=false

# ThreadSanitizer: the worker threads, the index-update bus, the shared counters.
$(TSAN_BUILD)/build.ninja:
	meson setup $(TSAN_BUILD) --buildtype=debug -Db_sanitize=thread -Db_lundef=false

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

build-asan: deps $(ASAN_BUILD)/build.ninja
	ninja -C $(ASAN_BUILD)

build-tsan: deps $(TSAN_BUILD)/build.ninja
	ninja -C $(TSAN_BUILD)

# The fuzz build: clang, libFuzzer, ASan+UBSan; only the fuzz targets are built in it.
$(FUZZ_BUILD)/build.ninja:
	CC=clang-14 CXX=clang++-14 meson setup $(FUZZ_BUILD) --buildtype=debugoptimized -Dfuzz=true \
	  -Db_sanitize=address,undefined -Db_lundef=false

build-fuzz: deps-fuzz $(FUZZ_BUILD)/build.ninja
	ninja -C $(FUZZ_BUILD) fuzzers

# Every fuzz target for FUZZ_S seconds (make fuzz FUZZ_S=600), or FUZZ_RUNS inputs each
# (make fuzz FUZZ_RUNS=10000000 FUZZ_S=36000); see test/fuzz/README.md.
fuzz: build-fuzz
	FUZZ_RUNS=$(FUZZ_RUNS) $(PY) test/fuzz/run.py $(FUZZ_BUILD) $(FUZZ_S)

run: deps-test build
	$(PY) bench/demo.py --build $(BUILD)

test: deps-test build build-asan build-tsan
	$(PY) test/run.py $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)

# `make install PREFIX=/usr DESTDIR=/tmp/stage`: the release build, installed by meson (binary,
# man page, example config). The prefix is set before building, since meson records install
# paths when it regenerates the build.
install: deps $(BUILD)/build.ninja
	meson configure $(BUILD) -Dprefix=$(PREFIX)
	ninja -C $(BUILD)
	meson install -C $(BUILD) --no-rebuild $(if $(DESTDIR),--destdir "$(abspath $(DESTDIR))")

bench: deps-bench build bench-hashring bench-kv bench-metrics bench-proxies bench-routing bench-attacks bench-tenancy \
       bench-resilience

bench-hashring: build
	$(BUILD)/bench/hashring/bench_hashring

# vLLM's KV-event payloads decoded per second, against msgpack-c's own C unpacker; then
# the blocks a second one worker applies to its table.
bench-kv: build
	$(BUILD)/bench/kv/bench_kv
	$(BUILD)/bench/kv/bench_kvtable

bench-metrics: build
	$(BUILD)/bench/metrics/bench_metrics

bench-proxies: deps-bench build
	$(PY) bench/proxies.py --build $(BUILD)

# Plain text, TLS from the clients and TLS to the pods, each pinned and unpinned at one and at
# the default thread count, with new and resumed handshakes; then memory per idle keep-alive
# connection; then the latency each proxy adds at a moderate rate (docs/BENCHMARKS.md).
# QUICK=1 for a smoke run.
bench-proxies-tls: deps-bench build
	$(PY) bench/proxies.py --build $(BUILD) --modes plain,tls,tls-pods --matrix --handshakes \
		--json bench/out/proxies-tls.json
	$(PY) bench/proxies.py --build $(BUILD) --modes tls --idle 10000 --reps 1 --duration 1 \
		--only pcrouter,haproxy,pcrouter_w0,haproxy_default --json bench/out/proxies-idle.json
	$(PY) bench/proxies.py --build $(BUILD) --modes plain,tls --pin none --latency 4000 \
		--latency-only --only direct,haproxy,pcrouter --no-two-threads \
		$(if $(filter-out 0,$(QUICK)),,--reps 15 --duration 4) --bodies 2048 \
		--json bench/out/proxies-latency.json

# WORKLOAD=shared_prefix|chat|agentic|conversation|mooncake|all [LOAD=light|knee|past],
# BEFORE=another/build/dir (adds its pcrouter's cache_aware as a row); QUICK=1 for a smoke run;
# MISCONFIG=2 (pods hold half the capacity the config says: feedback off and on);
# WORKERS=N (pcrouter's worker threads); CAPACITY=N (KV tokens per pod, over the workload's);
# REPEAT=N (runs of each policy, or of each MISCONFIG setup: medians, TTFT pooled over the
# runs, and with MISCONFIG the share feedback won back); UNSTREAMED=F (that fraction of the
# requests asks for a whole answer, "stream": false); ROLES=2p6d (with WORKLOAD: disaggregated,
# the same pods collocated against split, PD_MODES=auto,always,never, on the step engine).
bench-routing: deps-bench build
	$(PY) bench/routing.py --build $(BUILD) $(if $(WORKLOAD),--workload $(WORKLOAD)) \
	  $(if $(LOAD),--load $(LOAD)) $(if $(BEFORE),--before $(BEFORE)) \
	  $(if $(MISCONFIG),--misconfig $(MISCONFIG) --replicas 1) $(if $(WORKERS),--workers $(WORKERS)) \
	  $(if $(CAPACITY),--capacity-tokens $(CAPACITY)) $(if $(REPEAT),--repeat $(REPEAT)) \
	  $(if $(UNSTREAMED),--unstreamed $(UNSTREAMED)) $(if $(ENGINE),--engine $(ENGINE)) \
	  $(if $(ZONES),--zones $(ZONES)) $(if $(TIME_SCALE),--time-scale $(TIME_SCALE)) \
	  $(if $(ROLES),--roles $(ROLES)) $(if $(PD_MODES),--pd-modes $(PD_MODES))

# cache_aware's knobs on every workload and load in the offline simulator (bench/sweep.py);
# UNSTREAMED=F as for bench-routing.
bench-sweep: build
	$(PY) bench/sweep.py --build $(BUILD) $(if $(UNSTREAMED),--unstreamed $(UNSTREAMED))

# The attacks of the hardening tests at full scale: the router's RSS and CPU, and a
# well-behaved client's p99, during each (needs only the test packages).
bench-attacks: deps-test build
	$(PY) bench/attacks.py --build $(BUILD) --conns $(ATTACK_CONNS)

bench-resilience: deps-bench build
	$(PY) bench/resilience.py --build $(BUILD)

# Tenants sharing the pool through flow control (bench/tenancy.py): an interactive tenant beside
# a batch flood, and two equal tenants with long and short prompts. QUICK=1: 10 s runs;
# REPEAT=N: medians of N runs of each setup; ENGINE=step: pods with chunked prefill.
bench-tenancy: deps-bench build
	$(PY) bench/tenancy.py --build $(BUILD) $(if $(QUICK),--quick) $(if $(REPEAT),--repeat $(REPEAT)) \
	  $(if $(ENGINE),--engine $(ENGINE))

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
