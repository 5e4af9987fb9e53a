#!/usr/bin/env bash
# Serve and convert against thread count (issue 17's scaling table): W1 on one checkpoint at 1 and 2 threads,
# each against its floor measured in the same run on the same number of CPUs.
#
#   bash benchmarks/scale_threads.sh CKPT SCRATCH [REPS] [THREADS...]
#   bash benchmarks/scale_threads.sh /work/ckpt/w1_2g /work/ckpt/scratch 5 1 2
#
# serve:      w1_lazy.py serve --workers N           floor: w1_lazy.py copy-floor pinned to N CPUs (taskset)
# serve-into: w1_lazy.py serve-into --workers N      (same floor)
# convert:    w1_lazy.py convert --budget 256 MiB    floor: cp -r + sync pinned to N CPUs
# Every contestant gets warm memory right before it (3 GiB touched and freed: this VM hands freed memory back
# to its host, and re-faulting it is 10-40x slower) and a `sync`. Prints every run, then medians and ratios.
set -euo pipefail
ckpt=${1:?checkpoint folder}; scratch=${2:?scratch folder}; reps=${3:-5}; shift $(( $# < 3 ? $# : 3 ))
threads=("$@"); [ ${#threads[@]} -eq 0 ] && threads=(1 2)
PY=${PYTHON:-python}  # the interpreter that has lazyweights (python3 where there is no `python`)
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp)
prime() { "$PY" -c "import numpy as np; a = np.empty(3 << 30, np.uint8); a[::4096] = 1"; }
cpus() { seq -s, 0 $(( $1 - 1 )); }
mkdir -p "$scratch"
for rep in $(seq "$reps"); do
  for w in "${threads[@]}"; do
    sync; prime; echo "floor w=$w $(taskset -c "$(cpus "$w")" "$PY" "$here/w1_lazy.py" "$ckpt" copy-floor)" | tee -a "$out"
    sync; prime; echo "serve w=$w $("$PY" "$here/w1_lazy.py" "$ckpt" serve --workers "$w")" | tee -a "$out"
    sync; prime; echo "serve-into w=$w $("$PY" "$here/w1_lazy.py" "$ckpt" serve-into --workers "$w")" | tee -a "$out"
    rm -rf "$scratch/conv"; sync; prime
    echo "convert w=$w $("$PY" "$here/w1_lazy.py" "$ckpt" convert "$scratch/conv" --budget 268435456 --workers "$w")" | tee -a "$out"
    rm -rf "$scratch/conv"; sync; prime
    s=$(date +%s.%N); taskset -c "$(cpus "$w")" cp -r "$ckpt" "$scratch/conv"; sync; e=$(date +%s.%N)
    echo "cp w=$w {\"seconds\": $("$PY" -c "print($e - $s)")}" | tee -a "$out"
  done
done
rm -rf "$scratch/conv"
"$PY" - "$out" <<'PY'
import collections, json, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    key, _, rest = line.partition(" {")
    runs[key].append(json.loads("{" + rest)["seconds"])
m = {k: statistics.median(v) for k, v in runs.items()}
ws = sorted({int(k.split("w=")[1]) for k in m})
print("\nthreads | floor s | serve s (x floor) | serve-into s (x floor) | cp -r+sync s | convert s (x cp)")
for w in ws:
    f, c = m[f"floor w={w}"], m[f"cp w={w}"]
    print(f"{w} | {f:.3f} | {m[f'serve w={w}']:.3f} ({m[f'serve w={w}'] / f:.2f}) | "
          f"{m[f'serve-into w={w}']:.3f} ({m[f'serve-into w={w}'] / f:.2f}) | {c:.3f} | "
          f"{m[f'convert w={w}']:.3f} ({m[f'convert w={w}'] / c:.2f})")
PY
rm -f "$out"
