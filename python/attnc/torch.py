"""PyTorch front end: compiled specs as differentiable functions and modules,
through custom operators that ``torch.compile`` and ``torch.export`` trace.

    import torch, attnc.torch
    layer = attnc.torch.Module("stdlib/iha.attn", H=4, P=2, d=16)   # weights are nn.Parameters
    y = torch.compile(layer, fullgraph=True)(torch.randn(2, 100, 64))
    y.square().mean().backward()

Three operators (``torch.library.custom_op``) run a compiled program; each
takes the spec as a string key (``Program._key``: its name, text and
settings), compiled on first use in any process and cached:

- ``attnc::run(spec, inputs, backend) -> outputs``: no gradient needed;
- ``attnc::forward(spec, wrt, inputs, backend) -> outputs + residuals``:
  the training forward, which also returns what its backward reads of it
  (the projections, attention's output and rows' log-sum-exp, ...;
  ``compiler::grad::split``);
- ``attnc::backward(spec, wrt, inputs, residuals, cotangents, backend) ->
  gradients``: only the gradients' launches, in ``wrt``'s order.

``wrt`` names the differentiated inputs, comma-separated. Each operator
has a fake implementation that derives the outputs' shapes from the spec's
shape rules (symbolic sizes included) without running anything, and
``attnc::forward`` has its autograd formula (``register_autograd``), which
saves the inputs and residuals.

Tensors cross through DLPack: the native layer reads CPU tensors where
they lie (any float dtype, bfloat16 included, any strides); outputs come
back in the inputs' dtype, residuals in float32 (float64 for float64
inputs). Float64 tensors run in float64 on the interpreter, so
``torch.autograd.gradcheck`` holds the package to central differences.
CUDA tensors run on the CUDA backend without a host copy: kernels planned
at their shapes, launched on the current stream over their pointers, the
outputs allocated by PyTorch (specs with integer inputs, whose values are
checked on the host, excepted). float64 CPU tensors run on the
interpreter, other CPU tensors on wgpu when an adapter exists.
"""

from __future__ import annotations

import json
import logging
import os
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

import torch

# PyTorch's compiler stack (torch._dynamo, loaded by optimizers among
# others) and Mesa's CPU Vulkan driver (lavapipe) each load their own LLVM;
# loaded after lavapipe, PyTorch's crashes the process. Loading it first,
# here, keeps `attnc.torch` and the wgpu backend on lavapipe usable together.
import torch._dynamo  # noqa: F401,E402

from . import DeviceError, Program, _attnc, _inputs
from . import compile as _compile

__all__ = ["function", "Module", "CACHE_SIZE"]


_OUT = {torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}

#: How many compiled specs the operators keep (least recently used dropped;
#: compiling one again takes milliseconds, and its kernels stay cached by
#: the backend).
CACHE_SIZE = 64


def _cached(cache: "OrderedDict", key, make):
    """``cache[key]``, made by ``make()`` on a miss; the least recently
    used entries past ``CACHE_SIZE`` dropped."""
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    cache[key] = value = make()
    while len(cache) > CACHE_SIZE:
        cache.popitem(last=False)
    return value


class _Training:
    """A training step's programs for one ``wrt``, and what the operators
    read of them on every call, asked of the native layer once: the
    forward's shape rules and output names, the residuals, the inputs the
    backward differentiates."""

    def __init__(self, native, fixed):
        self.native = native
        (ins, outs), (_, grads), _ = native.shape_rules()
        self.rules = (ins, outs, fixed)
        self.forward_outputs = [n for n, _ in outs]
        self.saved = native.saved()
        self.gradients = [name[len("grad_") :] for name, _ in grads]

    def residuals(self, produced) -> List[torch.Tensor]:
        """The residuals among the forward's results ``produced`` (in its
        output order), in the backward's order."""
        by_name = dict(zip(self.forward_outputs, produced))
        return [by_name[n] for n in self.saved]

    def input_grads(self, tensors, names, grads):
        """The backward's ``grads`` per input (``None`` where not
        differentiated), each in its input's dtype."""
        by_name = dict(zip(self.gradients, grads))
        return [by_name[n].to(t.dtype) if n in by_name else None for n, t in zip(names, tensors)]


class _Spec:
    """A compiled spec as the operators use it: its program, input and
    output names, shape rules and training programs by ``wrt``."""

    def __init__(self, program: Program):
        self.program = program
        self.inputs = [t.name for t in program.inputs]
        self.outputs = [t.name for t in program.outputs]
        self.rules = program._native.shape_rules()
        # Integer inputs (lengths, page tables) are checked on the host
        # before a launch: such specs' CUDA tensors cross through it.
        self.on_device = not any(t.domain.startswith("Integers") for t in program.inputs)
        self._training: Dict[str, _Training] = {}

    def training(self, wrt: str) -> _Training:
        """The training programs for the gradients by ``wrt`` (input names,
        comma-separated; empty: every input a gradient is taken by default)."""
        if wrt not in self._training:
            native = self.program._native.training(wrt.split(",") if wrt else [])
            self._training[wrt] = _Training(native, self.rules[2])
        return self._training[wrt]


_SPECS: "OrderedDict[str, _Spec]" = OrderedDict()


def _spec(key: str, program: Optional[Program] = None) -> _Spec:
    """The cached spec for ``key``, compiled from it on a miss."""

    def make():
        if program is not None:
            return _Spec(program)
        k = json.loads(key)
        return _Spec(_compile(k["text"], **dict(k["settings"])))

    return _cached(_SPECS, key, make)


def _like(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensor whose dtype and device the outputs take: the first floating one."""
    return next((t for t in tensors if t.is_floating_point()), tensors[0])


def _out(like: torch.Tensor) -> torch.dtype:
    return like.dtype if like.dtype in _OUT else torch.float32


def _exact(like: torch.Tensor) -> torch.dtype:
    """The residuals' dtype."""
    return torch.float64 if like.dtype == torch.float64 else torch.float32


def _kernel_dtype(like: torch.Tensor, backend: str) -> str:
    """The kernels' storage type for tensors like ``like``: float16 and
    bfloat16 run the half-precision kernels (f32 accumulation) where the
    backend has the type (wgpu has no bf16: f32 kernels there); float64
    asks for float64 results (the interpreter computes in float64)."""
    if like.dtype == torch.float64:
        return "f64"
    if backend == "cuda" and like.dtype in (torch.float16, torch.bfloat16):
        return _OUT[like.dtype]
    if backend == "wgpu" and like.dtype == torch.float16:
        return "f16"
    return "f32"


_log = logging.getLogger("attnc.torch")
_ADAPTER: List[Optional[str]] = []
_TOLD: set = set()


def _backend(backend: str, like: torch.Tensor) -> str:
    """``backend``, or for ``"auto"``: CUDA tensors on ``cuda``; float64 on
    the interpreter (exact, so ``gradcheck`` holds); other CPU tensors on
    wgpu when an adapter exists (a GPU, or lavapipe), else the interpreter.
    ``ATTNC_TORCH_BACKEND`` pins the CPU choice. Logged once at DEBUG."""
    if backend != "auto":
        return backend
    if like.device.type == "cuda":
        return "cuda"
    if like.dtype == torch.float64:
        chosen, why = "interp", "float64 stays exact"
    elif os.environ.get("ATTNC_TORCH_BACKEND"):
        chosen, why = os.environ["ATTNC_TORCH_BACKEND"], "ATTNC_TORCH_BACKEND"
    else:
        if not _ADAPTER:
            _ADAPTER.append(_attnc.wgpu_adapter())
        chosen = "wgpu" if _ADAPTER[0] else "interp"
        why = f"wgpu adapter `{_ADAPTER[0]}`" if _ADAPTER[0] else "no wgpu adapter"
    if (like.dtype, chosen) not in _TOLD:
        _TOLD.add((like.dtype, chosen))
        _log.debug("attnc.torch: %s CPU tensors run on %s (%s)", like.dtype, chosen, why)
    return chosen


def _host(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the native layer reads it: detached (DLPack exports no
    autograd history), on the host (a no-op for CPU tensors)."""
    return t.detach().cpu()


def _adopt(outputs, device: torch.device) -> List[torch.Tensor]:
    """Native outputs adopted by PyTorch (no copy on the host), in order."""
    return [torch.from_dlpack(a).to(device) for _, a in outputs]


# Shapes without running: the dims solved from the inputs' sizes as the
# binder solves them (`bind::bind_inputs`: an axis a·X + c with X the one
# unknown dim), then the outputs' polynomials evaluated; sizes may be
# symbolic (torch.SymInt).


def _value(poly, dims):
    total = 0
    for coeff, monomial in poly:
        term = coeff
        for name, exponent in monomial:
            term = term * dims[name] ** exponent
        total = total + term
    return total


def _linear(poly, dims):
    """``(X, a, c)`` when ``poly`` is a·X + c in one unknown dim X."""
    unknown = {s for _, m in poly for s, _ in m if s not in dims}
    if len(unknown) != 1:
        return None
    (x,) = unknown
    a = c = 0
    for coeff, monomial in poly:
        term, has_x = coeff, False
        for name, exponent in monomial:
            if name == x:
                if exponent != 1:
                    return None
                has_x = True
            else:
                term = term * dims[name] ** exponent
        if has_x:
            a = a + term
        else:
            c = c + term
    return x, a, c


def _shapes(rules, shapes) -> List[List[object]]:
    """The outputs' shapes of a program with shape ``rules`` (its
    ``shape_rules()``) for inputs of ``shapes`` (in its input order)."""
    inputs, outputs, fixed = rules
    dims: Dict[str, object] = {}
    progress = True
    while progress:
        progress = False
        for (_, rule), shape in zip(inputs, shapes):
            for poly, size in zip(rule, shape):
                solved = _linear(poly, dims)
                if solved is not None:
                    x, a, c = solved
                    dims[x] = (size - c) // a
                    progress = True
    for name, value in fixed:
        dims.setdefault(name, value)
    return [[_value(p, dims) for p in rule] for _, rule in outputs]


def _empty(shapes, dtype, like):
    return [like.new_empty([int(s) if isinstance(s, int) else s for s in shape], dtype=dtype) for shape in shapes]


def _on_backend(backend: str, like: torch.Tensor, run):
    """``run(chosen)`` on ``backend`` (``"auto"`` resolved by ``_backend``).
    Where the kernels do not compute what the spec asks (a ``DeviceError``
    with ``.gap``: attention weights other than the softmax, say), an
    ``"auto"`` choice runs on the interpreter instead, said once at DEBUG;
    a backend asked for by name raises."""
    chosen = _backend(backend, like)
    try:
        return run(chosen)
    except DeviceError as e:
        gap = getattr(e, "gap", None)
        if backend != "auto" or chosen == "interp" or not gap:
            raise
        if ("gap", gap) not in _TOLD:
            _TOLD.add(("gap", gap))
            _log.debug("attnc.torch: the %s kernels do not compute %s; running on interp", chosen, gap)
        return run("interp")


# CUDA tensors without a copy: kernels planned at the inputs' shapes and
# loaded once per (spec, program, shapes, dtype, device), launched on
# PyTorch's current stream over the tensors' device pointers; outputs and
# the workspace come from PyTorch's caching allocator (freed memory is
# reused in stream order, so nothing waits). Inputs not yet in the
# kernels' storage type or not contiguous get one copy, on the device.

_STORAGE = {"f32": torch.float32, "f64": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
_KERNELS: "OrderedDict[tuple, object]" = OrderedDict()


def _on_device(like: torch.Tensor, backend: str, spec: _Spec) -> bool:
    return like.device.type == "cuda" and backend == "cuda" and spec.on_device


def _launch(load, key, named: Dict[str, torch.Tensor], outputs, kernel_dtype: str, device: torch.device):
    """Queue a program's kernels on the current stream: ``load(shapes)``
    gives them for the inputs' shapes (cached under ``key``); ``outputs``
    are ``(name, shape)``. Returns the outputs in the storage type."""
    storage = _STORAGE[kernel_dtype]
    shapes = {n: list(t.shape) for n, t in named.items()}
    key = (*key, tuple((n, tuple(v)) for n, v in sorted(shapes.items())), kernel_dtype, device.index)
    kernels = _cached(_KERNELS, key, lambda: load(shapes))
    given = {n: t.detach().to(dtype=storage).contiguous() for n, t in named.items()}
    given.update((n, torch.empty([int(d) for d in shape], dtype=storage, device=device)) for n, shape in outputs)
    bytes_ = kernels.workspace_bytes()
    workspace = torch.empty(bytes_, dtype=torch.uint8, device=device) if bytes_ else None
    pointers = {n: (t.data_ptr(), t.numel() * t.element_size()) for n, t in given.items()}
    stream = torch.cuda.current_stream(device).cuda_stream
    kernels.launch(pointers, stream, None if workspace is None else (workspace.data_ptr(), bytes_))
    return [given[n] for n, _ in outputs]


def _device_index(t: torch.Tensor) -> int:
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


@torch.library.custom_op("attnc::run", mutates_args=())
def _run(spec: str, inputs: List[torch.Tensor], backend: str) -> List[torch.Tensor]:
    s, like = _spec(spec), _like(inputs)

    def on(backend):
        kernel_dtype = _kernel_dtype(like, backend)
        if _on_device(like, backend, s):
            index = _device_index(like)
            outputs = list(zip(s.outputs, _shapes(s.rules, [t.shape for t in inputs])))
            load = lambda shapes: s.program._native.cuda_kernels_at(shapes, kernel_dtype, index)  # noqa: E731
            got = _launch(load, ("run", spec), dict(zip(s.inputs, inputs)), outputs, kernel_dtype, like.device)
            return [t.to(_out(like)) for t in got]
        named = {n: _host(t) for n, t in zip(s.inputs, inputs)}
        return _adopt(s.program._run(named, backend, kernel_dtype, out=_OUT[_out(like)]), like.device)

    return _on_backend(backend, like, on)


@_run.register_fake
def _(spec, inputs, backend):
    s, like = _spec(spec), _like(inputs)
    return _empty(_shapes(s.rules, [t.shape for t in inputs]), _out(like), like)


@torch.library.custom_op("attnc::forward", mutates_args=())
def _forward(spec: str, wrt: str, inputs: List[torch.Tensor], backend: str) -> List[torch.Tensor]:
    s, like = _spec(spec), _like(inputs)
    training = s.training(wrt)

    def on(backend):
        kernel_dtype = _kernel_dtype(like, backend)
        if _on_device(like, backend, s):
            index = _device_index(like)
            outputs = list(zip(training.forward_outputs, _shapes(training.rules, [t.shape for t in inputs])))
            load = lambda shapes: training.native.cuda_kernels_at("forward", shapes, kernel_dtype, index)  # noqa: E731
            named = dict(zip(s.inputs, inputs))
            got = _launch(load, ("forward", spec, wrt), named, outputs, kernel_dtype, like.device)
            n = len(s.outputs)
            return [t.to(_out(like)) for t in got[:n]] + [t.to(_exact(like)) for t in got[n:]]
        named = _inputs({n: _host(t) for n, t in zip(s.inputs, inputs)})
        return _adopt(training.native.forward(named, backend, kernel_dtype, _OUT[_out(like)]), like.device)

    return _on_backend(backend, like, on)


@_forward.register_fake
def _(spec, wrt, inputs, backend):
    s, like = _spec(spec), _like(inputs)
    shapes = _shapes(s.training(wrt).rules, [t.shape for t in inputs])
    n = len(s.outputs)
    return _empty(shapes[:n], _out(like), like) + _empty(shapes[n:], _exact(like), like)


@torch.library.custom_op("attnc::backward", mutates_args=())
def _backward(
    spec: str,
    wrt: str,
    inputs: List[torch.Tensor],
    saved: List[torch.Tensor],
    cotangents: List[torch.Tensor],
    backend: str,
) -> List[torch.Tensor]:
    s, like = _spec(spec), _like(inputs)
    training = s.training(wrt)
    given = dict(zip(s.inputs, inputs))
    given.update(zip(training.saved, saved))
    given.update(("cot_" + n, t) for n, t in zip(s.outputs, cotangents))

    def on(backend):
        kernel_dtype = _kernel_dtype(like, backend)
        if _on_device(like, backend, s):
            index = _device_index(like)
            outputs = [("grad_" + n, list(given[n].shape)) for n in training.gradients]
            load = lambda shapes: training.native.cuda_kernels_at("backward", shapes, kernel_dtype, index)  # noqa: E731
            got = _launch(load, ("backward", spec, wrt), given, outputs, kernel_dtype, like.device)
            return [t.to(_out(like)) for t in got]
        named = _inputs({n: _host(t) for n, t in given.items()})
        return _adopt(training.native.backward(named, backend, kernel_dtype, _OUT[_out(like)]), like.device)

    return _on_backend(backend, like, on)


@_backward.register_fake
def _(spec, wrt, inputs, saved, cotangents, backend):
    s, like = _spec(spec), _like(inputs)
    shapes = {n: list(t.shape) for n, t in zip(s.inputs, inputs)}
    return _empty([shapes[n] for n in s.training(wrt).gradients], _out(like), like)


def _setup_context(ctx, inputs, output):
    spec, wrt, tensors, backend = inputs
    s = _spec(spec)
    ctx.save_for_backward(*tensors, *s.training(wrt).residuals(output))
    ctx.attnc = (spec, wrt, backend, len(tensors), [o.shape for o in output[: len(s.outputs)]])


def _gradients(ctx, cotangents):
    spec, wrt, backend, count, shapes = ctx.attnc
    s = _spec(spec)
    kept = ctx.saved_tensors
    tensors, saved = list(kept[:count]), list(kept[count:])
    like = _like(tensors)
    # A cotangent PyTorch did not materialise (an output the loss ignores) is zero.
    cot = [
        c if c is not None else torch.zeros(shape, dtype=_out(like), device=like.device)
        for c, shape in zip(cotangents[: len(s.outputs)], shapes)
    ]
    grads = torch.ops.attnc.backward(spec, wrt, tensors, saved, cot, backend)
    return None, None, s.training(wrt).input_grads(tensors, s.inputs, grads), None


_forward.register_autograd(_gradients, setup_context=_setup_context)


def _run_setup_context(ctx, inputs, output):
    spec, tensors, backend = inputs
    ctx.save_for_backward(*tensors)
    ctx.attnc = (spec, backend)


def _run_gradients(ctx, cotangents):
    """``attnc::run`` differentiated (called directly on tensors that need
    gradients; ``function`` calls ``attnc::forward`` then): the training
    forward again, for its residuals, then the backward."""
    spec, backend = ctx.attnc
    s, tensors = _spec(spec), list(ctx.saved_tensors)
    training = s.training("")
    saved = training.residuals(torch.ops.attnc.forward(spec, "", tensors, backend))
    grads = torch.ops.attnc.backward(spec, "", tensors, saved, list(cotangents), backend)
    return None, training.input_grads(tensors, s.inputs, grads), None


_run.register_autograd(_run_gradients, setup_context=_run_setup_context)


def function(program: Program, backend: Optional[str] = None):
    """A callable taking the spec's inputs (positionally in declaration
    order, or by name) as torch tensors and returning its output (a dict when
    there are several), differentiable in every input with continuous values.
    ``backend`` runs the forward and the backward: by default (``"auto"``)
    CUDA tensors on ``"cuda"``, float64 CPU tensors on the interpreter and
    other CPU tensors on ``"wgpu"`` when an adapter exists.
    It calls ``attnc::run`` when no input needs a gradient, else
    ``attnc::forward`` (whose backward is ``attnc::backward``)."""
    key = program._key
    spec = _spec(key, program)
    names, outputs = spec.inputs, spec.outputs
    continuous = {t.name for t in program.inputs if t.domain in ("Any", "Finite")}

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
        tensors = [torch.as_tensor(given[n]) for n in names]
        chosen = backend or "auto"
        wrt = [n for n, t in zip(names, tensors) if n in continuous and t.requires_grad]
        if wrt and torch.is_grad_enabled():
            out = torch.ops.attnc.forward(key, ",".join(wrt), tensors, chosen)[: len(outputs)]
        else:
            out = torch.ops.attnc.run(key, tensors, chosen)
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
