#!/usr/bin/env bash
# `ray job submit ARGS...`, retried while the head's job agent is not up yet. The dashboard's job agent registers
# some seconds after `ray start --head` returns (longer on a busy machine); a submission before it fails with
# `No available agent to submit job, please try again later` and starts nothing, so it is made again, every 2 s,
# for at most RAY_SUBMIT_WAIT_S seconds (default 120). Any other outcome, success or failure, is submit's own
# (its output streams as it comes, its exit code is returned).
#
#   tools/ray_submit.sh --address http://10.0.0.1:8265 --working-dir . -- python -m ray_jobs.run ...
set -uo pipefail
wait_s=${RAY_SUBMIT_WAIT_S:-120}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$SECONDS
while :; do
  ray job submit "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ] || ! grep -q "No available agent to submit job" "$log"; then
    exit "$rc"
  fi
  if [ $((SECONDS - start)) -ge "$wait_s" ]; then
    echo "error: the Ray head's job agent did not come up within ${wait_s} s; see the head's" \
         "logs/dashboard_agent.log (in its session folder), or wait longer with RAY_SUBMIT_WAIT_S." >&2
    exit "$rc"
  fi
  echo "note: the Ray head's job agent is not up yet; submitting again in 2 s" >&2
  sleep 2
done
