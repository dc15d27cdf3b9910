# The two quick-start commands (README): each sets up .venv if needed, then runs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
# TORCH=cu130 (or another of download.pytorch.org's CUDA builds): the lock's torch, pinned, as that CUDA build,
# for a machine with an NVIDIA GPU (docs/training.md#training-on-a-gpu); empty: the lock's torch as it resolves
TORCH ?=
TORCH_VERSION := $(shell sed -n 's/^torch==//p' requirements.lock)
READY := $(VENV)/.ready$(if $(TORCH),-$(TORCH))
ARGS ?=
# the suite's processes (pytest-xdist), each on its share of the CPUs (tests/conftest.py); 0 runs it in one
TEST_WORKERS ?= 2
PYTEST := $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile

.PHONY: run test test-durations test-fast lint bench table4 search-table gpu-bundle gpu-check stack-up stack-down clean-work

# What is installed must be byte-compiled: these machines set PYTHONDONTWRITEBYTECODE=1, so without it every
# process compiles torch and the rest from source. compileall does it on every core, faster than pip's own one-core
# compile (both measured: docs/studies/test-suite-times.md, "Measured for the set-up"); a few packages ship files
# that do not compile (test data, other Pythons' syntax), as pip skips them
$(READY): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-compile -r requirements.lock
	$(VENV)/bin/python -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e .
ifneq ($(TORCH),)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --force-reinstall \
		--index-url https://download.pytorch.org/whl/$(TORCH) "torch==$(TORCH_VERSION)+$(TORCH)"
	$(VENV)/bin/python -c "import torch; assert torch.version.cuda, torch.__version__; print('torch', torch.__version__)"
endif
	touch $@

## run: the main job, the whole pipeline on the embedded default data (outputs in work/)
run: $(READY)
	$(VENV)/bin/dssm run --workdir work $(ARGS)

## test: the whole test suite (a real Spark session, real data from ../shared/data where present)
test: $(READY)
	$(VENV)/bin/ruff check .
	$(PYTEST) $(ARGS)

## test-durations: the whole suite, recording each module's time in tests/durations.json (make test runs the
## longest modules first by it); commit the file after a change that makes a module much longer or shorter
test-durations: $(READY)
	$(PYTEST) --record-durations tests/durations.json $(ARGS)

## test-fast: ruff, then the unit tests only (not those marked `integration`: real data, multi-process runs)
test-fast: $(READY)
	$(VENV)/bin/ruff check .
	$(PYTEST) -m "not integration" $(ARGS)

## bench: the data jobs' throughput, clean, vocab and negatives (benchmarks/jobs_bench.py; BENCHMARKS.md)
bench: $(READY)
	$(VENV)/bin/python benchmarks/jobs_bench.py $(ARGS)

## table4: Palangi et al.'s Table IV on Home Depot from the raw judged file (needs ../shared/data)
table4: $(READY)
	$(VENV)/bin/python reproductions/homedepot_table4.py $(ARGS)

## search-table: what `dssm search` serves on Home Depot (LSTM-RNN, fine-tuned MiniLM, BM25 fused), 3 seeds (needs ../shared/data)
search-table: $(READY)
	$(VENV)/bin/python reproductions/homedepot_search.py $(ARGS)

## gpu-bundle: what gpu-check reads, from a Home Depot work dir (its negatives and vocabulary), the judged file and
## all-MiniLM-L6-v2 (float16) into gpu-bundle/, ~58 MB: for a GPU machine without Spark or MLflow (docs/training.md)
gpu-bundle: $(READY)
	$(VENV)/bin/python benchmarks/gpu_check.py bundle --workdir bench-work/hd --out gpu-bundle $(ARGS)

## gpu-check: on a machine with a CUDA GPU, the GPU check (benchmarks/gpu_check.py): environment, a smoke training per
## encoder, the throughput table, the transformer's GPU fine-tune chosen on dev queries, exported to gpu-out/
gpu-check:
	$(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,python3) benchmarks/gpu_check.py run \
		$(if $(wildcard gpu-bundle),--bundle gpu-bundle) --out gpu-out $(ARGS)

## stack-up / stack-down: the local stack (Prefect server, MLflow server, Spark master + worker); infra/README.md
stack-up: $(READY)
	$(VENV)/bin/dssm stack up $(ARGS)

stack-down: $(READY)
	$(VENV)/bin/dssm stack down $(ARGS)

clean-work:
	rm -rf work
