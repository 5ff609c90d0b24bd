# tf_interlock: `make demo` and `make test` do all the set-up themselves.
PY ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test demo benchmark data bazel-test clean

setup: $(STAMP)

$(STAMP): requirements.txt
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -r requirements.txt
	touch $(STAMP)

test: setup
	$(PYTHON) -m pytest -q

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
