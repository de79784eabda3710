"""PyTorch reference for the device check (bench/device/run.sh).

usage: torch_ref.py SPEC INPUTS.safetensors OURS.safetensors BENCH_LOG [P] [MASK] [COLLAPSE] [DTYPE]

DTYPE is float32 (default) or bfloat16: PyTorch computes in it, and for
bfloat16 the script also measures the card's bf16 matmul rate and prints our
attention's and PyTorch's FLOP rates as fractions of it.

Reads the inputs `attnc run --seed` wrote (x and the weights), computes the
spec's output with PyTorch on the GPU (scaled_dot_product_attention on the
interleaved sequence for IHA, mixing and collapse as einsums), prints the
relative error of our CUDA output against it, and times PyTorch's attention
call on the same tensors, printing
`baseline pytorch (sdpa): attnc/torch time ratio R` (our attention kernel's
median over PyTorch's; lower is better).
"""

import sys

import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def split_heads(t, h):
    b, n, w = t.shape
    return t.view(b, n, h, w // h).transpose(1, 2)


def merge_heads(t):
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def interleaved_mask(n, p, mask):
    """Boolean [N·P, N·P] visibility on the interleaved sequence (True = attend)."""
    i = torch.arange(n * p, device=DEV)
    if mask == "flat_causal":
        return i[None, :] <= i[:, None]
    if mask == "token_causal":
        return (i[None, :] // p) <= (i[:, None] // p)
    return None


def forward(spec, t, p, mask, collapse, dtype=torch.float32):
    x = t["x"].to(DEV).to(dtype)
    w = {k: v.to(DEV).to(dtype) for k, v in t.items() if k != "x"}
    h = w["alpha_q"].shape[0] if spec == "iha" else None
    if spec != "iha":
        # MHA/GQA/MQA: heads from the projections' widths and d from w_o.
        raise SystemExit("torch_ref.py: only iha is checked here; MHA is iha with P = 1")
    q, k, v = (split_heads(x @ w[f"w_{n}"], h) for n in "qkv")
    # mix_heads: out[b,h,j,s,e] = Σ_m alpha[m,h,j] · x[b,m,s,e]; interleave: [b,h,s·P+j,e]
    def pseudo(t, a):
        m = torch.einsum("mhj,bmse->bhsje", a, t)
        b_, h_, s_, j_, e_ = m.shape
        return m.reshape(b_, h_, s_ * j_, e_)
    qt, kt, vt = pseudo(q, w["alpha_q"]), pseudo(k, w["alpha_k"]), pseudo(v, w["alpha_v"])
    n = x.shape[1]
    attn_mask = interleaved_mask(n, p, mask)

    def attend():
        return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=attn_mask)

    ot = attend()
    b_, h_, sp, e_ = ot.shape
    o = ot.reshape(b_, h_, n, p, e_)  # deinterleave: [b, h, s, j, e]
    r = w["r"].reshape(h, h, p)  # r[h, h'·P + j]
    if collapse == "per_head":
        r = r * torch.eye(h, device=DEV)[:, :, None]
    o = torch.einsum("hcj,bcsje->bhse", r, o)
    return merge_heads(o) @ w["w_o"], attend


UNITS = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}


def attention_seconds(log):
    """Our attention kernel's median from an `attnc bench` table."""
    for line in open(log, encoding="utf-8"):
        f = line.split()
        if len(f) > 2 and f[0].endswith("_attention") and f[2] in UNITS:
            return float(f[1]) * UNITS[f[2]]
    raise SystemExit(f"torch_ref.py: no attention kernel in {log}")


def main():
    spec, inputs, ours, log = sys.argv[1:5]
    ours_s = attention_seconds(log)
    p = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    mask = sys.argv[6] if len(sys.argv) > 6 else "flat_causal"
    collapse = sys.argv[7] if len(sys.argv) > 7 else "global"
    dtype = getattr(torch, sys.argv[8]) if len(sys.argv) > 8 else torch.float32
    t = load_file(inputs)
    y, attend = forward(spec, {k: v for k, v in t.items() if k != "y"}, p, mask, collapse, dtype)
    y = y.float()
    got = load_file(ours)["y"].to(DEV).float()
    err = (got - y).norm() / y.norm()
    print(f"cuda vs pytorch: {spec} P={p} mask={mask} collapse={collapse}: relative error {err:.3e}")
    for _ in range(3):
        attend()
    times = []
    for _ in range(20):
        if DEV == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        attend()
        if DEV == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    torch_s = times[len(times) // 2]
    print(f"pytorch sdpa {torch_s * 1e3:.3f} ms, attnc attention {float(ours_s) * 1e3:.3f} ms")
    print(f"baseline pytorch (sdpa): attnc/torch time ratio {float(ours_s) / torch_s:.3f}")
    if dtype != torch.float32 and DEV == "cuda":
        a = torch.randn(8192, 8192, device=DEV, dtype=dtype)
        for _ in range(3):
            a @ a
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()
        rate = 20 * 2 * 8192**3 / (time.perf_counter() - start)
        b, n, w = t["x"].shape
        h, e = t["alpha_q"].shape[0], t["w_o"].shape[0] // t["alpha_q"].shape[0]
        flops = 4 * b * h * (n * p) ** 2 * e * (0.5 if mask != "none" else 1.0)
        print(f"measured {dtype} matmul rate {rate / 1e12:.1f} TFLOP/s; attention {flops / 1e9:.1f} GFLOP: "
              f"attnc {flops / ours_s / rate:.3%} of it, pytorch {flops / torch_s / rate:.3%}")


if __name__ == "__main__":
    main()
