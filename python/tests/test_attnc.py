"""The Python package against the CLI: the same pipeline, so the same bits.

The CLI binary is `target/debug/attnc` of this checkout (built by `cargo
test`), or `$ATTNC_BIN`. The wgpu tests need a Vulkan device (lavapipe in
CI) and fail, not skip, without one.
"""

import json
import os
import pathlib
import re
import subprocess
import time
import warnings
import sys

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

import attnc
import attnc.torch  # before any wgpu run: see attnc/torch.py

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("ATTNC_BIN", str(ROOT / "target" / "debug" / "attnc"))

# Every stdlib spec, at sizes that are not multiples of any tile.
CASES = [
    ("mha", {"N": 37, "H": 3, "d": 6, "B": 2}),
    ("mha", {"N": 20, "H": 4, "H_kv": 2, "d": 8, "window": 5}),
    ("gqa", {"N": 25, "H": 4, "d": 4}),
    ("mqa", {"N": 19, "H": 3, "d": 5}),
    ("iha", {"N": 13, "H": 2, "P": 3, "d": 6}),
    ("iha", {"N": 11, "H": 3, "P": 2, "d": 4, "mask": "token_causal", "collapse": "per_head", "rope": 100.0}),
    ("gpt_oss", {"N": 21, "H": 4, "H_kv": 2, "d": 8, "window": 5}),
    ("sigmoid", {"N": 23, "H": 4, "H_kv": 2, "d": 8, "mask": "none"}),
    ("grpo", {}),
    ("grpo", {"std": "bessel", "G": 5}),
    ("dr_grpo", {}),
    ("rloo", {"G": 3}),
    ("maxrl", {}),
    ("gdpo", {"C": 2}),
    ("odrpo", {"K": 5}),
    ("odrpo", {"K": 4, "base": "maxrl", "weights": [1.0, 0.5, 2.0], "batch_norm": True}),
]


def cli(*args, cwd=ROOT):
    return subprocess.run([BIN, *map(str, args)], cwd=cwd, capture_output=True, text=True)


def sets(params):
    out = []
    for k, v in params.items():
        out += ["--set", f"{k}={attnc._setting(v)}"]
    return out


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name,params", CASES)
def test_every_stdlib_spec_runs_bit_identical_to_the_cli(tmp_path, name, params):
    spec = f"stdlib/{name}.attn"
    seeded = tmp_path / "seeded.safetensors"
    r = cli("run", spec, "--seed", 7, "--dtype", "f64", "--out", seeded, *sets(params))
    assert r.returncode == 0, r.stderr
    files = load_file(str(seeded))
    program = attnc.compile(ROOT / spec, **params)
    inputs = {t.name: files[t.name] for t in program.inputs}
    # The same draws as the CLI's --seed.
    drawn = program.sample(seed=7)
    assert sorted(drawn) == sorted(inputs)
    for n, a in inputs.items():
        assert same_bits(drawn[n], a), n
    # float64 outputs, bit for bit.
    out = program.run(dtype="f64", **inputs)
    assert sorted(out) == sorted(t.name for t in program.outputs)
    for t in program.outputs:
        assert not np.isnan(out[t.name]).any()
        assert same_bits(out[t.name], files[t.name]), t.name
    # float32 outputs (the default), as `run --inputs` writes them.
    f32 = tmp_path / "f32.safetensors"
    r = cli("run", spec, "--inputs", seeded, "--out", f32, *sets(params))
    assert r.returncode == 0, r.stderr
    want = load_file(str(f32))
    for n, a in program.run(**inputs).items():
        assert same_bits(a, want[n]), n


def test_inputs_of_any_real_dtype_are_converted():
    program = attnc.compile("stdlib/grpo.attn")
    r = np.array([[1, 2, 3, 4], [0, 0, 1, 1]], dtype=np.int32)
    a = program.run(rewards=r)["advantages"]
    b = program.run(dtype="f64", rewards=r.astype(np.float64))["advantages"]
    assert a.dtype == np.float32 and a.shape == (2, 4)
    assert same_bits(a, b.astype(np.float32))
    # GRPO: (r - mean) / (std + eps) per group; checked independently here.
    rf = r.astype(np.float64)
    ref = (rf - rf.mean(1, keepdims=True)) / (rf.std(1, keepdims=True) + 1e-6)
    assert np.allclose(b, ref, rtol=1e-12, atol=1e-12)


def test_inputs_are_read_in_place_whatever_their_layout_and_dtype():
    """Inputs cross through DLPack: strided views (transposed, stepped,
    reversed) give the bits their contiguous copies give, and every real
    dtype from NumPy and PyTorch (bfloat16 too) reads as its float64 value."""
    mha = attnc.compile("stdlib/mha.attn", H=2, d=4, N=37)
    inputs = mha.sample(seed=3)
    want = mha.run(dtype="f64", **inputs)["y"]
    views = {
        "x": np.ascontiguousarray(inputs["x"][:, ::-1])[:, ::-1],  # negative strides
        "w_q": np.ascontiguousarray(inputs["w_q"].T).T,  # column-major
        "w_k": np.repeat(inputs["w_k"], 3, axis=1)[:, ::3],  # stepped
        "w_v": torch.tensor(inputs["w_v"]).T.contiguous().T,  # a transposed torch tensor
        "w_o": inputs["w_o"],
    }
    assert not views["w_q"].flags.c_contiguous and views["x"].strides[1] < 0
    assert not views["w_v"].is_contiguous()
    assert same_bits(mha.run(dtype="f64", **views)["y"], want)

    grpo = attnc.compile("stdlib/grpo.attn")
    r = np.random.default_rng(4).integers(0, 100, size=(3, 5))
    ref = grpo.run(dtype="f64", rewards=r.astype(np.float64))["advantages"]
    for value in [
        r.astype(np.int8), r.astype(np.uint8), r.astype(np.int64), r.astype(np.float16),
        r.astype(">f8"),  # byte-swapped: through a native copy
        torch.tensor(r, dtype=torch.bfloat16), torch.tensor(r, dtype=torch.int16),
        torch.tensor(r, dtype=torch.float16), r.tolist(),
    ]:
        got = grpo.run(dtype="f64", rewards=value)["advantages"]
        assert same_bits(got, ref), type(value)
    b = np.array([[True, False, True], [False, False, True]])
    assert same_bits(grpo.run(dtype="f64", rewards=b)["advantages"],
                     grpo.run(dtype="f64", rewards=b.astype(np.float64))["advantages"])
    class OnDevice:  # a device tensor as DLPack describes it (no CUDA here)
        def __init__(self, t):
            self.t = t

        def __dlpack_device__(self):
            return (2, 0)  # kDLCUDA

        def __dlpack__(self, **kwargs):
            raise AssertionError("device memory is not read in place")

        def cpu(self):
            return self.t

    assert same_bits(grpo.run(dtype="f64", rewards=OnDevice(torch.tensor(r, dtype=torch.int32)))["advantages"], ref)
    tracked = torch.tensor(r, dtype=torch.float64, requires_grad=True)
    assert same_bits(grpo.run(dtype="f64", rewards=tracked)["advantages"], ref)
    with pytest.raises(attnc.InputError) as info:
        grpo.run(rewards=torch.zeros(2, 3, dtype=torch.complex64))
    assert info.value.tensor == "rewards" and "real numbers" in str(info.value), str(info.value)


def test_outputs_are_adopted_without_a_copy():
    program = attnc.compile("stdlib/grpo.attn")
    (name, native), = program._run({"rewards": np.arange(12.0).reshape(3, 4)}, "interp", "f64")
    a, t = np.from_dlpack(native), torch.from_dlpack(native)
    assert name == "advantages" and a.dtype == np.float64 and t.dtype == torch.float64
    assert a.ctypes.data == t.data_ptr()  # one buffer, shared
    assert np.array_equal(a, t.numpy()) and np.abs(a).sum() > 0
    for out, dtype in [("f32", torch.float32), ("f16", torch.float16), ("bf16", torch.bfloat16)]:
        (_, native), = program._run({"rewards": np.arange(12.0).reshape(3, 4)}, "interp", "f64", out=out)
        got = torch.from_dlpack(native)
        assert got.dtype == dtype and torch.equal(got, torch.from_numpy(a).to(dtype)), out


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 1e-2), (torch.float16, 2e-3), (torch.float32, 1e-6)])
def test_torch_half_precision_tensors_run_and_differentiate(dtype, tol):
    """CPU tensors in half precision (which NumPy cannot hold in bfloat16)
    run forward and backward and come back in their own dtype, within the
    dtype's rounding of the float64 result on the same (rounded) values."""
    program = attnc.compile("stdlib/iha.attn", H=2, P=2, d=8, N=50)
    f = attnc.torch.function(program)
    drawn = program.sample(seed=5)
    low = {n: torch.tensor(v).to(dtype).requires_grad_() for n, v in drawn.items()}
    exact = {n: v.detach().double().requires_grad_() for n, v in low.items()}
    y, y64 = f(**low), f(**exact)
    assert y.dtype == dtype and not torch.isnan(y).any()
    err = ((y.double() - y64).norm() / y64.norm()).item()
    assert err <= tol, err
    cot = torch.randn(y64.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    (y.double() * cot).sum().backward()
    (y64 * cot).sum().backward()
    for n in low:
        g, g64 = low[n].grad, exact[n].grad
        assert g.dtype == dtype and not torch.isnan(g).any(), n
        assert ((g.double() - g64).norm() / g64.norm()).item() <= 2 * tol, n


def test_kernels_on_wgpu_match_the_interpreter():
    program = attnc.compile("stdlib/iha.attn", H=2, P=3, d=16, N=300)
    inputs = program.sample(seed=1)
    want = program.run(dtype="f64", **inputs)["y"]
    for dtype, tol in [(None, 1e-4), ("f16", 5e-3)]:
        got = program.run(backend="wgpu", dtype=dtype, **inputs)["y"]
        assert got.dtype == np.float32 and not np.isnan(got).any()
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err <= tol, (dtype, err)


def test_reward_estimators_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # stdlib specs ship inside the package
    r = np.random.default_rng(0).integers(1, 11, size=(6, 8))
    r[2] = 7  # a group whose ratings are all equal gets exactly 0
    adv = attnc.compile("stdlib/odrpo.attn", K=10, base="grpo").run(rewards=r)["advantages"]
    assert adv.shape == (6, 8) and adv.dtype == np.float32
    assert (adv[2] == 0).all() and np.abs(adv).sum() > 0
    assert sorted(attnc.stdlib()) == sorted(p.stem for p in (ROOT / "stdlib").glob("*.attn"))


def test_spec_errors_carry_the_clis_diagnostic(tmp_path):
    bad = tmp_path / "bad.attn"
    bad.write_text("spec bad\ndim N = 4\ninput x: [N, 4] ~ normal(0, 1)\noutput y = x @ w_missing\n")
    with pytest.raises(attnc.SpecError) as info:
        attnc.compile(str(bad))
    e = info.value
    r = cli("check", bad)
    assert r.returncode != 0
    assert str(e) in r.stderr  # the same rendered diagnostic
    assert (e.file, e.line, e.column) == (str(bad), 4, 16)
    assert f"{bad}:4:16" in str(e)
    assert re.fullmatch(r"E\d{4}", e.code) and f"error[{e.code}]" in r.stderr
    # From text, and a parameter's own requirement.
    with pytest.raises(attnc.SpecError) as info:
        attnc.compile("spec t\ninput x: [2, 3]\noutput y = x + )\n")
    assert (info.value.file, info.value.line, info.value.column) == ("<string>", 3, 16), str(info.value)
    with pytest.raises(attnc.SpecError) as info:
        attnc.compile("stdlib/odrpo.attn", K=1)
    assert "K must be at least 2" in str(info.value)
    with pytest.raises(FileNotFoundError):
        attnc.compile("no/such/spec.attn")


def test_input_errors_name_the_tensor():
    mha = attnc.compile("stdlib/mha.attn", H=2, d=4)
    inputs = mha.sample(seed=0)
    bad = dict(inputs, x=inputs["x"][0])
    with pytest.raises(attnc.InputError) as info:
        mha.run(**bad)
    assert info.value.tensor == "x" and "[64, 8]" in str(info.value), str(info.value)
    bad = dict(inputs, w_o=inputs["w_o"][:, :5])
    with pytest.raises(attnc.InputError) as info:
        mha.run(**bad)
    assert info.value.tensor == "w_o" and "[8, 5]" in str(info.value), str(info.value)
    assert re.fullmatch(r"E\d{4}", info.value.code)
    missing = dict(inputs)
    del missing["w_o"]
    with pytest.raises(attnc.InputError) as info:
        mha.run(**missing)
    assert info.value.tensor == "w_o"
    with pytest.raises(attnc.InputError) as info:
        mha.run(**dict(inputs, x=np.array([["a"]])))
    assert info.value.tensor == "x"
    r = np.full((2, 4), 3.0)
    r[1, 2] = 11.0
    with pytest.raises(attnc.InputError) as info:
        attnc.compile("stdlib/odrpo.attn", K=10).run(rewards=r)
    assert info.value.tensor == "rewards" and "group 1" in str(info.value) and "sample 2" in str(info.value)


def test_non_finite_outputs_warn_or_raise_as_the_cli_reports_them(tmp_path):
    """An output holding NaN or an infinity: a RuntimeWarning naming the
    output, the counts and the first index (the CLI's stderr line, word for
    word); with finite=True, NonFiniteError with the CLI's code E0605."""
    text = "spec nonfinite\ninput x: [2, 3]\noutput y = sqrt(x) / x\n"
    program = attnc.compile(text)
    x = np.array([[1.0, 4.0, -1.0], [0.0, 9.0, 16.0]])
    with pytest.warns(RuntimeWarning) as caught:
        y = program.run(dtype="f64", x=x)["y"]
    assert np.isnan(y[0, 2]) and np.isnan(y[1, 0]) and y[0, 1] == 0.5
    message = str(caught[0].message)
    assert message == "output `y` holds 2 NaN and 0 infinite value(s); the first, NaN, at [0, 2]", message
    with pytest.raises(attnc.NonFiniteError) as info:
        program.run(dtype="f64", finite=True, x=x)
    assert info.value.code == "E0605" and message in str(info.value)
    spec, inputs, out = tmp_path / "n.attn", tmp_path / "x.safetensors", tmp_path / "y.safetensors"
    spec.write_text(text)
    from safetensors.numpy import save_file

    save_file({"x": x}, str(inputs))
    r = cli("run", spec, "--inputs", inputs, "--out", out, "--dtype", "f64")
    assert r.returncode == 0 and f"warning: {message}" in r.stderr, r.stderr
    r = cli("run", spec, "--inputs", inputs, "--out", tmp_path / "z.safetensors", "--finite")
    assert r.returncode != 0 and "E0605" in r.stderr, r.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        program.run(x=np.abs(x) + 1.0)  # finite: no warning


def test_settings_and_devices_raise_their_own_exceptions():
    grpo = attnc.compile("stdlib/grpo.attn")
    r = np.arange(8.0).reshape(2, 4)
    with pytest.raises(attnc.SettingError):
        grpo.run(backend="tpu", rewards=r)
    with pytest.raises(attnc.SettingError) as info:
        grpo.run(dtype="f16", rewards=r)  # the interpreter computes in float64
    assert "float64" in str(info.value)
    with pytest.raises(attnc.SettingError):
        grpo.emit("wgsl", dtype="bf16")
    with pytest.raises(attnc.SettingError):
        grpo.explain(target="tpu")
    # CUDA is in every build; this machine has no driver (libcuda.so.1).
    with pytest.raises(attnc.DeviceError) as info:
        grpo.run(backend="cuda", rewards=r)
    assert info.value.code == "E0702" and "libcuda.so.1" in str(info.value)
    with pytest.raises(attnc.DeviceError) as info:
        grpo.cuda_kernels()
    assert info.value.code == "E0702"
    assert issubclass(attnc.DeviceError, attnc.Error) and issubclass(attnc.SpecError, attnc.Error)


def test_hostile_inputs_raise_errors_never_panics():
    mha = attnc.compile("stdlib/mha.attn", H=2, d=4)
    rng = np.random.default_rng(3)
    shapes = [(0, 5, 8), (1, 0, 8), (2, 3, 8, 1), (), (1, 5, 0)]
    for shape in shapes:
        inputs = dict(mha.sample(seed=0), x=rng.standard_normal(shape))
        try:
            out = mha.run(**inputs)
            assert all(not np.isnan(v).any() for v in out.values())
        except attnc.Error:
            pass
    for params in [{"H": 0}, {"H": -1}, {"d": 10**12}, {"mask": "sideways"}, {"window": 1.5}]:
        with pytest.raises(attnc.Error):
            attnc.compile("stdlib/mha.attn", **params).run(**mha.sample(seed=0))


def test_emit_explain_and_ir_are_the_clis(tmp_path):
    params = {"H": 2, "P": 2, "d": 8, "N": 16}
    program = attnc.compile("stdlib/iha.attn", **params)
    for target in ["wgsl", "cuda"]:
        out = tmp_path / target
        r = cli("compile", "stdlib/iha.attn", "--target", target, "--out", out, *sets(params))
        assert r.returncode == 0, r.stderr
        files, manifest = program.emit(target)
        assert files == program.emit(target)[0]  # deterministic
        assert sorted(files) == sorted(p.name for p in out.iterdir() if p.name != "manifest.json")
        for name, text in files.items():
            assert (out / name).read_text() == text, name
        assert manifest == json.loads((out / "manifest.json").read_text())
        if target == "cuda" and os.environ.get("ATTNC_CUDA_TOOLS"):
            # CI installs NVIDIA's compilers: both sides carry the resource table.
            assert all(l["resources"]["arch"] == "sm_90" for l in manifest["launches"])
    if os.environ.get("ATTNC_CUDA_TOOLS"):
        sm80 = program.emit("cuda", arch="sm_80")[1]
        assert all(l["resources"]["arch"] == "sm_80" for l in sm80["launches"])
    with pytest.raises(attnc.SettingError, match="sm_75"):
        program.emit("cuda", arch="sm_75")
    r = cli("explain", "stdlib/iha.attn", "--target", "cpu", "--mode", "training", *sets(params))
    assert r.returncode == 0 and program.explain(target="cpu", mode="training") == r.stdout
    r = cli("ir", "stdlib/iha.attn", *sets(params))
    assert r.returncode == 0 and program.ir() == r.stdout


def test_inputs_and_outputs_describe_the_spec():
    iha = attnc.compile("stdlib/iha.attn", P=4)
    names = [t.name for t in iha.inputs]
    assert names[:1] == ["x"] and {"w_q", "alpha_q", "alpha_k", "alpha_v", "r"} <= set(names)
    roles = {t.name: t.role for t in iha.inputs}
    assert roles["x"] == "input" and roles["w_q"] == "weight" and roles["alpha_q"] == "weight"
    shapes = {t.name: t.shape for t in iha.inputs}
    assert shapes["alpha_q"][2] == 4 and all(isinstance(d, (int, str)) for d in shapes["x"])
    assert [t.name for t in iha.outputs] == ["y"] and iha.outputs[0].role == "output"
    odrpo = attnc.compile("stdlib/odrpo.attn", K=10)
    assert odrpo.inputs[0].domain.startswith("Integers")


def readme_python_blocks():
    text = (ROOT / "README.md").read_text() + (ROOT / "docs" / "python.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_readmes_python_examples_run(tmp_path, monkeypatch):
    blocks = readme_python_blocks()
    assert len(blocks) >= 3  # the README's tour and docs/python.md's examples
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, "README.md or docs/python.md", "exec"), {})


def test_grad_matches_the_cli_bit_for_bit(tmp_path):
    params = {"H": 2, "P": 2, "d": 4, "N": 6, "rope": 100.0}
    out = tmp_path / "grad.safetensors"
    r = cli("grad", "stdlib/iha.attn", "--seed", 5, "--dtype", "f64", "--out", out, *sets(params))
    assert r.returncode == 0, r.stderr
    files = load_file(str(out))
    program = attnc.compile("stdlib/iha.attn", **params)
    inputs = {t.name: files[t.name] for t in program.inputs}
    result = program.grad({"y": files["cot_y"]}, dtype="f64", **inputs)
    assert set(result) == {"y"} | {f"grad_{t.name}" for t in program.inputs}
    for name, a in result.items():
        assert same_bits(a, files[name]), name
    only = program.grad({"y": files["cot_y"]}, wrt=["alpha_q", "r"], **inputs)
    assert set(only) == {"y", "grad_alpha_q", "grad_r"} and only["grad_r"].dtype == np.float32
    with pytest.raises(attnc.SettingError) as info:
        attnc.compile("stdlib/odrpo.attn").grad({"advantages": np.ones((4, 8))}, rewards=np.ones((4, 8)))
    assert info.value.code == "E0801"


def test_torch_functions_pass_gradcheck_in_float64():
    for spec, params in [("iha", {"H": 2, "P": 2, "d": 2, "N": 3}), ("mha", {"H": 2, "d": 2, "N": 4})]:
        program = attnc.compile(f"stdlib/{spec}.attn", **params)
        f = attnc.torch.function(program)
        drawn = program.sample(seed=2)
        tensors = tuple(
            torch.tensor(drawn[t.name], dtype=torch.float64, requires_grad=True) for t in program.inputs
        )
        assert torch.autograd.gradcheck(f, tensors, eps=1e-6, atol=1e-7, rtol=1e-5), spec


def test_torch_module_trains_one_step():
    torch.manual_seed(0)
    layer = attnc.torch.Module("stdlib/iha.attn", H=2, P=2, d=4, N=8)
    names = {n for n, _ in layer.named_parameters()}
    assert {"w_q", "w_k", "w_v", "w_o", "alpha_q", "alpha_k", "alpha_v", "r"} <= names
    before = {n: p.detach().clone() for n, p in layer.named_parameters()}
    x = torch.randn(2, 8, 8)
    loss = layer(x).square().mean()
    loss.backward()
    torch.optim.SGD(layer.parameters(), lr=0.05).step()
    for n, p in layer.named_parameters():
        assert p.grad is not None and not torch.equal(before[n], p.detach()), n
    assert layer(x).square().mean() < loss


@pytest.mark.parametrize("backend", ["interp", "wgpu"])
def test_the_training_example_fits_the_teacher(tmp_path, backend):
    """The example trains on the interpreter and, as the issue asks, on the
    wgpu kernels (gradient programs included) in under a minute."""
    plot = tmp_path / "loss.svg"
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_iha.py"), "--backend", backend, "--plot", str(plot)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    elapsed = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    fell = float(re.search(r"fell (\d+)x", r.stdout).group(1))
    assert fell >= 100, r.stdout
    print(f"{backend}: loss fell {fell:.0f}x in {elapsed:.1f} s")
    assert plot.read_text().startswith("<svg") and "polyline" in plot.read_text()
