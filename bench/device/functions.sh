# Score and mask functions (issue "Attention as a function") on CUDA, sourced
# by run.sh (uses BIN, OUT, log, compare, status). First every stdlib
# function spec against the float64 interpreter at sizes past several tiles
# and not multiples of them (f32: expect ≤ 1e-4; bf16 storage: a few 1e-3),
# then the gradients of the score functions, then the kernels timed against
# PyTorch's FlexAttention (bench/device/flex_ref.py, which also checks our
# output against it) at B=1 H=16 N=8192 d=64. Large files go to WORK, not
# OUT (only the log comes back).
WORK=${WORK:-/tmp/attnc-functions}
mkdir -p "$WORK"
python3 bench/document_inputs.py "$WORK/doc-small.safetensors" 1500 4 64 100 >/dev/null || status=1
while read -r file sets; do
  case $file in document) inputs="--inputs $WORK/doc-small.safetensors" ;; *) inputs="--seed 1" ;; esac
  path=stdlib/$file.attn
  [ -f "$path" ] || path=bench/specs/$file.attn
  "$BIN" run "$path" $inputs $sets --dtype f64 --out "$WORK/fn-ref.safetensors" 2>>"$log" || status=1
  for dt in f32 bf16; do
    rm -f "$WORK/fn-$dt.safetensors"
    "$BIN" run "$path" $inputs $sets --backend cuda --dtype $dt --out "$WORK/fn-$dt.safetensors" 2>>"$log" || status=1
    err=$(compare "$WORK/fn-$dt.safetensors" "$WORK/fn-ref.safetensors" o 2>&1)
    echo "cuda $dt vs interpreter: $file $sets: relative error $err" | tee -a "$log"
  done
done <<'CASES'
alibi --set H=4 --set d=64 --set M=1000 --set N=1500
alibi --set H=4 --set H_kv=1 --set d=128 --set M=777 --set N=777 --set mask=none
softcap --set H=4 --set d=64 --set M=1000 --set N=1500 --set cap=5.0
relative_bias --set H=4 --set H_kv=2 --set d=64 --set M=1200 --set N=1200 --set R=64
document --set H=4 --set d=64
prefix_lm --set H=4 --set d=59 --set N=1500 --set prefix=300
sinks --set H=4 --set d=64 --set N=2000 --set window=300 --set sinks=4
blocks --set H=4 --set d=64 --set N=1111 --set block=100
CASES
while read -r spec sets; do
  "$BIN" grad "stdlib/$spec.attn" --seed 1 $sets --dtype f64 --out "$WORK/fn-grad-ref.safetensors" 2>>"$log" || status=1
  "$BIN" grad "stdlib/$spec.attn" --seed 1 $sets --backend cuda --out "$WORK/fn-grad.safetensors" 2>>"$log" || status=1
  for key in grad_q grad_k grad_v; do
    err=$(compare "$WORK/fn-grad.safetensors" "$WORK/fn-grad-ref.safetensors" "$key" 2>&1)
    echo "cuda grad vs interpreter: $spec $sets: $key relative error $err" | tee -a "$log"
  done
done <<'CASES'
alibi --set H=4 --set d=64 --set M=700 --set N=700
softcap --set H=4 --set d=64 --set M=700 --set N=900 --set cap=5.0
relative_bias --set H=4 --set d=64 --set M=700 --set N=700 --set R=64
CASES
N=${BIG_N:-8192}  # smaller to try the script on lavapipe (BIN a wrapper that runs wgpu)
big="--set H=16 --set d=64 --set N=$N"
python3 bench/document_inputs.py "$WORK/doc-big.safetensors" $N 16 64 512 >/dev/null || status=1
while read -r dtype torch_dtype file params; do
  sets="$big"
  case $file in alibi | softcap | relative_bias) sets="$sets --set M=$N" ;; esac
  for p in $params; do sets="$sets --set $p"; done
  path=stdlib/$file.attn
  [ -f "$path" ] || path=bench/specs/$file.attn
  case $file in
    document) inputs="--inputs $WORK/doc-big.safetensors"; extra="inputs=$WORK/doc-big.safetensors"; sets="--set H=16 --set d=64" ;;
    *) inputs="--seed 0"; extra="" ;;
  esac
  echo "== $dtype $file $sets" | tee -a "$log"
  rm -f "$WORK/flex-run.safetensors"
  "$BIN" run "$path" $inputs $sets --backend cuda --dtype "$dtype" --out "$WORK/flex-run.safetensors" 2>>"$log" || status=1
  bench_inputs=""
  [ "$file" = document ] && bench_inputs="$inputs"
  timeout 120 "$BIN" bench "$path" $bench_inputs $sets --backend cuda --dtype "$dtype" --iters 20 --warmup 3 \
    >"$WORK/flex-bench.txt" 2>&1 || status=1
  grep -E "attention|baseline" "$WORK/flex-bench.txt" | tee -a "$log"
  # attention.attn is the built-in causal mask: compared with the causal function's FlexAttention form.
  ref=$file
  [ "$file" = attention ] && ref=causal_fn
  timeout 150 python3 bench/device/flex_ref.py "$ref" "$WORK/flex-run.safetensors" "$WORK/flex-bench.txt" \
    "$torch_dtype" $params $extra 2>&1 | grep -v Warning | tee -a "$log" || status=1
done <<'CASES'
f32 float32 attention mask=causal
f32 float32 causal_fn
f32 float32 alibi mask=causal
f32 float32 document
bf16 bfloat16 attention mask=causal
bf16 bfloat16 alibi mask=causal
bf16 bfloat16 document
bf16 bfloat16 sinks window=1024 sinks=4
CASES
