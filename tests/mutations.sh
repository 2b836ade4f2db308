#!/usr/bin/env bash
# Planted mutations: proof that `make check-05` (and the other checks named below) can fail. Each mutation is a bug
# FSDP code really gets wrong; it is applied to a scratch copy of the tree (never to this one), the copy is rebuilt,
# and its `make check-05` (or the target its entry names) must fail.
# Prints, per mutation, the checks that caught it, and ends with "N passed, N failed" (a mutation that check-05
# does not catch is a failure). About 3 minutes per mutation on 2 cores; not part of `make check`.
#
#   tests/mutations.sh              every mutation
#   tests/mutations.sh NAME...      some of them (names below)
#   tests/mutations.sh --applies    only whether each still applies to the code it targets (seconds; make check runs
#                                   it, so a mutation whose text the code no longer has is found at once)
set -u
cd "$(dirname "$0")/.."
root=$(pwd)
# The tree is copied from here: a copy of this script run from elsewhere (/tmp) would take / for the tree and copy the
# whole filesystem. Refuse anything that is not the repository.
if [ ! -f "$root/Makefile" ] || [ ! -f "$root/core/fsdp/fsdp.h" ]; then
  echo "tests/mutations.sh: $root is not the fsdplab repository; run the script in place (tests/mutations.sh)" >&2
  exit 2
fi

# name | file | python expression turning the file's text into the mutant's (must change it) [| the make target that
# must catch it: check-05 when absent]
mutations=(
  "sum-for-mean|core/fsdp/fsdp.c|s.replace('flat_param_reduce_scatter_grad_start(fp, COMM_AVG, on)', "\
"'flat_param_reduce_scatter_grad_start(fp, COMM_SUM, on)')"
  # layers.1's reduce-scatter skipped: its shard keeps this rank's own chunk of the local gradient
  "skip-one-reduce-scatter|core/comm/comm.c|s.replace('    if (world == 1) { /* the sum of one rank; a mean "\
"divides by 1, which changes nothing */\n        memcpy(shard, full, chunk_bytes);', "\
"'    if (world == 1 ? 1 : c->unit != NULL "\
"&& strcmp(c->unit, \"layers.1\") == 0) {\n        memcpy(shard, full + (size_t)rank * chunk_bytes, chunk_bytes);')"
  "wrong-shard-offset|core/comm/comm.c|s.replace('full + (size_t)((rank - step - 2 + 2 * world) % world) * chunk', "\
"'full + (size_t)((rank - step - 1 + 2 * world) % world) * chunk')"
  "padding-rounds-down|core/fsdp/flat_param.c|s.replace('return (numel + world - 1) / world * world;', "\
"'return numel / world * world;')"
  "post-forward-keeps-layer-0|core/fsdp/fsdp.c|s.replace('int free_unsharded = unit != 0 &&', "\
"'int free_unsharded = unit > 1 &&')"
  # the backward's attention probabilities not made again: it reads whatever its workspace held (another layer's)
  "attention-probs-not-recomputed|core/models/qwen2.c|s.replace('        d->attention_probs(d, probs, scratch, a->q, "\
"a->k, B, T, H, KVH, D);\n', '')"
  # the same in bfloat16 (MP=bf16): lab 07's bfloat16 runs read another layer's probabilities
  "attention-probs-bf16-not-recomputed|core/models/qwen2.c|s.replace('        d->attention_probs_bf16(d, probs, "\
"scratch, a->q, a->k, B, T, H, KVH, D);\n', '')|check-07"
  # gradient accumulation without its 1/ACC: every ACC=2 gradient doubled (caught against ACC=1 with one micro-batch)
  "acc-missing-scale|core/fsdp/fsdp.c|s.replace('1.0f / (float)runtime->options.accumulation_steps;', '1.0f;')"
  # HYBRID_SHARD (lab 08)
  "hybrid-skips-replicate-all-reduce|core/fsdp/flat_param.c|s.replace('if (status == 0 && fp->replicate_group != "\
"NULL)\n        status = comm_all_reduce', 'if (0)\n        status = comm_all_reduce')|check-08"
  "hybrid-replicate-sum-for-mean|core/fsdp/flat_param.c|s.replace('fp->sharded_numel,"\
"\n                                             reduce,', 'fp->sharded_numel,"\
"\n                                             COMM_SUM,')|check-08"
  "hybrid-shards-over-world|core/fsdp/flat_param.c|s.replace('world = (size_t)fp->shard_group->size;', "\
"'world = (size_t)ctx->world_size;')|check-08"
  "hybrid-chunk-of-world-rank|core/fsdp/flat_param.c|s.replace('rank % fp->shard_group->size : rank', "\
"'rank : rank')|check-08"
  "hybrid-clip-norm-over-world|core/fsdp/optim.c|s.replace('unit_count > 0 ? units[0].shard_group : NULL', "\
"'NULL')|check-08"
  "hybrid-memory-model-world-ring|core/models/memory_model.c|s.replace('shard_group ? shard_group->size : "\
"world_size', 'shard_group ? world_size : world_size')|check-08"
  # mixed precision (lab 07): the bfloat16 all-reduce's mean, HYBRID_SHARD's replicate all-reduce in bfloat16, one
  # of the per-op roundings of bfloat16 compute (caught by tests/check_torch_bf16.py: needs torch, else skipped)
  "mp-all-reduce-sum-for-mean|core/comm/comm.c|s.replace('ring_add(c, received, buffer + add_first, add_length, "\
"last ? c->factor : 1.0f);', 'ring_add(c, received, buffer + add_first, add_length, last ? 1.0f : 1.0f);')|check-07"
  "mp-hybrid-skips-replicate-all-reduce|core/fsdp/flat_param.c|s.replace('if (status == 0 && fp->replicate_group != "\
"NULL)\n            status = comm_all_reduce_typed', 'if (0)\n            status = comm_all_reduce_typed')|check-07"
  "mp-rope-skips-a-rounding|core/base/kernel_math.h|s.replace('return km_bf16_round(km_bf16_round(a * "\
"km_bf16_round(cos_value)) + km_bf16_round(b * km_bf16_round(sin_value)));', 'return km_bf16_round(a * "\
"km_bf16_round(cos_value) + km_bf16_round(b * km_bf16_round(sin_value)));')|check-07"
  "hybrid-flows-across-groups|trace/chrome.c|s.replace('return a->seq == b->seq && a->group == b->group && "\
"a->group_ranks == b->group_ranks;', 'return a->seq == b->seq;')|check-08"
  # FSDP2's per-parameter rows (lab 10): c rounded down (ceil(d0/W) taken as floor: the last rows nobody's, shards
  # shifted), the copy-out reading the gathered buffer as if it were the parameters back to back (the rank-major padded
  # layout skipped), the memory model forgetting the all-gather buffer beside the parameters, a save that gathers
  "fsdp2-rows-per-rank-rounded-down|core/fsdp/flat_param.c|s.replace('info->shard_rows = (rows + world - 1) / "\
"world;', 'info->shard_rows = rows / world;')|check-10"
  "fsdp2-copy-out-skips-padding|core/device/device_cpu.c|s.replace('char *piece = (char *)rank_major + ((size_t)r * "\
"sharded_numel + p->shard_offset) * element;', 'char *piece = (char *)rank_major + (to_full ? p->offset + begin : "\
"(size_t)r * sharded_numel + p->shard_offset) * element;')|check-10"
  # reshard_after_forward=N (RESHARD_AFTER_FORWARD): backward's all-gather of the post-forward shards run on the world
  # instead of the group of N (each rank sends the first W-th of its slice), the post-forward slice taken at member
  # s's world rank instead of s W/N (rows of the wrong ranks), the memory model without the post-forward shards
  "fsdp2-post-forward-gather-on-world|core/fsdp/flat_param.c|s.replace('group = fp->post_forward_group;', "\
"'group = NULL;')|check-10"
  "fsdp2-post-forward-wrong-slice|core/fsdp/flat_param.c|s.replace('int first_rank = fp->post_forward_group->rank "\
"* ranks;', 'int first_rank = fp->post_forward_group->rank;')|check-10"
  "fsdp2-memory-model-without-post-forward-shards|core/models/memory_model.c|s.replace('return walk_gathered(w, "\
"unit) / (count)w->options->reshard_after_forward;', 'return 0 * walk_gathered(w, unit);')|check-10"
  "fsdp2-memory-model-without-all-gather-output|core/models/memory_model.c|s.replace('return w->p * "\
"w->units[unit].padded_unsharded_numel;', 'return 0 * w->units[unit].padded_unsharded_numel;')|check-10"
  # FSDP2's all_gather_state and explicit prefetch lists: the forward copy-out freeing its all-gather output at once
  # (not kept until the next unit's copy-out, as torch does on its all-gather stream), the memory model believing it
  # freed at once, each unit's forward list one unit short (FORWARD_PREFETCH_MODULES=N prefetching N - 1)
  "fsdp2-copy-out-frees-at-once|core/fsdp/fsdp.c|s.replace('unit_param(runtime, unit)->keep_all_gather_output = "\
"forward;', 'unit_param(runtime, unit)->keep_all_gather_output = 0;')|check-10"
  "fsdp2-memory-model-frees-at-copy-out|core/models/memory_model.c|s.replace('if (!keep) w->live -= "\
"walk_gathered(w, unit);', 'if (keep >= 0) w->live -= walk_gathered(w, unit);')|check-10"
  "fsdp2-forward-prefetch-list-one-short|core/fsdp/fsdp.c|s.replace('t < units && count < forward && count < MOST;', "\
"'t < units && count + 1 < forward && count < MOST;')|check-10"
  # FSDP2 with MixedPrecisionPolicy: the copy-in copying the float32 rows' bytes into the bfloat16 all-gather buffer
  # instead of casting them (the gathered parameters are halves of float32 words)
  "fsdp2-bf16-gather-copies-uncast-rows|core/fsdp/flat_param.c|s.replace('ctx->device.convert(&ctx->device, slice, "\
"type, rows, DTYPE_FLOAT32, fp->sharded_numel);', 'ctx->device.copy(&ctx->device, slice, rows, fp->sharded_numel "\
"* element, DEVICE_D2D);')|check-10"
  # MixedPrecisionPolicy.output_dtype=bfloat16 parsed but never applied: torch's roundings of the layers' outputs,
  # the logits and their gradients missing (check_output_dtype.sh: no closer to torch than without it)
  "fsdp2-output-dtype-ignored|core/models/qwen2.c|s.replace('return model->unit_count > 0 && "\
"model->units[0].mixed_precision.output_dtype == DTYPE_BFLOAT16 &&', 'return 0 * model->unit_count > 0 && "\
"model->units[0].mixed_precision.output_dtype == DTYPE_BFLOAT16 &&')|check-train"
  "fsdp2-save-issues-a-collective|core/io/dcp.c|s.replace('    uint64_t info[3] = {0, 0, 0}; /* wrote, bytes, "\
"checksum */', '    uint64_t info[3] = {0, 0, 0}; /* wrote, bytes, checksum */\n"\
"    comm_barrier(ctx, \"dcp\");')|check-10"
  # The CUDA backend, run on the CUDA emulator by the unit suite (tests/cuda_emulator), and the math it shares
  "cuda-causal-mask-off-by-one|core/cuda/kernels.cu|s.replace('row[j] = j <= last ? row[j] * inverse : 0.0f;', "\
"'row[j] = j < last ? row[j] * inverse : 0.0f;')|check-unit"
  "cuda-dlogit-keeps-target|core/cuda/kernels.cu|s.replace('if (j == target) d -= inverse_count;', '')|check-unit"
  "lerp-from-the-wrong-end|core/base/kernel_math.h|s.replace('fmaf(weight, end - start, start)', "\
"'fmaf(weight, start - end, start)')|check-unit"
  # The loss slots (gpu_layers' check_loss_slots): a micro-batch's loss overwriting its slot instead of adding into
  # it, the slots not zeroed after their read (the next step would add onto this one's), the accumulation scale
  # dropped from the loss's kernel, and the scale back in a kernel of its own (one launch more per chunk)
  "cuda-loss-slot-assigned|core/cuda/kernels.cu|s.replace('slot[0] += (double)result->mean_loss', "\
"'slot[0] = (double)result->mean_loss')|check-unit"
  "cuda-loss-slots-not-zeroed|core/cuda/cuda_ops.cu|s.replace('CUDA_CHECK(s->rank, cudaMemsetAsync(s->loss_slots "\
"+ 2 * (size_t)first, 0, bytes, s->compute))', '(void)0')|check-unit"
  "cuda-loss-scale-dropped|core/cuda/kernels.cu|s.replace('float scaled = d * dlogits_scale;', "\
"'float scaled = d;')|check-unit"
  "cuda-loss-scale-own-kernel|core/cuda/cuda_ops.cu|s.replace('                                   dlogits_scale, "\
"dlogits_dtype == DTYPE_BFLOAT16', '                                   1.0f, dlogits_dtype == DTYPE_BFLOAT16')"\
".replace('s->compute));\n}\n\n/* The slots to the host', 's->compute));\n    if (dlogits != "\
"NULL) LAUNCH(s, scale_launch(dlogits, dlogits_scale, (size_t)N * V, s->compute));\n}\n\n/* The slots to the host')"\
"|check-unit"
  # The residual add and the norm (residual_rmsnorm_forward, rmsnorm_backward's dresidual): the CUDA device's fused
  # forward back as two kernels (the same values, one launch more: gpu_layers' launch count), the residual's gradient
  # dropped from the norm's backward on the GPU, and on the CPU
  "cuda-residual-norm-two-kernels|core/cuda/cuda_ops.cu|s.replace('LAUNCH(s, residual_rmsnorm_forward_launch("\
"residual, out, rstd, inp, weight, N, C, eps, 0, s->compute));', 'LAUNCH(s, add_inplace_launch(residual, inp, "\
"(size_t)N * C, s->compute));\n    LAUNCH(s, rmsnorm_forward_launch(out, rstd, residual, weight, N, C, eps, "\
"s->compute));')|check-unit"
  "cuda-norm-backward-drops-residual|core/cuda/kernels.cu|s.replace('dx[c] = (floatX)((dres != NULL ? (float)dres[c] "\
": 0.0f) +', 'dx[c] = (floatX)((dres != NULL ? 0.0f : 0.0f) +')|check-unit"
  "norm-backward-drops-residual|core/kernels/layers.c|s.replace('dx[c] = (dres != NULL ? dres[c] : 0.0f) + "\
"km_rmsnorm_dinp', 'dx[c] = (dres != NULL ? 0.0f : 0.0f) + km_rmsnorm_dinp')|check-unit"
  # BACKEND=nccl on the emulator's NCCL: a mean reduction queued as ncclSum (every rank's gradient W times too large)
  "nccl-sum-for-avg|core/cuda/nccl_comm.c|s.replace('c->detail == 1 + COMM_AVG ? ncclAvg : ncclSum', "\
"'c->detail == 1 + COMM_AVG ? ncclSum : ncclSum')|check-cuda-emulated"
  # BACKEND=nccl's comm_wait waiting on the host for each collective again (the GPU's queue emptied before each)
  "nccl-host-waits-each|core/comm/comm.c|s.replace('        return defer(ctx, c);', "\
"'        return defer(ctx, c) != 0 ? -1 : comm_finish_pending(ctx);')|check-cuda-emulated"
  # the host's waits for a queue (cuda_queue_wait) as cudaStreamSynchronize again (no end when a collective never ends)
  "host-wait-stream-sync|core/cuda/cuda_device.c|s.replace('    cuda_event_wait(device, cuda_event_pool_record(pool, \
stream), what, stream_name);', '    (void)pool, (void)what, (void)stream_name; \
CUDA_CHECK(device->rank, cudaStreamSynchronize(stream));')|check-cuda-emulated"
  # PROFILE_KERNELS: the zero fills of mem_alloc's zeroed blocks queued outside CUDA_TIMED (its table misses them)
  "profile-untimed-fill|core/cuda/cuda_device.c|s.replace('    cuda_device_state *device = state;\n    CUDA_TIMED(\
device, \"cudaMemsetAsync\", 0, 0, 0,\n               CUDA_CHECK(', '    cuda_device_state *device = state;\n    \
((void)0, CUDA_CHECK(')|check-cuda-emulated"
  # the loss kernel reading the head's float32 sums as they are, not as their bfloat16 rounding (LOSS_CHUNK, bf16)
  "cuda-loss-logits-unrounded|core/cuda/kernels.cu|s.replace('return bf16 ? km_bf16_round((float)row[j]) : "\
"(float)row[j];', 'return (float)row[j];')|check-unit"
  # the memory check on a GPU against the host's MemAvailable again (a run too big for the GPU started, then failed)
  "memory-check-host-for-gpu|core/models/memory_model.c|s.replace('d->memory_info(d, &free_bytes, &total_bytes);', "\
"'(void)mem_host_info(&free_bytes, &total_bytes);')|check-cuda-emulated"
  # the GPU's free memory split among every rank of the machine, not those on the GPU (one GPU a rank refused)
  "memory-check-gpu-shared-by-node|core/models/memory_model.c|s.replace('ranks_sharing(ctx, d->ordinal)', "\
"'ranks_sharing(ctx, 0)')|check-cuda-emulated"
  # the emulator's shuffles in one set of words (one barrier a shuffle: a lane's next write lands before others read)
  "emulator-shuffle-one-set|tests/cuda_emulator/emulator.cpp|s.replace('lanes[warp_barriers[warp].generation & 1]"\
"[warp]', 'lanes[0][warp]')|check-unit"
  # clip_grad_norm_'s all-reduce on the host's float again: NCCL and MPI's staging read it as GPU memory
  "clip-norm-reduced-on-host|core/fsdp/optim.c|s.replace('comm_all_reduce(ctx, on_device, 1, COMM_SUM, "\
"\"clip_grad_norm\")', 'comm_all_reduce(ctx, &sum_of_squares, 1, COMM_SUM, \"clip_grad_norm\")')|check-cuda-emulated"
  # FSDP2's copy-in on the GPU leaves padding rows as they were (the emulator's fresh memory is NaN): the 3-rank runs
  "cuda-rows-padding-not-zeroed|core/cuda/kernels.cu|s.replace('else if (!to_full) rows_store(&piece[j], j < held ? "\
"full[p.offset + begin + j] : 0.0f);', 'else if (!to_full && j < held) rows_store(&piece[j], "\
"full[p.offset + begin + j]);')|check-cuda-emulated"
)

# A mutation's expression applied to its file (python3 -c "$mutate" FILE EXPRESSION check|write): every .replace in
# it must find its text (the text is a str whose replace refuses a missing one: a chain whose later part no longer
# matches would otherwise still change the file, and pass for applied), and the result must differ. On failure it
# exits naming what is missing; `write` writes the mutant over FILE.
mutate='
import sys
class Text(str):
    def replace(self, old, new, *count):
        if old not in self:
            sys.exit("no longer has the text " + repr(old[:70]))
        return Text(str.replace(self, old, new, *count))
path, expression, mode = sys.argv[1:4]
s = open(path).read()
mutant = str(eval(expression, {"s": Text(s)}))
if mutant == s:
    sys.exit("is unchanged by it")
if mode == "write":
    open(path, "w").write(mutant)
'

if [ "${1:-}" = --applies ]; then
  stale=0
  for entry in "${mutations[@]}"; do
    IFS='|' read -r name file expression target <<<"$entry"
    if why=$(python3 -c "$mutate" "$root/$file" "$expression" check 2>&1); then
      echo "applies  $name ($file)"
    else
      echo "STALE    $name: $file $why; update tests/mutations.sh"
      stale=$((stale + 1))
    fi
  done
  echo "${#mutations[@]} mutations, $stale stale"
  exit $((stale > 0))
fi

wanted=("$@")
passed=0
failed=0
scratch=$(mktemp -d /tmp/fsdplab-mutants.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
for entry in "${mutations[@]}"; do
  IFS='|' read -r name file expression target <<<"$entry"
  target=${target:-check-05}
  if [ ${#wanted[@]} -gt 0 ] && ! printf '%s\n' "${wanted[@]}" | grep -qx "$name"; then continue; fi
  copy="$scratch/$name"
  started=$(date +%s)
  # The tree as it is here (built objects included, so only the mutated file recompiles), minus old runs.
  mkdir -p "$copy" && tar -C "$root" --exclude=./runs --exclude=./.git -cf - . | tar -C "$copy" -xf -
  if ! why=$(python3 -c "$mutate" "$copy/$file" "$expression" write 2>&1); then
    echo "FAIL  $name: not applied: $file $why; update tests/mutations.sh"
    failed=$((failed + 1))
    continue
  fi
  if ! make -C "$copy" -s all >"$copy/build.log" 2>&1; then
    echo "FAIL  $name: the mutant does not build (see $copy/build.log)"; tail -5 "$copy/build.log"
    failed=$((failed + 1))
    continue
  fi
  make -C "$copy" -s "$target" >"$copy/check.log" 2>&1
  status=$?
  caught=$(grep -c '^FAIL ' "$copy/check.log")
  seconds=$(( $(date +%s) - started ))
  if [ $status -ne 0 ] && [ "$caught" -gt 0 ]; then
    passed=$((passed + 1))
    echo "PASS  $name: $target fails ($caught checks, ${seconds}s), e.g."
    grep '^FAIL ' "$copy/check.log" | sed 's/   (log:.*//' | head -4 | sed 's/^FAIL /        /'
  else
    failed=$((failed + 1))
    echo "FAIL  $name: $target still passes (${seconds}s): the checks are blind to this bug"
  fi
done
echo
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
