#!/usr/bin/env python3
"""Executes the notebooks headlessly (nbclient, kernel python3, working directory notebooks/) and fails on any error.

usage: python3 notebooks/run_notebooks.py [--html OUTDIR] [--timeout SECONDS] [NOTEBOOK.ipynb ...]

Prints one line per notebook (PASS/FAIL, cells, seconds). A failing notebook is named with its cell (number from 1,
as in Jupyter's top-to-bottom order), the error and the traceback's tail; the exit status is then 1. The notebooks
are committed without outputs: one saved with outputs fails too (clear them before committing). With --html, the
executed copies are also rendered to OUTDIR/<name>.html with their outputs (make notebooks). The source notebooks are
never rewritten. Exits 77 after printing "skipped: <reason>" when a needed Python package is missing.
"""
import argparse
import importlib.util
import sys
import time
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent


def missing_packages(html: bool) -> list:
    needed = ["pandas", "matplotlib", "nbclient", "nbformat", "ipykernel"] + (["nbconvert"] if html else [])
    return [name for name in needed if importlib.util.find_spec(name) is None]


def saved_outputs(nb) -> list:
    """Numbers (from 1) of the code cells stored with outputs or an execution count."""
    return [i for i, cell in enumerate(nb.cells, 1)
            if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count") is not None)]


def error_of(cell) -> str:
    """The error a cell's outputs hold (ename: evalue and the traceback's last lines), or ''."""
    import re
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            traceback = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(output.get("traceback", [])))
            tail = "\n".join(traceback.splitlines()[-12:])
            return f"{output.get('ename')}: {output.get('evalue')}\n{tail}"
    return ""


def execute(path: Path, timeout: int):
    """Runs every cell of the notebook at `path` in a fresh kernel. Returns (executed notebook, error text or '')."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    dirty = saved_outputs(nb)
    if dirty:
        return nb, f"saved with outputs in cells {dirty}; commit notebooks without outputs (clear them first)"
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    number = 0
    try:
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                number = index + 1
                client.execute_cell(cell, index)
    except CellExecutionError as error:
        detail = error_of(nb.cells[number - 1]) or str(error).strip().splitlines()[-1]
        return nb, f"cell {number} failed: {detail}"
    except CellTimeoutError:
        return nb, f"cell {number} ran past {timeout} s"
    except DeadKernelError as error:
        return nb, f"cell {number}: the kernel died ({error})"
    return nb, ""


def render_html(nb, out: Path) -> None:
    from nbconvert import HTMLExporter
    body, _ = HTMLExporter().from_notebook_node(nb)
    out.write_text(body, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/*.ipynb")
    parser.add_argument("--html", type=Path, metavar="OUTDIR", help="also render executed copies to OUTDIR/*.html")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    args = parser.parse_args()

    missing = missing_packages(args.html is not None)
    if missing:
        print(f"skipped: missing Python packages: {' '.join(missing)} (pip install -r scripts/requirements.txt)")
        return 77
    paths = [p.resolve() for p in args.notebooks] or sorted(NOTEBOOKS.glob("*.ipynb"))
    if not paths:
        print(f"no notebooks in {NOTEBOOKS}")
        return 1
    if args.html:
        args.html.mkdir(parents=True, exist_ok=True)

    failed = []
    total_start = time.perf_counter()
    for path in paths:
        start = time.perf_counter()
        nb, error = execute(path, args.timeout)
        seconds = time.perf_counter() - start
        cells = sum(cell.cell_type == "code" for cell in nb.cells)
        if error:
            failed.append(path.name)
            print(f"FAIL  {path.name}: {error}", flush=True)
            continue
        line = f"PASS  {path.name}: {cells} code cells in {seconds:.1f} s"
        if args.html:
            out = args.html / (path.stem + ".html")
            render_html(nb, out)
            line += f" -> {out}"
        print(line, flush=True)
    summary = f"{len(paths) - len(failed)} of {len(paths)} notebooks ran in {time.perf_counter() - total_start:.1f} s"
    print(summary + (f"; failed: {' '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
