"""fsdplab_events — what the notebooks share: run a lab, load its JSONL events into pandas, parse lab 05's memory
table.

    import fsdplab_events as fe
    run = fe.run_lab("05_full_step", ranks=2, out=fe.run_dir("01_memory_timeline") / "run", STEPS=2, ACC=1)
    ev = fe.load_events(run.out)          # ev.alloc, ev.state, ev.collective, ev.compute, ev.step, ev.memory, ...
    table = fe.parse_memory_table(run.stdout)

The event schema is trace/EVENTS.md. Every frame keeps each event's `line` (its 0-based line number in rank<R>.jsonl):
lines of one rank are in the order things happened, while `ts` of a collective or compute span is its *start* (the
line is written when it ends), so replaying state (memory, shard states) goes by `line`, and drawing spans by `ts`.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: every figure is saved as a PNG, then shown from the file
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

MB = 1e6  # lab 05 and the trace tool print decimal units (1 MB = 10^6 bytes); so do the notebooks
MS = 1e3  # event times are microseconds

OP_COLORS = {"all_gather": "#3182bd", "reduce_scatter": "#e6550d", "all_reduce": "#756bb1", "broadcast": "#31a354",
             "barrier": "#969696"}
PHASE_COLORS = {"forward": "#74c476", "backward": "#fd8d3c", "recompute": "#9e9ac8", "optimizer": "#6baed6"}


def repo_root() -> Path:
    """The fsdplab checkout this module lives in (the folder holding Makefile, lab/ and core/)."""
    here = Path(__file__).resolve().parent
    for folder in (here, *here.parents):
        if (folder / "Makefile").is_file() and (folder / "lab").is_dir() and (folder / "core").is_dir():
            return folder
    raise RuntimeError(f"no fsdplab checkout (Makefile, lab/, core/) above {here}")


REPO = repo_root()


def palette_tables(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """trace/palette.h's two tables, the one definition of the views' colours (memory.html and player.html read the
    same): ({category: "#rrggbb"} in trace/EVENTS.md's order, {state: "#rrggbb"})."""
    text = path.read_text(encoding="utf-8")
    states_at = text.index("palette_states[")
    row = re.compile(r'\{"(\w+)", "(#[0-9a-fA-F]{6})"\}')
    return dict(row.findall(text[:states_at])), dict(row.findall(text[states_at:]))


# Memory categories in trace/EVENTS.md's order, each with one colour in every notebook and view: trace/palette.h's.
CATEGORY_COLORS, STATE_COLORS = palette_tables(REPO / "trace" / "palette.h")
CATEGORIES = list(CATEGORY_COLORS)


def run_dir(notebook: str) -> Path:
    """runs/notebooks/<notebook>/ in the repository: where a notebook's lab runs and figures go."""
    path = REPO / "runs" / "notebooks" / notebook
    path.mkdir(parents=True, exist_ok=True)
    return path


def mpirun_command() -> list[str]:
    """The launcher: $MPIRUN when set (the Makefile exports it), else mpirun with --allow-run-as-root when root and
    --oversubscribe (3-4 ranks on a 2-core machine)."""
    if os.environ.get("MPIRUN"):
        return shlex.split(os.environ["MPIRUN"])
    command = ["mpirun"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-run-as-root")
    return command + ["--oversubscribe"]


@dataclass
class LabRun:
    lab: str
    ranks: int
    env: dict
    out: Path
    stdout: str
    seconds: float

    def __repr__(self) -> str:
        settings = " ".join(f"{k}={v}" for k, v in self.env.items())
        return f"<{self.lab} -np {self.ranks} {settings}: {self.out} ({self.seconds:.2f} s)>"


def run_lab(lab: str, ranks: int = 2, out: Path | str | None = None, timeout: float = 120, **env) -> LabRun:
    """Run lab/<lab> on `ranks` MPI ranks with the given environment settings (STEPS=2, STRATEGY="NO_SHARD", ...)
    into `out` (emptied first: a 4-rank run must not leave rank3.jsonl behind for a later 2-rank one). Raises
    RuntimeError with the lab's output when it fails."""
    binary = REPO / "lab" / lab
    if not os.access(binary, os.X_OK):
        raise RuntimeError(f"{binary} is not built; run `make` in {REPO} first")
    out = Path(out) if out is not None else run_dir(lab) / "run"
    if out.exists():
        shutil.rmtree(out)
    settings = {key: str(value) for key, value in env.items()}
    command = mpirun_command() + ["-np", str(ranks), str(binary)]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, env={**os.environ, **settings, "OUT": str(out)}, capture_output=True,
                            text=True, timeout=timeout)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise RuntimeError(f"{' '.join(command)} with {settings} exited {result.returncode}:\n{tail}")
    return LabRun(lab, ranks, settings, out, result.stdout, seconds)


def parameter_count(preset: str = "tiny") -> int:
    """Ψ, the parameter count, from the model itself (`tests/bin/qwen2_tool params <preset>`; make builds it)."""
    tool = REPO / "tests" / "bin" / "qwen2_tool"
    if not os.access(tool, os.X_OK):
        raise RuntimeError(f"{tool} is not built; run `make` in {REPO} first")
    with tempfile.TemporaryDirectory() as scratch:  # the tool writes its (empty) trace to $OUT
        output = subprocess.run([str(tool), "params", preset], cwd=scratch, env={**os.environ, "OUT": scratch},
                                capture_output=True, text=True, check=True).stdout
    match = re.search(r"^total (\d+)$", output, re.M)
    if not match:
        raise ValueError(f"no 'total N' line in qwen2_tool params {preset}")
    return int(match.group(1))


class Events:
    """A run's events, one DataFrame per kind over all ranks (`ev.alloc`, `ev.free`, `ev.state`, `ev.collective`,
    `ev.compute`, `ev.step`, `ev.mark`, `ev.meta`, `ev.wait`, `ev.fsdp`), plus `ev.memory`: alloc and free together in
    line order with a signed `delta`. Every frame has `rank`, `line` and `ms` (ts in milliseconds); spans also `end_ms`
    and `dur_ms`."""

    KINDS = ("meta", "mark", "state", "collective", "alloc", "free", "compute", "step", "wait", "fsdp")

    def __init__(self, directory: Path | str):
        self.dir = Path(directory)
        files = sorted(self.dir.glob("rank*.jsonl"), key=lambda p: int(re.sub(r"\D", "", p.stem)))
        if not files:
            raise FileNotFoundError(f"no rank*.jsonl in {self.dir}")
        rows = []
        for path in files:
            with open(path) as handle:
                for line_number, text in enumerate(handle):
                    event = json.loads(text)
                    event["line"] = line_number
                    rows.append(event)
        everything = pd.DataFrame(rows)
        self.frames = {}
        for kind in self.KINDS:
            frame = everything[everything["kind"] == kind].reset_index(drop=True)
            if len(frame):
                frame = frame.dropna(axis=1, how="all")
            frame["ms"] = frame["ts"] / MS
            if "dur" in frame:
                frame["dur_ms"] = frame["dur"] / MS
                frame["end_ms"] = frame["ms"] + frame["dur_ms"]
            self.frames[kind] = frame
        self.world = int(self.frames["meta"]["world"].iloc[0])
        self.ranks = sorted(int(r) for r in everything["rank"].unique())
        memory = pd.concat([self.frames["alloc"], self.frames["free"]]).sort_values(["rank", "line"])
        memory["delta"] = memory["bytes"].where(memory["kind"] == "alloc", -memory["bytes"])
        self.frames["memory"] = memory.reset_index(drop=True)

    def __getattr__(self, kind: str) -> pd.DataFrame:
        try:
            return self.__dict__["frames"][kind]
        except KeyError:
            raise AttributeError(kind) from None

    def __repr__(self) -> str:
        counts = ", ".join(f"{len(frame)} {kind}" for kind, frame in self.frames.items() if kind != "memory")
        return f"<events of {self.dir}: {self.world} ranks; {counts}>"

    def step_window(self, step: int, rank: int = 0) -> tuple[int, int, float, float]:
        """(first line, last line, start ms, end ms) of optimizer step `step` on `rank`: from just after step-1's
        closing `step` event (micro -1) to this step's own."""
        steps = self.step[(self.step["rank"] == rank) & (self.step["micro"] == -1)].set_index("step")
        if step not in steps.index:
            raise KeyError(f"no step {step} on rank {rank} (steps: {list(steps.index)})")
        end = steps.loc[step]
        if step - 1 in steps.index:
            before = steps.loc[step - 1]
            return int(before["line"]) + 1, int(end["line"]), float(before["ms"]), float(end["ms"])
        return 0, int(end["line"]), 0.0, float(end["ms"])

    def memory_timeline(self, rank: int = 0) -> pd.DataFrame:
        """Live bytes per category after every alloc/free on `rank` (one row each, in line order): columns line, ms,
        kind, owner, delta, the categories, live, and reserved (the caching allocator's segments after the event)."""
        memory = self.memory[self.memory["rank"] == rank].copy()
        wide = memory.pivot_table(index="line", columns="category", values="category_live", aggfunc="last")
        wide = wide.reindex(columns=CATEGORIES).ffill().fillna(0.0)
        base = memory.set_index("line")[["ms", "kind", "category", "owner", "delta", "live", "reserved"]]
        return base.join(wide).reset_index()

    def live_blocks(self, rank: int, line: int) -> pd.DataFrame:
        """The allocations live on `rank` right after line `line`: id, bytes, category, owner."""
        memory = self.memory[(self.memory["rank"] == rank) & (self.memory["line"] <= line)]
        freed = set(memory.loc[memory["kind"] == "free", "id"])
        allocated = memory[memory["kind"] == "alloc"]
        return allocated[~allocated["id"].isin(freed)][["id", "bytes", "category", "owner", "line"]]

    def states_at(self, rank: int, line: int) -> pd.DataFrame:
        """Each unit's TrainingState, HandleTrainingState and ShardState on `rank` right after line `line`."""
        states = self.state[(self.state["rank"] == rank) & (self.state["line"] <= line)]
        table = states.groupby(["unit", "machine"])["to"].last().unstack("machine")
        defaults = {"TrainingState": "IDLE", "HandleTrainingState": "IDLE", "ShardState": "SHARDED"}
        for machine, default in defaults.items():
            table[machine] = table[machine].fillna(default) if machine in table else default
        return table[list(defaults)].reindex(unit_order(self.state["unit"]))

    def shard_intervals(self, rank: int = 0) -> pd.DataFrame:
        """Every span a unit was UNSHARDED on `rank`: unit, start_ms, end_ms, hook that unsharded it, and the
        HandleTrainingState it entered (FORWARD, BACKWARD_PRE, ...)."""
        states = self.state[self.state["rank"] == rank].sort_values("line")
        spans, open_spans, handle = [], {}, {}
        for event in states.itertuples():
            if event.machine == "HandleTrainingState":
                handle[event.unit] = event.to
            elif event.machine == "ShardState" and event.to == "UNSHARDED":
                open_spans[event.unit] = (event.ms, event.hook, handle.get(event.unit, "IDLE"))
            elif event.machine == "ShardState" and event.to == "SHARDED" and event.unit in open_spans:
                start, hook, state = open_spans.pop(event.unit)
                spans.append((event.unit, start, event.ms, hook, state))
        end = float(self.memory.loc[self.memory["rank"] == rank, "ms"].max())
        spans += [(unit, start, end, hook, state) for unit, (start, hook, state) in open_spans.items()]
        return pd.DataFrame(spans, columns=["unit", "start_ms", "end_ms", "hook", "handle_state"])


def load_events(directory: Path | str) -> Events:
    return Events(directory)


def unit_order(units) -> list[str]:
    """root first, then layers.0, layers.1, ... in numeric order."""
    def key(name):
        numbers = re.findall(r"\d+", name)
        return (name != "root", re.sub(r"\d+", "", name), int(numbers[0]) if numbers else -1)
    return sorted(set(units), key=key)


def unit_of(owner: str) -> str:
    """The unit (or module) an allocation's owner belongs to: 'layers.3.mlp.up.output' -> 'layers.3'."""
    match = re.match(r"(layers\.\d+|root)", owner)
    return match.group(1) if match else owner.split(".")[0]


_UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def parse_size(text: str) -> float:
    """'873.0 KB' -> 873000.0 (lab 05 prints decimal units, rounded)."""
    number, unit = text.split()
    return float(number) * _UNITS[unit]


def format_bytes(nbytes: float) -> str:
    """Bytes as the C side prints them (core/memory/mem.c mem_format_bytes): '1.5 MB', '873.0 KB', '512 B'."""
    nbytes = int(nbytes)
    if nbytes >= 1_000_000_000:
        return f"{nbytes / 1e9:.2f} GB"
    if nbytes >= 1_000_000:
        return f"{nbytes / 1e6:.1f} MB"
    if nbytes >= 1_000:
        return f"{nbytes / 1e3:.1f} KB"
    return f"{nbytes} B"


def parse_memory_table(stdout: str) -> pd.DataFrame:
    """Lab 05's closing table ("memory per rank, analytic model vs measured peak") as a DataFrame indexed by
    category: predicted and measured bytes (as printed, so rounded), ratio, and the printed texts. Categories the lab
    leaves out (never used) are 0 ("0 B"). The `total` row holds the model's sum of category peaks (an upper bound of
    the total) and the measured total peak; its ratio is NaN."""
    size = r"(\d+(?:\.\d+)? [KMG]?B)"
    rows = {}
    for name, predicted, measured, ratio in re.findall(rf"^  (\w+)\s+{size}\s+{size}\s+(\S+)", stdout, re.M):
        rows[name] = {"predicted": parse_size(predicted), "measured": parse_size(measured),
                      "ratio": float(ratio) if re.fullmatch(r"[\d.]+", ratio) else float("nan"),
                      "predicted_text": predicted, "measured_text": measured}
    if "total" not in rows:
        raise ValueError("no memory table (analytic model vs measured peak) in the lab's output")
    table = pd.DataFrame.from_dict(rows, orient="index").reindex(CATEGORIES + ["total"])
    return table.fillna({"predicted": 0.0, "measured": 0.0, "predicted_text": "0 B", "measured_text": "0 B"})


def style() -> None:
    """One look for every figure."""
    plt.rcParams.update({
        "figure.dpi": 110, "savefig.dpi": 130, "savefig.bbox": "tight", "font.size": 10, "axes.titlesize": 12,
        "axes.titleweight": "bold", "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
        "grid.alpha": 0.3, "grid.linestyle": ":", "legend.frameon": False, "legend.fontsize": 9,
    })


def save(fig, path: Path | str, show: bool = True) -> None:
    """Save `fig` as a PNG at `path`, close it, and show the saved file in the notebook (so the HTML rendering shows
    exactly the PNG in the run dir)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    if show and "IPython" in sys.modules:
        from IPython.display import Image, display
        display(Image(filename=str(path)))


def megabytes(frame):
    """Bytes -> MB, rounded for tables."""
    return (frame / MB).round(3)


style()
