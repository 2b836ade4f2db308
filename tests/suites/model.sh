# The Qwen2 model: layer gradients vs finite differences, the model in C, and parity with HF transformers
# (tests/test_hf_parity.py: logits, loss, every gradient; names and counts of qwen2-0.5b and tiny).
check "test_layers: every layer's backward vs finite differences" tests/bin/test_layers
check "test_qwen2: presets, tree, init, model gradient, checkpoints, generation" \
  env OUT=runs/check/test_qwen2 tests/bin/test_qwen2
check "test_hf_parity: logits, loss, grads, names vs HF transformers" env OUT=runs/check/hf_parity \
  python3 tests/test_hf_parity.py
check "test_adamw_parity: AdamW vs torch.optim.AdamW" env OUT=runs/check/adamw_parity python3 tests/test_adamw_parity.py
# MODEL=qwen2, the seed's name, is the qwen2-0.5b preset: the same parameters, names and shapes.
check "qwen2_tool params qwen2: the same model as qwen2-0.5b (494032768 parameters)" env OUT=runs/check/qwen2_alias \
  bash -c 'diff <(tests/bin/qwen2_tool params qwen2) <(tests/bin/qwen2_tool params qwen2-0.5b) &&
    tests/bin/qwen2_tool params qwen2 | grep -qx "total 494032768"'
