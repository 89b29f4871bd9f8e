#!/usr/bin/env bash
# The GPU check of docs/simulator.md ("The GPU path"): Qwen3-8B's shape with random weights,
# bfloat16, every method's prefill timed on the device, and the cost model fitted on it.
# Run on a GPU machine from the repository root; writes into ${OUT:-gpu-out}. Needs torch with
# CUDA, numpy, scipy, pyyaml, tqdm (no model weights: timings do not depend on them).
set -euo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
PY=${PY:-python3}
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
"$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee -a "$OUT/gpu.txt"
"$PY" -m rcllm.cli bench shapes --shape qwen3-8b --device cuda --tokens 1024,2048,3072,4096 \
    --repeats 10 --warmup 2 --json "$OUT/shapes_qwen3-8b_cuda.json" \
    --profile-out "$OUT/profile_qwen3-8b_cuda.json" 2>&1 | tee "$OUT/shapes.log"
echo "wall $(( $(date +%s) - start )) s" | tee -a "$OUT/shapes.log"
