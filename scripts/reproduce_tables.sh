#!/usr/bin/env bash
# Reproduces every measured table of docs/serving.md and docs/simulator.md from scratch on this
# machine, stage by stage, and writes each stage's wall time (issue 30 item 6).
#
#   scripts/reproduce_tables.sh [OUT] [STAGE ...]
#
# OUT (default /tmp/rcllm-tables) gets one folder per stage with its outputs and log, and
# walltimes.tsv (stage, seconds, exit status). Without STAGE arguments every stage runs, in
# this order (estimated times are from the docs' own runs on the shared 2-core machine):
#   sim-profiles   simulator.md GPU profiles table                           (~5 s)
#   sim-bench      simulator.md Speed                                        (~30 s)
#   sim-run        simulator.md Results/Scaling/Policies/Ratio, 8B + 72B     (~3 min)
#   sim-amazon     simulator.md Amazon-2018 Magazine rows (with/without hot 1.0) (~1 min)
#   sim-projection simulator.md 40-instance projection, three cost models  (~30 s)
#   shapes-tiny    simulator.md bench shapes CPU check                       (~2 min)
#   sim-validate   simulator.md validation: 3 + 3 bench ttft runs, both directions (~40 min)
#   serve-scaling  serving.md "Measured": 1 vs 2 instances, tiny model, 2 runs (~2 min)
#   serve-targets  serving.md issue-17 targets (needs ADAPTER=<Magazine adapter>) (~23 min)
#   serve-calib    simulator.md served calibration: one short served run at 1.0x (another
#                  trace seed), whose engine CPU per request gives sim-sweep's served F (~4 min)
#   serve-sweep    serving.md rate sweep (bench serve --sweep, SmolLM2, Magazine) (~24 min)
#   sim-sweep      simulator.md served sweep prediction: bench ttft fit + sim sweep (~3 min;
#                  needs serve-sweep's output, and serve-calib's for its served-F row)
#   regime-calib   serving.md issue-51 regime: the router's calibration run on MovieLens
#                  (rcllm serve --save-profile, stopped once serving)           (~3 min)
#   regime-sweep   serving.md issue-51 regime: 1/4 budget METIS, 1/16 METIS and random, 1/16
#                  METIS without imports; 100 requests per cell (needs regime-calib) (~2 h)
#   sim-regime     simulator.md cache replay of regime-sweep's sweeps (bench ttft fit + sim
#                  sweep --routing caches) and the long-tail projection at 4/10/40 (~6 min)
# Environment: PY (default: python3), DATA (default ../shared/data/amazon2018 from the repo
# root), ADAPTER (serve-targets; the stage is skipped, saying so, without it), SWEEP_REQUESTS,
# SWEEP_RATES (serve-sweep's size; defaults: 30 requests per cell, 0.4x,0.7x,1.0x,1.3x,1.6x,2.0x).
# Timings are only comparable on a quiet machine: run nothing else meanwhile.
# Not here: simulator.md's H200 table, which needs a GPU (scripts/gpu_check.sh on a GPU machine
# writes it; its profile is kept in docs/data/gpu-h200/ and sim-projection reads it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/rcllm-tables}; shift || true
PY=${PY:-python3}
[[ "$PY" == */* ]] && PY=$(realpath -s "$PY")  # absolute, links kept: a venv python is a link
ROOT=$PWD
DATA=$(realpath "${DATA:-../shared/data/amazon2018}")
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(sim-profiles sim-bench sim-run sim-amazon sim-projection shapes-tiny
                                   sim-validate serve-scaling serve-targets serve-calib serve-sweep sim-sweep
                                   regime-calib regime-sweep sim-regime)
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
rcllm() { "$PY" -m rcllm.cli "$@"; }
MAG=(--data "$DATA" --category Magazine_Subscriptions)
GIFT=(--data "$DATA" --category Gift_Cards)

stage() {
  local name=$1 dir="$OUT/$1" t0 rc
  mkdir -p "$dir"
  t0=$(date +%s)
  ( set -e; cd "$dir"; "stage_${name//-/_}" ) > "$dir/log.txt" 2>&1
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$(( $(date +%s) - t0 ))" "$rc" | tee -a "$OUT/walltimes.tsv"
}

stage_sim_profiles() { rcllm sim profiles; }
stage_sim_bench() { rcllm bench sim --json bench_sim.json; }
stage_sim_run() {
  rcllm sim run all --requests 20000 --out 8b
  rcllm sim run cdf --profile qwen-72b@a100 --requests 20000 --out 72b
  rcllm sim run scaling --profile qwen-72b@a100 --requests 20000 --out 72b
  for p in metis hash; do rcllm sim run cdf --placement $p --requests 20000 --out "8b-$p"; done
}
stage_sim_amazon() {
  rcllm sim run cdf --data "$DATA/Magazine_Subscriptions_5.json" --format amazon2018 \
      --requests 5000 --out mag
  rcllm sim run cdf --data "$DATA/Magazine_Subscriptions_5.json" --format amazon2018 \
      --requests 5000 --hot-fraction 1.0 --out mag-hot
}
stage_sim_projection() {
  local h200="$ROOT/docs/data/gpu-h200/profile_qwen3-8b_cuda.json" p
  for p in qwen3-8b@a100 qwen3-8b@h100 "$h200"; do
    local n; n=$(basename "$p" .json)
    rcllm sim run cdf --requests 20000 --profile "$p" --out "$n"
    rcllm sim run cdf --requests 20000 --profile "$p" --hot-fraction 1.0 --out "$n-hot"
  done
  rcllm sim run cdf --requests 20000 --item-ratio 0.15 --history-ratio 0.15 --out a100-r15
  rcllm sim run cdf --requests 20000 --item-ratio 0.15 --history-ratio 0.15 --hot-fraction 1.0 \
      --out a100-hot-r15
  rcllm sim run cdf --requests 20000 --load 0.95 --out a100-load0.95
  rcllm sim run cdf --requests 20000 --profile "$h200" --load 0.3 --out h200-load0.3
}
stage_shapes_tiny() {
  rcllm bench shapes --shape tiny --layers 8 --tokens 2048,3072 --repeats 3 --threads 1 \
      --json shapes_tiny.json
}
stage_sim_validate() {
  # the categories' runs alternate, so a drift of the machine's speed hits both alike
  rcllm bench ttft "${MAG[@]}" --requests 10 --set model.threads=1 --json mag.json
  rcllm bench ttft "${GIFT[@]}" --new-reviews 1 --requests 10 --set model.threads=1 \
      --json gift.json
  for k in 2 3; do
    rcllm bench ttft "${MAG[@]}" --requests 6 --set model.threads=1 --json mag$k.json
    rcllm bench ttft "${GIFT[@]}" --new-reviews 1 --requests 6 --set model.threads=1 \
        --json gift$k.json
  done
  rcllm sim validate --fit-json mag.json,mag2.json,mag3.json \
      --bench-json gift.json,gift2.json,gift3.json --min-repeats 3 --json m2g.json
  rcllm sim validate --fit-json gift.json,gift2.json,gift3.json \
      --bench-json mag.json,mag2.json,mag3.json --min-repeats 3 --json g2m.json
  rcllm sim validate --fit-json mag.json --bench-json gift.json --json m2g_one.json
  rcllm sim validate --fit-json gift.json --bench-json mag.json --json g2m_one.json
  # the recorded files of tests/routing/data (copy them there to re-record)
  "$PY" "$ROOT/scripts/merge_bench_runs.py" ttft_magazine_cpu.json mag.json mag2.json mag3.json \
      --recorded-with "rcllm bench ttft --data amazon2018 --category Magazine_Subscriptions --requests 10|6|6 --set model.threads=1" \
      --machine "2 cores, nothing else running"
  "$PY" "$ROOT/scripts/merge_bench_runs.py" ttft_giftcards_cpu.json gift.json gift2.json gift3.json \
      --recorded-with "rcllm bench ttft --data amazon2018 --category Gift_Cards --new-reviews 1 --requests 10|6|6 --set model.threads=1" \
      --machine "2 cores, nothing else running"
}
stage_serve_scaling() {
  "$PY" "$ROOT/scripts/make_tiny_model.py" "$PWD/tiny"
  for run in A B; do
    rcllm bench serve --requests 60 --candidates 20 --qps 16 \
        --configs 1:affinity,2:affinity,2:round-robin --set model.path="$PWD/tiny" \
        --set model.threads=1 --json "run$run.json"
  done
}
stage_serve_targets() {
  if [ -z "${ADAPTER:-}" ]; then echo "skipped: set ADAPTER to the Magazine adapter"; return 0; fi
  rcllm bench serve "${MAG[@]}" --adapter "$ADAPTER" --configs 2:affinity --requests 40 \
      --qps 0.5 --queue-size 4 --redis-local --warmup all --fault-redis --soak-s 600 \
      --soak-load 2 --soak-warmup-s 300 --fault-instance --set model.threads=1 \
      --json bench-serve-full.json
}
stage_serve_sweep() {
  rcllm bench serve --sweep "${MAG[@]}" --scorer pointwise ${ADAPTER:+--adapter "$ADAPTER"} \
      --requests "${SWEEP_REQUESTS:-30}" --rates "${SWEEP_RATES:-0.4x,0.7x,1.0x,1.3x,1.6x,2.0x}" \
      --queue-size 8 --slo-ms 5000 --set model.threads=1 --out sweep
}
stage_serve_calib() {
  # a separate served run for the simulator's served slowdown: the sweep's shape and series at
  # one rate, on another slice of the trace (--seed 1), never the sweep it is used to predict
  rcllm bench serve --sweep "${MAG[@]}" --scorer pointwise ${ADAPTER:+--adapter "$ADAPTER"} \
      --requests "${SWEEP_REQUESTS:-30}" --rates 1.0x --policies affinity --seed 1 \
      --queue-size 8 --slo-ms 5000 --set model.threads=1 --out calib
}
stage_sim_sweep() {
  # the profile is fitted on a separate bench ttft run of the same model and scorer, never
  # on the sweep
  rcllm bench ttft "${MAG[@]}" --scorer pointwise ${ADAPTER:+--adapter "$ADAPTER"} \
      --requests 6 --seed 1 --set model.threads=1 --json ttft_fit.json
  rcllm sim sweep --sweep-json "$OUT/serve-sweep/sweep/sweep.json" --fit-json ttft_fit.json \
      --out replay
  rcllm sim sweep --sweep-json "$OUT/serve-sweep/sweep/sweep.json" --fit-json ttft_fit.json \
      --routing policy --out policy
  # the queueing model on each request's measured engine time: the error no cost model fixes
  rcllm sim sweep --sweep-json "$OUT/serve-sweep/sweep/sweep.json" --fit-json ttft_fit.json \
      --service measured --out measured
  # the same without the work behind the answers: how much of the prediction it carries
  rcllm sim sweep --sweep-json "$OUT/serve-sweep/sweep/sweep.json" --fit-json ttft_fit.json \
      --no-behind --out replay-no-behind
  # the busy slowdown per method: the same bench ttft twice at once, against the run alone
  for k in a b; do
    rcllm bench ttft "${MAG[@]}" --scorer pointwise ${ADAPTER:+--adapter "$ADAPTER"} \
        --requests 6 --seed 1 --set model.threads=1 --json "ttft_shared_$k.json" &
  done
  wait
  rcllm sim sweep --sweep-json "$OUT/serve-sweep/sweep/sweep.json" --fit-json ttft_fit.json \
      --busy-from ttft_fit.json,ttft_shared_a.json --out replay-busy
  # each cell scaled by its speed reference (off by default since 2026-12-05)
  rcllm sim sweep --sweep-json "$OUT/serve-sweep/sweep/sweep.json" --fit-json ttft_fit.json \
      --speed-reference --out replay-reference
  # F from the separate served run: the served engine's CPU per request over the profile
  if [ -f "$OUT/serve-calib/calib/sweep.json" ]; then
    rcllm sim sweep --sweep-json "$OUT/serve-sweep/sweep/sweep.json" --fit-json ttft_fit.json \
        --served-from "$OUT/serve-calib/calib/sweep.json" --out replay-served
    # and the builders' CPU weight from it too (the weight at which its replay gives the
    # engine time it measured) instead of CFS's weight of their niceness
    rcllm sim sweep --sweep-json "$OUT/serve-sweep/sweep/sweep.json" --fit-json ttft_fit.json \
        --served-from "$OUT/serve-calib/calib/sweep.json" --served-weight \
        --out replay-served-weight
  else
    echo "no $OUT/serve-calib/calib/sweep.json: run the serve-calib stage for the served-F row"
  fi
}

ML=(--data "$(realpath "${ML_DATA:-../shared/data/movielens-100k}")" --format movielens)
QUARTER=562464000     # 1/4 of MovieLens' item KV under the default prompt (docs/serving.md)
stage_regime_calib() {
  # the router's profile from a run apart from the sweeps: start, wait until it serves, stop
  rcllm serve --instances 2 "${ML[@]}" --set model.threads=1 --set reuse.store_bytes=$QUARTER \
      --save-profile profile.json > serve.log 2>&1 &
  local pid=$!
  until grep -q "rcllm serving on" serve.log || ! kill -0 $pid 2>/dev/null; do sleep 5; done
  kill -INT $pid; wait $pid || true
  test -s profile.json
}
regime() {   # OUT BUDGET PLACEMENT RATES [more options]
  local out=$1 budget=$2 placement=$3 rates=$4; shift 4
  rcllm bench serve --sweep "${ML[@]}" --no-redis --instances 2 --set model.threads=1 \
      --set reuse.store_bytes=$budget --placement $placement --placement-seed 0 --seed 0 \
      --profile "$OUT/regime-calib/profile.json" --methods rcllm:0.3:0.3 \
      --policies affinity,cost,hit-only,load-only,round-robin --trace-window users \
      --trace-session-gap-s 1800 --requests 100 --rates $rates --queue-size 8 \
      --slo-ms 5000 --out $out "$@"
}
stage_regime_sweep() {
  regime quarter-metis $QUARTER metis 0.7x,1.0x,1.3x
  regime sixteenth-metis $((QUARTER / 4)) metis 0.7x,1.0x
  regime sixteenth-random $((QUARTER / 4)) random 0.7x,1.0x
  regime sixteenth-metis-noimports $((QUARTER / 4)) metis 0.7x --no-imports
}
stage_sim_regime() {
  rcllm bench ttft "${ML[@]}" --requests 6 --seed 1 --set model.threads=1 --json ttft_fit.json
  for sweep in quarter-metis sixteenth-metis sixteenth-random sixteenth-metis-noimports; do
    rcllm sim sweep --sweep-json "$OUT/regime-sweep/$sweep/sweep.json" \
        --fit-json ttft_fit.json --routing caches --out caches-$sweep
  done
  # what-ifs: the 1/4 sweep's requests at 1/16, the 1/16 sweep without imports
  rcllm sim sweep --sweep-json "$OUT/regime-sweep/quarter-metis/sweep.json" \
      --fit-json ttft_fit.json --routing caches --store-bytes $((QUARTER / 4)) --out at-sixteenth
  rcllm sim sweep --sweep-json "$OUT/regime-sweep/sixteenth-metis/sweep.json" \
      --fit-json ttft_fit.json --routing caches --no-imports --out without-imports
  for k in 4 10 40; do
    rcllm sim run policy --zipf-from "${ML[1]}:movielens" --policy-instances $k \
        --requests 20000 --out projection-$k
  done
  rcllm sim run scaling --zipf-from "${ML[1]}:movielens" --ks 4,10,40 --requests 20000 \
      --out projection-scaling
}

for s in "${STAGES[@]}"; do
  if ! declare -F "stage_${s//-/_}" >/dev/null; then echo "unknown stage $s" >&2; exit 2; fi
  stage "$s"
done
echo "wall times: $OUT/walltimes.tsv"
