#!/usr/bin/env bash
# The device check for a session lent an NVIDIA GPU (see the developers'
# brief): run every stdlib spec on CUDA against the float64 interpreter, then
# time the kernels against cubek (in `bench`) and PyTorch (torch_ref.py), in
# f32 and then in bf16 on tensor cores. bench/device/README says how to build
# and carry the binary (a default release build) and the wheel.
# On the device: bash bench/device/run.sh [SECTION ...]  (writes its log under $OUT)
# Sections: cuda (the launcher: every stdlib spec against the interpreter in
# f32, tf32 and bf16 and its gradients, a CUDA graph, host overhead against
# SDPA, bench against the roofline; within 6 minutes), core (timings against
# cubek and PyTorch), half (bf16 and tf32), grad (gradients), functions
# (score and mask functions against the interpreter and FlexAttention),
# mixing (head mixing inside attention: Talking-Heads, Differential),
# serving (lengths, paged caches and split-KV decoding), torch (a bf16
# training step through attnc.torch against the IHA paper's PyTorch
# implementation, and the host/device copies in it: bench/device/torch_train.py).
# Default: all.
set -u
SECTIONS=${*:-cuda core half grad functions mixing serving torch}
want() { [[ " $SECTIONS " == *" $1 "* ]]; }
BIN=${BIN:-.device-bin/attnc}
if [ ! -x "$BIN" ] && [ -f "$BIN.xz" ]; then
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$BIN.xz" "$BIN"
  chmod +x "$BIN"
fi
OUT=${OUT:-/tmp/attnc-device}
mkdir -p "$OUT"
log="$OUT/log.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv | tee -a "$log"
compare() { # file_a file_b key -> relative error
  python3 - "$1" "$2" "$3" <<'PY'
import json, struct, sys, math, array
def load(p, k):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
    s, e = h[k]['data_offsets']; a = array.array('f' if h[k]['dtype'] == 'F32' else 'd'); a.frombytes(b[8 + n + s:8 + n + e]); return a
g, w = load(sys.argv[1], sys.argv[3]), load(sys.argv[2], sys.argv[3])
num = math.sqrt(sum((x - y) ** 2 for x, y in zip(g, w))); den = math.sqrt(sum(y * y for y in w)) or 1.0
bad = any(x != x for x in g)
print(f"{num / den:.3e}{' NaN' if bad else ''}")
PY
}
status=0
if want cuda; then
  source bench/device/cuda.sh
fi
if want core; then
while read -r spec key sets; do
  "$BIN" run "stdlib/$spec.attn" --seed 0 $sets --dtype f64 --out "$OUT/$spec-ref.safetensors" 2>>"$log" || status=1
  "$BIN" run "stdlib/$spec.attn" --seed 0 $sets --backend cuda --out "$OUT/$spec-cuda.safetensors" 2>>"$log" || status=1
  err=$(compare "$OUT/$spec-cuda.safetensors" "$OUT/$spec-ref.safetensors" "$key" 2>&1)
  echo "cuda vs interpreter: $spec $sets: relative error $err" | tee -a "$log"
done <<'CASES'
mha y --set H=4 --set d=32 --set N=77
mha y --set H=8 --set d=64 --set N=2048
mha y --set H=4 --set d=128 --set N=1500 --set mask=none
mha y --set H=2 --set d=59 --set N=1111 --set window=100
gqa y --set H=8 --set d=32 --set N=77
mqa y --set H=4 --set d=32 --set N=77
iha y --set H=4 --set P=3 --set d=32 --set N=41 --set rope=10000.0
iha y --set H=4 --set P=2 --set d=16 --set N=65 --set mask=token_causal --set window=8 --set collapse=per_head
iha y --set H=4 --set P=8 --set d=64 --set N=512
grpo advantages --set B=64 --set G=16
rloo advantages --set B=64 --set G=16
gdpo advantages --set B=64 --set G=16
odrpo advantages --set B=64 --set G=16
CASES
for args in "stdlib/mha.attn --set H=8 --set d=64 --set N=4096 --set mask=none" "stdlib/mha.attn --set H=8 --set d=64 --set N=4096" "stdlib/iha.attn --set H=8 --set P=2 --set d=64 --set N=2048" "stdlib/iha.attn --set H=8 --set P=8 --set d=64 --set N=1 --optimize"; do
  echo "== bench $args" | tee -a "$log"
  timeout 240 "$BIN" bench $args --backend cuda --iters 20 --warmup 3 2>&1 | tee -a "$log" || status=1
done
# Against PyTorch on the same inputs: SDPA on the interleaved sequence, the
# mixing and collapse as einsums (prints `baseline pytorch (sdpa): ...`).
while read -r p mask collapse n; do
  sets="--set H=8 --set P=$p --set d=64 --set N=$n --set mask=$mask --set collapse=$collapse"
  "$BIN" run stdlib/iha.attn --seed 0 $sets --backend cuda --out "$OUT/torch-in.safetensors" 2>>"$log" || status=1
  timeout 240 "$BIN" bench stdlib/iha.attn $sets --backend cuda --iters 20 --warmup 3 >"$OUT/torch-bench.txt" 2>&1 || status=1
  python3 bench/device/torch_ref.py iha "$OUT/torch-in.safetensors" "$OUT/torch-in.safetensors" "$OUT/torch-bench.txt" \
    "$p" "$mask" "$collapse" 2>&1 | tee -a "$log" || status=1
done <<'TORCH'
1 flat_causal global 4096
4 flat_causal global 1024
4 token_causal per_head 1024
TORCH
fi
if want half; then
# Half precision (issue "Half precision and tensor cores"): bf16 on tensor
# cores. Checked against the interpreter at a smaller size (bf16's unit
# roundoff is 2^-8, so expect relative errors of a few 1e-3), then timed at
# B·H = 64, N = 4096, P = 4, d = 128 (flat_causal, global collapse) and MHA at
# the same virtual length (N·P = 16384), next to cubek-attention's
# accelerated strategy (in `bench`), PyTorch in bf16 and the card's measured
# bf16 matmul rate (torch_ref.py).
while read -r spec key sets; do
  "$BIN" run "stdlib/$spec.attn" --seed 0 $sets --dtype f64 --out "$OUT/$spec-bf16-ref.safetensors" 2>>"$log" || status=1
  "$BIN" run "stdlib/$spec.attn" --seed 0 $sets --backend cuda --dtype bf16 --out "$OUT/$spec-bf16.safetensors" 2>>"$log" || status=1
  err=$(compare "$OUT/$spec-bf16.safetensors" "$OUT/$spec-bf16-ref.safetensors" "$key" 2>&1)
  echo "cuda bf16 vs interpreter: $spec $sets: relative error $err" | tee -a "$log"
done <<'CASES'
mha y --set H=4 --set d=128 --set N=1000
mha y --set H=8 --set d=64 --set N=777 --set window=100
iha y --set B=2 --set H=4 --set P=4 --set d=128 --set N=256 --set mask=flat_causal
CASES
iha="--set B=16 --set H=4 --set P=4 --set d=128 --set N=4096 --set mask=flat_causal --set collapse=global"
echo "== bench bf16 stdlib/iha.attn $iha" | tee -a "$log"
timeout 200 "$BIN" bench stdlib/iha.attn $iha --backend cuda --dtype bf16 --iters 5 --warmup 1 >"$OUT/bf16-bench.txt" 2>&1 || status=1
cat "$OUT/bf16-bench.txt" | tee -a "$log"
echo "== bench bf16 stdlib/mha.attn (same virtual length)" | tee -a "$log"
timeout 200 "$BIN" bench stdlib/mha.attn --set B=16 --set H=4 --set d=128 --set N=16384 --backend cuda --dtype bf16 \
  --iters 5 --warmup 1 2>&1 | tee -a "$log" || status=1
"$BIN" run stdlib/iha.attn --seed 0 $iha --backend cuda --dtype bf16 --out "$OUT/bf16-in.safetensors" 2>>"$log" || status=1
python3 bench/device/torch_ref.py iha "$OUT/bf16-in.safetensors" "$OUT/bf16-in.safetensors" "$OUT/bf16-bench.txt" \
  4 flat_causal global bfloat16 2>&1 | tee -a "$log" || status=1
# TF32 (f32 tensors, GEMMs on TF32 tensor cores): checked against the
# interpreter (TF32 operands: relative errors of a few 1e-4) and the GEMMs
# timed next to cubek-matmul in f32.
"$BIN" run stdlib/iha.attn --seed 0 --set B=2 --set H=4 --set P=4 --set d=128 --set N=256 --dtype f64 \
  --out "$OUT/iha-tf32-ref.safetensors" 2>>"$log" || status=1
"$BIN" run stdlib/iha.attn --seed 0 --set B=2 --set H=4 --set P=4 --set d=128 --set N=256 --backend cuda --dtype tf32 \
  --out "$OUT/iha-tf32.safetensors" 2>>"$log" || status=1
err=$(compare "$OUT/iha-tf32.safetensors" "$OUT/iha-tf32-ref.safetensors" y 2>&1)
echo "cuda tf32 vs interpreter: iha: relative error $err" | tee -a "$log"
echo "== bench tf32 stdlib/mha.attn" | tee -a "$log"
timeout 120 "$BIN" bench stdlib/mha.attn --set B=16 --set H=4 --set d=128 --set N=4096 --backend cuda --dtype tf32 \
  --iters 5 --warmup 1 2>&1 | tee -a "$log" || status=1
fi
if want grad; then
# Gradients (issue "Training"): the gradient program on CUDA against the
# float64 interpreter, every gradient, then a training step timed.
while read -r spec sets; do
  "$BIN" grad "stdlib/$spec.attn" --seed 0 $sets --out "$OUT/$spec-grad-ref.safetensors" --dtype f64 2>>"$log" || status=1
  "$BIN" grad "stdlib/$spec.attn" --seed 0 $sets --backend cuda --out "$OUT/$spec-grad.safetensors" 2>>"$log" || status=1
  for key in $(python3 -c "import json,struct,sys; b=open(sys.argv[1],'rb').read(); n=struct.unpack('<Q',b[:8])[0]; print(' '.join(k for k in json.loads(b[8:8+n]) if k.startswith('grad_')))" "$OUT/$spec-grad-ref.safetensors"); do
    err=$(compare "$OUT/$spec-grad.safetensors" "$OUT/$spec-grad-ref.safetensors" "$key" 2>&1)
    echo "cuda grad vs interpreter: $spec $sets: $key relative error $err" | tee -a "$log"
  done
done <<'CASES'
mha --set H=4 --set d=64 --set N=700
gqa --set H=8 --set d=32 --set N=300
iha --set H=4 --set P=3 --set d=32 --set N=200 --set mask=token_causal --set window=16
CASES
echo "== bench --grad stdlib/mha.attn" | tee -a "$log"
timeout 200 "$BIN" bench stdlib/mha.attn --set H=8 --set d=64 --set N=2048 --grad --backend cuda --iters 5 --warmup 1 \
  2>&1 | tee -a "$log" || status=1
# The backward on tensor cores (mma/flash_grad.rs: bf16, heads up to 64).
echo "== bench --grad --dtype bf16 stdlib/mha.attn" | tee -a "$log"
timeout 200 "$BIN" bench stdlib/mha.attn --set H=8 --set d=64 --set N=2048 --grad --backend cuda --dtype bf16 \
  --iters 5 --warmup 1 2>&1 | tee -a "$log" || status=1
fi
if want functions; then
  source bench/device/functions.sh
fi
if want serving; then
  source bench/device/serving.sh
fi
if want mixing; then
  source bench/device/mixing.sh
fi
if want torch; then
  whl=$(ls .device-bin/attnc-*.whl 2>/dev/null | head -1)
  [ -n "$whl" ] && python3 -m pip install -q --no-deps --force-reinstall "$whl" 2>&1 | tail -2 | tee -a "$log"
  timeout 400 python3 bench/device/torch_train.py 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit $status
