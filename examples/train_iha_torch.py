"""A small decoder with Interleaved Head Attention, trained under
torch.compile on multi-query associative recall (MQAR).

The attention follows the IHA paper's schedule: sliding-window IHA layers
whose window is W = N / (2P²) tokens, then one global IHA layer. Each layer
is `attnc.torch.Module("stdlib/iha.attn", ...)`, so the whole model goes
through `torch.compile(model, fullgraph=True)`: attnc's operators
(`attnc::forward`, `attnc::backward`) appear in the graph as opaque calls,
the backward runs on the forward's residuals.

The task: a sequence of K key/value pairs (keys and values from disjoint
vocabularies), then the K keys again in another order; the model must
answer each repeated key with its value. The loss is the cross-entropy on
the answers only: about ln(32) = 3.47 at the start, ln(16) = 2.77 once it
knows an answer is a value, 0 when it recalls every one.

    python examples/train_iha_torch.py                   # ~300 steps, a few minutes on 2 CPU cores
    python examples/train_iha_torch.py --steps 60 --backend interp

Prints the loss every few steps and, at the end, `loss fell X.XXx` (first
tenth of the steps' mean over the last tenth's) and the answers' accuracy.
"""

import argparse
import math
import time

import torch

import attnc.torch


class Block(torch.nn.Module):
    def __init__(self, width, heads, pseudo, window, backend):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(width)
        self.attn = attnc.torch.Module(
            "stdlib/iha.attn",
            H=heads,
            P=pseudo,
            d=width // heads,
            mask="token_causal",
            window=window,
            backend=backend,
        )
        self.norm2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Decoder(torch.nn.Module):
    def __init__(self, vocab, length, width, heads, pseudo, local_layers, backend):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(0.02 * torch.randn(length, width))
        window = max(1, length // (2 * pseudo * pseudo))  # the paper's W = N / (2P²)
        layers = [Block(width, heads, pseudo, window, backend) for _ in range(local_layers)]
        layers.append(Block(width, heads, pseudo, None, backend))  # one global layer
        self.layers = torch.nn.ModuleList(layers)
        self.norm = torch.nn.LayerNorm(width)
        self.out = torch.nn.Linear(width, vocab)
        self.window = window

    def forward(self, tokens):
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.out(self.norm(x))


def batch(size, pairs, keys, generator):
    """Tokens [size, 4·pairs] and, at each repeated key, the value to answer
    (elsewhere -100, ignored)."""
    k = torch.stack([torch.randperm(keys, generator=generator)[:pairs] for _ in range(size)])
    v = keys + torch.randint(0, keys, (size, pairs), generator=generator)
    order = torch.stack([torch.randperm(pairs, generator=generator) for _ in range(size)])
    context = torch.stack([k, v], dim=2).reshape(size, 2 * pairs)
    asked = torch.gather(k, 1, order)
    answer = torch.gather(v, 1, order)
    # Each query is the key then a slot where the answer is predicted.
    query = torch.stack([asked, asked], dim=2).reshape(size, 2 * pairs)
    tokens = torch.cat([context, query], dim=1)
    target = torch.full_like(tokens, -100)
    target[:, 2 * pairs :: 2] = answer
    return tokens, target


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--keys", type=int, default=16)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--pseudo", type=int, default=2)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--local-layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--backend", default=None, help="interp, wgpu or cuda (default: attnc.torch's choice)")
    ap.add_argument("--no-compile", action="store_true", help="run eagerly")
    a = ap.parse_args()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    length = 4 * a.pairs
    model = Decoder(2 * a.keys, length, a.width, a.heads, a.pseudo, a.local_layers, a.backend)
    step_fn = model if a.no_compile else torch.compile(model, fullgraph=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    print(
        f"IHA decoder: {len(model.layers)} layers (window {model.window} tokens, then global), "
        f"H={a.heads} P={a.pseudo} width={a.width}, N={length}, "
        f"{sum(p.numel() for p in model.parameters())} parameters"
    )
    losses, start = [], time.monotonic()
    for step in range(a.steps):
        tokens, target = batch(a.batch, a.pairs, a.keys, generator)
        logits = step_fn(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % max(1, a.steps // 15) == 0 or step == a.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  ({time.monotonic() - start:.0f} s)", flush=True)
    tenth = max(1, a.steps // 10)
    first, last = sum(losses[:tenth]) / tenth, sum(losses[-tenth:]) / tenth
    with torch.no_grad():
        tokens, target = batch(256, a.pairs, a.keys, generator)
        answered = model(tokens).argmax(-1)
        asked = target != -100
        accuracy = (answered[asked] == target[asked]).float().mean().item()
    assert math.isfinite(last)
    print(f"loss fell {first / last:.2f}x ({first:.3f} -> {last:.3f}); recall accuracy {accuracy:.1%} (chance {1 / a.keys:.1%})")


if __name__ == "__main__":
    main()
