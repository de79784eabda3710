"""The Python package's CUDA launcher on a machine without a GPU: a child
process loads tests/fake_cuda/libcuda.c, built here as a stand-in
libcuda.so.1 that logs every driver call, and launches a program's kernels
on made-up device pointers and a stream, as a framework would hand them.
NVRTC (ATTNC_CUDA_TOOLS, which .ci/run sets) compiles the kernels for real."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os, re, attnc
p = attnc.compile("stdlib/mha.attn", H=2, d=16, N=100)
k = p.cuda_kernels("f32")
m = json.loads(k.manifest())
def info_bytes(decl):
    fields = re.findall(r"(\w+) \w+\[(\d+)\];", decl)
    return sum(4 * int(n) for _, n in fields)
os.environ["FAKE_CUDA_ARGS"] = ";".join(
    f"{l['entry']}={len(l['bindings'])}+{info_bytes(l['info_struct'])}" for l in m["launches"])
sizes = k.tensor_bytes()
tensors = {n: (0x7000_0000_0000 + i * 2**32, b) for i, (n, b) in enumerate(sorted(sizes.items()))}
workspace = (0x6000_0000_0000, k.workspace_bytes())
open(os.environ["FAKE_CUDA_LOG"], "w").close()
k.launch(tensors, 0x5EED, workspace)
errors = []
name, size = sorted(sizes.items())[0]
for bad, ws in [({**tensors, name: (tensors[name][0], size - 1)}, workspace), ({}, workspace)]:
    try:
        k.launch(bad, 0, ws)
    except attnc.DeviceError as e:
        errors.append([e.code, str(e)])
print(json.dumps({"manifest": m, "tensors": tensors, "workspace": workspace, "errors": errors, "name": name}))
"""


def fake_driver(tmp):
    out = tmp / "libcuda.so.1"
    cc = subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o", str(out),
                         str(ROOT / "tests" / "fake_cuda" / "libcuda.c")], capture_output=True, text=True)
    assert cc.returncode == 0, f"building the stand-in driver needs a C compiler: {cc.stderr}"
    return tmp


def child(tmp_path, code):
    """Run `code` in a child process on the stand-in driver (its calls
    logged); its last line of output as JSON, and the log's path."""
    assert os.environ.get("ATTNC_CUDA_TOOLS") or os.environ.get("CUDA_HOME"), \
        "NVRTC is needed: set ATTNC_CUDA_TOOLS (see .ci/run)"
    log = tmp_path / "log"
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_driver(tmp_path)), "FAKE_CUDA_LOG": str(log),
           "ATTNC_CACHE_DIR": str(tmp_path / "cache")}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1]), log


def test_launches_on_the_callers_pointers_and_stream(tmp_path):
    got, log = child(tmp_path, CHILD)
    manifest, tensors, (ws, _) = got["manifest"], got["tensors"], got["workspace"]
    launches = [line.split(" ") for line in log.read_text().splitlines() if line.startswith("launch ")]
    # Only the first, good call launched anything, and it called nothing else.
    assert len(launches) == len(manifest["launches"]) == len(log.read_text().splitlines())
    by_id = {}
    for b in manifest["buffers"]:
        outputs = {v: k for k, v in manifest["outputs"].items()}
        if b["role"] == "input":
            by_id[b["id"]] = tensors[b["name"]][0]
        elif b["id"] in outputs:
            by_id[b["id"]] = tensors[outputs[b["id"]]][0]
    for words, launch in zip(launches, manifest["launches"]):
        assert words[1] == launch["entry"] and words[3] == str(0x5EED)
        assert [int(w) for w in words[5:8]] == launch["grid"]
        pointers = [int(w) for w in words[15:15 + len(launch["bindings"])]]
        for b, p in zip(launch["bindings"], pointers):
            if b["buffer"] in by_id:
                assert p == by_id[b["buffer"]], (launch["entry"], b)
            else:
                assert ws <= p < ws + max(got["workspace"][1], 1), (launch["entry"], b)
    (small, missing) = got["errors"]
    assert small[0] == "E0709" and f"`{got['name']}` holds" in small[1], small
    assert missing[0] == "E0709" and "no device tensor" in missing[1], missing


# The PyTorch operators' CUDA path up to the driver: kernels planned at the
# shapes of tensors that live on the device (MHA at N = 37, not the spec's
# default 64), for the plain program and the training forward and backward,
# each sized as the operators allocate its tensors and launched on them.
SHAPED = r"""
import json, os, re, attnc
import attnc.torch as at
p = attnc.compile("stdlib/mha.attn", H=2, d=16)
spec = at._spec(p._key, p)
x = [1, 37, 32]
shapes = {"x": x, "w_q": [32, 32], "w_k": [32, 32], "w_v": [32, 32], "w_o": [32, 32]}
def info_bytes(decl):
    return sum(4 * int(n) for _, n in re.findall(r"(\w+) \w+\[(\d+)\];", decl))
report, entries = {}, []
def check(name, k, want):
    m = json.loads(k.manifest())
    entries.extend(f"{l['entry']}={len(l['bindings'])}+{info_bytes(l['info_struct'])}" for l in m["launches"])
    os.environ["FAKE_CUDA_ARGS"] = ";".join(entries)
    sizes = k.tensor_bytes()
    report[name] = {"sizes": sizes, "want": want, "launches": len(m["launches"])}
    tensors = {n: (0x7000_0000_0000 + i * 2**32, b) for i, (n, b) in enumerate(sorted(sizes.items()))}
    k.launch(tensors, 0x5EED, (0x6000_0000_0000, k.workspace_bytes()))
def numel(shape):
    out = 1
    for d in shape:
        out *= d
    return out
def wanted(named):
    return {n: 4 * numel(s) for n, s in named.items()}
outs = at._shapes(spec.rules, [shapes[n] for n in spec.inputs])
check("run", p._native.cuda_kernels_at(shapes, "f32", 0), wanted({**shapes, "y": outs[0]}))
training = spec.training("")
forward = dict(zip(training.forward_outputs, at._shapes(training.rules, [shapes[n] for n in spec.inputs])))
check("forward", training.native.cuda_kernels_at("forward", shapes, "f32", 0), wanted({**shapes, **forward}))
given = {**shapes, **{n: forward[n] for n in training.saved}, "cot_y": forward["y"]}
grads = {"grad_" + n: shapes[n] for n in training.gradients}
check("backward", training.native.cuda_kernels_at("backward", given, "f32", 0), wanted({**given, **grads}))
print(json.dumps(report))
"""


def test_operators_plan_device_tensors_at_their_shapes(tmp_path):
    report, log = child(tmp_path, SHAPED)
    for name, r in report.items():
        # Every tensor the operator allocates is the size the kernels need, at N = 37.
        assert r["sizes"] == r["want"], (name, r)
    assert report["forward"]["sizes"]["x"] == 4 * 37 * 32
    # Five residuals (q, k, v, o, log-sum-exp); the backward repeats no forward launch.
    assert len([n for n in report["backward"]["sizes"] if n.startswith("saved_")]) == 5
    assert report["forward"]["launches"] + report["backward"]["launches"] <= 15
    launched = [line for line in log.read_text().splitlines() if line.startswith("launch ")]
    assert len(launched) == sum(r["launches"] for r in report.values())
