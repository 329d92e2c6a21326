#!/usr/bin/env bash
# The window of 2026-11-30 (issue 56), on the device after `on-device.sh stage` has joined, installed and checked Ray.
# Five full-protocol Office-Caltech runs side by side: three through Ray (fractional GPU shares, two Ray clusters of
# their own side by side), two with the local executor; FedOpt seed 1 (Ray) against seed 2 (local) is the same
# work a round, for Ray's cost. Each Ray sweep falls back to the local executor if it fails.
D=tools/gpu/on-device.sh
T="--table 2 --datasets office_caltech --checkpoint-every 1000"
G="--executor ray --gpus-per-actor 0.1 --driver-gpus 0.1"
L="--executor local"
bash $D bg ray-fedopt "python3 -m ray_jobs.sweep $T --methods fedopt --seeds 1 $G || python3 -m ray_jobs.sweep $T --methods fedopt --seeds 1 $L"
bash $D bg local-fedprox "python3 -m ray_jobs.sweep $T --readings --methods fedprox --seeds 1 $L"
sleep 12
bash $D bg ray-feddyn "python3 -m ray_jobs.sweep $T --readings --methods feddyn --seeds 1 $G --actor-restarts 0 || python3 -m ray_jobs.sweep $T --readings --methods feddyn --seeds 1 $L --parallel 2"
bash $D bg gpumon "sleep 20; while pgrep -f ray_jobs.sweep > /dev/null; do date +%T; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' '; echo; sleep 30; done"
WINDOW_TESTS=0 bash $D window ${1:-540} $T --methods fedopt --seeds 2 $L
