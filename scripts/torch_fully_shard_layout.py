"""FSDP2's layout as torch makes it: fully_shard applied as torch_fsdp_train.py --fsdp-version 2 applies it, and each
rank's shard of each parameter written out, for fsdplab's per-parameter sharding to be compared with byte for byte.

Run on the CPU with gloo, one process per rank (W ranks), on a checkpoint written by `qwen2_tool init`:

    torchrun --nproc_per_node W scripts/torch_fully_shard_layout.py --model-dir D --out DIR

Writes, per rank r, DIR/rank<r>.safetensors: every parameter's local shard (the DTensor's to_local(): its rows only,
no padding; float32; HF's names, the tied lm_head.weight once as model.embed_tokens.weight), and from rank 0
DIR/layout.json:

    {"world": W, "torch": "<version>", "parameters": {"<HF name>": {
        "unit": "<the fully_shard module's name, '' for the root>", "index_in_unit": i,
        "shape": [...], "d0": rows, "chunk_rows": ceil(d0 / W),
        "padded_local_shape": [...] (FSDPParam.padded_sharded_param_size: every rank's shard padded to chunk_rows),
        "ranks": [{"start": s, "end": e}, ...]}}}   (rows [s, e) of dim 0 held by rank r, e - s possibly 0)

Each rank's [start, end) is torch's own (DTensor's compute_local_shape_and_global_offset for the parameter's mesh and
Shard(0) placement), checked against the data: its to_local() must have e - s rows, equal to full_tensor()[s:e].
"""
import argparse
import json
import math
import os

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from transformers import Qwen2ForCausalLM

from torch_fsdp_train import apply_fully_shard


def arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True, help="config.json + model.safetensors (`qwen2_tool init`)")
    parser.add_argument("--out", required=True, help="directory for rank<r>.safetensors and layout.json")
    return parser.parse_args()


def fsdp_params(model):
    """id(sharded parameter) -> (unit name, index in its unit, FSDPParam), from each fully_shard module's state."""
    found = {}
    for unit, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        for group in module._get_fsdp_state()._fsdp_param_groups:
            for index, fsdp_param in enumerate(group.fsdp_params):
                found[id(fsdp_param.sharded_param)] = (unit, index, fsdp_param)
    return found


def main():
    args = arguments()
    if not os.path.isfile(os.path.join(args.model_dir, "config.json")):
        raise SystemExit(f"--model-dir {args.model_dir}: no config.json there (write one with `qwen2_tool init`)")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = Qwen2ForCausalLM.from_pretrained(args.model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    apply_fully_shard(model, "FULL_SHARD", "fp32", torch.device("cpu"), world)
    states = fsdp_params(model)
    local, mine = {}, {}
    for name, param in model.named_parameters():
        shard = param.to_local()
        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        start, end = offset[0], offset[0] + shape[0]
        full = param.full_tensor()
        if shard.shape[0] != end - start or not torch.equal(shard, full[start:end]):
            raise SystemExit(f"rank {rank}: {name}'s to_local() ({tuple(shard.shape)}) is not rows [{start}, {end}) "
                             f"of its full_tensor() {tuple(full.shape)}")
        local[name] = shard.detach().float().contiguous()
        mine[name] = (start, end)
    per_rank = [None] * world
    dist.all_gather_object(per_rank, mine)
    os.makedirs(args.out, exist_ok=True)
    save_file(local, os.path.join(args.out, f"rank{rank}.safetensors"))
    if rank == 0:
        parameters = {}
        for name, param in model.named_parameters():
            unit, index, fsdp_param = states[id(param)]
            d0 = param.shape[0]
            parameters[name] = {
                "unit": unit, "index_in_unit": index, "shape": list(param.shape), "d0": d0,
                "chunk_rows": math.ceil(d0 / world),
                "padded_local_shape": list(fsdp_param.padded_sharded_param_size),
                "ranks": [{"start": ranges[name][0], "end": ranges[name][1]} for ranges in per_rank]}
        with open(os.path.join(args.out, "layout.json"), "w") as file:
            json.dump({"world": world, "torch": torch.__version__, "parameters": parameters}, file, indent=1)
            file.write("\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
