#!/usr/bin/env bash
# Build the mindtorch venv (MindSpore 2.7.0 + mindnlp 0.5.1's mindtorch + transformers 4.57.1)
# from requirements/mindtorch-constraints.txt:
#
#   requirements/install_mindtorch.sh PYTHON VENV_DIR      (make: python3 .venv-mindtorch)
#
# Idempotent: exits at once when VENV_DIR holds this script's stamp for the current pins.
# Why a venv of its own and why --no-deps: see the header of mindtorch-constraints.txt.
#
# Exit status: 0 when the venv is ready. When pip reports that a pinned wheel cannot be had here
# (no wheel for this Python or platform, or the package index unreachable), the venv cannot be
# built on this machine: the reason goes to VENV_DIR/UNBUILDABLE, a banner says so, and the exit
# status is 0 so that `make test` runs the rest of the suite; tests/mindtorch then skip, quoting
# that file. Every other failure (a pin resolving to another version, mindtorch not importing)
# exits 1. Each run retries from the start, so a machine that can reach the index builds it.
set -euo pipefail

PY="${1:?usage: install_mindtorch.sh PYTHON VENV_DIR}"
VENV="${2:?usage: install_mindtorch.sh PYTHON VENV_DIR}"
HERE="$(cd "$(dirname "$0")" && pwd)"
CONSTR="$HERE/mindtorch-constraints.txt"
PINS_HASH="$(cat "$CONSTR" "$0" | sha256sum | cut -c1-16)"
STAMP="$VENV/.mindtorch-$PINS_HASH.ok"

if [ -f "$STAMP" ]; then
    exit 0
fi

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
UNBUILDABLE="$VENV/UNBUILDABLE"
rm -f "$UNBUILDABLE"
VPY="$VENV/bin/python"
PIP_LOG="$VENV/pip-install.log"

# pip install -c CONSTR ARGS...; on failure either record why the venv cannot be built here
# (exit 0, see the header) or stop (exit 1), showing pip's own message either way.
pip_install() {
    if "$VPY" -m pip install --disable-pip-version-check -c "$CONSTR" "$@" >"$PIP_LOG" 2>&1; then
        return 0
    fi
    tail -n 25 "$PIP_LOG" >&2
    local cause
    cause="$(grep -m1 -E 'No matching distribution found|Could not find a version that satisfies|NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|Name or service not known|Network is unreachable|ReadTimeoutError|ConnectTimeoutError' "$PIP_LOG" || true)"
    # A pin with no candidate at all reads as a conflict with only the constraint itself in it
    # (no "X depends on Y" line, which a real clash between pins would have).
    if [ -z "$cause" ] && grep -q ResolutionImpossible "$PIP_LOG" && ! grep -q ' depends on ' "$PIP_LOG"; then
        cause="no candidate for $(grep 'The user requested (constraint)' "$PIP_LOG" | sed 's/.*(constraint) //' | tr '\n' ' ')"
    fi
    if [ -z "$cause" ]; then
        echo "install_mindtorch: pip failed installing $* into $VENV (log: $PIP_LOG); see above" >&2
        exit 1
    fi
    {
        echo "the mindtorch venv cannot be built on this machine: pip could not get a pinned package"
        echo "($(uname -sm), $("$VPY" -c 'import sys; print("Python %d.%d" % sys.version_info[:2])'),"
        echo " pins: requirements/mindtorch-constraints.txt)."
        echo "pip: $cause"
        echo "Retry with \`make mindtorch-venv\` once the package index is reachable."
    } > "$UNBUILDABLE"
    {
        echo "##################################################################################"
        echo "install_mindtorch: NOT BUILT; tests/mindtorch will be skipped. $UNBUILDABLE:"
        sed 's/^/    /' "$UNBUILDABLE"
        echo "##################################################################################"
    } >&2
    exit 0
}

echo "[install_mindtorch] mindnlp + accelerate (no deps) ..." >&2
pip_install --no-deps mindnlp accelerate
echo "[install_mindtorch] MindSpore 2.7.0, transformers 4.57.1 and what mindtorch imports ..." >&2
pip_install mindspore numpy transformers diffusers ml-dtypes ftfy typing_extensions pandas openpyxl \
    pytz einops matplotlib pyyaml psutil

# Guard: the pins mindtorch needs, as installed.
"$VPY" "$HERE/check_pins.py" "$CONSTR" install_mindtorch mindnlp mindspore numpy transformers

# Importable, and `import torch` is mindtorch (the device is set before mindtorch loads).
"$VPY" -c "
import mindspore as ms
ms.set_device('CPU')
import mindtorch, torch, transformers
assert isinstance(torch.ones(1), ms.Tensor), 'import torch did not resolve to mindtorch'
" || { echo "install_mindtorch: $VENV is installed but mindtorch does not import" >&2; exit 1; }

rm -f "$VENV"/.mindtorch-*.ok
touch "$STAMP"
echo "[install_mindtorch] $VENV ready ($(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1))" >&2
