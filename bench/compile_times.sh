#!/usr/bin/env bash
# Compile time and emitted source size of every stdlib spec at the sizes
# users run, per target and dtype: a benchmark, not a test (bench/RESULTS.md
# records its output). Uses the release binary; NVIDIA's compilers are
# hidden so only attnc's own emission is timed.
#   cargo build --release && bash bench/compile_times.sh > /tmp/compile_times.md
set -u
BIN=${BIN:-target/release/attnc}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "| spec | sizes | target | dtype | seconds | kernels | largest kernel (KB) | total (KB) |"
echo "|---|---|---|---|---|---|---|---|"
while read -r spec sets; do
  for target in wgsl cuda; do
    for dtype in f32 tf32 f16 bf16; do
      [ "$target" = wgsl ] && { [ "$dtype" = tf32 ] || [ "$dtype" = bf16 ]; } && continue
      rm -rf "$out/k"
      start=$(date +%s.%N)
      # shellcheck disable=SC2086
      env -u ATTNC_CUDA_TOOLS -u CUDA_HOME -u CUDA_PATH "$BIN" compile "stdlib/$spec.attn" $sets \
        --target "$target" --dtype "$dtype" --out "$out/k" 2>/dev/null >/dev/null || { echo "| $spec | $sets | $target | $dtype | failed | | | |"; continue; }
      end=$(date +%s.%N)
      n=$(ls "$out/k" | grep -vc manifest.json)
      largest=$(find "$out/k" -name "*.$([ "$target" = cuda ] && echo cu || echo wgsl)" -printf '%s\n' | sort -n | tail -1)
      total=$(find "$out/k" -name "*.$([ "$target" = cuda ] && echo cu || echo wgsl)" -printf '%s\n' | awk '{t += $1} END {print t}')
      printf '| %s | %s | %s | %s | %.2f | %s | %d | %d |\n' "$spec" "$sets" "$target" "$dtype" \
        "$(awk "BEGIN {print $end - $start}")" "$n" $((largest / 1024)) $((total / 1024))
    done
  done
done <<'CASES'
mha --set H=8 --set N=4096 --set d=128
mha --set H=2 --set N=2048 --set d=256
gqa --set H=8 --set H_kv=2 --set N=4096 --set d=128
mqa --set H=8 --set N=4096 --set d=128
iha --set H=8 --set N=2048 --set P=4 --set d=64
mha --set H=32 --set N=1 --set d=128
grpo --set B=64 --set G=16
dr_grpo --set B=64 --set G=16
rloo --set B=64 --set G=16
maxrl --set B=64 --set G=16
gdpo --set B=64 --set G=16
odrpo --set B=64 --set G=16
CASES
