# The two commands a newcomer needs: `make run` and `make test`.
# Both install what they need first (scripts/setup.sh is idempotent).
BUILD_DIR ?= build
FUZZ_DIR ?= build-fuzz
JOBS ?= $(shell nproc)
WERROR ?= $(if $(CI),ON,OFF)
FUZZ_SECONDS ?= 15
MODEL ?= models/SmolLM2-135M-Instruct.Q4_1.gguf

.PHONY: all setup build run test ctest pytest fuzz clean format bench-cpu bench-serve

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

fuzz: setup
	@# Every library is instrumented (coverage + ASan + UBSan), not just the harness.
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
	  -DRILL_FUZZ=ON -DRILL_TESTS=OFF -DRILL_BENCH=OFF >/dev/null
	@cmake --build $(FUZZ_DIR) -j $(JOBS) --target $$(cd tests/fuzz && ls *_fuzz.cpp | sed 's/_fuzz.cpp//; s/^/fuzz_/')
	@for f in tests/fuzz/*_fuzz.cpp; do \
	  name=$$(basename $$f _fuzz.cpp); mkdir -p $(FUZZ_DIR)/corpus/$$name; \
	  echo "fuzz: $$name for $(FUZZ_SECONDS)s"; \
	  if ! $(FUZZ_DIR)/tests/fuzz/fuzz_$$name -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 \
	       -timeout=10 -artifact_prefix=$(FUZZ_DIR)/corpus/$$name- \
	       $(FUZZ_DIR)/corpus/$$name tests/fuzz/corpus/$$name > $(FUZZ_DIR)/fuzz_$$name.log 2>&1; then \
	    tail -n 40 $(FUZZ_DIR)/fuzz_$$name.log; echo "fuzz: $$name FAILED (input saved under $(FUZZ_DIR)/corpus/)"; exit 1; \
	  fi; grep -E "^Done [0-9]+ runs" $(FUZZ_DIR)/fuzz_$$name.log; \
	done

test: ctest pytest fuzz

# Side-by-side CPU benchmark with llama.cpp (installs llama-cpp-python into
# .venv-tools on first use); results in build/bench/ and docs/perf.md.
bench-cpu: build
	@bash bench/run_cpu_bench.sh --wait-quiet 600

# rill serve vs rill bench direct (decode tok/s, TTFT), a load generator at
# concurrency 1/8/32 and 1,024 open idle streams; JSON in build/bench/.
bench-serve: build
	@python3 bench/e2e/serve_bench.py --rill $(BUILD_DIR)/rill --model $(MODEL) --out $(BUILD_DIR)/bench/serve_bench.json

format:
	@clang-format -i $$(git ls-files '*.cpp' '*.h')

clean:
	rm -rf $(BUILD_DIR) $(FUZZ_DIR)
