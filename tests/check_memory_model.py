"""Reads lab 05's printed memory table (analytic model vs measured peak, per category) and checks that every
category's measured peak equals the model's to the byte. Nothing here is rounded: allocations are whole bytes,
the same on every CPU, and core/models/memory_model.c counts the very buffers the code allocates, so a difference of one
byte is a bug in the runtime (a buffer kept too long, one too many in flight) or in the model.

Reserved bytes (the caching allocator's segments) are bounded, not predicted: allocated peak <= reserved peak <=
the model's bound (core/models/memory_model.c says what the bound assumes). ALLOC=malloc runs have reserved == the
rounded allocations, so the same check holds.

usage: python3 tests/check_memory_model.py LAB05_OUTPUT_LOG
"""
import re
import sys


def main(log):
    rows = re.findall(r"^  (\w+)\s+[\d.]+ [KMG]?B\s+[\d.]+ [KMG]?B\s+[\d.]+\s+([+-]\d+) B$", open(log).read(), re.M)
    if not rows:
        print(f"FAIL: no memory table in {log}")
        return 1
    bad = [name for name, difference in rows if int(difference) != 0]
    for name, difference in rows:
        print(f"{name:17s} measured - predicted = {int(difference):+d} bytes")
    print(f"{'FAIL' if bad else 'OK'}: {len(rows)} categories, {len(bad)} differ from the model: {bad or 'none'}")
    reserved = re.search(r"^  reserved bytes: measured (\d+), allocated peak (\d+), bound (\d+)$", open(log).read(),
                         re.M)
    if not reserved:
        print(f"FAIL: no reserved bytes line in {log}")
        return 1
    measured, allocated, bound = map(int, reserved.groups())
    reserved_ok = allocated <= measured <= bound
    print(f"{'OK' if reserved_ok else 'FAIL'}: reserved peak {measured} B: allocated peak {allocated} <= reserved <= "
          f"bound {bound} ({measured / bound:.3f} of the bound)")
    return 1 if bad or not reserved_ok else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
