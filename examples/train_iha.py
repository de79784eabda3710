"""Fit a student IHA layer to a teacher IHA layer with plain gradient descent.

    python examples/train_iha.py [--steps 600] [--lr 1.0] [--backend wgpu] [--plot loss.svg]

Both layers are `stdlib/iha.attn` (H = 2 heads, P = 2 pseudo-heads, d = 4).
The teacher's weights are the spec's own random draws (seed 1). The student
starts from other random projections (seed 2), mixing coefficients α near
the identity (α[m, h, j] = 1[m = h] plus noise of 0.01) and the collapse
R = 1/P over each head's own pseudo-heads, as the IHA paper initialises.
Every step computes the student's output (`Program.run`), the cotangent of
the mean squared error, and every weight's gradient (`Program.grad`, the
compiler's reverse-mode program), then steps each weight against it. It
prints the loss curve and writes it as an SVG plot; the loss falls by more
than 100x in a few hundred steps. `--backend wgpu` runs the forward and the
gradient programs on the GPU kernels (f32; FlashAttention-2's backward for
attention); the default, `interp`, is the float64 reference.
"""

from __future__ import annotations

import argparse

import numpy as np

import attnc

H, P, d, N, B = 2, 2, 4, 8, 4


def initial_student(program: attnc.Program) -> dict:
    drawn = program.sample(seed=2)
    weights = {t.name: drawn[t.name] for t in program.inputs if t.role == "weight"}
    rng = np.random.default_rng(3)
    eye = np.zeros((H, H, P))
    for h in range(H):
        eye[h, h, :] = 1.0
    for a in ("alpha_q", "alpha_k", "alpha_v"):
        weights[a] = eye + 0.01 * rng.standard_normal((H, H, P))
    r = np.zeros((H, H * P))
    for h in range(H):
        r[h, h * P : (h + 1) * P] = 1.0 / P
    weights["r"] = r
    return weights


def train(steps: int = 600, lr: float = 1.0, backend: str = "interp") -> list:
    program = attnc.compile("stdlib/iha.attn", H=H, P=P, d=d, N=N)
    names = [t.name for t in program.inputs if t.role == "weight"]
    drawn = program.sample(seed=1)
    teacher = {n: drawn[n] for n in names}
    student = initial_student(program)
    x = np.random.default_rng(4).standard_normal((B, N, H * d))
    target = program.run(backend=backend, dtype="f64", x=x, **teacher)["y"]
    losses = []
    for _ in range(steps):
        y = program.run(backend=backend, dtype="f64", x=x, **student)["y"]
        losses.append(float(np.mean((y - target) ** 2)))
        cotangent = 2.0 * (y - target) / y.size  # d loss / d y
        grads = program.grad({"y": cotangent}, wrt=names, backend=backend, dtype="f64", x=x, **student)
        for n in names:
            student[n] = student[n] - lr * grads["grad_" + n]
    return losses


def svg(losses: list, path: str) -> None:
    """The loss curve on a log scale, as a small standalone SVG."""
    w, h, pad = 480, 300, 40
    logs = np.log10(np.asarray(losses))
    lo, hi = float(logs.min()), float(logs.max())
    pts = " ".join(
        f"{pad + (w - 2 * pad) * i / max(len(logs) - 1, 1):.1f},{h - pad - (h - 2 * pad) * (v - lo) / max(hi - lo, 1e-12):.1f}"
        for i, v in enumerate(logs)
    )
    text = f"""<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="{w}" height="{h}" fill="white"/>
<text x="{w / 2}" y="20" text-anchor="middle">student IHA vs teacher: mean squared error (log10)</text>
<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>
<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>
<text x="{pad - 4}" y="{pad + 4}" text-anchor="end">{hi:.1f}</text>
<text x="{pad - 4}" y="{h - pad}" text-anchor="end">{lo:.1f}</text>
<text x="{w - pad}" y="{h - pad + 16}" text-anchor="end">step {len(logs)}</text>
<polyline fill="none" stroke="steelblue" stroke-width="2" points="{pts}"/>
</svg>
"""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=1.0)
    ap.add_argument("--backend", default="interp")
    ap.add_argument("--plot", default="loss.svg")
    args = ap.parse_args()
    losses = train(args.steps, args.lr, args.backend)
    for step in range(0, len(losses), max(len(losses) // 12, 1)):
        print(f"step {step:4d}  loss {losses[step]:.3e}")
    print(f"step {len(losses) - 1:4d}  loss {losses[-1]:.3e}  (fell {losses[0] / losses[-1]:.0f}x)")
    svg(losses, args.plot)
    print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
