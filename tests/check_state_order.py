"""Checks that one micro-batch of lab 05 (FULL_SHARD, units: root + one per decoder layer) makes exactly PyTorch
FSDP1's sequence of state transitions, read from rank 0's events.

PyTorch's order (torch/distributed/fsdp/_runtime_utils.py), for the root wrapping embed_tokens and norm and one unit
per layer: the root's _pre_forward (TrainingState, HandleTrainingState, unshard); each layer's _pre_forward and
_post_forward (reshard); the root's _post_forward keeps its parameters; backward starts at the root
(_pre_backward_hook: already unsharded), then each layer from the last: _pre_backward_hook (unshard),
_post_backward_hook (BACKWARD_POST, then _post_backward_reshard); the root's _post_backward_hook after the embedding's
gradient; then _post_backward_final_callback sets every unit's TrainingState and then its handle back to IDLE.

With BACKWARD_PRE (third argument), torch's _pre_backward_hook also prefetches the unit backward meets next: the
root's prefetches the last layer, each layer's the one before it (layer 0's none), each a ShardState change by
_prefetch_handle right after the hook's HandleTrainingState change; a prefetched unit's own hook then unshards
nothing.

usage: python3 tests/check_state_order.py RUNDIR LAYERS [NONE|BACKWARD_PRE]
"""
import json
import sys


def expected(layers, backward_prefetch="NONE"):
    units = ["root"] + [f"layers.{l}" for l in range(layers)]
    prefetching = backward_prefetch == "BACKWARD_PRE"
    seq = []

    def pre_forward(unit):
        seq.append((unit, "TrainingState", "IDLE", "FORWARD_BACKWARD", "_pre_forward"))
        seq.append((unit, "HandleTrainingState", "IDLE", "FORWARD", "_pre_forward"))
        seq.append((unit, "ShardState", "SHARDED", "UNSHARDED", "_pre_forward"))

    pre_forward("root")
    for unit in units[1:]:
        pre_forward(unit)
        seq.append((unit, "ShardState", "UNSHARDED", "SHARDED", "_post_forward"))
        seq.append((unit, "HandleTrainingState", "FORWARD", "IDLE", "_post_forward"))
    seq.append(("root", "HandleTrainingState", "FORWARD", "IDLE", "_post_forward"))
    seq.append(("root", "HandleTrainingState", "IDLE", "BACKWARD_PRE", "_pre_backward_hook"))
    if prefetching:
        seq.append((units[-1], "ShardState", "SHARDED", "UNSHARDED", "_prefetch_handle"))
    for index in range(layers, 0, -1):
        unit = units[index]
        seq.append((unit, "HandleTrainingState", "IDLE", "BACKWARD_PRE", "_pre_backward_hook"))
        if not prefetching:
            seq.append((unit, "ShardState", "SHARDED", "UNSHARDED", "_pre_backward_hook"))
        elif index > 1:
            seq.append((units[index - 1], "ShardState", "SHARDED", "UNSHARDED", "_prefetch_handle"))
        seq.append((unit, "HandleTrainingState", "BACKWARD_PRE", "BACKWARD_POST", "_post_backward_hook"))
        seq.append((unit, "ShardState", "UNSHARDED", "SHARDED", "_post_backward_hook"))
    seq.append(("root", "HandleTrainingState", "BACKWARD_PRE", "BACKWARD_POST", "_post_backward_hook"))
    seq.append(("root", "ShardState", "UNSHARDED", "SHARDED", "_post_backward_hook"))
    for unit in units:
        seq.append((unit, "TrainingState", "FORWARD_BACKWARD", "IDLE", "_post_backward_final_callback"))
        seq.append((unit, "HandleTrainingState", "BACKWARD_POST", "IDLE", "_post_backward_final_callback"))
    return seq


def main(rundir, layers, backward_prefetch="NONE"):
    with open(f"{rundir}/rank0.jsonl") as events:
        states = [e for e in map(json.loads, events) if e["kind"] == "state"]
    want = expected(layers, backward_prefetch)
    got = [(e["unit"], e["machine"], e["from"], e["to"], e["hook"]) for e in states[:len(want)]]
    for index, (a, b) in enumerate(zip(got, want)):
        if a != b:
            print(f"FAIL: transition {index}: got {a}, PyTorch's order has {b}")
            return 1
    if len(got) < len(want):
        print(f"FAIL: only {len(got)} transitions, expected {len(want)}")
        return 1
    print(f"OK: the first micro-batch's {len(want)} transitions are PyTorch FSDP1's order (backward_prefetch "
          f"{backward_prefetch})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:4]))
