"""PyTorch front end: compiled specs as differentiable functions and modules.

    import torch, attnc.torch
    layer = attnc.torch.Module("stdlib/iha.attn", H=4, P=2, d=16)   # weights are nn.Parameters
    y = layer(x=torch.randn(2, 100, 64))
    y.square().mean().backward()                                  # gradients by `Program.grad`

Forward and backward both run the compiled program (`Program.run`,
`Program.grad`). Tensors cross through DLPack: the native layer reads CPU
tensors where they lie (any float dtype, bfloat16 included, any strides),
and outputs come back in the inputs' dtype in buffers PyTorch adopts without
a copy. Float64 tensors run and differentiate in float64 on the
interpreter, so `torch.autograd.gradcheck` holds the package to central
differences. The forward runs CUDA tensors on the CUDA backend and CPU
tensors on the interpreter unless ``backend`` says otherwise; CUDA tensors
still cross through host memory (one copy each way). The backward runs the
gradient program on the forward's backend.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

# PyTorch's compiler stack (torch._dynamo, loaded by optimizers among
# others) and Mesa's CPU Vulkan driver (lavapipe) each load their own LLVM;
# loaded after lavapipe, PyTorch's crashes the process. Loading it first,
# here, keeps `attnc.torch` and the wgpu backend on lavapipe usable together.
import torch._dynamo  # noqa: F401,E402

from . import Program
from . import compile as _compile

__all__ = ["function", "Module"]


_OUT = {torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def _host(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the native layer reads it: detached (DLPack exports no
    autograd history), on the host (a no-op for CPU tensors)."""
    return t.detach().cpu()


def _tensors(outputs, device: torch.device) -> Dict[str, torch.Tensor]:
    """Native outputs adopted by PyTorch (no copy on the host)."""
    return {n: torch.from_dlpack(a).to(device) for n, a in outputs}


def function(program: Program, backend: Optional[str] = None):
    """A callable taking the spec's inputs (positionally in declaration
    order, or by name) as torch tensors and returning its output (a dict when
    there are several), differentiable in every input with continuous values.
    ``backend`` runs the forward and the backward: by default CUDA tensors on
    ``"cuda"`` and CPU tensors on the interpreter (``"wgpu"`` is the other choice)."""
    names: List[str] = [t.name for t in program.inputs]
    outputs: List[str] = [t.name for t in program.outputs]
    continuous = {t.name for t in program.inputs if t.domain in ("Any", "Finite")}

    class _Apply(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *tensors):
            ctx.save_for_backward(*tensors)
            like = next((t for t in tensors if t.is_floating_point()), tensors[0])
            ctx.like = (like.dtype, like.device)
            dtype = "f64" if like.dtype == torch.float64 else None
            chosen = backend or ("cuda" if like.device.type == "cuda" else "interp")
            ctx.backend = chosen
            inputs = {n: _host(t) for n, t in zip(names, tensors)}
            out = _tensors(program._run(inputs, chosen, dtype, out=_OUT.get(like.dtype, "f32")), like.device)
            return tuple(out[n].to(like.dtype) for n in outputs)

        @staticmethod
        def backward(ctx, *cotangents):
            tensors = ctx.saved_tensors
            dtype, device = ctx.like
            wrt = [n for n, need in zip(names, ctx.needs_input_grad) if need and n in continuous]
            if not wrt:
                return (None,) * len(names)
            result = program._grad(
                {n: _host(c) for n, c in zip(outputs, cotangents)},
                wrt,
                ctx.backend,
                "f64" if dtype == torch.float64 else None,
                {n: _host(t) for n, t in zip(names, tensors)},
                out=_OUT.get(dtype, "f32"),
            )
            grads = _tensors(result, device)
            return tuple(grads["grad_" + n].to(dtype) if n in wrt else None for n in names)

    def call(*args: torch.Tensor, **kwargs: torch.Tensor):
        if len(args) > len(names):
            raise TypeError(f"{len(names)} inputs ({', '.join(names)}), got {len(args)} positional tensors")
        given: Dict[str, torch.Tensor] = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise TypeError(f"unexpected input `{k}`; the spec's inputs are {', '.join(names)}")
            if k in given:
                raise TypeError(f"input `{k}` given twice")
            given[k] = v
        missing = [n for n in names if n not in given]
        if missing:
            raise TypeError(f"missing inputs: {', '.join(missing)}")
        out = _Apply.apply(*(torch.as_tensor(given[n]) for n in names))
        return out[0] if len(outputs) == 1 else dict(zip(outputs, out))

    return call


class Module(torch.nn.Module):
    """A spec as a layer: every ``weight`` input is an ``nn.Parameter``
    initialised from the spec's own distributions (``Program.sample(seed)``);
    the other inputs are the forward's arguments, by position or name.
    ``Module("stdlib/iha.attn", H=8, P=4, d=64)`` is an IHA layer taking ``x``."""

    def __init__(self, spec, seed: int = 0, backend: Optional[str] = None, dtype: torch.dtype = torch.float32, **params):
        super().__init__()
        self.program: Program = _compile(spec, **params)
        drawn = self.program.sample(seed)
        self._inputs = [t.name for t in self.program.inputs]
        self._weights = [t.name for t in self.program.inputs if t.role == "weight"]
        self._activations = [n for n in self._inputs if n not in self._weights]
        for n in self._weights:
            self.register_parameter(n, torch.nn.Parameter(torch.from_numpy(drawn[n]).to(dtype)))
        self._fn = function(self.program, backend)

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor):
        given = dict(zip(self._activations, args))
        given.update(kwargs)
        return self._fn(**given, **{n: getattr(self, n) for n in self._weights})

    def extra_repr(self) -> str:
        return repr(self.program)
