# Two entry points: `make demo` and `make test`. Each builds .venv first when it is
# missing or older than the files that define it; a set-up venv costs only a stat.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PIP     := $(BIN)/python -m pip
CONSTR  := requirements/constraints.txt
STAMP   := $(VENV)/.installed

.PHONY: demo test venv clean browser

venv: $(STAMP)

$(STAMP): pyproject.toml $(CONSTR) requirements/install_vllm.sh Makefile
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check -c $(CONSTR) -e '.[test,msprobe,fast]'
	bash requirements/install_vllm.sh $(BIN)/python
	$(BIN)/python -m ts_core.native
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python recipes/demo.py

# Debian's chromium for the headless-browser test of report.html's model tree
# (tests/compare/test_report_tree.py). A no-op when chromium is there. Installing needs root
# (CI runs as root) and takes ~1 min on a fresh Debian 12 (no recommends: the desktop extras
# chromium recommends - printing, samba, perl, udev - are not needed headless; the fonts are).
# When it cannot be installed, `make test` goes on and that test skips, saying why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	        --no-install-recommends chromium fonts-liberation; } || \
	      echo "make browser: apt-get could not install chromium: the report.html browser test will be skipped"; \
	  else echo "make browser: chromium not installed and not root: the report.html browser test will be skipped"; fi

test: $(STAMP) browser
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) demo_output
