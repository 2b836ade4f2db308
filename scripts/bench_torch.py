"""The PyTorch side of scripts/bench_model.sh: HF Qwen2ForCausalLM (eager attention, float32) forward + backward on
one CPU thread, same config, batch and timing rule as scripts/bench_model (median of the iterations after one
warm-up). Prints one JSON line.

    python3 scripts/bench_torch.py model=tiny B=4 T=128 iterations=5 [hidden_size=512 num_hidden_layers=8 ...]
"""
import json
import sys
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

PRESETS = {  # the same values as core/models/qwen2.c's presets
    "tiny": dict(vocab_size=260, hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=1024, rope_theta=10000.0),
    "qwen2-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=131072,
                       rope_theta=1000000.0),
}
PRESETS["qwen2"] = PRESETS["qwen2-0.5b"]  # the seed's name for it, as core/models/qwen2.c accepts
RUN_KEYS = {"model", "B", "T", "iterations"}  # everything else is a Qwen2Config field, as for scripts/bench_model


def main(argv):
    args = dict(arg.split("=", 1) for arg in argv)
    model = args.get("model", "tiny")
    if model not in PRESETS:
        sys.exit(f"bench_torch: model='{model}' is not a model; choose one of: {', '.join(PRESETS)}")
    fields = dict(PRESETS[model])
    for key, value in args.items():
        if key not in RUN_KEYS:
            fields[key] = float(value) if "." in value or "e" in value else int(value)
    batch, length, iterations = int(args.get("B", 4)), int(args.get("T", 128)), int(args.get("iterations", 5))
    torch.set_num_threads(1)
    torch.manual_seed(1)
    config = Qwen2Config(**fields, rms_norm_eps=1e-6, tie_word_embeddings=True, attn_implementation="eager")
    model = Qwen2ForCausalLM(config).float()
    tokens = torch.randint(0, config.vocab_size, (batch, length))

    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=tokens, labels=tokens).loss.backward()

    step()  # warm-up
    seconds = []
    for _ in range(iterations):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    median = sorted(seconds)[iterations // 2]
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"impl": "torch", "tokens_per_s": round(batch * length / median, 1), "step_s": round(median, 5),
                      "params": params, "torch": torch.__version__}))


if __name__ == "__main__":
    main(sys.argv[1:])
