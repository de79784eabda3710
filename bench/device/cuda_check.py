"""The CUDA launcher on PyTorch's memory and stream (bench/device/cuda.sh):

1. MHA's kernels launched on torch tensors' device pointers and
   torch.cuda.current_stream(), equal to the float64 interpreter;
2. the same launches captured in a CUDA graph and replayed: bit-equal to
   eager, and no host copy (the graph replays without Python);
3. per-call host overhead of the plan (B=1, N=128) against PyTorch SDPA's:
   the time to queue N calls, the GPU not waited for.

Needs an NVIDIA GPU, PyTorch with CUDA and the attnc wheel.
"""

import json
import time

import numpy as np
import torch

import attnc


def device_tensors(program, kernels, inputs, dtype):
    """Inputs uploaded and outputs allocated by torch, in the plan's storage type."""
    torch_dtype = {"f32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    sizes = kernels.tensor_bytes()
    tensors = {}
    for name, nbytes in sizes.items():
        if name in inputs:
            tensors[name] = torch.tensor(inputs[name], dtype=torch_dtype, device="cuda").contiguous()
        else:
            tensors[name] = torch.zeros(nbytes // torch.tensor([], dtype=torch_dtype).element_size(), dtype=torch_dtype, device="cuda")
    return tensors


def pointers(tensors):
    return {n: (t.data_ptr(), t.numel() * t.element_size()) for n, t in tensors.items()}


def main():
    assert torch.cuda.is_available(), "this check needs an NVIDIA GPU"
    program = attnc.compile("stdlib/mha.attn", B=1, H=8, d=64, N=128)
    inputs = program.sample(seed=0)
    reference = program.run(backend="interp", dtype="f64", **inputs)["y"]
    kernels = program.cuda_kernels("f32")
    launches = len(json.loads(kernels.manifest())["launches"])
    tensors = device_tensors(program, kernels, inputs, "f32")
    workspace = torch.empty(max(kernels.workspace_bytes(), 1), dtype=torch.uint8, device="cuda")
    ptrs = pointers(tensors)
    ws = (workspace.data_ptr(), workspace.numel())

    def call():
        kernels.launch(ptrs, torch.cuda.current_stream().cuda_stream, ws)

    call()
    torch.cuda.synchronize()
    eager = tensors["y"].clone()
    got = eager.double().cpu().numpy().reshape(reference.shape)
    err = np.linalg.norm(got - reference) / np.linalg.norm(reference)
    print(f"torch memory and stream: mha B=1 N=128 ({launches} launches): relative error {err:.3e} against the interpreter")
    assert err <= 1e-4 and np.isfinite(got).all(), err

    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # warm-up on the capturing stream, as torch asks
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        call()
    tensors["y"].zero_()
    graph.replay()
    torch.cuda.synchronize()
    same = torch.equal(tensors["y"], eager)
    print(f"CUDA graph: captured {launches} launches, replay equal to eager: {same}")
    assert same

    q, k, v = (torch.randn(1, 8, 128, 64, device="cuda") for _ in range(3))
    for _ in range(20):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        call()
    torch.cuda.synchronize()
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    ours = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    sdpa = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    print(
        f"host overhead per call, B=1 N=128: attnc mha plan ({launches} launches) {ours * 1e6:.1f} us, "
        f"{ours / launches * 1e6:.1f} us a launch; torch SDPA (1 attention) {sdpa * 1e6:.1f} us; ratio {ours / sdpa:.2f}"
    )


if __name__ == "__main__":
    main()
