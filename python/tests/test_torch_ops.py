"""attnc's PyTorch operators (attnc::run, attnc::forward, attnc::backward):
traced by torch.compile with no graph break, checked by opcheck, exported
by torch.export, with symbolic shapes, and a backward that runs on the
forward's residuals."""

import logging

import numpy as np
import pytest
import torch
import torch._dynamo.testing

import attnc
import attnc.torch


class TwoLayers(torch.nn.Module):
    """An IHA layer and a talking-heads layer, each with a residual."""

    def __init__(self, d=8, H=2):
        super().__init__()
        self.iha = attnc.torch.Module("stdlib/iha.attn", seed=1, H=H, P=2, d=d)
        self.th = attnc.torch.Module("stdlib/talking_heads.attn", seed=2, H=H, d=d)

    def forward(self, x):
        x = x + self.iha(x)
        return x + self.th(x)


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def step(model, x, run=None):
    """One loss's output and gradients, through ``run`` (default ``model``)."""
    model.zero_grad()
    y = (model if run is None else run)(x)
    y.square().mean().backward()
    return y.detach(), grads(model)


def assert_same(a, b, what, tol=1e-6):
    assert not torch.isnan(a).any(), what
    err = ((a.double() - b.double()).norm() / b.double().norm()).item()
    assert err <= tol, (what, err)


def test_compiled_model_traces_without_graph_breaks_and_equals_eager():
    torch.manual_seed(0)
    model = TwoLayers()
    x = torch.randn(2, 24, 16, requires_grad=True)
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained
    y, g = step(model, x)
    dx = x.grad.clone()
    x.grad = None
    compiled = torch.compile(model, fullgraph=True)
    y2, g2 = step(model, x, compiled)
    assert_same(y2, y, "output")
    assert_same(x.grad, dx, "grad x")
    assert g.keys() == g2.keys() and len(g) == 2 * 4 + 3 + 1 + 2
    for n in g:
        assert_same(g2[n], g[n], n)


def specs():
    """Small instances of IHA, MHA, talking heads and a score-function spec."""
    return [
        ("iha", dict(H=2, P=2, d=4, N=7)),
        ("mha", dict(H=2, d=4, N=9)),
        ("talking_heads", dict(H=2, d=4, N=6)),
        ("alibi", dict(H=2, d=4, M=5, N=7)),
    ]


@pytest.mark.parametrize("name,params", specs())
def test_opcheck_passes_on_each_operator(name, params):
    program = attnc.compile(f"stdlib/{name}.attn", **params)
    attnc.torch.function(program)  # registers the spec
    drawn = program.sample(seed=3)
    tensors = [torch.tensor(drawn[t.name], dtype=torch.float32, requires_grad=True) for t in program.inputs]
    wrt = ",".join(t.name for t in program.inputs if t.domain in ("Any", "Finite"))
    key = program._key
    for op, args in [
        (torch.ops.attnc.run.default, (key, tensors, "interp")),
        (torch.ops.attnc.forward.default, (key, wrt, tensors, "interp")),
    ]:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)
    outputs = torch.ops.attnc.forward(key, wrt, [t.detach() for t in tensors], "interp")
    saved = attnc.torch._spec(key).training(wrt).residuals(outputs)
    cot = [torch.randn(o.shape) for o in outputs[: len(program.outputs)]]
    result = torch.library.opcheck(
        torch.ops.attnc.backward.default, (key, wrt, [t.detach() for t in tensors], saved, cot, "interp")
    )
    assert set(result.values()) == {"SUCCESS"}, result


def test_backward_from_residuals_equals_the_gradient_program():
    """In float64 on the interpreter the backward run on the forward's
    residuals gives `Program.grad`'s gradients (which run the forward
    again) bit for bit."""
    for name, params in specs():
        program = attnc.compile(f"stdlib/{name}.attn", **params)
        drawn = program.sample(seed=4)
        tensors = {n: torch.tensor(v, requires_grad=True) for n, v in drawn.items()}
        y = attnc.torch.function(program)(**tensors)
        cot = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
        (y * cot).sum().backward()
        want = program.grad({program.outputs[0].name: cot.numpy()}, dtype="f64", **drawn)
        assert np.array_equal(y.detach().numpy(), want[program.outputs[0].name]), name
        assert len(program._native.training([]).saved()) >= 2, name
        for n, t in tensors.items():
            if "grad_" + n in want:
                assert np.array_equal(t.grad.numpy(), want["grad_" + n]), (name, n)


def test_dynamic_shapes_compile_once_for_every_length():
    """With symbolic sizes the fake implementations give the outputs'
    shapes from the spec's rules: one graph serves several lengths."""
    layer = attnc.torch.Module("stdlib/iha.attn", H=2, P=2, d=4)
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(layer, backend=counter, dynamic=True, fullgraph=True)
    for n in (10, 17, 23):
        x = torch.randn(2, n, 8)
        assert_same(compiled(x), layer(x), f"N={n}")
        compiled(x).sum().backward()
    assert counter.frame_count == 1, counter.frame_count


def test_torch_export_of_a_model_with_an_attnc_layer():
    torch.manual_seed(1)
    model = TwoLayers(d=4)
    x = torch.randn(1, 12, 8)
    exported = torch.export.export(model, (x,))
    assert any("attnc" in str(n.target) for n in exported.graph.nodes)
    assert_same(exported.module()(x), model(x), "exported")


def test_cpu_tensors_run_on_wgpu_in_their_precision_and_say_so_once(caplog):
    """By default float64 CPU tensors stay on the interpreter (exact) and
    float32/float16 ones run on wgpu (lavapipe in CI), float16 on the
    half-precision kernels both ways: against float64 on the same rounded
    values, f32 kernels are within 1e-4 and f16 ones show half precision's
    error (above 1e-5, at most 8u, u = 2⁻¹¹). The choice is logged once
    per dtype at DEBUG."""
    caplog.set_level(logging.DEBUG, logger="attnc.torch")
    attnc.torch._TOLD.clear()
    program = attnc.compile("stdlib/mha.attn", H=2, d=16, N=300)
    f = attnc.torch.function(program)
    drawn = program.sample(seed=9)
    cot = torch.randn(2, dtype=torch.float64)  # replaced below, once y's shape is known
    u = 2.0**-11
    for dtype, lo, hi in [(torch.float32, 0.0, 1e-4), (torch.float16, 1e-5, 8 * u)]:
        low = {n: torch.tensor(v).to(dtype).requires_grad_() for n, v in drawn.items()}
        exact = {n: t.detach().double().requires_grad_() for n, t in low.items()}
        y64 = f(**exact)
        cot = torch.randn(y64.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
        (y64 * cot).sum().backward()
        y = f(**low)
        f(**{n: t.detach() for n, t in low.items()})  # again, without gradients: attnc::run
        assert y.dtype == dtype
        (y.double() * cot).sum().backward()
        pairs = [("y", y, y64)] + [("grad_" + n, low[n].grad, exact[n].grad) for n in low]
        for name, got, want in pairs:
            assert got.dtype == dtype and not torch.isnan(got).any(), (dtype, name)
            err = ((got.double() - want).norm() / want.norm()).item()
            assert lo < err <= hi, (dtype, name, err)
    told = [r.getMessage() for r in caplog.records if r.name == "attnc.torch"]
    assert len(told) == 3, told
    assert any("torch.float64" in m and "on interp" in m for m in told), told
    assert any("torch.float16" in m and "on wgpu" in m for m in told), told


def test_the_torch_training_example_learns_associative_recall():
    """examples/train_iha_torch.py: an IHA decoder (sliding-window layers,
    then a global one) under torch.compile(fullgraph=True) on multi-query
    associative recall; its loss must fall and the recall beat chance (1/16)."""
    import pathlib
    import re
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [sys.executable, str(root / "examples" / "train_iha_torch.py"), "--steps", "300"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    fell = float(re.search(r"loss fell ([\d.]+)x", r.stdout).group(1))
    accuracy = float(re.search(r"recall accuracy ([\d.]+)%", r.stdout).group(1))
    print(r.stdout)
    assert fell >= 4 and accuracy >= 50, r.stdout


def test_the_device_checks_paper_implementation_is_iha():
    """bench/device/torch_train.py times attnc against the IHA paper's own
    PyTorch implementation on a GPU; on the CPU, in float64, that
    implementation's loss is attnc's (to 1e-12) with the same weights, and
    its gradients are too."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "device"))
    from torch_train import paper_step

    for p in (2, 4):
        layer = attnc.torch.Module("stdlib/iha.attn", H=2, P=p, d=8, mask="flat_causal", dtype=torch.float64)
        x = torch.randn(1, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(p))
        ours = layer(x).float().square().mean()
        ours.backward()
        g = grads(layer)
        layer.zero_grad()
        paper = paper_step(x, dict(layer.named_parameters()), p, 2)
        paper.backward()
        assert abs(ours.item() - paper.item()) <= 1e-12 * abs(paper.item()), p
        for n, want in grads(layer).items():
            assert_same(g[n], want, n, tol=1e-6)


def test_what_the_kernels_do_not_compute_runs_on_the_interpreter_by_default(caplog):
    """Learned ALiBi slopes under a learned sink: the kernels compute the
    forward and the sink's gradient but not the gradient of a tensor a
    score function reads under a weighting other than a plain softmax.
    For float32 CPU tensors, which `auto` sends to wgpu, that backward
    runs on the interpreter instead, said once at DEBUG, with the
    gradients of float64's; asked for by name, wgpu refuses it with a
    DeviceError whose `.gap` names what is missing."""
    caplog.set_level(logging.DEBUG, logger="attnc.torch")
    attnc.torch._TOLD.clear()
    text = (
        "spec s\ninput q: [1, 2, 9, 4]\ninput k: [1, 2, 9, 4]\ninput v: [1, 2, 9, 4]\nweight sinks: [2]\n"
        "weight slopes: [2]\noutput o = attention(q, k, v, mask = causal, sink = sinks, "
        "score = |s, b, h, i, j| s - slopes[h] * abs(i - j))\n"
    )
    layer = attnc.torch.Module(text)
    exact = attnc.torch.Module(text, dtype=torch.float64)
    qkv = [torch.randn(1, 2, 9, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    for m, ts in [(layer, qkv), (exact, [t.double() for t in qkv])]:
        m(*ts).square().sum().backward()
    for name in ["sinks", "slopes"]:
        got, want = getattr(layer, name).grad, getattr(exact, name).grad
        assert want.abs().sum() > 0, name
        assert_same(got, want, "grad " + name, tol=1e-5)
    told = [r.getMessage() for r in caplog.records if r.name == "attnc.torch"]
    assert sum("do not compute" in m and "score function reads" in m for m in told) == 1, told
    wgpu = attnc.torch.Module(text, backend="wgpu")
    y = wgpu(*qkv)
    with pytest.raises(attnc.DeviceError) as info:
        y.square().sum().backward()
    assert "score function reads" in info.value.gap, info.value
