#!/usr/bin/env bash
# The lent GPU machine's side of tools/gpu (docs/running.md, GPU runbook); runs there from the project's root (the tree that
# travelled, with the .device/ folders the call carried).
#   stage            carried data parts into a data root that outlives the call; the code to a fixed folder (detached
#                    runs keep reading it while later calls bring fresh copies; refreshed only when none runs);
#                    carried wheels installed; Ray's parts gathered, and once all are here: joined, checked (sha256),
#                    installed, and `ray` run
#   ray              checks Ray: a local instance with 2 CPUs and the GPU it detects, two tasks sharing the GPU
#   bg NAME CMD...   CMD detached (setsid) in the code folder, output to /root/logs/NAME.log; it survives between calls
#                    while the machine is held (given back 30 s after a call ends, or 30 min after its start)
#   poll SECS        waits up to SECS for the detached jobs, then puts logs.tgz and results-small.tgz (the small files
#                    of the run folders and reports written since staging: no model or checkpoint) under $OUT
#   sh CMD...        CMD in the code folder with the same environment
#   window SECS ARGS one short window's plan in one call, everything collected within SECS seconds of its start:
#                    `python3 -m ray_jobs.sweep ARGS` detached (the table's runs); beside it the engine tests on CUDA
#                    (tests/test_fused.py, TEST_DEVICE=cuda, and once MNIST is staged tests/test_scale.py, whose
#                    groups take the GPU: correctness, not timing); once the sweep ends, the bench
#                    (`ray_jobs.bench --skip-ray`, alone on the GPU) with the time left (its file rewritten after each
#                    line; BENCH_ARGS adds to its flags, e.g. "--full-runs --full-rounds 3"); then `poll 0`. Run
#                    `stage` first (in the same call: `stage && window ...`). WINDOW_TESTS=0: no engine tests (the
#                    GPU for the runs alone); WINDOW_TESTS=bf16: only the bfloat16 ones (about 30: the open CUDA
#                    question). While it waits for the runs it writes the GPU's use and the processes on it every
#                    30 s to gpu.log
set -uo pipefail
K=${KIT_HOME:-/root}; R=$K/fpdata; P=$K/proj; L=$K/logs; S=$K/site; W=$K/rayparts
export PYTHONPATH=$S:$P WANDB_MODE=disabled PYTHONUNBUFFERED=1 BENCH_DATA_ROOT=$R RAY_USAGE_STATS_ENABLED=0
install() { python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $S "$@"; }
ray_check() {
  python3 - <<'PY'
import os, ray, torch
ray.init(address="local", num_cpus=2, logging_level="WARNING")  # its own instance; the GPU as Ray detects it
have = ray.cluster_resources()
print(f"ray {ray.__version__} from {os.path.dirname(ray.__file__)}: {have.get('CPU', 0):g} CPUs, {have.get('GPU', 0):g} GPUs")
if not have.get("GPU"):
    raise SystemExit("error: Ray detects no GPU; runs with --gpus-per-actor cannot start (torch sees "
                     f"{torch.cuda.device_count()})")

@ray.remote(num_gpus=0.5)
def where():
    import torch
    return os.getpid(), ray.get_gpu_ids(), torch.cuda.get_device_name(0)

print("two tasks of 0.5 GPU each (pid, Ray's GPU ids, device):", ray.get([where.remote(), where.remote()]))
ray.shutdown()
PY
}
running() { for f in $L/*.pid; do [ -e "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && return 0; done; return 1; }
case "${1:-}" in
  stage) mkdir -p $R $L $P $S
         for d in .device/data*; do [ -d "$d" ] && cp -r "$d"/. $R/; done
         if running; then echo "detached jobs running: code in $P left as it is"
         else tar --exclude=./.device --exclude=./.git -cf - . | tar -xf - -C $P; touch $K/.staged; echo "code copied to $P"; fi
         [ -d .device/whl ] && install .device/whl/*.whl
         for d in .device/ray*; do [ -d "$d" ] && mkdir -p $W && cp "$d"/* $W/; done
         if [ -d $W ]; then
           python3 tools/gpu/kit.py join $W $K/ray-wheels.tar; rc=$?
           if [ $rc = 0 ]; then
             rm -rf $K/raywhl && mkdir -p $K/raywhl && tar -xf $K/ray-wheels.tar -C $K/raywhl \
               && install $K/raywhl/*.whl && rm -rf $W $K/ray-wheels.tar && echo "installed: $(tr '\n' ' ' < $K/raywhl/REQUIRED.txt)" \
               && ray_check
           elif [ $rc != 3 ]; then exit $rc; fi   # 3: a part is still to come
         fi
         nvidia-smi -L; python3 -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__)"
         ls $R $R/digits 2>/dev/null | tr '\n' ' '; echo ;;
  ray)   ray_check ;;
  bg)    name=$2; shift 2; mkdir -p $L; cd $P && { setsid nohup bash -c "$*" > $L/$name.log 2>&1 < /dev/null & echo $! > $L/$name.pid; }
         echo "started $name (pid $(cat $L/$name.pid))" ;;
  poll)  end=$((SECONDS + ${2:-560}))
         while [ $SECONDS -lt $end ] && running; do sleep 10; done
         running && echo "still running: $(for f in $L/*.pid; do kill -0 "$(cat "$f")" 2>/dev/null && basename "$f" .pid; done | tr '\n' ' ')" || echo "no detached job left"
         for f in $L/*.log; do [ -e "$f" ] && { echo "== $(basename "$f")"; tail -n 4 "$f" | cut -c1-220; }; done
         mkdir -p $OUT; tar -czf $OUT/logs.tgz -C $L . 2>/dev/null
         (cd $P && find results \( -name summary.json -o -name config.json -o -name metrics.jsonl -o -name metrics.jsonl.gz -o -name run.log \
            -o -name error.txt -o -name 'bench-*.txt' -o -name '*.md' -o -name '*.csv' -o -name '*.png' -o -name '*.svg' \) \
            -size -4M -newer $K/.staged | tar -czf $OUT/results-small.tgz -T - 2>/dev/null)
         ls -la $OUT; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null; true ;;
  sh)    shift; cd $P && bash -c "$*" ;;
  window) end=$((SECONDS + $2)); shift 2; self=$(readlink -f "$0")
         mkdir -p $K/shared && ln -sfn $R $K/shared/data   # the tests' data root: ../shared/data beside the code
         bash "$self" bg sweep "python3 -m ray_jobs.sweep $*"
         rm -f $L/test-fused-cuda.log   # no earlier window's log in this one's
         if [ "${WINDOW_TESTS:-1}" != 0 ]; then
           more=(); [ -f $R/digits/mnist_test.npz ] && more=(tests/test_scale.py)  # (MNIST: data1 at today's tree size)
           [ "${WINDOW_TESTS:-1}" = bf16 ] && more=(-k "bf16 or bfloat16")
           (cd $P && TEST_DEVICE=cuda timeout $((end - SECONDS - 60)) python3 -m pytest -q -p no:cacheprovider \
              tests/test_fused.py ${more[@]+"${more[@]}"} > $L/test-fused-cuda.log 2>&1
            echo "pytest exit status $?" >> $L/test-fused-cuda.log)
           tail -n 3 $L/test-fused-cuda.log
         fi
         next=0   # the GPU's use every 30 s while the runs go on, to gpu.log (in logs.tgz)
         while [ $SECONDS -lt $((end - 90)) ] && running; do
           if [ $SECONDS -ge $next ]; then next=$((SECONDS + 30))
             echo "$(date +%T) $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null)," \
                  "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | wc -l) processes" >> $L/gpu.log; fi
           sleep 5; done
         running && echo "the sweep is still running: no bench in this window" || {
           echo "sweep done at ${SECONDS} s; bench with $((end - SECONDS - 30)) s left"
           (cd $P && timeout -s INT $((end - SECONDS - 30)) python3 -m ray_jobs.bench --skip-ray ${BENCH_ARGS:-} \
              > $L/bench.log 2>&1) ; }
         bash "$self" poll 0 ;;
  *)     echo "usage: on-device.sh stage | ray | bg NAME CMD... | poll SECS | sh CMD... | window SECS SWEEP-ARGS..."; exit 2 ;;
esac
