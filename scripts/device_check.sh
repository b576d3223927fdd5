#!/usr/bin/env bash
# One device call: build Slipstream on the GPU image (PyTorch's LibTorch,
# CUDA, other dependencies from the carried Debian .deb files in .deb/),
# then run the stages named on the command line, writing logs under $OUT:
#   build  configure and build into build-gpu/
#   test   every CTest test (the *_CUDA ones run here, not in CI)
#   bench  slipstream bench, volume config, Muon+AdamW then AdamW
#   train  the volume config for a few epochs, then TensorBoard's reader
#   audit  slipstream train --audit-syncs on the volume config
#   profile  ms/step with fewer slices or layers (where the time goes)
#   torchrun  2 GPUs through torchrun (kind nvidia-h200-x2)
#   multi  2 GPUs (kind nvidia-h200-x2): NCCL tests, bench on 1 and 2 GPUs, training
# Usage (device tool): bash scripts/device_check.sh build test bench train
#   fused  the fused slice kernels: correctness against the plain path, the
#          per-kernel benchmark, and slipstream bench with them on and off
#          (FUSED_ALSO_PLAIN= leaves the plain-path bench out)
#   floor  ms/step with the slice work made small (16 slices), fused
#   ncu    Nsight Compute on one launch of each slice kernel
#   profile_step  device time per kernel over AdamW steps (bench --profile)
#   layernorm  AdamW step with the bf16 LayerNorm on and off (fused kernels on)
# Also: quickbench (a short bench). Carry .deb and .fixtures, filled here
# first by scripts/device_prepare.sh.
set -uo pipefail
OUT=${OUT:-/tmp/slipstream-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
DEPS=/tmp/slipstream-deps
mkdir -p "$DEPS"
for f in .deb/*.deb; do dpkg -x "$f" "$DEPS"; done
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export SLIPSTREAM_FIXTURES_DIR="$PWD/.fixtures"
BIN=./build-gpu/app/slipstream
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/summary.txt"; }

stage_build() {
  local torch_prefix nccl_inc
  torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
  nccl_inc=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])')/include
  log "build: torch $(python3 -c 'import torch; print(torch.__version__)'), nccl include $nccl_inc"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$OUT/summary.txt"
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$DEPS/usr" -DSLIPSTREAM_NCCL_INCLUDE="$nccl_inc" \
    -DSLIPSTREAM_BUILD_BENCHMARKS=OFF -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/cmake.log" 2>&1 \
    || { log "cmake FAILED"; tail -40 "$OUT/cmake.log"; return 1; }
  grep -E "slipstream:" "$OUT/cmake.log" | tee -a "$OUT/summary.txt"
  if ! cmake --build build-gpu -j"$(nproc)" >"$OUT/build.log" 2>&1; then
    log "build FAILED"; grep -E "error" -A5 "$OUT/build.log" | head -80; return 1
  fi
  log "build ok"
}

stage_test() {
  (cd build-gpu && ctest --output-on-failure -j4 >"$OUT/ctest.log" 2>&1); local rc=$?
  tail -25 "$OUT/ctest.log" | tee -a "$OUT/summary.txt"
  for t in build-gpu/tests/*_CUDA_test; do
    "$t" 2>&1 | grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|Failure|actual|Sync audit|^layer norm width|^output: autocast|^largest excess" | tee -a "$OUT/summary.txt"
  done
  return $rc
}

stage_diag() {
  for t in jsonl_sink_test; do
    cuda-gdb -batch -ex run -ex bt "build-gpu/tests/$t" >"$OUT/gdb_$t.log" 2>&1
    grep -E "^#|signal|SIG" "$OUT/gdb_$t.log" | head -30 | tee -a "$OUT/summary.txt"
  done
}

stage_bench() {
  log "bench: volume config, 200k points, Muon+AdamW"
  $BIN bench --rounds 3 --steps 20 --warmup 10 run_id=bench-muon 2>&1 | grep -vE "^Epoch" | tee -a "$OUT/summary.txt"
  log "bench: volume config, 200k points, AdamW"
  $BIN bench --rounds 3 --steps 20 --warmup 10 optimizer.name=adamw run_id=bench-adamw 2>&1 | grep -vE "^Epoch" | tee -a "$OUT/summary.txt"
}

stage_multi() {
  log "multi: CUDA tests (NCCL readback needs 2 GPUs)"
  build-gpu/tests/readback_CUDA_test 2>&1 | grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|Failure|actual" | tee -a "$OUT/summary.txt"
  build-gpu/tests/distributed_trainer_test 2>&1 | grep -E "^\[ +(OK|FAILED|SKIPPED) +\]" | tee -a "$OUT/summary.txt"
  log "multi: bench on 1 GPU (Muon+AdamW)"
  $BIN bench --rounds 2 --steps 10 --warmup 5 --policies blocking async none 2>&1 | grep -vE "^Epoch" | tee -a "$OUT/summary.txt"
  log "multi: bench on 2 GPUs (Muon+AdamW), per-rank 200k points"
  $BIN launch --nproc 2 --port 29533 -- bench --rounds 2 --steps 10 --warmup 5 --policies blocking async none 2>&1 | grep -vE "^Epoch" | tee -a "$OUT/summary.txt"
  log "multi: train on 2 GPUs, 2 epochs of 8 steps"
  $BIN launch --nproc 2 --port 29534 -- train model=transolver_volume dataset=synthetic_volume \
    training.num_epochs=2 training.steps_per_epoch=8 run_id=volume2 >"$OUT/train_volume2.log" 2>&1
  grep -vE "^Epoch [0-9]+ \[" "$OUT/train_volume2.log" | grep -E "loss |epoch_seconds|peak|error|Run directory" | tee -a "$OUT/summary.txt"
  cp runs/volume2/metrics.jsonl "$OUT/metrics_volume2.jsonl" 2>/dev/null
}

stage_torchrun() {
  log "torchrun: 2 ranks, torchrun --nproc-per-node 2 --no-python slipstream train"
  torchrun --nproc-per-node 2 --no-python $BIN train model=transolver_volume \
    dataset=synthetic_volume training.num_epochs=1 training.steps_per_epoch=6 \
    training.validate=false run_id=torchrun >"$OUT/torchrun.log" 2>&1
  local rc=$?
  grep -E "summary|^  loss |error|Error|Run directory" "$OUT/torchrun.log" | head -20 | tee -a "$OUT/summary.txt"
  python3 - <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import json
rs = [json.loads(l) for l in open("runs/torchrun/metrics.jsonl")]
steps = [r["global_step"] for r in rs if r["kind"] == "train_step"]
ws = [r["dataset"]["world_size"] for r in rs if r["kind"] == "dataset"]
print(f"torchrun run: world_size {ws}, train steps logged {steps}")
PY
  return $rc
}

stage_fused() {
  log "fused: kernels against the plain path (several N, dim_head 16/32/64)"
  build-gpu/tests/fused_attention_CUDA_test >"$OUT/fused_test.log" 2>&1; local rc=$?
  grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|Failure|Expected|Which is|N=|grad " "$OUT/fused_test.log" \
    | head -150 | tee -a "$OUT/summary.txt"
  log "fused: per-kernel timings, volume shapes (200k points)"
  build-gpu/bench/slice_kernels_bench 200000 20 2>&1 | tee -a "$OUT/summary.txt"
  for opt in adamw muon; do
    for fused in true ${FUSED_ALSO_PLAIN-false}; do
      log "fused: bench, volume config, $opt, fused_attention=$fused"
      $BIN bench --rounds 2 --steps 10 --warmup 5 optimizer.name=$opt \
        model.fused_attention=$fused --policies async 2>&1 | grep -E "^async|error|rror" \
        | tee -a "$OUT/summary.txt"
    done
  done
  return $rc
}

stage_ncu() {
  # Nsight Compute on one launch of each slice kernel (Firecracker machines
  # read the counters; clocks left alone).
  for k in reduce_kernel expand_kernel backward_kernel; do
    log "ncu: $k (volume shapes)"
    ncu --clock-control none -k "regex:$k" -c 1 --section SpeedOfLight --section WarpStateStats \
      --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      build-gpu/bench/slice_kernels_bench 200000 1 >"$OUT/ncu_$k.txt" 2>&1
    grep -E "Duration|Throughput|Stall|Warp Cycles Per|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Issued|Eligible|Bank" \
      "$OUT/ncu_$k.txt" | head -40 | tee -a "$OUT/summary.txt"
  done
}

stage_profile_step() {
  log "profile: one AdamW step's kernels, fused (volume config)"
  $BIN bench --rounds 1 --steps 6 --warmup 4 optimizer.name=adamw run_id=profile --profile \
    --policies async 2>&1 | grep -vE "^Epoch|^\{" | tee -a "$OUT/summary.txt"
  python3 scripts/trace_ops.py runs/bench-profile-kernel_trace.json 14 10 >"$OUT/trace_ops.txt" 2>&1
  cat "$OUT/trace_ops.txt" | tee -a "$OUT/summary.txt"
}

stage_layernorm() {
  for ln in true false; do
    log "layernorm: bench, volume config, adamw, fused, model.bf16_layer_norm=$ln"
    $BIN bench --rounds 2 --steps 10 --warmup 5 optimizer.name=adamw model.bf16_layer_norm=$ln \
      --policies async 2>&1 | grep -E "^async|rror" | tee -a "$OUT/summary.txt"
  done
}

stage_floor() {
  log "floor: AdamW, fused, model.slice_num=16 (what the step costs besides the slices)"
  $BIN bench --rounds 2 --steps 10 --warmup 5 optimizer.name=adamw model.slice_num=16 \
    --policies async 2>&1 | grep -E "^async|rror" | tee -a "$OUT/summary.txt"
}

stage_quickbench() {
  log "quickbench: volume config, Muon+AdamW, 2 rounds x 10 steps"
  $BIN bench --rounds 2 --steps 10 --warmup 5 2>&1 | grep -E "^(blocking|async|none) " | tee -a "$OUT/summary.txt"
}

stage_profile() {
  # Where the step's time goes, for the fused-kernel work: the same step
  # with fewer slices (less points x heads x slices traffic), and AdamW.
  for extra in "" "model.slice_num=32" "model.slice_num=64" "model.n_layers=6"; do
    log "profile: AdamW, async, $extra"
    $BIN bench --rounds 1 --steps 10 --warmup 5 optimizer.name=adamw $extra --policies async 2>&1 \
      | grep -E "^async|error" | tee -a "$OUT/summary.txt"
  done
}

stage_audit() {
  log "audit: volume config, 200k points, 30 steps"
  $BIN train --audit-syncs model=transolver_volume dataset=synthetic_volume training.num_epochs=1 \
    training.steps_per_epoch=30 training.validate=false run_id=audit 2>&1 | grep -E "Sync audit|error" | tee -a "$OUT/summary.txt"
}

stage_train() {
  log "train: volume config, 200k points, bf16, 3 epochs of 16 steps"
  $BIN train model=transolver_volume dataset=synthetic_volume training.num_epochs=3 \
    training.steps_per_epoch=16 run_id=volume >"$OUT/train_volume.log" 2>&1
  local rc=$?
  grep -vE "^Epoch [0-9]+ \[" "$OUT/train_volume.log" | tail -40 | tee -a "$OUT/summary.txt"
  cp runs/volume/metrics.jsonl "$OUT/metrics_volume.jsonl" 2>/dev/null
  python3 scripts/check_tensorboard.py runs/volume 2>&1 | tee -a "$OUT/summary.txt"
  return $rc
}

rc=0
for stage in "$@"; do
  "stage_$stage" || { rc=1; log "stage $stage failed"; [ "$stage" = build ] && exit 1; }
done
exit $rc
