"""Writes tests/data/hf_written.safetensors with HF's own `safetensors` package (pip: safetensors, numpy), so that
test_safetensors reads a file that fsdplab did not write. Run once; the output is committed (a few hundred bytes).

    python3 tests/data/make_hf_fixture.py
"""
import os

import numpy as np
from safetensors.numpy import save_file

here = os.path.dirname(os.path.abspath(__file__))
tensors = {
    # Names and shapes of a Qwen2 model; values are i * 0.25 - 1 so the C test can recompute them.
    "model.layers.0.self_attn.k_proj.bias": np.arange(5, dtype=np.float32) * 0.25 - 1,
    "model.embed_tokens.weight": (np.arange(12, dtype=np.float32) * 0.25 - 1).reshape(3, 4),
    "model.norm.weight": np.arange(4, dtype=np.float32) * 0.25 - 1,
}
save_file(tensors, os.path.join(here, "hf_written.safetensors"), metadata={"format": "pt"})
