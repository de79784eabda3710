"""The device check's `torch` section (bench/device/run.sh torch): a bf16
training step of an IHA layer through `attnc.torch` against the IHA
paper's own PyTorch implementation (mixing as an einsum, the interleave,
`scaled_dot_product_attention` on the N·P sequence, the collapse), at the
paper's head width d = 128, P = 2 and 4, N = 2048 and 8192.

For each size it prints the losses of both (they must agree within bf16's
rounding: relative difference ≤ 2e-2), the median step time of each (CUDA
events, forward + backward, after warm-up) and their ratio, and the
host/device copies `torch.profiler` sees inside attnc's step. It exits 1
if the losses disagree or if attnc's step copies between host and device
(the zero-copy CUDA path of issue 51, item 3, is what makes it pass).

    python3 bench/device/torch_train.py [--H 8] [--iters 10]
"""

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

import attnc.torch


def paper_step(x, w, p, h):
    """The paper's implementation of one IHA layer (flat causal mask,
    global collapse), then the loss."""

    def split(t):
        b, n, width = t.shape
        return t.view(b, n, h, width // h).transpose(1, 2)

    def pseudo(t, a):  # mix heads, then interleave token-major: row s·P + j
        m = torch.einsum("mhj,bmse->bhsje", a, t)
        b, hh, s, j, e = m.shape
        return m.reshape(b, hh, s * j, e)

    q, k, v = (split(x @ w[f"w_{n}"]) for n in "qkv")
    qt, kt, vt = pseudo(q, w["alpha_q"]), pseudo(k, w["alpha_k"]), pseudo(v, w["alpha_v"])
    ot = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    b, hh, sp, e = ot.shape
    n = sp // p
    o = torch.einsum("hcj,bcsje->bhse", w["r"].reshape(h, h, p), ot.reshape(b, hh, n, p, e))
    y = o.transpose(1, 2).reshape(b, n, hh * e) @ w["w_o"]
    return y.float().square().mean()


def timed(step, iters):
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def copies(step):
    """Host/device copies (memcpy HtoD/DtoH) the profiler sees in one step."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        step()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    return [n for n in names if "HtoD" in n or "DtoH" in n or "Memcpy" in n and "DtoD" not in n]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_train.py needs a CUDA device")
    status = 0
    for p in (2, 4):
        for n in (2048, 8192):
            layer = attnc.torch.Module("stdlib/iha.attn", H=a.H, P=p, d=128, mask="flat_causal", dtype=torch.bfloat16)
            layer = layer.cuda()
            x = torch.randn(1, n, a.H * 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            w = dict(layer.named_parameters())

            def ours():
                loss = layer(x).float().square().mean()
                loss.backward()
                return loss

            def paper():
                loss = paper_step(x, w, p, a.H)
                loss.backward()
                return loss

            try:
                l_ours, l_paper = ours().item(), paper().item()
                t_ours, t_paper = timed(ours, a.iters), timed(paper, a.iters)
                seen = copies(ours)
            except Exception as e:  # noqa: BLE001 - report and go on to the next size
                print(f"torch step P={p} N={n}: failed: {type(e).__name__}: {e}")
                status = 1
                continue
            diff = abs(l_ours - l_paper) / abs(l_paper)
            print(
                f"torch step bf16 H={a.H} P={p} d=128 N={n}: loss attnc {l_ours:.5f} paper {l_paper:.5f} "
                f"(relative {diff:.1e}); step attnc {t_ours * 1e3:.2f} ms, paper {t_paper * 1e3:.2f} ms, "
                f"attnc/paper time ratio {t_ours / t_paper:.2f}; host/device copies in attnc's step: {len(seen)}"
            )
            if diff > 2e-2 or seen:
                status = 1
    sys.exit(status)


if __name__ == "__main__":
    main()
