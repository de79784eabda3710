"""FlexAttention reference for score and mask functions (bench/device/run.sh).

usage: flex_ref.py SPEC RUN.safetensors BENCH_LOG DTYPE [NAME=VALUE ...]

SPEC is a stdlib or bench spec with a score or mask function (alibi,
softcap, relative_bias, document, prefix_lm, sinks, causal_fn, blocks).
RUN.safetensors is what `attnc run --backend cuda --seed` (or `--inputs`)
wrote: the inputs (q, k, v and what the function reads) and our output `o`.
BENCH_LOG is `attnc bench`'s table for the same sizes. DTYPE is float32 or
bfloat16. NAME=VALUE are the spec's parameters (cap, prefix, window, sinks,
R, block, mask), and inputs=FILE for a run made with --inputs FILE.

Computes the same attention with PyTorch's FlexAttention (its score_mod and
mask_mod written independently from the spec's functions, the block mask
from create_block_mask), prints the relative error of our output against it,
times the compiled flex_attention call (CUDA events, median of 20 after
warm-up) and prints `baseline pytorch (flex_attention): attnc/torch time
ratio R` (our attention kernel's median over FlexAttention's), with the
FLOPs of the visible pairs. For causal masks it also times PyTorch's SDPA
with is_causal (FlashAttention's kernel).
"""

import sys
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from torch_ref import attention_seconds

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: to try the script without a GPU


def mods(spec, t, p):
    """FlexAttention's (score_mod, mask_mod) for `spec` with parameters `p`."""
    causal = p.get("mask", "causal") == "causal"

    def causal_mask(b, h, i, j):
        return j <= i

    base_mask = causal_mask if causal else None
    if spec == "alibi":
        slopes = t["slopes"].to(DEV).float()
        return (lambda s, b, h, i, j: s - slopes[h] * (i - j).abs()), base_mask
    if spec == "softcap":
        cap = float(p.get("cap", 50.0))
        return (lambda s, b, h, i, j: cap * torch.tanh(s / cap)), base_mask
    if spec == "relative_bias":
        bias, r = t["bias"].to(DEV).float(), int(p.get("R", 128))
        return (lambda s, b, h, i, j: s + bias[h, (i - j).clamp(-r, r) + r]), base_mask
    if spec == "document":
        doc = t["doc"].to(DEV).long()
        return None, (lambda b, h, i, j: (j <= i) & (doc[b, i] == doc[b, j]))
    if spec == "prefix_lm":
        prefix = int(p.get("prefix", 16))
        return None, (lambda b, h, i, j: (j <= i) | (j < prefix))
    if spec == "sinks":
        window, sinks = int(p.get("window", 256)), int(p.get("sinks", 4))
        return None, (lambda b, h, i, j: (j <= i) & ((i - j < window) | (j < sinks)))
    if spec == "causal_fn":
        return None, causal_mask
    if spec == "blocks":
        block = int(p.get("block", 256))
        return None, (lambda b, h, i, j: (j <= i) & (i - i % block == j - j % block))
    raise SystemExit(f"flex_ref.py: no FlexAttention form for {spec}")


def median_ms(f):
    for _ in range(3):
        f()
    times = []
    for _ in range(20):
        if DEV == "cpu":
            start = time.perf_counter()
            f()
            times.append((time.perf_counter() - start) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        f()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    spec, run, log, dtype = sys.argv[1:5]
    p = dict(a.split("=", 1) for a in sys.argv[5:])
    dtype = getattr(torch, dtype)
    t = load_file(run)
    if "inputs" in p:  # a run from --inputs: its file holds the outputs alone
        t = {**load_file(p.pop("inputs")), **t}
    q, k, v = (t[n].to(DEV).to(dtype) for n in "qkv")
    b, h, m, d = q.shape
    n = k.shape[2]
    score_mod, mask_mod = mods(spec, t, p)
    block_mask = create_block_mask(mask_mod, b, None, m, n, device=DEV) if mask_mod else None
    flex = torch.compile(flex_attention)
    gqa = k.shape[1] != h

    def call():
        return flex(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa)

    ref = call().float()
    got = t["o"].to(DEV).float()
    err = ((got - ref).norm() / ref.norm()).item()
    nan = " NaN" if torch.isnan(got).any().item() else ""
    print(f"cuda vs flex_attention: {spec} {dtype} B={b} H={h} M={m} N={n} d={d}: relative error {err:.3e}{nan}")
    flex_ms = median_ms(call)
    ours_ms = attention_seconds(log) * 1e3
    # Visible pairs from the block mask's own count when there is one.
    frac = 1.0 if block_mask is None else 1.0 - block_mask.sparsity() / 100.0
    flops = 4 * b * h * m * n * d * frac
    print(f"flex_attention {flex_ms:.3f} ms ({flops / flex_ms / 1e9:.1f} TFLOP/s on {frac:.1%} of the tiles), "
          f"attnc attention {ours_ms:.3f} ms ({flops / ours_ms / 1e9:.1f} TFLOP/s)")
    print(f"baseline pytorch (flex_attention): attnc/torch time ratio {ours_ms / flex_ms:.3f}")
    if spec in ("causal_fn", "alibi", "softcap", "relative_bias") and p.get("mask", "causal") == "causal":
        sdpa_ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        print(f"pytorch sdpa causal (no function) {sdpa_ms:.3f} ms: attnc/sdpa time ratio {ours_ms / sdpa_ms:.3f}")


if __name__ == "__main__":
    main()
