# Serving (issue "The inference surface") on CUDA, sourced by run.sh (uses
# BIN, OUT, log, compare, status): stdlib/kvcache.attn (per-sequence
# lengths, one-sided windows) and stdlib/paged.attn (a block table) against
# the float64 interpreter in f32 and bf16, split over their keys
# (--compute-units 132) and not (0); then a decode step (B=1 H=8 M=1
# N=32768 d=128, bf16) timed split (the device's SMs) against unsplit, next
# to PyTorch's SDPA on the same sizes (the lengths at their full N there).
WORK=${WORK:-/tmp/attnc-serving}
mkdir -p "$WORK"
while read -r spec sets; do
  "$BIN" run "stdlib/$spec.attn" --seed 2 $sets --dtype f64 --out "$WORK/ref.safetensors" 2>>"$log" || status=1
  for dt in f32 bf16; do
    for units in 132 0; do
      rm -f "$WORK/got.safetensors"
      "$BIN" run "stdlib/$spec.attn" --seed 2 $sets --backend cuda --dtype $dt --compute-units $units \
        --out "$WORK/got.safetensors" 2>>"$log" || status=1
      err=$(compare "$WORK/got.safetensors" "$WORK/ref.safetensors" o 2>&1)
      echo "cuda $dt (compute units $units) vs interpreter: $spec $sets: relative error $err" | tee -a "$log"
    done
  done
done <<'CASES'
kvcache --set B=3 --set H=8 --set H_kv=2 --set d=128 --set M=1 --set N=5000
kvcache --set B=2 --set H=4 --set d=64 --set M=37 --set N=3001 --set window_left=700
kvcache --set B=2 --set H=4 --set H_kv=1 --set d=59 --set M=1 --set N=2049 --set mask=none
paged --set B=3 --set H=8 --set H_kv=2 --set d=128 --set M=1 --set PS=256 --set MP=16 --set NB=48
paged --set B=2 --set H=4 --set d=64 --set M=5 --set PS=16 --set MP=100 --set NB=200
CASES
D="--set B=1 --set H=8 --set M=1 --set N=32768 --set d=128 --dtype bf16 --backend cuda --iters 20 --warmup 3"
for units in "" "--compute-units 0"; do
  echo "== bench stdlib/kvcache.attn decode B=1 H=8 N=32768 d=128 bf16 $units" | tee -a "$log"
  timeout 120 "$BIN" bench stdlib/kvcache.attn $D $units 2>&1 | tee -a "$log" || status=1
done
python3 - <<'PY' 2>&1 | tee -a "$log"
import torch, torch.nn.functional as F
q = torch.randn(1, 8, 1, 128, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(1, 8, 32768, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
for _ in range(3):
    F.scaled_dot_product_attention(q, k, v)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(20):
    F.scaled_dot_product_attention(q, k, v)
e.record(); torch.cuda.synchronize()
print(f"baseline pytorch (sdpa) decode B=1 H=8 N=32768 d=128 bf16: {s.elapsed_time(e) / 20 * 1000:.1f} us")
PY
