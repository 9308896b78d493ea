#!/usr/bin/env bash
# Build the mindtorch venv (MindSpore 2.7.0 + mindnlp 0.5.1's mindtorch + transformers 4.57.1)
# from requirements/mindtorch-constraints.txt:
#
#   requirements/install_mindtorch.sh PYTHON VENV_DIR      (make: python3 .venv-mindtorch)
#
# Idempotent: exits at once when VENV_DIR holds this script's stamp for the current pins.
# Why a venv of its own and why --no-deps: see the header of mindtorch-constraints.txt.
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
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install -q --disable-pip-version-check -c "$CONSTR")

echo "[install_mindtorch] mindnlp + accelerate (no deps) ..." >&2
"${PIP[@]}" --no-deps mindnlp accelerate
echo "[install_mindtorch] MindSpore 2.7.0, transformers 4.57.1 and what mindtorch imports ..." >&2
"${PIP[@]}" mindspore numpy transformers diffusers ml-dtypes ftfy typing_extensions pandas openpyxl \
    pytz einops matplotlib pyyaml psutil

# Guard: the pins mindtorch needs, as installed.
"$VPY" - "$CONSTR" <<'PYEOF'
import importlib.metadata as md, sys
pins = {}
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if "==" in line:
        n, v = line.split("==", 1)
        pins[n.strip().lower()] = v.strip()
bad = [f"{n} {md.version(n)} != pinned {pins[n]}"
       for n in ("mindnlp", "mindspore", "numpy", "transformers") if md.version(n) != pins[n]]
if bad:
    sys.exit("install_mindtorch: " + "; ".join(bad))
PYEOF

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
