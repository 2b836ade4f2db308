"""The PyTorch side of scripts/train.sh: the same training as lab/05_full_step, with torch's own FSDP.

HF transformers' Qwen2ForCausalLM (eager attention, float32) wrapped by torch.distributed.fsdp's
FullyShardedDataParallel (FSDP1; FULL_SHARD, transformer_auto_wrap_policy({Qwen2DecoderLayer}): one unit per decoder
layer, as fsdplab), on CPU with the gloo backend; AdamW with torch's defaults and the same lr; the same gradient
accumulation ((loss / ACC).backward() per micro-batch, a reduce-scatter each time). It starts from the bytes fsdplab
initialises (a checkpoint written by `qwen2_tool init`) and reads the very token windows lab 05 trains on (written
by `qwen2_tool batches`), so the two runs differ only in who implements FSDP. With --fsdp-version 2, FSDP2 instead:
torch.distributed.fsdp.fully_shard on each decoder layer, then on the root (each parameter sharded on dim 0, Shard(0),
as DTensors), reshard_after_forward True for FULL_SHARD and False for SHARD_GRAD_OP (the other strategies are FSDP1's
and refused), --mp as MixedPrecisionPolicy, the same optimizer, accumulation, batches and lines. Prints lab 05's line
format:

    1/3: Loss = 5.551234, Peak = 12.3 MB, Time = 0.0123s

where Loss is the mean over micro-batches and ranks and Peak the largest process max-RSS over ranks (with
--backend nccl: on the GPU, rank r on cuda:LOCAL_RANK, Peak the largest torch.cuda.max_memory_allocated() of the
step over ranks, the GPU memory fsdplab's tracked peak measures, and Time after torch.cuda.synchronize()).

    torchrun --nproc_per_node 2 scripts/torch_fsdp_train.py --model-dir D --batches B.bin --mbs 4 --acc 2 --steps 3
"""
import argparse
import functools
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers import Qwen2ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

STRATEGIES = {"FULL_SHARD": ShardingStrategy.FULL_SHARD, "SHARD_GRAD_OP": ShardingStrategy.SHARD_GRAD_OP,
              "NO_SHARD": ShardingStrategy.NO_SHARD, "HYBRID_SHARD": ShardingStrategy.HYBRID_SHARD,
              "_HYBRID_SHARD_ZERO2": ShardingStrategy._HYBRID_SHARD_ZERO2}
# --fsdp-version 2: fully_shard's reshard_after_forward for the strategies it has (FULL_SHARD reshards after forward and
# all-gathers again in backward; SHARD_GRAD_OP keeps the unsharded parameters from forward to backward)
RESHARD_AFTER_FORWARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}
BACKWARD_PREFETCH = {"NONE": None, "None": None, "BACKWARD_PRE": BackwardPrefetch.BACKWARD_PRE,
                     "BACKWARD_POST": BackwardPrefetch.BACKWARD_POST}


def arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True, help="config.json + model.safetensors (fsdplab's init)")
    parser.add_argument("--batches", required=True, help="int32 global micro-batches from `qwen2_tool batches`")
    parser.add_argument("--mbs", type=int, required=True, help="sequences per rank per micro-batch")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--acc", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--clip", type=float, default=0.0)
    parser.add_argument("--strategy", default="FULL_SHARD", choices=sorted(STRATEGIES))
    parser.add_argument("--shard-group", type=int, default=0,
                        help="HYBRID_SHARD: ranks per shard group (0: the ranks per node, LOCAL_WORLD_SIZE)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"),
                        help="gloo: CPU; nccl: each rank on GPU LOCAL_RANK (train.sh BACKEND=nccl)")
    parser.add_argument("--backward-prefetch", default="BACKWARD_PRE", choices=sorted(BACKWARD_PREFETCH))
    parser.add_argument("--forward-prefetch", type=int, default=0, choices=(0, 1))
    parser.add_argument("--limit-all-gathers", type=int, default=1, choices=(0, 1))
    parser.add_argument("--grads", default="",
                        help="write step 1's gradients (after the reduce, all micro-batches) there as "
                        "model.safetensors with HF's names, as lab 05's GRADS (FULL_SHARD and SHARD_GRAD_OP)")
    parser.add_argument("--mp", default="fp32", help="lab 05's MP: fp32 (off), bf16, bf16,reduce=fp32, "
                        "bf16,keep_low_precision_grads=1")
    parser.add_argument("--params", default="",
                        help="write the parameters after the last step there as model.safetensors with HF's names")
    parser.add_argument("--fsdp-version", type=int, default=1, choices=(1, 2),
                        help="1: FullyShardedDataParallel (flat parameters); 2: fully_shard (each parameter Shard(0))")
    parser.add_argument("--forward-prefetch-modules", type=int, default=0,
                        help="--fsdp-version 2: each decoder layer's set_modules_to_forward_prefetch gets the N layers "
                             "after it (lab 05's FORWARD_PREFETCH_MODULES)")
    parser.add_argument("--backward-prefetch-modules", type=int, default=0,
                        help="--fsdp-version 2: each decoder layer's set_modules_to_backward_prefetch gets the N "
                             "layers before it (BACKWARD_PREFETCH_MODULES)")
    args = parser.parse_args()
    lists = (args.forward_prefetch_modules, args.backward_prefetch_modules)
    if min(lists) < 0 or (max(lists) > 0 and args.fsdp_version != 2):
        parser.error(f"--forward-prefetch-modules {lists[0]} --backward-prefetch-modules {lists[1]}: counts >= 0, "
                     "and fully_shard's (--fsdp-version 2) only")
    return args


DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def mixed_precision_fields(text):
    """lab 05's MP setting as a dict of torch's field names (None when off); the same grammar as
    fsdp_mixed_precision_parse: <param_dtype>[,reduce=<dtype>][,buffer=fp32][,keep_low_precision_grads=0|1]
    [,output=<dtype>], reduce_dtype following param_dtype when not given (torch's None does the same)."""
    if text in ("", "none", "fp32", "float32"):
        return None
    first, *settings = text.split(",")
    fields = {"param_dtype": DTYPES[first]}
    names = {"reduce": "reduce_dtype", "buffer": "buffer_dtype", "output": "output_dtype"}
    for setting in settings:
        name, value = setting.split("=")
        if name in names:
            fields[names[name]] = DTYPES[value]
        elif name == "keep_low_precision_grads":
            fields["keep_low_precision_grads"] = value == "1"
        else:
            raise SystemExit(f"--mp '{text}': '{name}' is not reduce, buffer, keep_low_precision_grads or output")
    fields.setdefault("reduce_dtype", fields["param_dtype"])
    return fields


def mixed_precision(text):
    """--mp for --fsdp-version 1: torch's MixedPrecision (None when off); output= is FSDP2's only."""
    fields = mixed_precision_fields(text)
    if fields is None:
        return None
    if "output_dtype" in fields:
        raise SystemExit(f"--mp '{text}': output= is fully_shard's MixedPrecisionPolicy.output_dtype "
                         "(--fsdp-version 2); FSDP1's MixedPrecision has none")
    return MixedPrecision(**fields)


def mixed_precision_policy(text):
    """--mp for --fsdp-version 2: fully_shard's MixedPrecisionPolicy (None when off), reduce_dtype following
    param_dtype when not given, as FSDP1 does (torch 2.15's MixedPrecisionPolicy would reduce in the parameter's own
    dtype, float32, so it is always named). FSDP2 casts no buffers (buffer=fp32 is what it does anyway) and has no
    keep_low_precision_grads: =1 is refused. output= is its output_dtype (each fully_shard module's forward output cast
    to it)."""
    fields = mixed_precision_fields(text)
    if fields is None:
        return None
    if fields.get("keep_low_precision_grads"):
        raise SystemExit(f"--mp '{text}': keep_low_precision_grads=1 has no counterpart in fully_shard "
                         "(--fsdp-version 2); use it with --fsdp-version 1")
    return MixedPrecisionPolicy(param_dtype=fields["param_dtype"], reduce_dtype=fields["reduce_dtype"],
                                output_dtype=fields.get("output_dtype"))


def apply_fully_shard(model, strategy, mp, device, world):
    """FSDP2: fully_shard on each Qwen2DecoderLayer, then on the root (embed_tokens, the tied lm_head, the final norm),
    the same units as FSDP1's transformer_auto_wrap_policy; a 1-D mesh of all ranks on the device's type."""
    from torch.distributed.device_mesh import init_device_mesh
    if strategy not in RESHARD_AFTER_FORWARD:
        raise SystemExit(f"--strategy {strategy} with --fsdp-version 2: fully_shard has FULL_SHARD and SHARD_GRAD_OP "
                         f"(reshard_after_forward True or False); {strategy} is FSDP1's (--fsdp-version 1)")
    mesh = init_device_mesh(device.type, (world,))
    policy = mixed_precision_policy(mp) or MixedPrecisionPolicy()
    reshard = RESHARD_AFTER_FORWARD[strategy]
    for module in model.modules():
        if isinstance(module, Qwen2DecoderLayer):
            fully_shard(module, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    return model


def my_batches(path, rank, world, mbs, seq, count):
    """This rank's rows of each global micro-batch: tokens and targets, each (mbs, seq)."""
    global_batch = mbs * world
    data = np.fromfile(path, dtype="<i4")
    expected = count * 2 * global_batch * seq
    if data.size != expected:
        raise SystemExit(f"rank {rank}: {path} holds {data.size} int32, expected {expected} "
                         f"({count} micro-batches x 2 x {global_batch} x {seq})")
    data = data.reshape(count, 2, global_batch, seq)[:, :, rank * mbs:(rank + 1) * mbs]
    return [(torch.from_numpy(d[0].copy()).long(), torch.from_numpy(d[1].copy()).long()) for d in data]


def hybrid_mesh(args, world):
    """HYBRID_SHARD's 2-D mesh, (replicate, shard) = (world / S, S), as fsdplab's core/comm/group.h lays it out: shard
    groups of consecutive ranks. Without a mesh torch would split by CUDA devices per node, which CPU has none of.
    None for the other strategies."""
    if not args.strategy.lstrip("_").startswith("HYBRID_SHARD"):
        return None
    from torch.distributed.device_mesh import init_device_mesh
    shard = args.shard_group or int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if shard < 1 or world % shard != 0:
        raise SystemExit(f"--shard-group {shard} does not divide the world size {world}")
    device_type = "cuda" if args.backend == "nccl" else "cpu"
    return init_device_mesh(device_type, (world // shard, shard), mesh_dim_names=("replicate", "shard"))


def save_gradients(model, directory, rank, world, of_gradients=True):
    """Every FlatParameter's sharded gradient (float32: FSDP casts the reduced gradient back to the parameter's dtype
    unless keep_low_precision_grads) all-gathered, unpadded and cut into its parameters, named as HF names them (the
    tied lm_head.weight is embed_tokens.weight, once), written by rank 0 as lab 05's GRADS writes ours. With
    of_gradients=False the same of the parameters themselves (--params)."""
    from safetensors.torch import save_file
    from torch.distributed.fsdp._common_utils import clean_tensor_name
    gradients = {}
    for name, module in model.named_modules():
        if not isinstance(module, FullyShardedDataParallel) or module._handle is None:
            continue
        flat = module._handle.flat_param
        tensor = flat.grad if of_gradients else flat
        if tensor is None:
            continue
        shard = tensor.detach().float().contiguous()
        pieces = [torch.empty_like(shard) for _ in range(world)]
        dist.all_gather(pieces, shard)
        full = torch.cat(pieces)[:flat._unpadded_unsharded_size.numel()]
        prefix = clean_tensor_name(name)
        for fqn, piece, shape in zip(flat._fqns, full.split(list(flat._numels)), flat._shapes):
            gradients[f"{prefix}.{fqn}" if prefix else fqn] = piece.reshape(shape).clone()
    if rank == 0:
        os.makedirs(directory, exist_ok=True)
        save_file(gradients, os.path.join(directory, "model.safetensors"))


def fully_shard_prefetch(model, args, rank):
    """FSDP1's prefetch settings under fully_shard: FORWARD_PREFETCH=1 is set_modules_to_forward_prefetch (each
    decoder layer all-gathers the next one's parameters); backward prefetch is fully_shard's own, one unit ahead, as
    BACKWARD_PRE; limit_all_gathers has no counterpart (fully_shard bounds its all-gathers itself). None of them
    changes a number."""
    layers = [module for module in model.modules() if isinstance(module, Qwen2DecoderLayer)]
    if args.forward_prefetch and not args.forward_prefetch_modules:
        for layer, following in zip(layers, layers[1:]):
            layer.set_modules_to_forward_prefetch([following])
    # the explicit lists as torch's FSDP2 example sets them (num_to_forward_prefetch, num_to_backward_prefetch)
    forward, backward = args.forward_prefetch_modules, args.backward_prefetch_modules
    for i, layer in enumerate(layers):
        if forward and i + 1 < len(layers):
            layer.set_modules_to_forward_prefetch(layers[i + 1:i + 1 + forward])
        if backward and i > 0:
            layer.set_modules_to_backward_prefetch(layers[max(0, i - backward):i][::-1])
    if rank == 0 and (forward or backward):
        print(f"(fully_shard prefetch lists: each decoder layer set_modules_to_forward_prefetch the {forward} after "
              f"it, set_modules_to_backward_prefetch the {backward} before it)", file=sys.stderr, flush=True)
    if rank == 0 and args.backward_prefetch != "BACKWARD_PRE":
        print(f"(--backward-prefetch {args.backward_prefetch}: FSDP1's; fully_shard prefetches one unit ahead in "
              "backward, as BACKWARD_PRE)", file=sys.stderr, flush=True)
    if rank == 0 and not args.limit_all_gathers:
        print("(--limit-all-gathers 0: FSDP1's; fully_shard has no such setting)", file=sys.stderr, flush=True)


def save_gradients_fully_shard(model, directory, rank, of_gradients=True):
    """--fsdp-version 2's save_gradients: each parameter's gradient (or, of_gradients=False, the parameter) is a
    Shard(0) DTensor, gathered whole (full_tensor) and written by rank 0 under HF's name (the tied lm_head.weight is
    embed_tokens.weight, once)."""
    from safetensors.torch import save_file
    tensors = {}
    for name, param in model.named_parameters():
        tensor = param.grad if of_gradients else param
        if tensor is not None:
            tensors[name] = tensor.full_tensor().detach().float().contiguous()
    if rank == 0:
        os.makedirs(directory, exist_ok=True)
        save_file(tensors, os.path.join(directory, "model.safetensors"))


def main():
    args = arguments()
    torch.set_num_threads(args.threads)
    gpu = args.backend == "nccl"
    if gpu:
        if not torch.cuda.is_available():
            raise SystemExit("--backend nccl needs a CUDA GPU; torch sees none")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        # float32 GEMMs as fsdplab's default (TF32 off), so the two compute the same arithmetic
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        # bfloat16 GEMMs accumulate in float32 to the end, as fsdplab's (CUBLAS_COMPUTE_32F_FAST_16BF): torch's default
        # lets cuBLAS reduce split-K partial sums in bfloat16, a rounding the parity bound does not count
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = Qwen2ForCausalLM.from_pretrained(args.model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    if args.fsdp_version == 2:
        model = apply_fully_shard(model, args.strategy, args.mp, device, world)
        fully_shard_prefetch(model, args, rank)
        clip = functools.partial(torch.nn.utils.clip_grad_norm_, list(model.parameters()), args.clip)  # DTensor norms
        dump_gradients = functools.partial(save_gradients_fully_shard, model, args.grads, rank)
        dump_parameters = functools.partial(save_gradients_fully_shard, model, args.params, rank, of_gradients=False)
    else:
        model = FullyShardedDataParallel(
            model, sharding_strategy=STRATEGIES[args.strategy], device_id=device,  # CPU + gloo or GPU + nccl, named
            device_mesh=hybrid_mesh(args, world),
            auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                               transformer_layer_cls={Qwen2DecoderLayer}),
            backward_prefetch=BACKWARD_PREFETCH[args.backward_prefetch], forward_prefetch=bool(args.forward_prefetch),
            limit_all_gathers=bool(args.limit_all_gathers), mixed_precision=mixed_precision(args.mp))
        clip = functools.partial(model.clip_grad_norm_, args.clip)
        dump_gradients = functools.partial(save_gradients, model, args.grads, rank, world)
        dump_parameters = functools.partial(save_gradients, model, args.params, rank, world, of_gradients=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=False)
    batches = my_batches(args.batches, rank, world, args.mbs, args.seq, args.steps * args.acc)
    if rank == 0:
        print(f"Ranks = {world}, FSDP = torch, Acc = {args.acc}", flush=True)
        if args.fsdp_version == 2:
            print(f"(FSDP2: fully_shard on each decoder layer and the root, Shard(0) per parameter, "
                  f"reshard_after_forward={RESHARD_AFTER_FORWARD[args.strategy]})", flush=True)
        if args.mp not in ("", "none", "fp32", "float32"):
            policy = mixed_precision_policy(args.mp) if args.fsdp_version == 2 else mixed_precision(args.mp)
            print(f"(mixed precision: {policy})", flush=True)
    for step in range(1, args.steps + 1):
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start, loss_sum = time.perf_counter(), 0.0
        for micro in range(args.acc):
            tokens, targets = (t.to(device) for t in batches[(step - 1) * args.acc + micro])
            logits = model(input_ids=tokens).logits
            # mean cross-entropy over every position's given target, as fsdplab (HF's `labels=` would drop the last)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-100)
            (loss / args.acc).backward()
            loss_sum += loss.item()
        peak_before_dump = 0
        if step == 1 and args.grads:
            # a diagnostic outside FSDP (every gradient gathered at once): the step's GPU peak leaves it out, as lab
            # 05's GRADS does (the CPU's max RSS cannot)
            peak_before_dump = torch.cuda.max_memory_allocated() if gpu else 0
            dump_gradients()
            if gpu:
                torch.cuda.reset_peak_memory_stats()
        if args.clip > 0:
            clip()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if gpu:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        stats = torch.tensor([loss_sum / args.acc, 0.0, 0.0], dtype=torch.float64, device=device)
        dist.all_reduce(stats[:1])  # sum of the ranks' losses
        used = max(peak_before_dump, torch.cuda.max_memory_allocated()) if gpu else \
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
        peak = torch.tensor([float(used), elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"{step}/{args.steps}: Loss = {stats[0].item() / world:.6f}, Peak = {peak[0].item() / 1e6:.1f} MB, "
                  f"Time = {peak[1].item():.4f}s", flush=True)
    if args.params:
        dump_parameters()
    dist.barrier()
    dist.destroy_process_group()
    # About one run in ten, torch 2.15's gloo aborted at interpreter teardown after the last step ("terminate called
    # without an active exception", exit -6); everything is printed by then, so leave without the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
