"""attnc from Python: compile attention and group-advantage specs, run them on
NumPy arrays, emit their kernels.

    import numpy as np, attnc
    iha = attnc.compile("stdlib/iha.attn", P=4, mask="flat_causal")
    y = iha.run(**iha.sample(seed=0))["y"]

This package is a thin layer over the Rust pipeline (`attnc._attnc`): it
converts arrays and errors; every meaning is the compiler's. The specs'
mathematics is in the repository's `docs/semantics.md`; the CLI's `--dtype`,
`--backend` and `--optimize` are the keyword arguments of `Program.run`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

from . import _attnc
from ._attnc import DeviceError, Error, InputError, NonFiniteError, SettingError, SpecError

__all__ = [
    "compile",
    "stdlib",
    "Program",
    "Tensor",
    "Error",
    "SpecError",
    "InputError",
    "DeviceError",
    "SettingError",
    "NonFiniteError",
]

Dim = Union[int, str]


@dataclass(frozen=True)
class Tensor:
    """An input or output of a spec: its name, its shape (numbers, or
    symbolic dims such as ``"N"`` or ``"N*P"`` that the arrays fix), its role
    (``"weight"``, ``"input"`` or ``"output"``) and, for inputs, the values it
    may hold (``"Any"``, ``"Finite"``, ``"Integers { lo: 1, hi: 10 }"``, ``"Binary"``)."""

    name: str
    shape: Tuple[Dim, ...]
    role: str
    domain: Optional[str] = None


def _dims(shape: List[str]) -> Tuple[Dim, ...]:
    return tuple(int(d) if d.isdigit() else d for d in shape)


def _setting(value) -> str:
    """A Python value as the spec language writes it (as `--set NAME=VALUE` takes it)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_setting(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def stdlib() -> List[str]:
    """The names of the specs shipped with attnc (``attnc.compile("stdlib/<name>.attn")``)."""
    return list(_attnc.stdlib_names())


def _source(spec: Union[str, "os.PathLike[str]"]) -> Tuple[str, str]:
    """The spec's name (as diagnostics print it) and text: a file, a stdlib
    spec (``stdlib/iha.attn`` from any directory), or the text itself."""
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise TypeError(f"spec must be a path or the text of a spec, not {type(spec).__name__}")
    if "\n" in spec or not (spec.endswith(".attn") or os.path.exists(spec)):
        if "\n" not in spec and not spec.lstrip().startswith("spec "):
            raise FileNotFoundError(f"no spec file `{spec}` (and it is not the text of a spec)")
        return "<string>", spec
    if os.path.exists(spec):
        with open(spec, encoding="utf-8") as f:
            return spec, f.read()
    name = os.path.basename(spec)[: -len(".attn")]
    text = _attnc.stdlib(name) if os.path.dirname(spec) in ("stdlib", "") else None
    if text is None:
        raise FileNotFoundError(f"no spec file `{spec}`")
    return spec, text


def compile(spec: Union[str, "os.PathLike[str]"], **params) -> "Program":
    """Compile a spec: a path (``stdlib/...`` specs are found from any
    directory) or its text. Keyword arguments bind parameters and dims, as
    ``--set NAME=VALUE`` does (``P=4``, ``mask="causal"``, ``weights=[1, 2]``);
    dims left free are fixed by the arrays given to :meth:`Program.run`.
    Raises :class:`SpecError` with the CLI's diagnostic."""
    name, text = _source(spec)
    settings = [(k, _setting(v)) for k, v in params.items()]
    program = Program(_attnc.compile(name, text, settings))
    # What compiles it again: the key `attnc.torch`'s operators are called
    # with (a string, as torch.library's schemas take), in any process.
    program._key = json.dumps({"name": name, "text": text, "settings": settings}, sort_keys=True)
    return program


# DLPack device types in host memory: CPU, CUDA pinned, CUDA managed.
_HOST = (1, 3, 13)


def _exchangeable(name: str, value):
    """An input as the native layer reads it (through DLPack): objects that
    speak DLPack (PyTorch, JAX, CuPy on the host, ...) as they are; anything
    else through NumPy, which must find real numbers in it."""
    if hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
        # `run` is not differentiable (see `attnc.torch`); PyTorch exports
        # no tensor that requires grad.
        if getattr(value, "requires_grad", False):
            value = value.detach()
        # Device memory (a CUDA tensor) crosses through the host: one copy.
        if hasattr(value, "__dlpack_device__") and value.__dlpack_device__()[0] not in _HOST and hasattr(value, "cpu"):
            value = value.cpu()
        return value
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        error = InputError(f"tensor `{name}` has dtype {array.dtype}, but the spec takes real numbers")
        error.code, error.tensor = _attnc.TENSOR_FILE_CODE, name
        raise error
    if not (array.dtype.isnative and array.flags.writeable):
        # NumPy before 2.0 exports neither read-only nor byte-swapped arrays.
        array = np.array(array, dtype=array.dtype.newbyteorder("="))
    return array


def _types(dtype: Optional[str], out: Optional[str]) -> Tuple[str, str]:
    """The kernels' dtype (default f32) and the outputs' element type
    (default: float64 for ``dtype="f64"``, else float32)."""
    dtype = dtype or "f32"
    return dtype, out or ("f64" if dtype == "f64" else "f32")


def _inputs(tensors) -> List[Tuple[str, object]]:
    return [(n, _exchangeable(n, v)) for n, v in tensors.items()]


def _numpy(outputs) -> Dict[str, np.ndarray]:
    """Native outputs, adopted by NumPy without a copy."""
    return {n: np.from_dlpack(a) for n, a in outputs}


class Program:
    """A compiled spec: parameters bound, dims free until inputs fix them."""

    def __init__(self, native):
        self._native = native

    @property
    def inputs(self) -> List[Tensor]:
        """The spec's inputs in declaration order (weights have role ``"weight"``)."""
        return [
            Tensor(n, _dims(s), "weight" if w else "input", domain)
            for n, s, w, domain in self._native.inputs()
        ]

    @property
    def outputs(self) -> List[Tensor]:
        return [Tensor(n, _dims(s), "output") for n, s in self._native.outputs()]

    @property
    def warnings(self) -> str:
        """Warnings the compiler found, rendered as the CLI prints them ("" when none)."""
        return self._native.warnings()

    def sample(self, seed: int = 0) -> Dict[str, np.ndarray]:
        """Inputs drawn from the spec's own distributions at its default dims
        (float64; the same values as ``attnc run --seed``)."""
        return _numpy(self._native.sample(seed))

    def run(
        self, backend: str = "interp", dtype: Optional[str] = None, optimize: bool = False, finite: bool = False, **tensors
    ):
        """Run on arrays given by input name; returns the outputs by name as
        NumPy arrays. An input is anything NumPy converts, in any real dtype,
        or any object that speaks DLPack on the host (a PyTorch CPU tensor,
        bfloat16 included), read where it lies. ``backend``: ``"interp"``
        (the float64 reference), ``"wgpu"`` or ``"cuda"``. ``dtype`` as the
        CLI's ``--dtype``: ``None``/``"f32"`` (float32 outputs), ``"f64"``
        (float64 outputs), ``"f16"``, ``"bf16"`` or ``"tf32"`` (kernels store
        that type; float32 outputs). ``optimize`` runs the optimizer's choice.
        An output holding NaN or an infinity is a ``RuntimeWarning`` naming
        it and its first such index; with ``finite=True`` it raises
        :class:`NonFiniteError` (code ``E0605``), as ``attnc run --finite``."""
        return _numpy(self._run(tensors, backend, dtype, optimize, finite=finite))

    def _run(self, tensors, backend, dtype, optimize=False, out=None, finite=False):
        """The native outputs (DLPack producers), in element type ``out``
        (default: float64 for ``dtype="f64"``, else float32)."""
        dtype, out = _types(dtype, out)
        return self._native.run(_inputs(tensors), backend, dtype, optimize, out, finite)

    def grad(self, cotangents, wrt=None, backend: str = "interp", dtype: Optional[str] = None, **tensors):
        """Reverse-mode gradients, as ``attnc grad`` computes them: given the
        inputs and a cotangent per output (a dict named like the outputs),
        returns the forward outputs and ``grad_<input>`` for each input of
        ``wrt`` (default: every input with continuous values). Outputs are
        float32, float64 with ``dtype="f64"``."""
        return _numpy(self._grad(cotangents, wrt, backend, dtype, tensors))

    def _grad(self, cotangents, wrt, backend, dtype, tensors, out=None):
        if isinstance(wrt, str):
            wrt = [wrt]
        dtype, out = _types(dtype, out)
        return self._native.grad(_inputs(tensors), _inputs(cotangents), list(wrt or []), backend, dtype, out)

    def emit(self, target: str = "wgsl", dtype: Optional[str] = None, optimize: bool = False, arch: str = "sm_90"):
        """Kernel source at the default dims, as ``attnc compile`` writes it:
        ``({file name: source}, manifest)``. For ``cuda``, where NVIDIA's
        compilers are found (``ATTNC_CUDA_TOOLS``, ``CUDA_HOME``), each launch
        carries its ``resources`` on ``arch`` (``sm_80`` or ``sm_90``)."""
        files, manifest = self._native.emit(target, dtype or "f32", optimize, arch)
        return dict(files), json.loads(manifest)

    def cuda_kernels(self, dtype: Optional[str] = None, device: int = 0):
        """The kernels at the compiled sizes, compiled by NVRTC for CUDA
        device ``device`` (cached on disk) and loaded, to launch on device
        memory the caller owns: ``k.tensor_bytes()`` (bytes each input and
        output needs, by name), ``k.workspace_bytes()``,
        ``k.launch({name: (device_pointer, bytes)}, stream, workspace=None)``
        (queued on the ``CUstream`` given as an int, e.g.
        ``torch.cuda.current_stream().cuda_stream``; no copy, no
        synchronisation), ``k.reserve_workspace()`` and ``k.manifest()``.
        Tensors hold the storage type of ``dtype`` (``"f32"``, ``"f16"``,
        ``"bf16"``; ``"tf32"`` stores f32), contiguous and row-major.
        Raises ``DeviceError`` (code ``E0702`` without a driver)."""
        return self._native.cuda_kernels(dtype or "f32", device)

    def explain(self, target: str = "h200", mode: str = "inference") -> str:
        """The optimizer's report, as ``attnc explain`` prints it."""
        return self._native.explain(target, mode)

    def ir(self) -> str:
        """The typed IR, as ``attnc ir`` prints it."""
        return self._native.ir()

    def __repr__(self) -> str:
        ins = ", ".join(f"{t.name}: [{', '.join(map(str, t.shape))}]" for t in self.inputs)
        outs = ", ".join(t.name for t in self.outputs)
        return f"<attnc.Program ({ins}) -> {outs}>"
