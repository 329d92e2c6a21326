#!/usr/bin/env bash
# Harvest a sweep's finished runs into this checkout: from SRC (another worktree or copy of the project, where a
# sweep runs), every run folder with a summary.json that this checkout's results/runs lacks gets its summary.json,
# config.json and metrics.jsonl.gz copied here (what .gitignore lets git track; for a run whose code predates
# metrics.jsonl.gz it is made here from its metrics.jsonl by benchmark.results.pack_metrics, the bytes a run of
# today's code writes; SRC is only read); in-progress runs, models,
# checkpoints and W&B folders stay there. A run SRC's own commit holds (a worktree made from an older main) is not a
# new run: when this checkout lacks it, it was removed here on purpose, and it is skipped with a note. Prints the runs
# copied. Then write the reports
# (`python -m ray_jobs.sweep --table T --report-only`, `python -m ray_jobs.results_table --write`).
# Usage: bash tools/harvest.sh SRC
set -euo pipefail
SRC=${1:?usage: bash tools/harvest.sh SRC (a worktree whose results/runs holds finished runs)}
[ -d "$SRC/results/runs" ] || { echo "error: $SRC/results/runs is no folder; name the sweep's worktree" >&2; exit 2; }
ROOT=$(git rev-parse --show-toplevel)
PY=${PYTHON:-$ROOT/.venv/bin/python}; command -v "$PY" > /dev/null || PY=python3
[ "$(cd "$SRC" && pwd -P)" != "$(cd "$ROOT" && pwd -P)" ] || { echo "error: SRC is this checkout" >&2; exit 2; }
for run in "$SRC"/results/runs/*/; do
  name=$(basename "$run")
  [ -f "$run/summary.json" ] && [ ! -f "$ROOT/results/runs/$name/summary.json" ] || continue
  if git -C "$SRC" ls-files --error-unmatch "results/runs/$name/summary.json" > /dev/null 2>&1; then
    echo "note: $name not copied: committed in $SRC's commit and absent here (removed since?)" >&2
    continue
  fi
  mkdir -p "$ROOT/results/runs/$name"
  cp "$run/config.json" "$ROOT/results/runs/$name/"
  if [ -f "$run/metrics.jsonl.gz" ]; then cp "$run/metrics.jsonl.gz" "$ROOT/results/runs/$name/"
  else PYTHONPATH="$ROOT" "$PY" -c 'import sys; from benchmark.results import pack_metrics; pack_metrics(*sys.argv[1:])' \
         "$run" "$ROOT/results/runs/$name"; fi
  cp "$run/summary.json" "$ROOT/results/runs/$name/"  # last: a folder with a summary is complete
  echo "$name"
done
