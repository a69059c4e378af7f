#!/usr/bin/env bash
# GPU check for corral.mask_kernels, for a lent GPU box (Python 3.12 with torch, triton and
# transformers, but without xgrammar and its dependencies). Finishes in under 8 minutes:
#   1. installs the cp312 manylinux wheels the lead put in .whl/ at the repo root (xgrammar,
#      apache-tvm-ffi, pydantic, pydantic-core, annotated-types, typing-inspection, llguidance;
#      fetched elsewhere with `python3 -m pip download --no-deps --only-binary=:all:
#      --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .whl N==V`)
#      into /tmp/site, offline, and puts it on PYTHONPATH; then installs corral editable.
#      The tests also need pytest (+ pluggy, iniconfig, packaging), hypothesis (+ attrs,
#      sortedcontainers) and numpy: if the box lacks them, add their wheels to .whl/ too —
#      step 1 reports what is missing;
#   2. runs tests/mask_kernels on CUDA (the cuda-parametrised cases; Triton kernels compiled for
#      real) and on CPU;
#   3. runs bench/kernels.py on CUDA with a bounded grid (--budget-s) so the whole stays < 8 min.
# Everything goes to $OUT/gpu_check.log when $OUT is set (the device runner's output folder),
# else to bench/results/gpu_check.log. Exit status: non-zero if the tests failed.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG_DIR="${OUT:-bench/results}"
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/gpu_check.log"
exec > >(tee "$LOG") 2>&1
PY=python3
echo "== gpu_check $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

echo "== 1. install offline wheels and corral"
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
  echo "!! no wheels in .whl/: xgrammar columns will be missing from the bench"
fi
$PY -m pip install -q --no-deps --no-build-isolation -e . || echo "!! editable install failed"
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
$PY -c "import xgrammar; print('xgrammar', xgrammar.__version__)" || true
for mod in pytest hypothesis numpy; do
  $PY -c "import $mod" 2>/dev/null || echo "!! $mod is missing: put its wheel (and its deps) in .whl/"
done

echo "== 2. tests (cuda + cpu)"
timeout 240 $PY -m pytest -q -p no:cacheprovider tests/mask_kernels -rs --durations=8
TEST_RC=$?
echo "tests exit status: $TEST_RC"

echo "== 3. benchmark"
timeout 270 $PY bench/kernels.py --device cuda --budget-s 200
echo "bench exit status: $?"
echo "== done $(date -u +%FT%TZ); tests exit status $TEST_RC"
exit $TEST_RC
