# tf_interlock: `make demo` and `make test` do all the set-up themselves.
PY ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test test-slow test-cluster demo benchmark cluster-benchmark onednn-effect device-check data bazel-test clean

setup: $(STAMP)

$(STAMP): requirements.txt
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -r requirements.txt
	# The library itself, editable: a script anywhere can import
	# tf_interlock (and layers) from this checkout (tests/test_install.py).
	$(PYTHON) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

# pytest-xdist: one pytest worker per core (2 here; WORKERS=0 runs in one
# process). --dist loadfile keeps each test file on one worker, so a file's
# module-scoped fixtures (a trained run) are built once. FLOOR=library,
# train or research runs one floor (tests/floors.py). See docs/testing.md.
WORKERS ?= 2
FLOOR ?=
XDIST := -n $(WORKERS) --dist loadfile --no-loadscope-reorder
ONLY := $(if $(FLOOR),$(FLOOR) and ,)

test: setup
	$(PYTHON) -m pytest -q --durations=10 $(XDIST) \
	  -m "$(ONLY)not cluster and not slow"

# The binaries under attack: dozens of processes each (bad flags, hostile
# files, signals, kill-and-resume, compare's refusals), and the research
# tools' binaries end to end. .ci/run runs them.
test-slow: setup
	$(PYTHON) -m pytest -q --durations=10 $(XDIST) \
	  -m "$(ONLY)slow and not cluster"

# placement=cluster with real worker processes on 127.0.0.1 (slow: each
# test starts its own train.worker processes and stops them).
# One process: each test already starts several (workers, a client).
test-cluster: setup
	$(PYTHON) -m pytest -q --durations=10 -m "$(ONLY)cluster"

# The offline default data set: Debian's dataset-fashion-mnist (IDX files).
FASHION_MNIST := /usr/share/datasets/fashion-mnist
DEMO_DIR ?= runs/demo

data:
	@if [ -r $(FASHION_MNIST)/train-images-idx3-ubyte.gz ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -q dataset-fashion-mnist; \
	else \
	  echo "Fashion-MNIST is missing: run 'sudo apt-get install" \
	    "dataset-fashion-mnist' (Debian/Ubuntu), or put the four IDX files" \
	    "in a folder and pass --source_dir=FOLDER." >&2; exit 1; \
	fi

# Trains the Fashion-MNIST ResNet-20 (K = 4, 2-wise, 4 simulated devices) for
# 300 steps, exports a SavedModel and evaluates it. Rerunning resumes.
demo: setup data
	$(PYTHON) -m train.train --preset=fashion_mnist_resnet --loop_block=1 \
	  --model_dir=$(DEMO_DIR)
	$(PYTHON) -m train.evaluate --model_dir=$(DEMO_DIR)

# MLP K = 4 on simulated devices vs plain Keras fit on all cores (its own
# process); every strategy on the threading plan the schedule model picks.
# Then the XLA table: each strategy (single and simulated placements) and
# plain Keras, with and without jit_compile, interleaved per repeat.
BENCH_OUT := docs/results/benchmark_mlp_k4_simulated
benchmark: setup
	$(PYTHON) -m research.benchmark --json_out=$(BENCH_OUT).json \
	  > $(BENCH_OUT).txt.new
	$(PYTHON) -m research.xla_benchmark --repeats=3 \
	  --out=$(BENCH_OUT)_xla.json >> $(BENCH_OUT).txt.new
	mv $(BENCH_OUT).txt.new $(BENCH_OUT).txt
	cat $(BENCH_OUT).txt

# K = 2 modules on two train.worker processes of one core each vs one
# simulated process (research/cluster_benchmark.py; starts and stops the workers).
cluster-benchmark: setup
	$(PYTHON) -m research.cluster_benchmark --model=mlp --num_workers=2

# oneDNN off vs on per preset (op costs in separate processes, and each
# strategy's step time through the schedule model).
onednn-effect: setup
	$(PYTHON) -m research.onednn_effect --out_dir=docs/results/onednn_effect

# Step time with one core (or GPU) per module, measured vs the schedule model,
# in under 8 minutes (research/device_check.py); degenerate (K = 2) on < 8 cores.
device-check: setup
	$(PYTHON) -m research.device_check --out_dir=runs/device_check

# Bazel (Debian's bazel-bootstrap 4.2.3, offline): BUILD is generated from the
# tree by tools/gen_build.py, and bazel-test fails while it is stale.
BAZEL ?= bazel
BAZEL_TEST_FLAGS ?= --local_test_jobs=2

.PHONY: build-file
build-file:
	$(PY) tools/gen_build.py

bazel-test: setup
	@command -v $(BAZEL) >/dev/null || { echo "bazel-test needs bazel:" \
	  "apt-get install bazel-bootstrap (Debian, 4.2.3)" >&2; exit 1; }
	$(PY) tools/gen_build.py --check
	$(BAZEL) test $(BAZEL_TEST_FLAGS) //...

clean:
	rm -rf $(VENV) runs
