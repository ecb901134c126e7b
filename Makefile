# pcrouter: the two commands a user needs are `make run` and `make test`.
# Every target installs what is missing first (Debian 12 packages, apt-get, only when missing).

BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
PY         := /usr/bin/python3
PREFIX     ?= /usr/local
# DESTDIR (empty by default) stages an install under another root, as packagers do.

# Build: compilers, meson, and the libraries found through pkg-config.
BUILD_PKGS := gcc pkg-config meson ninja-build libevent-dev libnghttp2-dev libssl-dev \
              libxxhash-dev libjansson-dev libcjson-dev libhiredis-dev libhttp-parser-dev
# Run and test: real clients and servers the tests start themselves (redis-server and its
# Python client for the index sharing), groff for the manual page, YAML and the Kubernetes
# object models for the manifests' offline check.
TEST_PKGS  := curl openssl nghttp2-client redis-server python3 python3-pytest python3-h2 \
              python3-redis groff-base python3-yaml python3-kubernetes
# Benchmarks: the proxies we compare with, the load generators, the plots.
BENCH_PKGS := wrk haproxy nginx-light gnuplot-nox

.PHONY: all build build-asan build-tsan deps deps-test deps-bench run test install bench bench-routing bench-proxies bench-hashring clean

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

# ThreadSanitizer: the worker threads, the index-update bus, the shared counters.
$(TSAN_BUILD)/build.ninja:
	meson setup $(TSAN_BUILD) --buildtype=debug -Db_sanitize=thread -Db_lundef=false

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

build-asan: deps $(ASAN_BUILD)/build.ninja
	ninja -C $(ASAN_BUILD)

build-tsan: deps $(TSAN_BUILD)/build.ninja
	ninja -C $(TSAN_BUILD)

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

bench: deps-bench build bench-hashring bench-proxies bench-routing

bench-hashring: build
	$(BUILD)/bench/hashring/bench_hashring

bench-proxies: deps-bench build
	$(PY) bench/proxies.py --build $(BUILD)

bench-routing: deps-bench build
	$(PY) bench/routing.py --build $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
