#!/usr/bin/env bash
# The GPU check: cgvm's CuPy backend tested and measured on an NVIDIA GPU, in under 8 minutes.
#
#   scripts/gpu_check.sh OUTDIR            the whole check (results in OUTDIR)
#   scripts/gpu_check.sh --check OUTDIR    only say whether this machine can run it, and what is missing
#
# For a machine with an NVIDIA driver, Python 3.12 with CuPy (cupy-cuda13x) and PyTorch CUDA installed,
# and no package index reachable. Everything else travels as wheels in ./wheels (made beforehand by
# scripts/gpu_wheels.sh on a networked machine; the lists are scripts/gpu_requirements*.txt). Steps:
#   1. environment: scripts/gpu_env.py -> OUTDIR/environment.txt, environment.json (GPU, driver, CuPy,
#      cuDNN, torch, packages); stops here with --check, or when a GPU run cannot go ahead
#   2. a venv with the system's packages (.venv-gpu; GPU_CHECK_VENV), the wheels and cgvm from this
#      checkout installed with --no-index (PYTHONPATH=checkout when an editable install is impossible)
#   3. the GPU tests (tests/backend, tests/ops with both backends, DLPack, NCCL under mpiexec) -> junit_gpu.xml, pytest_gpu.txt
#   4. the GPU benchmarks (python -m benchmarks.gpu) -> benchmarks.md, benchmarks.json
#   5. the whole suite with CGVM_BACKEND=cupy, for the time left -> junit_suite.xml, pytest_suite.txt
#   6. OUTDIR/summary.md: the counts of 3 and 5, the benchmark table, what ran out of time
# Budget: GPU_CHECK_BUDGET_S seconds in all (default 470); each step runs under `timeout`: the GPU tests
# 35% of what is left after the install (150 s at most), the benchmarks 60% of the rest (200 s at most),
# the whole suite what remains. GPU_CHECK_ALLOW_NO_GPU=1 goes on without a GPU (to try the steps).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODE=run
if [ "${1:-}" = "--check" ]; then MODE=check; shift; fi
if [ $# -ne 1 ]; then
    echo "usage: scripts/gpu_check.sh [--check] OUTDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-470}
WHEELS=${GPU_CHECK_WHEELS:-$ROOT/wheels}
VENV=${GPU_CHECK_VENV:-$ROOT/.venv-gpu}
PY=${GPU_CHECK_PYTHON:-$(command -v python3.12 || command -v python3)}
cd "$ROOT"

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
log() { echo "[gpu_check $(( $(date +%s) - START ))s] $*" | tee -a "$OUT/log.txt"; }
# run_for SECONDS CMD...: CMD under a timeout that interrupts like ^C (pytest still writes its junit xml)
run_for() {
    local limit=$1; shift
    if [ "$limit" -lt 10 ]; then log "skipped (no time left): $*"; return 124; fi
    timeout -s INT -k 20 "$limit" "$@"
}

: > "$OUT/log.txt"
log "mode $MODE, checkout $ROOT, python $PY, wheels $WHEELS, budget ${BUDGET}s"

# 1. environment -------------------------------------------------------------------------------
"$PY" scripts/gpu_env.py --wheels "$WHEELS" --json "$OUT/environment.json" > "$OUT/environment.txt" 2>&1
READY=$?
cat "$OUT/environment.txt"
if [ "$MODE" = check ]; then
    log "check only: environment report in $OUT/environment.txt"
    exit $READY
fi
if [ $READY -ne 0 ] && [ "${GPU_CHECK_ALLOW_NO_GPU:-0}" = 1 ]; then
    log "not ready, going on anyway (GPU_CHECK_ALLOW_NO_GPU=1: a dry run of the steps; GPU tests skip)"
elif [ $READY -ne 0 ]; then
    log "this machine cannot run the GPU check (see $OUT/environment.txt)"
    { echo "# GPU check: not run"; echo; echo '```'; cat "$OUT/environment.txt"; echo '```'; } > "$OUT/summary.md"
    exit 1
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true

# 2. venv, wheels, cgvm ------------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv --system-site-packages "$VENV" 2>>"$OUT/log.txt" \
        || "$PY" -m venv --system-site-packages --without-pip "$VENV" 2>>"$OUT/log.txt" \
        || log "no venv could be made: the system Python is used"
fi
VPY=$PY
[ -x "$VENV/bin/python" ] && VPY=$VENV/bin/python
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
if [ -d "$WHEELS" ]; then
    for reqs in scripts/gpu_requirements.txt scripts/gpu_requirements_peers.txt; do
        "$VPY" -m pip install -q --no-index --find-links "$WHEELS" -r "$reqs" >>"$OUT/log.txt" 2>&1 && continue
        log "not every requirement of $reqs installs from $WHEELS; installing one at a time"
        grep -v '^\s*#' "$reqs" | grep -v '^\s*$' | while read -r req; do
            # no wheel of that name: nothing to install (the machine has it, or its tests skip)
            name=$(echo "$req" | sed 's/[<>=!~;[ ].*//' | tr 'A-Z.-' 'a-z__')
            if ! ls "$WHEELS" | tr 'A-Z.-' 'a-z__' | grep -q "^${name}_"; then
                log "no wheel of $req in $WHEELS"
                continue
            fi
            "$VPY" -m pip install -q --no-index --find-links "$WHEELS" "$req" >>"$OUT/log.txt" 2>&1 \
                || log "not installed: $req (tests needing it skip)"
        done
    done
else
    log "no wheel folder $WHEELS (scripts/gpu_wheels.sh makes it): only what the machine has is used"
fi
if "$VPY" -m pip install -q --no-index --no-deps --no-build-isolation -e . >>"$OUT/log.txt" 2>&1; then
    log "cgvm installed from the checkout (editable)"
else
    log "editable install failed (no setuptools?): cgvm runs from the checkout through PYTHONPATH"
fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export KERAS_BACKEND=torch
"$VPY" -m pip freeze > "$OUT/pip_freeze.txt" 2>/dev/null || true
XDIST=()
if "$VPY" -c "import xdist" 2>/dev/null; then XDIST=(-n "${GPU_CHECK_WORKERS:-8}" --dist loadfile); fi

# 3. the GPU tests -----------------------------------------------------------------------------
GPU_TESTS=(tests/backend tests/ops tests/interop/test_dlpack.py tests/frontends/caffe/test_cli.py tests/distributed/test_nccl_gpu.py)
log "GPU tests: ${GPU_TESTS[*]}"
T=$(( $(left) * 35 / 100 )); [ "$T" -gt 150 ] && T=150
# NVIDIA_TF32_OVERRIDE=0 for the tests: cuDNN would otherwise compute float32 convolutions in TF32, outside
# the op tables' float32 tolerances (the benchmarks leave TF32 on, as PyTorch's cuDNN convolutions do)
run_for "$T" env NVIDIA_TF32_OVERRIDE=0 "$VPY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" -rfEs -o junit_family=xunit2 \
    --junitxml="$OUT/junit_gpu.xml" "${GPU_TESTS[@]}" > "$OUT/pytest_gpu.txt" 2>&1
GPU_RC=$?
tail -n 3 "$OUT/pytest_gpu.txt" | tee -a "$OUT/log.txt"

# 4. the GPU benchmarks ------------------------------------------------------------------------
T=$(( $(left) * 60 / 100 )); [ "$T" -gt 200 ] && T=200
log "benchmarks (up to ${T}s)"
run_for "$T" "$VPY" -m benchmarks.gpu --out "$OUT/benchmarks.md" --json "$OUT/benchmarks.json" \
    --budget "$(( T - 15 ))" > "$OUT/benchmarks.txt" 2>&1
BENCH_RC=$?
tail -n 40 "$OUT/benchmarks.txt"

# 5. the whole suite on the CuPy backend -------------------------------------------------------
T=$(( $(left) - 15 ))
log "whole suite with CGVM_BACKEND=cupy (up to ${T}s)"
run_for "$T" env CGVM_BACKEND=cupy NVIDIA_TF32_OVERRIDE=0 "$VPY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" -rfE -o junit_family=xunit2 \
    --junitxml="$OUT/junit_suite.xml" > "$OUT/pytest_suite.txt" 2>&1
SUITE_RC=$?
tail -n 3 "$OUT/pytest_suite.txt" | tee -a "$OUT/log.txt"

# 6. summary -----------------------------------------------------------------------------------
"$VPY" scripts/gpu_summary.py "$OUT" --rc "gpu=$GPU_RC" --rc "benchmarks=$BENCH_RC" --rc "suite=$SUITE_RC" \
    > "$OUT/summary.md" 2>>"$OUT/log.txt"
log "done in $(( $(date +%s) - START ))s: $OUT/summary.md"
cat "$OUT/summary.md"
exit 0
