"""Reads lab 05's printed memory table (analytic model vs measured peak, per category) and checks every category
is within 10% of the model.

usage: python3 tests/check_memory_model.py LAB05_OUTPUT_LOG [TOLERANCE]
"""
import re
import sys


def main(log, tolerance=0.10):
    rows = re.findall(r"^  (\w+)\s+[\d.]+ [KMG]?B\s+[\d.]+ [KMG]?B\s+([\d.]+)$", open(log).read(), re.M)
    if not rows:
        print(f"FAIL: no memory table in {log}")
        return 1
    bad = [(name, float(ratio)) for name, ratio in rows if abs(float(ratio) - 1.0) > tolerance]
    for name, ratio in rows:
        print(f"{name:17s} measured / predicted = {float(ratio):.3f}")
    print(f"{'FAIL' if bad else 'OK'}: {len(rows)} categories, {len(bad)} outside ±{tolerance:.0%}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *(float(x) for x in sys.argv[2:])))
