# Two entry points: `make demo` and `make test`. Each builds .venv first when it is
# missing or older than the files that define it; a set-up venv costs only a stat.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PIP     := $(BIN)/python -m pip
CONSTR  := requirements/constraints.txt
STAMP   := $(VENV)/.installed
# mindtorch (seed 002's MSAdapter scenario) needs MindSpore 2.7 / numpy<2: a venv of its own
MT_VENV  := .venv-mindtorch
MT_STAMP := $(MT_VENV)/.installed

.PHONY: demo test venv mindtorch-venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml $(CONSTR) requirements/install_vllm.sh Makefile
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check -c $(CONSTR) -e '.[test,msprobe]'
	bash requirements/install_vllm.sh $(BIN)/python
	@touch $(STAMP)

mindtorch-venv: $(MT_STAMP)

$(MT_STAMP): requirements/mindtorch-constraints.txt requirements/install_mindtorch.sh
	bash requirements/install_mindtorch.sh $(PY) $(MT_VENV)
	@touch $(MT_STAMP)

demo: $(STAMP)
	$(BIN)/python recipes/demo.py

test: $(STAMP) $(MT_STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(MT_VENV) demo_output
