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

clean:
	rm -rf $(VENV) runs
