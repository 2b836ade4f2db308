"""Checks of a resumed lab 05 run (RESUME) against the uninterrupted run of the same settings.

  python3 tests/check_resume.py exact REFERENCE_RUNDIR RESUMED_RUNDIR
      every `step` event (each micro-batch's loss and the step's mean, at full precision) the resumed run wrote
      equals the reference's for the same step and micro-batch, bit for bit, and there is at least one
  python3 tests/check_resume.py reshard REFERENCE_RUNDIR RESUMED_RUNDIR CONFIG TOKENS SEQ
      the same resume on another world size: the first resumed step starts from bit-identical parameters, so its loss
      differs only by the rounding of the sums (tests/tolerances.py loss_tolerance, relative); later steps are left
      to the parameter check (qwen2_tool compare with the AdamW bound)
"""
import json
import sys

import tolerances


def step_events(rundir):
    events = {}
    with open(f"{rundir}/rank0.jsonl") as lines:
        for event in map(json.loads, lines):
            if event["kind"] == "step":
                events[(event["step"], event["micro"])] = event["loss"]
    return events


def exact(reference_dir, resumed_dir):
    reference, resumed = step_events(reference_dir), step_events(resumed_dir)
    if not resumed:
        print(f"FAIL: no step events in {resumed_dir}/rank0.jsonl")
        return 1
    failed = 0
    for key in sorted(resumed):
        same = key in reference and reference[key] == resumed[key]  # == on floats: bit for bit (NaN fails)
        failed += not same
        print(f"step {key[0]} micro {key[1]:2d}: {resumed[key]!r} vs {reference.get(key)!r} {'' if same else 'FAIL'}")
    print(f"{'FAIL' if failed else 'OK'}: {failed} of {len(resumed)} losses differ")
    return 1 if failed else 0


def reshard(reference_dir, resumed_dir, config_path, tokens, seq):
    reference, resumed = step_events(reference_dir), step_events(resumed_dir)
    steps = sorted(step for step, micro in resumed if micro == -1)
    if not steps or (steps[0], -1) not in reference:
        print(f"FAIL: no resumed step of {resumed_dir} in {reference_dir}")
        return 1
    first = steps[0]
    rounding = tolerances.loss_tolerance(tolerances.load_config(config_path), int(tokens), int(seq))
    a, b = resumed[(first, -1)], reference[(first, -1)]
    ok = abs(a - b) <= rounding * abs(b)
    print(f"step {first}: {a!r} vs {b!r}: |difference| {abs(a - b):.2e}, bound {rounding * abs(b):.2e} "
          f"{'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "exact":
        sys.exit(exact(*sys.argv[2:]))
    if len(sys.argv) == 7 and sys.argv[1] == "reshard":
        sys.exit(reshard(*sys.argv[2:]))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
