#!/usr/bin/env bash
# Here, from the project's root, before a lent GPU machine's first call (docs/running.md, GPU runbook): builds the ignored
# folder .device/ with what that machine lacks, in folders packed into calls that each carry at most 63 MiB beside the
# tree (the run tool carries 64 MiB a call), and prints those calls:
#   .device/data1, data2, ...      the data root in as many folders as it takes to fit beside the tree: Office-Caltech,
#                                  USPS and SVHN in data1 (the Office runs and the engine tests need no other), then
#                                  MNIST and SYN (none with `office`); with `digit5` also MNIST-M, for FedPLVM's Digit-5
#   .device/whl                    finch-clust's wheel (11 kB), carried with data1
#   .device/ray1, ray2, ...        with `ray`: the wheels of Ray (the version installed here, without its `default`
#                                  extra: the runs and the check need no dashboard; 77.6 MiB against 103.3 MiB on
#                                  2026-11-30) and of every package it needs that the machine lacks, one archive in
#                                  parts of at most half a call (kit.py), each packed into the first call with room
#                                  for it: one rides beside a data folder, two fill a call of their own
# Usage: bash tools/gpu/stage.sh [ray] [office | digit5]      (PYTHON: the interpreter with Ray; default .venv/bin/python)
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel); cd "$ROOT"
PY=${PYTHON:-.venv/bin/python}; [ -x "$PY" ] || PY=python3
RAY=0; DIGIT5=0; OFFICE=0
usage="usage: bash tools/gpu/stage.sh [ray] [office | digit5]"
for a in "$@"; do case $a in ray) RAY=1 ;; digit5) DIGIT5=1 ;; office) OFFICE=1 ;; *) echo "error: unknown argument $a; $usage" >&2; exit 2 ;; esac; done
[ $OFFICE = 1 ] && [ $DIGIT5 = 1 ] && { echo "error: office stages no Digits data and digit5 adds MNIST-M to it: give one of them; $usage" >&2; exit 2; }
D=$("$PY" -c 'from benchmark.data import resolve_data_root; print(resolve_data_root(None))')
PIP_TARGET=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64)
rm -rf .device && mkdir -p .device/whl
"$PY" -m pip download -q "${PIP_TARGET[@]}" -d .device/whl "finch-clust==$("$PY" -c 'from importlib.metadata import version; print(version("finch-clust"))')"
# the data in as few folders as fit beside the tree, one a call (the tree alone: 14.9 MiB on 2026-11-26, once the
# committed runs' rounds were gzipped; 37 MiB before),
# in the order the runs need them: Office-Caltech, USPS and SVHN first (Office runs, the engine tests), then MNIST
# and SYN (Digits), then MNIST-M (digit5)
mib() { awk '{s += $1} END {printf "%.1f", s / 1048576}'; }
TREE=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | mib)
CAP=$(awk -v t="$TREE" 'BEGIN {printf "%d", (63 - t) * 1048576}')   # what one call carries beside the tree
bytes() { find "$@" -type f -exec stat -c %s {} + | awk '{s += $1} END {print s + 0}'; }
BUDGET=$((CAP - $(bytes .device/whl)))   # a data folder's share: data1 travels with the wheel
FILES=(office_caltech10/caltech.npz office_caltech10/amazon.npz office_caltech10/webcam.npz office_caltech10/dslr.npz
       digits/usps_train.npz digits/usps_test.npz digits/svhn_train_first1083.npz)
[ $OFFICE = 1 ] || FILES+=(digits/mnist_train.npz digits/mnist_test.npz digits/syn_test.npz digits/syn_train_part0.npz
                           digits/syn_train_part1.npz)
[ $DIGIT5 = 1 ] && FILES+=(digits/mnistm_test_part0.npz digits/mnistm_test_part1.npz $(cd "$D" && ls digits/mnistm_train_part*.npz))
k=1; used=$(stat -c %s "$D/SHA256SUMS"); mkdir -p .device/data1 && cp "$D/SHA256SUMS" .device/data1/
for f in "${FILES[@]}"; do
  [ -f "$D/$f" ] || { echo "error: $D/$f is missing (the data root's README says how to make it)" >&2; exit 1; }
  size=$(stat -c %s "$D/$f")
  [ "$size" -le "$BUDGET" ] || { echo "error: $f ($size bytes) does not fit beside the tree ($TREE MiB) in one call" >&2; exit 1; }
  if [ $((used + size)) -gt "$BUDGET" ]; then k=$((k + 1)); used=0; fi
  mkdir -p ".device/data$k/$(dirname "$f")" && cp "$D/$f" ".device/data$k/$f"; used=$((used + size))
done
# the calls: each data folder one (data1 with the wheel), then Ray's parts, each in the first call with room for it
CALLS=(); LEFT=()   # each call's folders, and the bytes it has left
for d in $(ls -d .device/data* | sort -V); do
  c=$d; [ "$d" = .device/data1 ] && c="$d .device/whl"
  CALLS+=("$c"); LEFT+=($((CAP - $(bytes $c))))
done
LAST_RAY=-1   # the call that brings Ray's last part (the calls are made in order)
if [ $RAY = 1 ]; then
  "$PY" tools/gpu/kit.py wheels .device/raywhl
  tar -cf .device/ray-wheels.tar -C .device/raywhl .
  "$PY" tools/gpu/kit.py split .device/ray-wheels.tar .device/ray --part-mib "$(awk -v c="$CAP" 'BEGIN {print c / 2 / 1048576}')"
  rm -rf .device/raywhl .device/ray-wheels.tar
  for d in $(ls -d .device/ray* | sort -V); do
    size=$(bytes "$d"); k=0
    while [ $k -lt ${#CALLS[@]} ] && [ "${LEFT[$k]}" -lt "$size" ]; do k=$((k + 1)); done
    if [ $k = ${#CALLS[@]} ]; then CALLS+=("$d"); LEFT+=($((CAP - size))); else CALLS[$k]+=" $d"; LEFT[$k]=$((LEFT[$k] - size)); fi
    [ $k -gt $LAST_RAY ] && LAST_RAY=$k
  done
fi
# what travels in each call: the tree (tracked and untracked, not ignored, files) and the carried folders
over=0
for k in "${!CALLS[@]}"; do
  size=$(bytes ${CALLS[$k]} | mib)
  what=$(for d in ${CALLS[$k]}; do case $d in
           .device/data*) (cd "$d" && find . -name '*.npz' | sed 's#^./##' | tr '\n' ' ') ;;
           .device/ray*) echo -n "Ray's $(ls "$d" | grep -o 'part[0-9]*of[0-9]*') " ;; esac; done)
  echo "  call $((k + 1)): $size MiB (+ the tree, $TREE MiB): $what"
  awk -v a="$size" -v b="$TREE" 'BEGIN {exit !(a + b > 64)}' && { echo "error: call $((k + 1)) and the tree exceed the 64 MiB a call carries" >&2; over=1; }
done
[ $over = 0 ] || exit 1
echo "Device calls (the run tool: carry, command), back to back (a machine goes back 30 s after a call ends):"
for k in "${!CALLS[@]}"; do
  carry=$(printf '"%s", ' ${CALLS[$k]})
  note=""; [ $k = $LAST_RAY ] && note="     (Ray's last part: joins the parts, checks sha256, installs, checks Ray)"
  echo "  $([ $k = 0 ] && echo "1. " || echo "+  ")[${carry%, }]   bash tools/gpu/on-device.sh stage$note"
done
cat <<TXT
then: bash tools/gpu/on-device.sh bg NAME "CMD"     (detached, survives between calls while the machine is held)
      bash tools/gpu/on-device.sh poll 560           (waits for the detached jobs; logs and small result files to \$OUT)
TXT
