# Two entry points: `make demo` and `make test`. Each builds .venv first when it is
# missing or older than the files that define it; a set-up venv costs only a stat.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PIP     := $(BIN)/python -m pip
CONSTR  := requirements/constraints.txt
STAMP   := $(VENV)/.installed
# mindtorch (seed 002's MSAdapter scenario) needs MindSpore 2.7 / numpy<2: a venv of its own.
# Its script keeps its own stamp (a hash of the pins), so running it when set up costs a hash.
MT_VENV  := .venv-mindtorch

.PHONY: demo test venv mindtorch-venv clean browser

venv: $(STAMP)

# The editable install also compiles the C extension ts_core.native._kernels in place (setup.py),
# so a change to its sources reinstalls; `python -m ts_core.native` then says whether it is in use.
# editable_mode=compat: a plain path in a .pth, not setuptools' import finder, whose import
# (pathlib, urllib, ipaddress) cost every python start here ~25 ms before `tsprobe compare`'s head
# start could begin (a pip install from a wheel has no finder either).
NATIVE  := setup.py $(wildcard ts_core/native/*.c ts_core/native/*.h)

$(STAMP): pyproject.toml $(CONSTR) requirements/install_vllm.sh Makefile $(NATIVE)
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check -c $(CONSTR) -e '.[test,msprobe,fast]' \
	    --config-settings editable_mode=compat
	bash requirements/install_vllm.sh $(BIN)/python
	$(BIN)/python -m ts_core.native
	@touch $(STAMP)

# Built on every machine that can reach the package index; where pip cannot get a pinned wheel
# the script says why (in $(MT_VENV)/UNBUILDABLE), exits 0, and tests/mindtorch skip quoting it.
mindtorch-venv:
	bash requirements/install_mindtorch.sh $(PY) $(MT_VENV)

demo: $(STAMP)
	$(BIN)/python recipes/demo.py

# Debian's chromium for the headless-browser test of report.html's model tree
# (tests/compare/test_report_tree.py). A no-op when chromium is there. Installing needs root
# (CI runs as root): 174 packages, 2.5 min on a fresh Debian 12 chroot on the loaded shared
# 2-core machine (30 s of CPU) (no recommends: the desktop extras
# chromium recommends - printing, samba, perl, udev - are not needed headless; the fonts are).
# When it cannot be installed, `make test` goes on and that test skips, saying why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	        --no-install-recommends chromium fonts-liberation; } || \
	      echo "make browser: apt-get could not install chromium: the report.html browser test will be skipped"; \
	  else echo "make browser: chromium not installed and not root: the report.html browser test will be skipped"; fi

test: $(STAMP) mindtorch-venv browser
	$(BIN)/python -m pytest -q -rs

clean:
	rm -rf $(VENV) $(MT_VENV) demo_output
