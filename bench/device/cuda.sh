# The CUDA launcher (issue "CUDA in every build"), sourced by run.sh (uses
# BIN, OUT, log, status); within 6 minutes on an H100/H200. The carried
# binary is a default release build: no feature, no LLVM, no CUDA toolkit.
#  1. Every stdlib spec on CUDA against the float64 interpreter at its
#     default sizes and at sizes past several tiles: forward in f32, tf32 and
#     bf16, gradients in f32 (`attnc grad --dtype` takes f32 and f64 until
#     issue 51; bf16's backward is timed by `bench --grad` below). Expect
#     f32 ≤ 1e-4, tf32 a few 1e-4, bf16 a few 1e-3.
#  2. bench/device/cuda_check.py (needs the carried wheel, .device-bin/*.whl):
#     a plan captured in a CUDA graph and replayed, equal to eager; per-call
#     host overhead of MHA at B=1 N=128 against PyTorch SDPA's.
#  3. `attnc bench --backend cuda` against the roofline, forward and --grad.
WORK=${WORK:-/tmp/attnc-cuda}
mkdir -p "$WORK"
# NVRTC 12 and the CUDA headers from PyTorch's own wheels (site-packages/nvidia/...)
# where they are there, else CUDA_HOME or /usr/local/cuda (attnc's own lookup).
if [ -z "${ATTNC_CUDA_TOOLS:-}" ]; then
  sp=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  [ -e "$sp/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ] && export ATTNC_CUDA_TOOLS=$sp
fi
echo "NVRTC from ${ATTNC_CUDA_TOOLS:-${CUDA_HOME:-/usr/local/cuda}}: $(ls ${ATTNC_CUDA_TOOLS:-${CUDA_HOME:-/usr/local/cuda}}/{nvidia/cuda_nvrtc/lib,lib64}/libnvrtc.so* 2>/dev/null | head -3 | tr '\n' ' ')" | tee -a "$log"
export ATTNC_CACHE_DIR="$WORK/cubin"
compare_all() { # cuda_file ref_file -> the largest relative error over the tensors of both
  python3 - "$1" "$2" <<'PY'
import json, struct, sys, math, array
def load(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k == '__metadata__' or v['dtype'] not in ('F32', 'F64'): continue
        s, e = v['data_offsets']; a = array.array('f' if v['dtype'] == 'F32' else 'd'); a.frombytes(b[8 + n + s:8 + n + e]); out[k] = a
    return out
g, w = load(sys.argv[1]), load(sys.argv[2])
worst, name, nan = 0.0, '-', False
for k in sorted(set(g) & set(w)):
    num = math.sqrt(sum((x - y) ** 2 for x, y in zip(g[k], w[k]))); den = math.sqrt(sum(y * y for y in w[k])) or 1.0
    nan |= any(x != x for x in g[k])
    if num / den >= worst: worst, name = num / den, k
print(f"{worst:.3e} ({name}){' NaN' if nan else ''}")
PY
}
start=$(date +%s)
for spec in $(ls stdlib/*.attn | xargs -n1 basename | sed 's/\.attn$//'); do
  "$BIN" run "stdlib/$spec.attn" --seed 0 --dtype f64 --out "$WORK/ref.safetensors" 2>>"$log" || { status=1; continue; }
  for dt in f32 tf32 bf16; do
    rm -f "$WORK/cuda.safetensors"
    if "$BIN" run "stdlib/$spec.attn" --seed 0 --backend cuda --dtype $dt --out "$WORK/cuda.safetensors" 2>>"$log"; then
      echo "cuda $dt vs interpreter: $spec: $(compare_all "$WORK/cuda.safetensors" "$WORK/ref.safetensors")" | tee -a "$log"
    else
      echo "cuda $dt: $spec FAILED (see the log above)" | tee -a "$log"; status=1
    fi
  done
  if "$BIN" grad "stdlib/$spec.attn" --seed 0 --dtype f64 --out "$WORK/gref.safetensors" 2>>"$log"; then
    rm -f "$WORK/grad.safetensors"
    "$BIN" grad "stdlib/$spec.attn" --seed 0 --backend cuda --out "$WORK/grad.safetensors" 2>>"$log" || status=1
    echo "cuda grad vs interpreter: $spec: $(compare_all "$WORK/grad.safetensors" "$WORK/gref.safetensors")" | tee -a "$log"
  fi
done
# Past several tiles in every dimension, lengths no tile divides.
while read -r spec sets; do
  "$BIN" run "stdlib/$spec.attn" --seed 1 $sets --dtype f64 --out "$WORK/ref.safetensors" 2>>"$log" || status=1
  for dt in f32 tf32 bf16; do
    "$BIN" run "stdlib/$spec.attn" --seed 1 $sets --backend cuda --dtype $dt --out "$WORK/cuda.safetensors" 2>>"$log" || status=1
    echo "cuda $dt vs interpreter: $spec $sets: $(compare_all "$WORK/cuda.safetensors" "$WORK/ref.safetensors")" | tee -a "$log"
  done
  "$BIN" grad "stdlib/$spec.attn" --seed 1 $sets --dtype f64 --out "$WORK/gref.safetensors" 2>>"$log" || status=1
  "$BIN" grad "stdlib/$spec.attn" --seed 1 $sets --backend cuda --out "$WORK/grad.safetensors" 2>>"$log" || status=1
  echo "cuda grad vs interpreter: $spec $sets: $(compare_all "$WORK/grad.safetensors" "$WORK/gref.safetensors")" | tee -a "$log"
done <<'CASES'
mha --set H=4 --set d=128 --set N=1100
gqa --set H=8 --set H_kv=2 --set d=64 --set N=700
iha --set H=4 --set P=2 --set d=64 --set N=333
kvcache --set N=3000 --set d=128
CASES
echo "== the stdlib on CUDA took $(( $(date +%s) - start )) s" | tee -a "$log"
whl=$(ls .device-bin/attnc-*.whl 2>/dev/null | head -1)
if [ -n "$whl" ]; then
  python3 -m pip install -q --no-deps --force-reinstall "$whl" 2>&1 | tail -2 | tee -a "$log"
  timeout 120 python3 bench/device/cuda_check.py 2>&1 | tee -a "$log" || status=1
else
  echo "no wheel in .device-bin/: the graph and overhead checks did not run" | tee -a "$log"; status=1
fi
for args in "stdlib/mha.attn --set H=8 --set d=64 --set N=4096" "stdlib/mha.attn --set H=8 --set d=128 --set N=4096 --dtype bf16" \
  "stdlib/mha.attn --set H=8 --set d=64 --set N=2048 --grad" "stdlib/mha.attn --set H=8 --set d=64 --set N=2048 --grad --dtype bf16" \
  "stdlib/kvcache.attn --set N=32768 --set d=128 --dtype bf16"; do
  echo "== bench $args" | tee -a "$log"
  timeout 60 "$BIN" bench $args --backend cuda --iters 10 --warmup 2 2>&1 | tee -a "$log" || status=1
done
echo "== the cuda section took $(( $(date +%s) - start )) s" | tee -a "$log"
