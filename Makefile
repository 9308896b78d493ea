# Two entry points: `make demo` and `make test`. Each builds .venv first when it is
# missing or older than the files that define it; a set-up venv costs only a stat.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PIP     := $(BIN)/python -m pip
CONSTR  := requirements/constraints.txt
STAMP   := $(VENV)/.installed

.PHONY: demo test venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml $(CONSTR) requirements/install_vllm.sh Makefile
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check -c $(CONSTR) -e '.[test,msprobe,fast]'
	bash requirements/install_vllm.sh $(BIN)/python
	$(BIN)/python -m ts_core.native
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python recipes/demo.py

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) demo_output
