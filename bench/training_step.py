"""A training step (forward + backward) of an attnc layer from PyTorch,
before and after the backward learned to use the forward's residuals:

- before: the forward (`Program.run`), then the whole gradient program
  (`Program.grad`), which computes the forward again;
- after: `attnc::forward` (outputs and residuals) then `attnc::backward`
  (only the gradients' launches), as `attnc.torch` calls them.

Medians of --repeat steps after one warm-up step (which compiles the
kernels), on one backend, alternating before and after so both see the
same machine. Usage:

    python bench/training_step.py --backend interp --B 2 --N 256 --H 2 --P 2 --d 8
    python bench/training_step.py --backend wgpu --N 256 --H 4 --P 2 --d 16
"""

import argparse
import statistics
import time

import torch

import attnc
import attnc.torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default="stdlib/iha.attn")
    ap.add_argument("--backend", default="interp")
    ap.add_argument("--repeat", type=int, default=5)
    for dim, default in [("B", 1), ("N", 256), ("H", 2), ("P", 2), ("d", 8)]:
        ap.add_argument(f"--{dim}", type=int, default=default)
    a = ap.parse_args()
    params = {k: getattr(a, k) for k in "BNHPd"}
    if "iha" not in a.spec:
        params.pop("P")
    program = attnc.compile(a.spec, **params)
    drawn = program.sample(seed=0)
    out = program.outputs[0].name
    cot = torch.randn(program.run(backend="interp", **drawn)[out].shape)
    f = attnc.torch.function(program, backend=a.backend)
    tensors = {n: torch.tensor(v, dtype=torch.float32, requires_grad=True) for n, v in drawn.items()}

    def before():
        y = program.run(backend=a.backend, **drawn)[out]
        g = program.grad({out: cot.numpy()}, backend=a.backend, **drawn)
        return y, g

    def after():
        y = f(**tensors)
        (y * cot).sum().backward()
        return y

    times = {"before": [], "after": []}
    for step in range(a.repeat + 1):
        for name, fn in [("before", before), ("after", after)]:
            start = time.perf_counter()
            fn()
            if step:
                times[name].append(time.perf_counter() - start)
    b, f_ = statistics.median(times["before"]), statistics.median(times["after"])
    print(f"{a.spec} {params} on {a.backend}: step before {b * 1e3:.1f} ms, after {f_ * 1e3:.1f} ms, ratio {b / f_:.2f}")


if __name__ == "__main__":
    main()
