#!/usr/bin/env bash
# Builds Slipstream on a CUDA machine with PyTorch installed and runs the
# stages named on the command line, logging under $OUT (default
# /tmp/slipstream-out; a summary in $OUT/summary.txt):
#   build      configure (PyTorch's LibTorch, NCCL found by CMake) and build into build-gpu/
#              (BUILD_TARGETS: those targets alone; BUILD_BENCHMARKS=ON: bench/ too)
#   test       every CTest test, the *_CUDA ones included
#   cuda       the *_CUDA test binaries alone (CUDA_TESTS: globs of names, space-separated), full logs
#   bench      slipstream bench, volume config: Muon + AdamW, then AdamW
#   fused      the fused kernels against the plain path, per-kernel timings,
#              and bench with them on and off (FUSED_ALSO_PLAIN= leaves the plain bench out)
#   audit      slipstream train --audit-syncs: synchronizing calls per steady step (AUDIT_MODEL, AUDIT_ARGS)
#   geo        GeoTransolver volume: bench (fused and plain GALE, AdamW and Muon), its sync audit, the ball query
#   surface    bench transolver_surface at 200k cells and geotransolver_surface
#              (SURFACE_GEO_CELLS), then a full-resolution inference of a 9M-cell
#              synthetic surface (SURFACE_INFER_CELLS; 0: none)
#   exact      exact chunked inference of a 2M- and a 20M-point volume (EXACT_POINTS;
#              EXACT_MODEL: transolver_volume or geotransolver_volume)
#   mdlus      export a fine-tuned model as .mdlus; torch.load and the fixture's names check it
#   train      3 epochs of the volume config, then TensorBoard's own reader on the logs
#   recompute  bench RECOMPUTE_MODEL at RECOMPUTE_POINTS x RECOMPUTE_MODES (training.recompute), and its sync audit
#   profile    bench --profile: device time per kernel (and the operators behind them), the
#              idle gaps and the small kernels (trace_gaps.py, trace_small.py);
#              PROFILE_ARGS: more bench arguments (e.g. model=geotransolver_volume)
#   ncu        Nsight Compute on one kernel launch (NCU_KERNEL regex, default the ball query's
#              search, matched against NCU_NAME_BASE names: function, or demangled for e.g.
#              "backward_kernel<.int.56"; NCU_SKIP launches skipped; NCU_CMD the program,
#              default ball_query_bench):
#              its details page and the SASS lines with the most stall samples
#   wgmma      dev/probes/wgmma_probe.cu: the wgmma helpers' products against the host's, with the
#              MN-major descriptor as wgmma.cuh has it (must pass) and swapped (for comparison);
#              dev/probes/wgmma_rate.cu: the time of one product for small N
#   slices     build-gpu/bench/slice_kernels_bench at 200k points, head sizes SLICE_DIMS (default
#              "56 32"), with the mma.sync kernels (numerics.slice_kernels: mma) and the wgmma ones
#              (SLICE_KERNELS: those of "mma wgmma" to run)
#   gelugemm   dev/probes/gelu_gemm_probe.cu: a wgmma GEMM with GELU (forward) or GELU's backward in its
#              epilogue, checked against a reference and timed against cuBLAS + a GELU pass
#   gemm       cuBLAS (through PyTorch) per operand layout at the GALE layer's shapes, and
#              lt_matmul_bench (cuBLASLt's residual epilogue against linear + add) and
#              gemm_shapes_bench (the block GEMMs against the device's ceilings) where built
#   base       start building the base tree AB_BASE (a `git archive` tarball, or a commit where .git is
#              present) in a tree of its own, in the background, for a later `ab` (AB_BASE_BENCH:
#              bench targets built there too; `slices` runs the base's slice_kernels_bench after ours)
#   ab         the same bench (AB_MODEL: models, space-separated, default geotransolver_volume;
#              AB_POINTS, AB_OPTIMIZER; AB_ARGS: more bench arguments for every tree) on this tree and on the base tree AB_BASE (built by `base`,
#              or here), AB_ROUNDS rounds taken in turn so that drift hits them alike; AB_VARIANTS:
#              this binary again with each override (or, for NAME=value in capitals, environment variable)
#   table      one bench per model x optimizer x precision (TABLE_MODELS, default the four volume and
#              surface configs; TABLE_OPTIMIZERS "adamw muon"; TABLE_PRECISIONS "bf16 fp8"; TABLE_POINTS
#              200000; TABLE_STEPS 10 after TABLE_WARMUP 4): a markdown row of ms/step and peak GiB each
#   ahmed      the full configs (AHMED_MODELS, default both surface ones) trained on prepared
#              Ahmed samples (AHMED_SURFACE, AHMED_VOLUME: `prepare --splits configs/splits/ahmed.json`
#              output, a .tar.xz of it, or the space-separated parts `split` made) for AHMED_EPOCHS epochs (scheduler.step_size AHMED_STEP;
#              AHMED_TIMEOUT s at most, then the checkpoint a SIGTERM leaves), then `infer --split val`:
#              $OUT/ahmed_<model>.log, _val.jsonl (infer_step records) and _forces.svg
#   ahmedvar   variants trained side by side on one GPU, then each one's val inference:
#              AHMED_VARIANTS "label:model:arg,arg,... ..." (e.g. "tf:transolver_surface:loss.forces.weight=0.01";
#              a list value keeps its commas: "vf:transolver_volume:precision=fp8,numerics.fp8_exclude=[a,b]"),
#              on AHMED_SURFACE / AHMED_VOLUME as above, AHMED_EPOCHS / AHMED_STEP / AHMED_TIMEOUT as above;
#              $OUT/ahmed_<label>.log, _val.jsonl, _forces.svg, and a line per variant in the summary;
#              a run that exits non-zero (its time limit: 124) is named there and fails the stage
#   split      (on this machine) SPLIT_DIR, a prepared directory, as .tar.xz parts of at most
#              SPLIT_FILES files each (default 16) in .ab/: for data larger than a call's carry
#   keep       KEEP_FILES (space-separated) copied to /tmp/slipstream-keep, for a later call on the
#              same (warm) machine: carry part 1 and keep it, then carry part 2 and name both,
#              e.g. AHMED_VOLUME="/tmp/slipstream-keep/ahmed_v.1.tar.xz .ab/ahmed_v.2.tar.xz"
#   data       bench-data (DATA_SIZES points per sample, default 1M,10M,50M, none: skip; 200k kept, page
#              cache dropped before each step), then the volume Transolver trained on
#              DATA_SAMPLES (default 4) prepared samples of DATA_POINTS (default 20M) points on
#              disk: each epoch's data-wait share from its summary
#   prepare    the streamed prepare of a synthetic volume of PREPARE_POINTS (default 10M) points
#              (page cache dropped) on PREPARE_CORES (default "all 1": every core, then CPU 0 alone):
#              wall time, points a second and peak memory (--block-rows default)
#   multi      2 GPUs: NCCL tests, bench on 1 and 2 GPUs, a 2-rank training
#   torchrun   2 GPUs through torchrun
# Usage: bash scripts/gpu_check.sh build test bench
#
# The other build dependencies (yaml-cpp, nlohmann-json, CLI11, GoogleTest)
# come from the system, or from Debian .deb files in .deb/ unpacked into a
# prefix — for an image without a package manager: on a Debian machine run
# `bash scripts/gpu_check.sh fetch-debs` and copy .deb/ along.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/slipstream-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
DEPS=/tmp/slipstream-deps
PREFIX_PATH=""
if compgen -G ".deb/*.deb" >/dev/null; then
  mkdir -p "$DEPS"
  for f in .deb/*.deb; do dpkg -x "$f" "$DEPS"; done
  export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  PREFIX_PATH="$DEPS/usr"
fi
BIN=./build-gpu/app/slipstream
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/summary.txt"; }
bench() { "$BIN" bench "$@" 2>&1 | grep -vE "^Epoch|^Model:" | tee -a "$OUT/summary.txt"; }

stage_fetch-debs() {
  mkdir -p .deb && (cd .deb && apt-get download $(cat ../scripts/gpu_debs.txt)) && ls .deb
}

stage_build() {
  local torch_prefix
  torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
  log "build: torch $(python3 -c 'import torch; print(torch.__version__)')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$OUT/summary.txt"
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$PREFIX_PATH" \
    -DSLIPSTREAM_BUILD_BENCHMARKS=${BUILD_BENCHMARKS:-OFF} \
    -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/cmake.log" 2>&1 \
    || { log "cmake FAILED"; tail -40 "$OUT/cmake.log"; return 1; }
  grep -E "slipstream:" "$OUT/cmake.log" | tee -a "$OUT/summary.txt"
  # BUILD_TARGETS: build these targets alone (e.g. slipstream), not everything.
  if ! cmake --build build-gpu -j"$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} \
    >"$OUT/build.log" 2>&1; then
    log "build FAILED"; grep -E "error" -A5 "$OUT/build.log" | head -80; return 1
  fi
  log "build ok"
}

stage_test() {
  # Four tests at a time, four CPU threads each. Without the cap the CPU-only
  # tests took minutes there (transolver_test 299 s, 2.5 s on a CI machine):
  # presumably four LibTorch thread pools of 16 on 16 cores (not yet confirmed).
  (cd build-gpu && OMP_NUM_THREADS=4 ctest --output-on-failure -j4 >"$OUT/ctest.log" 2>&1)
  local rc=$?
  tail -30 "$OUT/ctest.log" | tee -a "$OUT/summary.txt"
  for t in build-gpu/tests/*_CUDA_test build-gpu/tests/run_test; do
    SLIPSTREAM_BIN="$BIN" "$t" 2>&1 | grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|Failure|actual|Sync audit|^largest excess" \
      | tee -a "$OUT/summary.txt"
  done
  return $rc
}

stage_cuda() {  # the CUDA test binaries alone (CUDA_TESTS: globs of their names, space-separated)
  local rc=0 pattern t patterns
  read -ra patterns <<<"${CUDA_TESTS:-*}"  # split, not globbed here
  for pattern in "${patterns[@]}"; do
    for t in build-gpu/tests/${pattern}_CUDA_test; do
      [ -x "$t" ] || { log "cuda: no test binary matches $pattern"; rc=1; continue; }
      SLIPSTREAM_BIN="$BIN" "$t" >"$OUT/$(basename "$t").log" 2>&1 || rc=1
      grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|Failure|actual|^GALE|^  grad|^N=|^context projector|^recompute|^parameter casts|^gelu_linear|^gelu_mlp|^layer norm" \
        "$OUT/$(basename "$t").log" | tee -a "$OUT/summary.txt"
    done
  done
  return $rc
}

stage_bench() {
  log "bench: volume config, 200k points, Muon+AdamW"
  bench --rounds 3 --steps 20 --warmup 10 run_id=bench-muon
  log "bench: volume config, 200k points, AdamW"
  bench --rounds 3 --steps 20 --warmup 10 optimizer.name=adamw run_id=bench-adamw
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
      bench --rounds 2 --steps 10 --warmup 5 optimizer.name=$opt model.fused_attention=$fused \
        --policies async
    done
  done
  return $rc
}

stage_audit() {  # AUDIT_MODEL (default transolver_volume), AUDIT_ARGS: more train arguments
  local model=${AUDIT_MODEL:-transolver_volume}
  log "audit: $model, synthetic volume, 30 steps"
  $BIN train --audit-syncs model=$model dataset=synthetic_volume training.num_epochs=1 \
    training.steps_per_epoch=30 training.validate=false run_id=audit-$model \
    training.start_over=true ${AUDIT_ARGS:-} 2>&1 \
    | grep -E "Sync audit|error" | tee -a "$OUT/summary.txt"
}

stage_geo() {
  # GEO_VARIANTS: "fused-adamw fused-muon plain-adamw" by default.
  for points in ${GEO_POINTS:-20000}; do
    for variant in ${GEO_VARIANTS:-fused-adamw fused-muon plain-adamw}; do
      local fused=true
      [ "${variant%%-*}" = plain ] && fused=false
      log "geo: bench, geotransolver_volume, $points points, ${variant#*-}, fused GALE $fused"
      bench --rounds 1 --steps ${GEO_STEPS:-5} --warmup 3 --policies async \
        model=geotransolver_volume optimizer.name=${variant#*-} model.fused_attention=$fused \
        dataset.points_per_sample=$((points + points / 20)) dataset.sampling_resolution=$points \
        run_id=geo-$points-$variant
    done
  done
  log "geo: audit, geotransolver_volume, 8 steps of 20k points, fused GALE"
  $BIN train --audit-syncs model=geotransolver_volume dataset=synthetic_volume \
    dataset.sampling_resolution=20000 training.num_epochs=1 training.steps_per_epoch=8 \
    training.validate=false run_id=geo-audit >"$OUT/geo_audit.log" 2>&1
  grep -E "Sync audit|error" "$OUT/geo_audit.log" | tee -a "$OUT/summary.txt"
  [ -x build-gpu/bench/ball_query_bench ] || return 0  # built with SLIPSTREAM_BUILD_BENCHMARKS
  log "geo: the ball query alone, the volume config's six scales"
  build-gpu/bench/ball_query_bench ${GEO_QUERY_POINTS:-200000} 2>&1 | tee -a "$OUT/summary.txt"
}

# The base tree of an A/B: AB_BASE, a `git archive` tarball (e.g. made by
# `git archive -o .ab/base.tar.gz BASE` and carried) or, where .git is
# here, a commit (checked out with `git worktree add`). It is built in a
# tree of its own, never in this one.
AB_DIR=/tmp/slipstream-ab
base_tree() {
  local src=$AB_DIR/base-src
  [ -d "$src" ] && { echo "$src"; return 0; }
  mkdir -p "$AB_DIR"
  if [ -f "${AB_BASE:-}" ]; then
    mkdir -p "$src" && tar -xzf "$AB_BASE" -C "$src" || return 1
  elif [ -n "${AB_BASE:-}" ] && git rev-parse --verify -q "${AB_BASE}^{commit}" >/dev/null; then
    git worktree add --detach "$src" "$AB_BASE" >/dev/null 2>&1 || return 1
  else
    return 1
  fi
  cp -r .deb "$src/" 2>/dev/null
  echo "$src"
}

# The base tree's slipstream binary, as stage_build builds this one's; with
# AB_BASE_BENCH (bench targets, e.g. slice_kernels_bench) those too, as
# $AB_DIR/base-<target>, for the same kernel bench on both trees.
build_base() {
  local src torch_prefix t bench=OFF
  src=$(base_tree) || { echo "ab: AB_BASE '${AB_BASE:-}' is neither a tarball nor a commit"; return 1; }
  torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
  [ -n "${AB_BASE_BENCH:-}" ] && bench=ON
  cmake -S "$src" -B "$src/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$PREFIX_PATH" -DSLIPSTREAM_BUILD_BENCHMARKS=$bench \
    -DSLIPSTREAM_BUILD_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES=90 &&
    cmake --build "$src/build-gpu" -j"$(nproc)" --target slipstream ${AB_BASE_BENCH:-} &&
    cp "$src/build-gpu/app/slipstream" "$AB_DIR/base" || return 1
  for t in ${AB_BASE_BENCH:-}; do cp "$src/build-gpu/bench/$t" "$AB_DIR/base-$t" || return 1; done
}

wait_base() {  # until the background build that `base` started has ended, where it did
  [ -f "$AB_DIR/base.pid" ] || return 1
  while kill -0 "$(cat "$AB_DIR/base.pid")" 2>/dev/null; do sleep 2; done
}

stage_base() {  # starts the base build in the background (stage ab waits for it)
  [ -n "${AB_BASE:-}" ] || { log "base: set AB_BASE"; return 1; }
  log "base: building $AB_BASE in $AB_DIR/base-src, in the background"
  mkdir -p "$AB_DIR"
  (build_base >"$OUT/ab-base.log" 2>&1; echo $? >"$AB_DIR/base.rc") &
  echo $! >"$AB_DIR/base.pid"
}

stage_ab() {
  # Trees: this one; the base (AB_BASE) where set; and this binary again
  # with each override in AB_VARIANTS (NAME=value in capitals: an
  # environment variable). Rounds (AB_ROUNDS) take the trees in turn, so
  # that drift hits them alike.
  [ -n "${AB_BASE:-}${AB_VARIANTS:-}" ] || { log "ab: set AB_BASE and/or AB_VARIANTS"; return 1; }
  local points=${AB_POINTS:-200000} v i trees=(this) bins=("$BIN") extras=("") envs=("")
  if [ -n "${AB_BASE:-}" ]; then
    wait_base || { build_base >"$OUT/ab-base.log" 2>&1; echo $? >"$AB_DIR/base.rc"; }
    [ "$(cat "$AB_DIR/base.rc" 2>/dev/null)" = 0 ] ||
      { log "ab: the base does not build (see $OUT/ab-base.log)"; tail -20 "$OUT/ab-base.log"; return 1; }
    log "ab: base built"
    trees+=(base)
    bins+=("$AB_DIR/base")
    extras+=("")
    envs+=("")
  fi
  for v in ${AB_VARIANTS:-}; do
    trees+=("$v")
    bins+=("$BIN")
    if [[ $v =~ ^[A-Z_][A-Z0-9_]*= ]]; then extras+=(""); envs+=("$v"); else extras+=("$v"); envs+=(""); fi
  done
  local model
  for model in ${AB_MODEL:-geotransolver_volume}; do
    local args=(--rounds 1 --steps ${AB_STEPS:-10} --warmup 4 --policies async
      model=$model optimizer.name=${AB_OPTIMIZER:-adamw}
      dataset.points_per_sample=$((points + points / 20)) dataset.sampling_resolution=$points
      ${AB_ARGS:-})
    for r in $(seq "${AB_ROUNDS:-3}"); do
      for i in "${!trees[@]}"; do
        echo "ab $model round $r ${trees[$i]}: $(env ${envs[$i]} "${bins[$i]}" bench "${args[@]}" \
          ${extras[$i]} run_id=ab-$i-$r 2>&1 | grep -E '^async')" | tee -a "$OUT/summary.txt"
      done
    done
  done
}

stage_table() {
  local points=${TABLE_POINTS:-200000} model opt prec data line rc=0 fields
  log "table: $points points, ${TABLE_STEPS:-10} steps after ${TABLE_WARMUP:-4}, one bench each"
  echo "| model | optimizer | precision | ms/step | peak GiB |" | tee -a "$OUT/summary.txt"
  echo "| --- | --- | --- | --- | --- |" | tee -a "$OUT/summary.txt"
  for model in ${TABLE_MODELS:-transolver_volume geotransolver_volume transolver_surface geotransolver_surface}; do
    case $model in *surface) data=synthetic_surface ;; *) data=synthetic_volume ;; esac
    for opt in ${TABLE_OPTIMIZERS:-adamw muon}; do
      for prec in ${TABLE_PRECISIONS:-bf16 fp8}; do
        # bench's "async" row: mean, min and max ms/step, then peak GiB.
        line=$("$BIN" bench --rounds 1 --steps "${TABLE_STEPS:-10}" --warmup "${TABLE_WARMUP:-4}" \
          --policies async model="$model" dataset="$data" optimizer.name="$opt" precision="$prec" \
          dataset.points_per_sample=$((points + points / 20)) dataset.sampling_resolution="$points" \
          run_id="table-$model-$opt-$prec" 2>"$OUT/table-$model-$opt-$prec.err" | grep -E '^async' | tail -1)
        read -ra fields <<<"$line"
        if [ "${#fields[@]}" -lt 5 ]; then
          rc=1; fields=(async failed - - -)
          tail -3 "$OUT/table-$model-$opt-$prec.err" >>"$OUT/summary.txt"
        fi
        echo "| $model | $opt | $prec | ${fields[1]} | ${fields[4]} |" | tee -a "$OUT/summary.txt"
      done
    done
  done
  return $rc
}

stage_surface() {
  log "surface: bench, transolver_surface, 200k cells, AdamW"
  bench --rounds 1 --steps 10 --warmup 3 --policies async model=transolver_surface \
    dataset=synthetic_surface dataset.points_per_sample=210000 dataset.sampling_resolution=200000 \
    optimizer.name=adamw run_id=surface-bench
  for cells in ${SURFACE_GEO_CELLS:-200000}; do
    log "surface: bench, geotransolver_surface, $cells cells, AdamW, plain GALE"
    bench --rounds 1 --steps 3 --warmup 2 --policies async model=geotransolver_surface \
      dataset=synthetic_surface dataset.points_per_sample=$((cells + cells / 20)) \
      dataset.sampling_resolution=$cells optimizer.name=adamw run_id=geo-surface-$cells
  done
  local cells=${SURFACE_INFER_CELLS:-9000000}
  [ "$cells" = 0 ] && return 0
  log "surface: full-resolution inference of a $cells-cell synthetic surface"
  $BIN train model=transolver_surface dataset=synthetic_surface dataset.num_train=2 \
    dataset.num_val=1 dataset.points_per_sample=20000 training.num_epochs=1 \
    run_id=surface-infer >"$OUT/surface_train.log" 2>&1 || { log "surface train FAILED"; tail -20 "$OUT/surface_train.log"; }
  local t0=$(date +%s)
  $BIN make-synthetic --out /tmp/surface-big dataset=synthetic_surface dataset.num_train=1 \
    dataset.num_val=0 dataset.points_per_sample=$cells 2>&1 | tee -a "$OUT/summary.txt"
  log "surface: wrote the sample in $(( $(date +%s) - t0 )) s"
  $BIN infer --checkpoint runs/surface-infer/checkpoints --split train --data /tmp/surface-big \
    --out "$OUT/surface-infer" 2>&1 | tee -a "$OUT/summary.txt"
}

stage_exact() {
  local model=${EXACT_MODEL:-transolver_volume}
  log "exact: $model chunked inference (two passes a layer) on a large synthetic volume"
  build-gpu/tests/transolver_test --gtest_filter='*Chunk*' 2>&1 | grep -E "OK|FAILED|largest" \
    | tee -a "$OUT/summary.txt"
  $BIN train model=$model dataset=synthetic_volume dataset.num_train=2 \
    dataset.num_val=1 training.num_epochs=1 run_id=exact >"$OUT/exact_train.log" 2>&1 \
    || { log "exact train FAILED"; tail -20 "$OUT/exact_train.log"; return 1; }
  for points in ${EXACT_POINTS:-2000000 20000000}; do
    local t0=$(date +%s)
    timeout ${EXACT_TIMEOUT:-240} $BIN make-synthetic --out /tmp/exact-$points dataset=synthetic_volume \
      dataset.num_train=1 dataset.num_val=0 dataset.points_per_sample=$points 2>&1 | tail -1 \
      | tee -a "$OUT/summary.txt"
    log "exact: wrote the $points-point sample in $(( $(date +%s) - t0 )) s"
    $BIN infer --checkpoint runs/exact --split train --data /tmp/exact-$points \
      --out "$OUT/exact-$points" 2>&1 | grep -vE "^coef|^C[DLSM]" | tee -a "$OUT/summary.txt"
  done
}

stage_recompute() {
  # Points per step x training.recompute (issue 19): ms/step and peak GiB.
  # RECOMPUTE_MODEL: transolver_volume (default) or geotransolver_volume.
  local model=${RECOMPUTE_MODEL:-transolver_volume}
  for points in ${RECOMPUTE_POINTS:-200000 1000000}; do
    for mode in ${RECOMPUTE_MODES:-none attention block}; do
      log "recompute: bench, $model, $points points, AdamW, recompute=$mode"
      bench --rounds 1 --steps ${RECOMPUTE_STEPS:-5} --warmup 2 --policies async model=$model \
        optimizer.name=adamw training.recompute=$mode dataset.num_train=2 dataset.num_val=0 \
        dataset.points_per_sample=$((points + points / 20)) dataset.sampling_resolution=$points \
        run_id=rc-$mode-$points || log "recompute: $mode at $points points FAILED"
    done
  done
  if [ -z "${RECOMPUTE_NO_AUDIT:-}" ]; then
    log "recompute: audit, $model, 200k points, recompute=block, 20 steps"
    $BIN train --audit-syncs model=$model dataset=synthetic_volume training.num_epochs=1 \
      training.steps_per_epoch=20 training.validate=false training.recompute=block \
      run_id=rc-audit 2>&1 | grep -E "Sync audit|error" | tee -a "$OUT/summary.txt"
  fi
}

stage_mdlus() {
  log "mdlus: export a model fine-tuned from PhysicsNeMo's checkpoint, read it with torch.load"
  local fx=tests/fixtures
  $BIN train model.init_from=$fx/transolver_small.mdlus model.n_layers=2 model.n_hidden=64 \
    model.n_head=4 model.slice_num=16 dataset.num_train=2 dataset.num_val=1 \
    training.num_epochs=1 run_id=mdlus-ft >"$OUT/mdlus_train.log" 2>&1 \
    || { log "mdlus train FAILED"; tail -20 "$OUT/mdlus_train.log"; return 1; }
  $BIN export --checkpoint runs/mdlus-ft --out /tmp/ft.mdlus 2>&1 | tee -a "$OUT/summary.txt"
  python3 scripts/check_mdlus.py /tmp/ft.mdlus $fx/transolver_small.mdlus 2>&1 | tee -a "$OUT/summary.txt"
  $BIN train model=geotransolver_small model.init_from=$fx/geotransolver_small_volume.mdlus \
    dataset.num_train=2 dataset.num_val=1 training.num_epochs=1 run_id=mdlus-geo \
    >"$OUT/mdlus_geo.log" 2>&1 || { log "mdlus geo train FAILED"; tail -8 "$OUT/mdlus_geo.log"; return 1; }
  $BIN export --checkpoint runs/mdlus-geo --out /tmp/geo.mdlus 2>&1 | tee -a "$OUT/summary.txt"
  python3 scripts/check_mdlus.py /tmp/geo.mdlus $fx/geotransolver_small_volume.mdlus 2>&1 | tee -a "$OUT/summary.txt"
}

stage_train() {
  log "train: volume config, 200k points, bf16, 3 epochs of 16 steps"
  $BIN train model=transolver_volume dataset=synthetic_volume training.num_epochs=3 \
    training.steps_per_epoch=16 run_id=volume >"$OUT/train_volume.log" 2>&1
  local rc=$?
  grep -vE "^(Epoch [0-9]+(/[0-9]+)? \[|Validation [0-9])" "$OUT/train_volume.log" | tail -52 | tee -a "$OUT/summary.txt"
  python3 scripts/check_tensorboard.py runs/volume 2>&1 | tee -a "$OUT/summary.txt"
  return $rc
}

# A prepared directory, or a .tar.xz of one (or its parts, space-separated)
# unpacked under /tmp: its path.
prepared_dir() {
  case "$1" in
    *.tar.xz*)
      local part
      mkdir -p /tmp/ahmed
      for part in $1; do tar xJf "$part" -C /tmp/ahmed || return 1; done
      echo "/tmp/ahmed/$(tar tJf "${1%% *}" | head -1 | cut -d/ -f1)" ;;
    *) echo "$1" ;;
  esac
}

stage_split() {
  local dir=${SPLIT_DIR:?SPLIT_DIR is not set} name files i=0 n
  name=$(basename "$dir")
  mkdir -p .ab
  mapfile -t files < <(cd "$(dirname "$dir")" && find "$name" -type f | sort -V)
  n=${SPLIT_FILES:-16}
  while ((i * n < ${#files[@]})); do
    (cd "$(dirname "$dir")" && tar cf - "${files[@]:i*n:n}" | xz -T0) >".ab/$name.$((i + 1)).tar.xz" ||
      return 1
    i=$((i + 1))
  done
  ls -l .ab/"$name".*.tar.xz | tee -a "$OUT/summary.txt"
}

stage_keep() {
  mkdir -p /tmp/slipstream-keep && cp ${KEEP_FILES:?KEEP_FILES is not set} /tmp/slipstream-keep/ &&
    ls -l /tmp/slipstream-keep | tee -a "$OUT/summary.txt"
}

stage_ahmed() {
  local m kind data rc=0
  for m in ${AHMED_MODELS:-transolver_surface geotransolver_surface}; do
    case $m in
      *surface) kind=surface; data=${AHMED_SURFACE:-} ;;
      *) kind=volume; data=${AHMED_VOLUME:-} ;;
    esac
    [ -n "$data" ] || { log "ahmed: AHMED_${kind^^} is not set"; rc=1; continue; }
    data=$(prepared_dir "$data") || { log "ahmed: cannot unpack $data"; rc=1; continue; }
    log "ahmed: $m on $data, ${AHMED_EPOCHS:-200} epochs"
    timeout -s TERM "${AHMED_TIMEOUT:-300}" "$BIN" train model="$m" dataset="ahmed_$kind" \
      dataset.path="$data" training.num_epochs="${AHMED_EPOCHS:-200}" \
      scheduler.step_size="${AHMED_STEP:-50}" training.save_interval=25 run_id="ahmed_$m" \
      ${AHMED_ARGS:-} 2>&1 | grep -vE "^(Epoch [0-9]+(/[0-9]+)? \[|Validation [0-9])" >"$OUT/ahmed_$m.log" || rc=1
    tail -40 "$OUT/ahmed_$m.log" | tee -a "$OUT/summary.txt"
    "$BIN" infer --checkpoint "runs/ahmed_$m" --split val --out "runs/ahmed_$m/infer_val" \
      >>"$OUT/ahmed_$m.log" 2>&1 || rc=1
    tail -16 "$OUT/ahmed_$m.log" | tee -a "$OUT/summary.txt"
    cp "runs/ahmed_$m/infer_val/metrics.jsonl" "$OUT/ahmed_${m}_val.jsonl"
    [ "$kind" = surface ] && cp "runs/ahmed_$m/infer_val/forces.svg" "$OUT/ahmed_${m}_forces.svg"
  done
  return $rc
}

stage_ahmedvar() {
  local v label model args argv kind data rc=0 pids=() labels=() surface="" volume=""
  # Unpacked once, before any run reads them.
  [ -n "${AHMED_SURFACE:-}" ] && { surface=$(prepared_dir "$AHMED_SURFACE") || return 1; }
  [ -n "${AHMED_VOLUME:-}" ] && { volume=$(prepared_dir "$AHMED_VOLUME") || return 1; }
  for v in ${AHMED_VARIANTS:?AHMED_VARIANTS is not set}; do
    IFS=: read -r label model args <<<"$v"
    case $model in *surface) kind=surface; data=$surface ;; *) kind=volume; data=$volume ;; esac
    [ -n "$data" ] || { log "ahmedvar: AHMED_${kind^^} is not set"; rc=1; continue; }
    # The args split at commas outside [...]: a list value stays one arg.
    mapfile -t argv < <(python3 -c 'import re, sys; print("\n".join(re.findall(r"(?:[^,\[]|\[[^\]]*\])+", sys.argv[1])))' "$args")
    [ -n "$args" ] || argv=()
    log "ahmedvar: $label: $model ${argv[*]}, ${AHMED_EPOCHS:-200} epochs"
    timeout -s TERM "${AHMED_TIMEOUT:-300}" "$BIN" train model="$model" dataset="ahmed_$kind" \
      dataset.path="$data" training.num_epochs="${AHMED_EPOCHS:-200}" \
      scheduler.step_size="${AHMED_STEP:-50}" training.save_interval=25 run_id="ahmed_$label" \
      "${argv[@]}" >"$OUT/ahmed_$label.log" 2>&1 &
    pids+=($!); labels+=("$label")
  done
  # Each run's own exit status: one that died (a time limit, a fault) is
  # still measured from its last checkpoint, but flagged, and fails the stage.
  local i status
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"; status=$?
    [ "$status" -eq 0 ] || { log "ahmedvar: ${labels[$i]}: training exited $status (124: its time limit); measured from its last checkpoint"; rc=1; }
  done
  for label in "${labels[@]}"; do
    grep -vE "^(Epoch [0-9]+(/[0-9]+)? \[|Validation [0-9])" "$OUT/ahmed_$label.log" | tail -24 >>"$OUT/summary.txt"
    "$BIN" infer --checkpoint "runs/ahmed_$label" --split val --out "runs/ahmed_$label/infer_val" \
      >>"$OUT/ahmed_$label.log" 2>&1 || rc=1
    cp "runs/ahmed_$label/metrics.jsonl" "$OUT/ahmed_${label}_train.jsonl"
    cp "runs/ahmed_$label/infer_val/metrics.jsonl" "$OUT/ahmed_${label}_val.jsonl"
    cp "runs/ahmed_$label/infer_val/forces.svg" "$OUT/ahmed_${label}_forces.svg" 2>/dev/null
    python3 - "$OUT/ahmed_${label}_val.jsonl" "$label" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
s = next((r for r in rs if r.get("phase") == "infer_summary"), {})
f = next((r for r in rs if r.get("phase") == "infer_forces_summary"), {})
m = s.get("metrics", s)
def g(d, *k):
    for x in k:
        d = d.get(x, {}) if isinstance(d, dict) else {}
    return d if d != {} else None
l2 = " ".join(f"{k} {v:.4f}" for k, v in sorted(m.items()) if k.endswith("_l2") and isinstance(v, float))
print(sys.argv[2], l2,
      "CD", json.dumps(f.get("CD", f.get("coefficients", {}).get("CD"))),
      "CL", json.dumps(f.get("CL", f.get("coefficients", {}).get("CL"))))
PY
  done
  return $rc
}

stage_data() {
  local dir=/tmp/slipstream-data
  mkdir -p "$dir"
  if [ "${DATA_SIZES:-}" != none ]; then
    log "data: bench-data, sizes ${DATA_SIZES:-1000000,10000000,50000000}"
    $BIN bench-data --dir "$dir/bench" --sizes "${DATA_SIZES:-1000000,10000000,50000000}" \
      2>&1 | tee -a "$OUT/summary.txt"
  fi
  log "data: ${DATA_SAMPLES:-4} samples of ${DATA_POINTS:-20000000} points"
  /usr/bin/time -v "$BIN" make-synthetic --out "$dir/big" dataset=synthetic_volume \
    dataset.num_train="${DATA_SAMPLES:-4}" dataset.num_val=0 \
    dataset.points_per_sample="${DATA_POINTS:-20000000}" >"$OUT/data_make.log" 2>&1 || return 1
  grep -E "Elapsed|Maximum resident" "$OUT/data_make.log" | tee -a "$OUT/summary.txt"
  du -sh "$dir/big" | tee -a "$OUT/summary.txt"
  # From the disk: the samples' pages dropped from the cache (each epoch
  # reads other blocks, so later epochs read from the disk too).
  python3 -c 'import glob, os
for p in glob.glob("'"$dir"'/big/*.safetensors"):
    fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)'
  log "data: transolver_volume on them, 200k points a step, page cache dropped"
  $BIN train model=transolver_volume dataset=prepared dataset.path="$dir/big" \
    dataset.sampling_resolution=200000 training.num_epochs="${DATA_EPOCHS:-6}" \
    run_id=data_big ${DATA_ARGS:-} >"$OUT/data_train.log" 2>&1 || return 1
  grep -vE "^(Epoch [0-9]+(/[0-9]+)? \[|Validation [0-9])" "$OUT/data_train.log" | tail -30 | tee -a "$OUT/summary.txt"
  python3 - <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import json
rs = [json.loads(l) for l in open("runs/data_big/metrics.jsonl")]
for r in rs:
    if "data_wait_share" in r:
        print({k: r.get(k) for k in ("phase", "epoch", "epoch_seconds", "data_time_s", "data_wait_share", "steps")})
steps = [r for r in rs if r.get("phase") == "train_step"]
if steps:
    late = steps[len(steps) // 3:]
    d = sum(r["data_time_s"] for r in late); t = sum(r["step_time_s"] for r in late)
    print(f"train steps after the first third: data wait {d:.3f} s of {t:.3f} s ({100*d/t:.2f} %)")
PY
}

stage_prepare() {
  local n=${PREPARE_POINTS:-10000000} dir=/tmp/slipstream-prepare cores pin rc=0
  rm -rf "$dir" && mkdir -p "$dir"
  log "prepare: a synthetic volume of $n points; cores: ${PREPARE_CORES:-all 1} of $(nproc)"
  "$BIN" make-synthetic --format vtk --out "$dir/raw" dataset=synthetic_volume dataset.num_train=1 \
    dataset.num_val=0 dataset.points_per_sample="$n" >"$OUT/prepare_make.log" 2>&1 \
    || { tail -5 "$OUT/prepare_make.log"; return 1; }
  for cores in ${PREPARE_CORES:-all 1}; do
    # One core: the process pinned to CPU 0 (its threads share it).
    pin=""; [ "$cores" = all ] || pin="taskset -c 0-$((cores - 1))"
    rm -rf "$dir/out"
    sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
    /usr/bin/time -v $pin "$BIN" prepare --in "$dir/raw" --out "$dir/out" --val-fraction 0 \
      >"$OUT/prepare_$cores.log" 2>&1 || { tail -20 "$OUT/prepare_$cores.log"; rc=1; continue; }
    grep -E "Prepared|Elapsed|Maximum resident" "$OUT/prepare_$cores.log" | tee -a "$OUT/summary.txt"
    python3 - "$OUT/prepare_$cores.log" "$n" "$cores" <<'PY' | tee -a "$OUT/summary.txt"
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", t)
s = (int(m.group(1) or 0) * 3600 + int(m.group(2)) * 60 + float(m.group(3)))
print(f"prepare, {sys.argv[3]} cores: {int(sys.argv[2]) / s / 1e6:.2f} M points/s over {s:.1f} s")
PY
  done
  return $rc
}

stage_profile() {
  log "profile: one AdamW round's kernels, fused (volume config)"
  bench --rounds 1 --steps 6 --warmup 4 optimizer.name=adamw run_id=profile --profile \
    --policies async ${PROFILE_ARGS:-}
  python3 dev/trace/trace_ops.py runs/bench-profile-kernel_trace.json ${PROFILE_KERNELS:-14} 10 2>&1 \
    | tee -a "$OUT/summary.txt"
  log "profile: where the GPU sits idle"
  python3 dev/trace/trace_gaps.py runs/bench-profile-kernel_trace.json 10 16 2>&1 | tee -a "$OUT/summary.txt"
  log "profile: the small kernels"
  python3 dev/trace/trace_small.py runs/bench-profile-kernel_trace.json 10 ${PROFILE_SMALL:-25} 2>&1 \
    | tee -a "$OUT/summary.txt"
}

stage_wgmma() {
  local nvcc rc=0 swap
  nvcc=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' build-gpu/CMakeCache.txt 2>/dev/null)
  for swap in 0 1; do
    "${nvcc:-nvcc}" -std=c++17 -arch=sm_90a -I src -DSLIPSTREAM_WGMMA_MN_SWAP=$swap \
      dev/probes/wgmma_probe.cu -o "/tmp/wgmma_probe_$swap" >"$OUT/wgmma_probe_$swap.log" 2>&1 ||
      { log "wgmma: the probe does not build"; cat "$OUT/wgmma_probe_$swap.log"; return 1; }
    "/tmp/wgmma_probe_$swap" 2>&1 | tee -a "$OUT/summary.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || { [ $swap = 1 ] || rc=1; }
  done
  "${nvcc:-nvcc}" -std=c++17 -arch=sm_90a -I src dev/probes/wgmma_rate.cu -o /tmp/wgmma_rate \
    >"$OUT/wgmma_rate.log" 2>&1 && /tmp/wgmma_rate 2>&1 | tee -a "$OUT/summary.txt"
  return $rc
}

stage_gelugemm() {  # dev/probes/gelu_gemm_probe.cu: the MLP's GEMM with GELU in its epilogue
  log "gelugemm: wgmma GEMM + GELU epilogue against cuBLAS + a GELU pass"
  nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I src -Xptxas -v \
    dev/probes/gelu_gemm_probe.cu -lcublas -o /tmp/gelu_gemm_probe >"$OUT/gelugemm-build.log" 2>&1 \
    || { log "gelugemm: build FAILED"; grep -E "error" "$OUT/gelugemm-build.log" | head; return 1; }
  /tmp/gelu_gemm_probe "${GELU_GEMM_M:-200000}" 2>&1 | tee -a "$OUT/summary.txt"
}

stage_slices() {
  local k d
  [ -n "${AB_BASE_BENCH:-}" ] && wait_base  # the base's bench, where `base` builds it
  for k in ${SLICE_KERNELS:-mma wgmma}; do
    for d in ${SLICE_DIMS:-56 32}; do
      log "slices: $k kernels, dim_head $d"
      build-gpu/bench/slice_kernels_bench 200000 20 "$d" "$k" 2>&1 | tee -a "$OUT/summary.txt"
      if [ -x "$AB_DIR/base-slice_kernels_bench" ]; then  # built by `base` with AB_BASE_BENCH
        log "slices: the base tree's, $k kernels, dim_head $d"
        "$AB_DIR/base-slice_kernels_bench" 200000 20 "$d" "$k" 2>&1 | tee -a "$OUT/summary.txt"
      fi
    done
  done
}

stage_ncu() {
  local cmd=${NCU_CMD:-build-gpu/bench/ball_query_bench 200000 1}
  log "ncu: ${NCU_KERNEL:-search_kernel} (launch ${NCU_SKIP:-12} skipped) in: $cmd"
  ncu --clock-control none --set full --import-source no --kernel-name-base "${NCU_NAME_BASE:-function}" \
    -k "regex:${NCU_KERNEL:-search_kernel}" \
    --launch-skip "${NCU_SKIP:-12}" --launch-count 1 -f -o "$OUT/ncu" $cmd >"$OUT/ncu_run.log" 2>&1 ||
    { tail -20 "$OUT/ncu_run.log" | tee -a "$OUT/summary.txt"; return 1; }
  ncu --import "$OUT/ncu.ncu-rep" --page details >"$OUT/ncu_details.txt" 2>&1
  grep -vE "^ +-+ +-+" "$OUT/ncu_details.txt" | head -${NCU_LINES:-220} | tee -a "$OUT/summary.txt"
  ncu --import "$OUT/ncu.ncu-rep" --page source --print-source sass --csv >"$OUT/ncu_sass.csv" 2>&1
  python3 - "$OUT/ncu_sass.csv" <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next((i for i, r in enumerate(rows) if any("Source" == c for c in r)), None)
if head is None:
    print("ncu: no source table:", rows[:3]); sys.exit()
cols = rows[head]
si = cols.index("Source")
stall = [i for i, c in enumerate(cols) if "Stall Sampling (All" in c] or \
        [i for i, c in enumerate(cols) if "Sampling" in c]
def num(r, i):
    try: return float(r[i].replace(",", ""))
    except (ValueError, IndexError): return 0.0
body = [r for r in rows[head + 1:] if len(r) > si]
total = sum(num(r, stall[0]) for r in body) or 1.0
print("ncu: SASS lines by stall samples (%s), %d lines" % (cols[stall[0]], len(body)))
for idx, r in sorted(enumerate(body), key=lambda t: -num(t[1], stall[0]))[:45]:
    print("%5d %5.1f%%  %s" % (idx, 100 * num(r, stall[0]) / total, r[si][:110]))
PY
}

stage_gemm() {
  log "gemm: cuBLAS per operand layout, the GALE layer's shapes at 200k rows"
  python3 dev/probes/gemm_layouts.py 200000 2>&1 | tee -a "$OUT/summary.txt"
  if [ -x build-gpu/bench/lt_matmul_bench ]; then
    log "gemm: cuBLASLt's residual epilogue against linear + add (lt_matmul_bench)"
    build-gpu/bench/lt_matmul_bench 200000 20 2>&1 | tee -a "$OUT/summary.txt"
  fi
  if [ -x build-gpu/bench/gemm_shapes_bench ]; then
    log "gemm: the volume models' block GEMMs against this device's ceilings (gemm_shapes_bench)"
    build-gpu/bench/gemm_shapes_bench 200000 20 2>&1 | tee -a "$OUT/summary.txt"
  fi
}

stage_multi() {
  log "multi: NCCL readback and distributed tests (2 GPUs)"
  for t in readback_CUDA_test distributed_trainer_test; do
    build-gpu/tests/$t 2>&1 | grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|Failure|actual" \
      | tee -a "$OUT/summary.txt"
  done
  log "multi: bench on 1 GPU, then 2 (200k points per rank)"
  bench --rounds 2 --steps 10 --warmup 5
  $BIN launch --nproc 2 --port 29533 -- bench --rounds 2 --steps 10 --warmup 5 2>&1 \
    | grep -vE "^Epoch|^Model:" | tee -a "$OUT/summary.txt"
  log "multi: train on 2 GPUs, 2 epochs of 8 steps"
  $BIN launch --nproc 2 --port 29534 -- train model=transolver_volume dataset=synthetic_volume \
    training.num_epochs=2 training.steps_per_epoch=8 run_id=volume2 >"$OUT/train_volume2.log" 2>&1
  grep -E "loss |epoch_seconds|peak|error|Run directory" "$OUT/train_volume2.log" \
    | tee -a "$OUT/summary.txt"
}

stage_torchrun() {
  log "torchrun: 2 ranks"
  torchrun --nproc-per-node 2 --no-python $BIN train model=transolver_volume \
    dataset=synthetic_volume training.num_epochs=1 training.steps_per_epoch=6 \
    training.validate=false run_id=torchrun >"$OUT/torchrun.log" 2>&1
  local rc=$?
  python3 - <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import json
rs = [json.loads(l) for l in open("runs/torchrun/metrics.jsonl")]
steps = [r["global_step"] for r in rs if r["phase"] == "train_step"]
ws = [r["world_size"] for r in rs if r["phase"] == "dataset"]
print(f"torchrun run: world_size {ws}, train steps logged {steps}")
PY
  return $rc
}

rc=0
for stage in "$@"; do
  "stage_$stage" || { rc=1; log "stage $stage failed"; [ "$stage" = build ] && exit 1; }
done
exit $rc
