#!/usr/bin/env bash
# Times attention kernels of two attnc binaries alternately in one sitting
# (lavapipe's speed varies between machines and runs: only same-session
# ratios compare). Usage: bench/alternate.sh OLD_BINARY NEW_BINARY [ROUNDS]
# Prints, per case and binary, the median of each attention launch.
set -euo pipefail
old=$1 new=$2 rounds=${3:-2}
cd "$(dirname "$0")/.."
cases=(
  "mha none d=64|stdlib/mha.attn --set N=1024 --set H=8 --set d=64 --set mask=none"
  "mha causal d=64|stdlib/mha.attn --set N=1024 --set H=8 --set d=64"
  "mha none d=128|stdlib/mha.attn --set N=1024 --set H=8 --set d=128 --set mask=none"
  "mha causal d=128|stdlib/mha.attn --set N=1024 --set H=8 --set d=128"
  "mha causal d=64 f16|stdlib/mha.attn --set N=1024 --set H=8 --set d=64 --dtype f16"
  "mha backward d=64|stdlib/mha.attn --set N=512 --set H=4 --set d=64 --grad"
  "talking heads|stdlib/talking_heads.attn --set N=1024 --set H=8 --set d=64"
  "split-KV decode|stdlib/kvcache.attn --set N=16384 --set B=2 --set H=8 --set d=64 --set M=1 --compute-units 64"
  "sinks backward window 64|stdlib/sinks.attn --set N=1024 --set window=64 --grad"
)
for round in $(seq "$rounds"); do
  for c in "${cases[@]}"; do
    name=${c%%|*} args=${c#*|}
    for which in old new; do
      bin=${!which}
      # shellcheck disable=SC2086
      out=$("$bin" bench $args --iters 3 --warmup 1 -q 2>/dev/null)
      times=$(echo "$out" | awk '$1 ~ /_attention|_combine/ && $3 == "ms" {printf "%s %s; ", $1, $2}')
      ratio=$(echo "$out" | grep -o 'time ratio [0-9.]*' | head -1 || true)
      echo "round $round | $name | $which | $times $ratio"
    done
  done
done
