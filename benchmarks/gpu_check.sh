#!/usr/bin/env bash
# The GPU checks in one command (issue 37, item 5), for a lent GPU machine (docs/performance.md,
# "Running the GPU checks"): build the C extension, run `pytest -m cuda`, then
# `benchmarks/overhead.py --device cuda` side by side with msprobe, all within ~8 minutes; the
# logs and a summary go into one tarball in $OUT (only a few files come back from that machine).
#
# Run from the repository root:  bash benchmarks/gpu_check.sh
# Wheels the image lacks (msgspec, isal, mindstudio-probe, pytest ...) travel in .whl/ (see the
# docs) and are installed with pip --no-index into a private folder; none is required.
# Environment: GPU_CHECK_BUDGET_S (default 470: what all steps may take together),
# GPU_CHECK_STEPS (overhead.py steps, default 5), GPU_CHECK_SIZES (default 12x768).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpu_check_out}
LOGS=$(mktemp -d /tmp/gpu_check.XXXXXX)
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-470}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export CUBLAS_WORKSPACE_CONFIG=:4096:8          # deterministic cuBLAS for the deterministic cases
export TSPROBE_QUIET=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
step() {    # step NAME SECONDS CMD...: run CMD with a time limit, its output in $LOGS/NAME.log
    local name=$1 limit=$2; shift 2
    local remaining; remaining=$(left)
    (( limit > remaining )) && limit=$remaining
    if (( limit < 10 )); then
        echo "$name: skipped (time budget spent)" | tee -a "$LOGS/summary.txt"; return 0
    fi
    local t0; t0=$(date +%s)
    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    echo "$name: rc=$rc in $(( $(date +%s) - t0 ))s (limit ${limit}s)" | tee -a "$LOGS/summary.txt"
    return 0
}

{
    echo "gpu_check $(date -u +%FT%TZ) at $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    $PY -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
} >"$LOGS/summary.txt" 2>&1
cat "$LOGS/summary.txt"

# 1. wheels the image lacks, into a private site folder (never the image's own)
if compgen -G ".whl/*.whl" >/dev/null; then
    step wheels 90 $PY -m pip install --no-index --no-deps --target /tmp/gpu_check_site .whl/*.whl
    export PYTHONPATH=$PYTHONPATH:/tmp/gpu_check_site
fi
# 2. the C extension, in place
step build 120 $PY setup.py -q build_ext --inplace
$PY -c "import pytest" 2>/dev/null || echo "pytest: not installed (put its wheels in .whl/)" | tee -a "$LOGS/summary.txt"

# 3. the cuda tests (they skip, saying why, where torch sees no GPU)
step pytest_cuda 300 $PY -m pytest -m cuda -q -rs -p no:cacheprovider tests/cuda
tail -5 "$LOGS/pytest_cuda.log" 2>/dev/null | tee -a "$LOGS/summary.txt"

# 4. speed on the GPU, side by side with msprobe (the flag comes with overhead.py's CUDA mode)
if $PY benchmarks/overhead.py --help 2>/dev/null | grep -q -- "--device"; then
    step overhead_cuda 400 $PY benchmarks/overhead.py --device cuda --steps "${GPU_CHECK_STEPS:-5}" \
        --sizes "${GPU_CHECK_SIZES:-12x768}"
    tail -25 "$LOGS/overhead_cuda.log" 2>/dev/null >>"$LOGS/summary.txt"
else
    echo "overhead_cuda: skipped (benchmarks/overhead.py has no --device option in this tree)" | tee -a "$LOGS/summary.txt"
fi

echo "total $(( $(date +%s) - START ))s" | tee -a "$LOGS/summary.txt"
tar -czf "$OUT/gpu_check_logs.tar.gz" -C "$LOGS" .
cp "$LOGS/summary.txt" "$OUT/gpu_check_summary.txt"
rm -rf "$LOGS"
