# Thin wrapper over CMake presets. `make run` and `make test` are the two commands of the README.
SHELL := /bin/bash
JOBS ?= $(shell nproc)
# Debian's Python with python3-torch (the python3 first on PATH may be another); MEGAMOE_PYTHON=... picks one
PY := $(or $(MEGAMOE_PYTHON),/usr/bin/python3)
BUILD := build/release
APT_PACKAGES := cmake make gcc g++ libdnnl-dev libopenmpi-dev openmpi-bin libucx-dev pkg-config \
                python3-torch python3-numpy python3-pytest iproute2 \
                libtorch-dev python3-pip python3-venv python3-setuptools python3-wheel \
                python3-matplotlib clang libclang-rt-14-dev \
                python3-tqdm debootstrap
# Labels of the C tests that also run under ThreadSanitizer (runtime and executor). The
# simulated-host tests (label hosts) are left out there: entering a host's mount namespace
# (setns) needs a single-threaded process, and TSan's runtime keeps a thread of its own; the
# engine's data path still runs under TSan in the *_engine tests (UCX between ranks of one host).
# The ops and kernels labels too (the shipped synchronisation, annotated: src/base/tsan.h), less
# test_kernels_gemm, the single-thread GEMM sweep, too slow instrumented (>150 s) and with no
# threads of its own (test_kernels_gemm_concurrency covers the kernels' threading).
TSAN_LABELS ?= shmem|multicore|tsan|ops|kernels
TSAN_EXCLUDE ?= ^test_kernels_gemm$$
# `make fuzz`: seconds per libFuzzer target (docs/reliability.md).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=

# ctest of preset $(1) with arguments $(2); the harness appends each skipped C test case to
# Testing/skipped_cases.txt (tests/harness/harness.h), listed after the run: a skip is never
# a silent pass.
define mm_ctest
	@mkdir -p build/$(1)/Testing && rm -f build/$(1)/Testing/skipped_cases.txt
	@MEGAMOE_TEST_SKIP_LOG=$(CURDIR)/build/$(1)/Testing/skipped_cases.txt ctest --preset $(1) $(2); \
	rc=$$?; log=build/$(1)/Testing/skipped_cases.txt; \
	if [ -s $$log ]; then echo "skipped C test cases ($$(wc -l < $$log)):"; sort $$log | sed 's/^/  /'; fi; \
	exit $$rc
endef

.PHONY: abi-layout deps build run test test-c test-python test-asan test-asan-python test-tsan test-report fuzz fuzz-coverage bench report docs clean \
        debian13-root test-debian13 debian13-run

deps:
	@missing=""; \
	for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "make deps: installing$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends$$missing >/dev/null; \
	  else \
	    echo "make deps: missing Debian packages; run:"; \
	    echo "  sudo apt-get install -y$$missing"; \
	    exit 1; \
	  fi; \
	fi

build: deps
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)

run: deps build
	$(BUILD)/bin/megamoe run $(ARGS)

test: deps build test-c test-python

test-c:
	$(call mm_ctest,release,-j $(JOBS))

test-python:
	PYTHONPATH=$(CURDIR)/python MEGAMOE_BUILD_DIR=$(CURDIR)/$(BUILD) $(PY) -m pytest -q tests

# The real `megamoe bench report --quick` (a few minutes, so not part of `make test`, whose
# report test renders from tiny benchmark runs instead; docs/bench_report.md).
test-report: deps build
	PYTHONPATH=$(CURDIR)/python MEGAMOE_BUILD_DIR=$(CURDIR)/$(BUILD) $(PY) -m pytest -q \
	  -m report_quick tests/tools/test_bench_report.py

test-asan: deps
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	$(call mm_ctest,asan,-j $(JOBS))

# The Python-driven operator (V2/V1, companion, serving) and experts suites under ASan+UBSan (after `make test-asan`): the
# asan build's libmegamoe in Debian's interpreter, the sanitizer runtimes preloaded (Python and
# torch are not built with them; leaks off: the interpreter's own are not ours). Sanitizer builds
# have no C++ Torch adapter, so the ctypes path runs. ~3 min on the 2-core EPYC.
ASAN_PY_TESTS ?= tests/ops/test_ops_v2.py tests/ops/test_ops_v2_validation.py tests/ops/test_ops_v1.py \
                 tests/ops/test_ops_api.py tests/moe/test_experts_autograd.py tests/moe/test_experts_torch.py \
                 tests/ops/test_companion_ops.py tests/ops/test_companion_blocks.py tests/serve/test_serve.py
test-asan-python: deps
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 MEGAMOE_TEST_TIMEOUT_MULTIPLIER=4 \
	  PYTHONPATH=$(CURDIR)/python MEGAMOE_BUILD_DIR=$(CURDIR)/build/asan $(PY) -m pytest -q $(ASAN_PY_TESTS)

test-tsan: deps
	cmake --preset tsan >/dev/null
	cmake --build --preset tsan -j $(JOBS)
	$(call mm_ctest,tsan,-j $(JOBS) -L "$(TSAN_LABELS)" -LE hosts -E "$(TSAN_EXCLUDE)")

fuzz: deps
	cmake --preset fuzz >/dev/null
	cmake --build --preset fuzz -j $(JOBS)
	tests/fuzz/run_fuzz.sh build/fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# Line coverage of the fuzzed files by the corpora (after `make fuzz`).
fuzz-coverage: deps
	tests/fuzz/coverage.sh $(FUZZ_TARGETS)

bench: deps build
	$(BUILD)/bin/megamoe bench all

# The performance report of this machine (docs/bench_report.md): REPORT_DIR=... to choose
# where, REPORT_ARGS=--quick for the short one.
REPORT_DIR ?= build/report
report: deps build
	$(BUILD)/bin/megamoe bench report --out $(REPORT_DIR) $(REPORT_ARGS)

docs: build
	{ printf '# Environment variables\n\nGenerated by `megamoe info --config --markdown` from the one table in\n`src/base/env_table.h` (run `make docs` after changing it; a test compares the two).\nParsing is strict: a bad value is an error naming the variable and the accepted form.\nPrecedence: default < environment < explicit API parameters.\n\n'; \
	  $(BUILD)/bin/megamoe info --config --markdown; } > docs/env.md

# Record the public struct layouts after appending fields or adding a struct (the ABI scheme,
# include/megamoe/version.h; tests/install/test_abi_layout.py checks them).
abi-layout: build
	MEGAMOE_BUILD_DIR=$(CURDIR)/$(BUILD) $(PY) tests/install/abi_layout.py --update

# The Debian 13 (trixie) leg: python3-torch 2.6, gcc 14, oneDNN 3.7, UCX 1.18, Open MPI 5 in a root
# built once with debootstrap from Debian's mirror under build/debian13 and reused
# (tools/debian13/debian13.sh; root only). `make test-debian13` builds megamoe in it and runs the
# C and Python tests; `make debian13-run CMD='python3 my_script.py'` runs a command there in this
# checkout with the package importable.
debian13-root:
	tools/debian13/debian13.sh root

test-debian13:
	tools/debian13/debian13.sh test

debian13-run:
	@if [ -z "$$CMD" ]; then echo "usage: make debian13-run CMD='command'"; exit 2; fi
	tools/debian13/debian13.sh run "$$CMD"

clean:
	rm -rf build
