"""Inputs for `attnc bench stdlib/document.attn --inputs`: random q, k, v
(B=1, H=2, N=4096, d=64, seed 0) and document ids of 16 documents of 256
tokens each (token i in document i // 256), the same blocks as
bench/specs/blocks.attn. usage: document_inputs.py [OUT [N H d DOC]]
(other sizes: N tokens, H heads, width d, documents of DOC tokens). Needs numpy and safetensors (the Python package's
test environment has both)."""
import sys

import numpy as np
from safetensors.numpy import save_file

out = sys.argv[1] if len(sys.argv) > 1 else "document_inputs.safetensors"
n, h, d, doc = (int(a) for a in sys.argv[2:6]) if len(sys.argv) > 5 else (4096, 2, 64, 256)
rng = np.random.default_rng(0)
tensors = {name: rng.uniform(-1, 1, (1, h, n, d)).astype(np.float32) for name in ("q", "k", "v")}
tensors["doc"] = (np.arange(n) // doc).astype(np.float32)[None, :]
save_file(tensors, out)
print(f"wrote {out}")
