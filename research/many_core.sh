#!/usr/bin/env bash
# Issue 39's many-core tables, on plans that are what they say: one script
# for the 16-core host (../shared/tools/device_tf/README.md), under 8 min.
#
#   bash research/many_core.sh OUT_DIR [--quick]
#
# Run from the project's root with PYTHONPATH set (there:
# PYTHONPATH=/tmp/site:$PWD). Each part runs under `timeout`; a part that
# fails or runs out of time leaves its log line and the others still run.
# Writes into OUT_DIR (6 files):
#   pool_check.json  research.pool_check: 4 devices x 4 threads with pools
#                    of their own, then one shared pool (threads per device,
#                    how many devices' chains ran at once), one line each.
#   mlp_k8.json/.txt research.benchmark, MLP K = 8 (width 512, batch 512,
#                    steps_per_loop 8) on 8 devices x 2 threads (16 cores),
#                    e2e, e2e-m4, e2e-m8, local, 2wise, 2wise-m4, with plain
#                    Keras on all cores.
#   lm_k4.json/.txt  research.benchmark, the fortunes LM shape K = 4 (3
#                    blocks a module, batch 64, steps_per_loop 2) on 4
#                    devices x 4 threads, each with its own pool: e2e,
#                    local, 2wise, e2e-m4, with plain Keras on all cores.
#   log.txt          each part's start, end, exit status and stderr tail.
# --quick shrinks every part (K = 4 MLP of width 64, K = 2 LM of one block,
# 2 devices x 1 thread) to check the script: a minute or two on 2 idle cores.
set -u
out=${1:?usage: bash research/many_core.sh OUT_DIR [--quick]}
quick=${2:-}
if [ -n "$quick" ] && [ "$quick" != --quick ]; then
  echo "error: the second argument may only be --quick. Received: $quick" >&2
  exit 2
fi
mkdir -p "$out" || exit 2
py=${PYTHON:-python3}
log="$out/log.txt"
: > "$log"

# part NAME SECONDS COMMAND...: runs COMMAND under timeout, its stdout to
# OUT/NAME, its status and the tail of its stderr to the log.
part() {
  local name=$1 limit=$2
  shift 2
  echo "$(date -u +%T) start $name (limit ${limit}s): $*" >> "$log"
  timeout -k 10 "$limit" "$@" > "$out/$name" 2> "$out/.err"
  local rc=$?
  echo "$(date -u +%T) end $name rc=$rc$([ $rc = 124 ] && echo ' (timed out)')" >> "$log"
  tail -n 5 "$out/.err" >> "$log"
  rm -f "$out/.err"
}

echo "host: $(nproc) cores; $($py --version 2>&1)" >> "$log"
if [ -z "$quick" ]; then
  pool=(--num_devices=4 --threads_per_device=4 --width=1024 --chain=16)
  mlp=(--model=mlp --num_modules=8 --width=512 --batch_size=512
       --steps_per_loop=8 --steps=5 --threads_per_device=2
       --modules_per_device=1
       --strategies=e2e,e2e-m4,e2e-m8,local,2wise,2wise-m4)
  lm=(--model=lm --num_modules=4 --layers_per_module=3 --batch_size=64
      --steps_per_loop=2 --steps=3 --threads_per_device=4
      --modules_per_device=1 --strategies=e2e,local,2wise,e2e-m4)
  limits=(35 35 180 200)  # 7.5 min at most
else
  pool=(--num_devices=2 --threads_per_device=1 --width=256 --chain=8)
  mlp=(--model=mlp --num_modules=4 --width=64 --batch_size=64
       --steps_per_loop=2 --steps=2 --threads_per_device=1
       --modules_per_device=1 --strategies=e2e,local,2wise-m4)
  lm=(--model=lm --num_modules=2 --layers_per_module=1 --batch_size=8
      --steps_per_loop=1 --steps=1 --threads_per_device=1
      --modules_per_device=1 --strategies=e2e,local)
  limits=(60 60 300 300)  # 2 busy cores: TF starts slowly
fi

# Two lines: own pools, then TF's default of one shared pool.
part pool_check.json "${limits[0]}" $py -m research.pool_check "${pool[@]}"
part .pool_shared "${limits[1]}" $py -m research.pool_check "${pool[@]}" \
  --shared_pool
cat "$out/.pool_shared" >> "$out/pool_check.json" 2>/dev/null
rm -f "$out/.pool_shared"
part mlp_k8.txt "${limits[2]}" $py -m research.benchmark "${mlp[@]}" \
  --fit=false --json_out="$out/mlp_k8.json"
part lm_k4.txt "${limits[3]}" $py -m research.benchmark "${lm[@]}" \
  --fit=false --json_out="$out/lm_k4.json"
echo "$(date -u +%T) done" >> "$log"
cat "$log"
