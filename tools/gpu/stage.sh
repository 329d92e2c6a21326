#!/usr/bin/env bash
# Here, from the project's root, before a lent GPU machine's first call (README, GPU runbook): builds the ignored
# folder .device/ with what that machine lacks, in folders that each travel beside the tree in one call (64 MiB a
# call in all):
#   .device/data1, .device/data2   the data root (Office-Caltech, MNIST, USPS, SVHN; SYN)
#   .device/whl                    finch-clust's wheel (11 kB)
#   .device/ray1, .device/ray2     with `ray`: the wheels of ray[default] (the version installed here) and of every
#                                  package it needs that the machine lacks, one archive in two parts (kit.py)
#   .device/data3, .device/data4   with `digit5`: MNIST-M, for FedPLVM's Digit-5
# Usage: bash tools/gpu/stage.sh [ray] [digit5]      (PYTHON: the interpreter with Ray; default .venv/bin/python)
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel); cd "$ROOT"
PY=${PYTHON:-.venv/bin/python}; [ -x "$PY" ] || PY=python3
RAY=0; DIGIT5=0
for a in "$@"; do case $a in ray) RAY=1 ;; digit5) DIGIT5=1 ;; *) echo "error: unknown argument $a; usage: bash tools/gpu/stage.sh [ray] [digit5]" >&2; exit 2 ;; esac; done
D=$("$PY" -c 'from benchmark.data import resolve_data_root; print(resolve_data_root(None))')
PIP_TARGET=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64)
rm -rf .device && mkdir -p .device/whl .device/data1/digits .device/data1/office_caltech10 .device/data2/digits
"$PY" -m pip download -q "${PIP_TARGET[@]}" -d .device/whl "finch-clust==$("$PY" -c 'from importlib.metadata import version; print(version("finch-clust"))')"
cp "$D"/office_caltech10/*.npz .device/data1/office_caltech10/
cp "$D"/digits/mnist_*.npz "$D"/digits/usps_*.npz "$D"/digits/svhn_*.npz .device/data1/digits/
cp "$D/SHA256SUMS" .device/data1/
cp "$D"/digits/syn_*.npz .device/data2/digits/
if [ $DIGIT5 = 1 ]; then
  mkdir -p .device/data3/digits .device/data4/digits
  cp "$D"/digits/mnistm_train_part0.npz "$D"/digits/mnistm_train_part1.npz "$D"/digits/mnistm_test_part0.npz .device/data3/digits/
  cp "$D"/digits/mnistm_train_part2.npz "$D"/digits/mnistm_train_part3.npz "$D"/digits/mnistm_test_part1.npz .device/data4/digits/
fi
if [ $RAY = 1 ]; then
  "$PY" tools/gpu/kit.py wheels .device/raywhl --extra default
  tar -cf .device/ray-wheels.tar -C .device/raywhl .
  "$PY" tools/gpu/kit.py split .device/ray-wheels.tar .device/ray --part-mib 60
  rm -rf .device/raywhl .device/ray-wheels.tar
fi
# what travels in each call: the tree (tracked and untracked, not ignored, files) and the carried folders
mib() { awk '{s += $1} END {printf "%.1f", s / 1048576}'; }
TREE=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | mib)
over=0
for d in .device/data* .device/ray*; do
  [ -d "$d" ] || continue
  size=$(find "$d" -type f -exec stat -c %s {} + | mib)
  [ "$d" = .device/data1 ] && size=$(find "$d" .device/whl -type f -exec stat -c %s {} + | mib)
  echo "  $d: $size MiB (+ the tree, $TREE MiB)"
  awk -v a="$size" -v b="$TREE" 'BEGIN {exit !(a + b > 64)}' && { echo "error: $d and the tree exceed the 64 MiB a call carries" >&2; over=1; }
done
[ $over = 0 ] || exit 1
cat <<TXT
Device calls (the run tool: carry, command), back to back (a machine goes back 30 s after a call ends):
  1. [".device/data1", ".device/whl"]   bash tools/gpu/on-device.sh stage
  2. [".device/data2"]                  bash tools/gpu/on-device.sh stage
TXT
[ $DIGIT5 = 1 ] && echo '  +  [".device/data3"], then [".device/data4"]: bash tools/gpu/on-device.sh stage'
[ $RAY = 1 ] && cat <<TXT
  3. [".device/ray1"]                   bash tools/gpu/on-device.sh stage     (says: 1 of 2 parts here)
  4. [".device/ray2"]                   bash tools/gpu/on-device.sh stage     (joins, checks sha256, installs, checks Ray)
TXT
cat <<TXT
then: bash tools/gpu/on-device.sh bg NAME "CMD"     (detached, survives between calls while the machine is held)
      bash tools/gpu/on-device.sh poll 560           (waits for the detached jobs; logs and small result files to \$OUT)
TXT
