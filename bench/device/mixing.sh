# Head mixing inside attention (issue "Head mixing inside attention") on
# CUDA, sourced by run.sh (uses BIN, OUT, log, compare, status): the
# stdlib's talking_heads and diff against the float64 interpreter (f32:
# expect <= 1e-4; bf16 storage: a few 1e-3), their gradients, then
# talking heads timed against plain causal attention of the same sizes
# (the issue's bound: <= 3x at H=8 N=1024 d=64), forward and backward.
WORK=${WORK:-/tmp/attnc-mixing}
mkdir -p "$WORK"
while read -r spec sets; do
  "$BIN" run "stdlib/$spec.attn" --seed 1 $sets --dtype f64 --out "$WORK/mix-ref.safetensors" 2>>"$log" || status=1
  for dt in f32 bf16; do
    rm -f "$WORK/mix-$dt.safetensors"
    "$BIN" run "stdlib/$spec.attn" --seed 1 $sets --backend cuda --dtype $dt --out "$WORK/mix-$dt.safetensors" 2>>"$log" || status=1
    err=$(compare "$WORK/mix-$dt.safetensors" "$WORK/mix-ref.safetensors" y 2>&1)
    echo "cuda $dt vs interpreter: $spec $sets: relative error $err" | tee -a "$log"
  done
  "$BIN" grad "stdlib/$spec.attn" --seed 0 $sets --out "$WORK/mix-grad-ref.safetensors" --dtype f64 2>>"$log" || status=1
  "$BIN" grad "stdlib/$spec.attn" --seed 0 $sets --backend cuda --out "$WORK/mix-grad.safetensors" 2>>"$log" || status=1
  for key in $(python3 -c "import json,struct,sys; b=open(sys.argv[1],'rb').read(); n=struct.unpack('<Q',b[:8])[0]; print(' '.join(k for k in json.loads(b[8:8+n]) if k.startswith('grad_')))" "$WORK/mix-grad-ref.safetensors"); do
    err=$(compare "$WORK/mix-grad.safetensors" "$WORK/mix-grad-ref.safetensors" "$key" 2>&1)
    echo "cuda grad vs interpreter: $spec $sets: $key relative error $err" | tee -a "$log"
  done
done <<'CASES'
talking_heads --set H=8 --set d=64 --set N=300
talking_heads --set H=4 --set H_kv=2 --set d=128 --set N=257 --set mask=none --set window=64
diff --set H=4 --set d=64 --set N=300
CASES
for spec in talking_heads mha; do
  echo "== bench stdlib/$spec.attn H=8 N=1024 d=64 (causal)" | tee -a "$log"
  timeout 120 "$BIN" bench "stdlib/$spec.attn" --set H=8 --set d=64 --set N=1024 --backend cuda --iters 10 --warmup 2 \
    2>&1 | tee -a "$log" || status=1
done
echo "== bench --grad stdlib/talking_heads.attn H=8 N=1024 d=64" | tee -a "$log"
timeout 120 "$BIN" bench stdlib/talking_heads.attn --set H=8 --set d=64 --set N=1024 --grad --backend cuda --iters 5 --warmup 1 \
  2>&1 | tee -a "$log" || status=1
