"""The report the Python checks print: one OK / FAIL line per check (FAIL followed by up to 12 of its problems),
then a closing "N passed, N failed" line; shared by validate_trace.py, check_snapshot.py, check_memory_page.py and
test_summary.py."""

PROBLEMS_SHOWN = 12


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, title, problems):
        """A check passes when `problems` (a list of messages naming rank, line and values) is empty."""
        if problems:
            self.failed += 1
            print(f"FAIL {title}")
            for problem in problems[:PROBLEMS_SHOWN]:
                print(f"       {problem}")
            if len(problems) > PROBLEMS_SHOWN:
                print(f"       ... and {len(problems) - PROBLEMS_SHOWN} more")
        else:
            self.passed += 1
            print(f"OK   {title}")

    def skip(self, title, reason):
        print(f"SKIP {title} ({reason})")

    def finish(self, label=""):
        """Prints the closing line and returns the exit status: 1 when any check failed."""
        print(f"{label + ': ' if label else ''}{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0
