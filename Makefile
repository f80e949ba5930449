# The two commands a newcomer needs: `make run` and `make test`.
# Both install what they need first (scripts/setup.sh is idempotent).
BUILD_DIR ?= build
FUZZ_DIR ?= build-fuzz
JOBS ?= $(shell nproc)
WERROR ?= ON
FUZZ_SECONDS ?= 15
MODEL ?= models/SmolLM2-135M-Instruct.Q4_1.gguf

.PHONY: all setup build run test format-check ctest pytest san-build sanitize fuzz clean format bench-cpu bench-serve

all: build

setup:
	@bash scripts/setup.sh

build: setup
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release -DRILL_WERROR=$(WERROR) >/dev/null
	@cmake --build $(BUILD_DIR) -j $(JOBS)

run: build
	@$(BUILD_DIR)/rill serve $(MODEL)

ctest: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

pytest: build
	@if ls tests/integration/test_*.py >/dev/null 2>&1; then \
	  RILL_BINARY=$(abspath $(BUILD_DIR))/rill .venv/bin/pytest -q tests/integration; fi

# One clang build with ASan + UBSan (and libFuzzer's coverage hooks) on every
# library serves both the sanitized test run and the fuzzers: the unit tests
# and the server integration tests run on it, then each fuzz target.
SAN_FLAGS := -gline-tables-only -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
san-build: setup
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="$(SAN_FLAGS)" \
	  -DRILL_FUZZ=ON -DRILL_TESTS=ON -DRILL_BENCH=OFF -DRILL_CUDA=OFF -DRILL_WERROR=OFF >/dev/null
	@cmake --build $(FUZZ_DIR) -j $(JOBS)

# Sanitizer findings abort the test that hit them (halt_on_error).
SAN_ENV := ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
sanitize: san-build
	@cd $(FUZZ_DIR) && $(SAN_ENV) ctest --output-on-failure -j $(JOBS) -LE gpu
	@$(SAN_ENV) RILL_BINARY=$(abspath $(FUZZ_DIR))/rill RILL_SANITIZED=1 .venv/bin/pytest -q tests/integration

fuzz: san-build
	@for f in tests/fuzz/*_fuzz.cpp; do \
	  name=$$(basename $$f _fuzz.cpp); mkdir -p $(FUZZ_DIR)/corpus/$$name; \
	  echo "fuzz: $$name for $(FUZZ_SECONDS)s"; \
	  if ! $(FUZZ_DIR)/tests/fuzz/fuzz_$$name -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 \
	       -timeout=10 -artifact_prefix=$(FUZZ_DIR)/corpus/$$name- \
	       $(FUZZ_DIR)/corpus/$$name tests/fuzz/corpus/$$name > $(FUZZ_DIR)/fuzz_$$name.log 2>&1; then \
	    tail -n 40 $(FUZZ_DIR)/fuzz_$$name.log; echo "fuzz: $$name FAILED (input saved under $(FUZZ_DIR)/corpus/)"; exit 1; \
	  fi; grep -E "^Done [0-9]+ runs" $(FUZZ_DIR)/fuzz_$$name.log; \
	done

test: format-check ctest pytest sanitize fuzz

# Side-by-side CPU benchmark with llama.cpp (installs llama-cpp-python into
# .venv-tools on first use); results in build/bench/ and docs/perf.md.
# BENCH_TYPES=Q4_K_M,Q8_0 (any llama-quantize types): per quant type on a
# random-weight Llama-3.2-1B-shape model against llama-bench instead.
BENCH_TYPES ?=
bench-cpu: build
	@bash bench/run_cpu_bench.sh --wait-quiet 600 $(if $(BENCH_TYPES),--types $(BENCH_TYPES))

# rill serve vs rill bench direct (decode tok/s, TTFT), a load generator at
# concurrency 1/8/32 and 1,024 open idle streams; JSON in build/bench/.
bench-serve: build
	@python3 bench/e2e/serve_bench.py --rill $(BUILD_DIR)/rill --model $(MODEL) --out $(BUILD_DIR)/bench/serve_bench.json

# Formatting is mechanical: .clang-format decides, `make format` applies it,
# and `make test` (so CI) fails on any file it would change.
FORMAT_FILES = $$(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
format:
	@clang-format -i $(FORMAT_FILES)

format-check: setup
	@clang-format --dry-run -Werror $(FORMAT_FILES) || { echo "format-check: run 'make format'"; exit 1; }

clean:
	rm -rf $(BUILD_DIR) $(FUZZ_DIR)
