# pcrouter: the two commands a user needs are `make run` and `make test`.
# Every target installs what is missing first (Debian 12 packages, apt-get, only when missing).

BUILD      ?= build
ASAN_BUILD ?= build-asan
PY         := /usr/bin/python3

# Build: compilers, meson, and the libraries found through pkg-config.
BUILD_PKGS := gcc pkg-config meson ninja-build libevent-dev libnghttp2-dev libssl-dev \
              libxxhash-dev libjansson-dev libcjson-dev libhiredis-dev libhttp-parser-dev
# Run and test: real clients and servers the tests start themselves.
TEST_PKGS  := curl openssl nghttp2-client redis-server python3 python3-pytest python3-h2
# Benchmarks: the proxies we compare with, the load generators, the plots.
BENCH_PKGS := wrk haproxy nginx-light gnuplot-nox

.PHONY: all build deps deps-test deps-bench run test bench bench-routing bench-sweep bench-proxies bench-hashring clean

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

$(BUILD)/build.ninja:
	meson setup $(BUILD) --buildtype=release

$(ASAN_BUILD)/build.ninja:
	meson setup $(ASAN_BUILD) --buildtype=debug -Db_sanitize=address,undefined -Db_lundef=false

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

build-asan: deps $(ASAN_BUILD)/build.ninja
	ninja -C $(ASAN_BUILD)

run: deps-test build
	$(PY) bench/demo.py --build $(BUILD)

test: deps-test build build-asan
	$(PY) test/run.py $(BUILD) $(ASAN_BUILD)

bench: deps-bench build bench-hashring bench-proxies bench-routing

bench-hashring: build
	$(BUILD)/bench/hashring/bench_hashring

bench-proxies: deps-bench build
	$(PY) bench/proxies.py --build $(BUILD)

# WORKLOAD=shared_prefix|chat|agentic|conversation|mooncake|all [LOAD=light|knee|past],
# BEFORE=another/build/dir (adds its pcrouter's cache_aware as a row); QUICK=1 for a smoke run.
bench-routing: deps-bench build
	$(PY) bench/routing.py --build $(BUILD) $(if $(WORKLOAD),--workload $(WORKLOAD)) \
	  $(if $(LOAD),--load $(LOAD)) $(if $(BEFORE),--before $(BEFORE))

# cache_aware's knobs on every workload and load in the offline simulator (bench/sweep.py).
bench-sweep: build
	$(PY) bench/sweep.py --build $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
