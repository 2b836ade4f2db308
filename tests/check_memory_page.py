#!/usr/bin/env python3
"""check_memory_page.py: opens a run's memory.html in headless Chromium and checks that it draws.

    python3 tests/check_memory_page.py <rundir> [--screenshot PATH] [--chromium PATH]

Drives headless Chromium over the DevTools protocol (tests/browser.py). For every rank it selects the rank and checks
that the SVG has one band (path.band) per `alloc` line of rank<R>.jsonl and that the page's peak equals the peak
recomputed here; it hovers the biggest band and checks the side panel names its owner, category and bytes and the FSDP
state; every step and micro-batch label lies within the span it names; at 1,400 px the subtitle ends inside the
SVG and the key to the vertical lines and the legend are above the fold; it fails on any console error or uncaught
exception. Then it saves a screenshot of the whole page (default
<rundir>/memory.png) and prints the page's size and drawing time. Exit 0 when every check passes, 1 when one fails, 77
("skipped: <reason>") when Chromium or websocket-client is missing.
"""
import argparse
import base64
import json
import os
import sys
import time

from browser import Browser, require_chromium
from check_report import Report

VIEWPORT = (1600, 1000)


def rank_files(rundir):
    """{rank: [event, ...]} from rank<R>.jsonl for the world rank0.jsonl's meta line names, with each event's line
    number in '_line'. A rank's view is its device pool: the host pool's memory events (CPU offload, EVENTS.md
    version 4) are drawn in views of their own after the ranks, and left out here."""
    ranks = {}
    with open(os.path.join(rundir, "rank0.jsonl"), encoding="utf-8") as file:
        world = json.loads(file.readline())["world"]
    for rank in range(world):
        events = []
        with open(os.path.join(rundir, f"rank{rank}.jsonl"), encoding="utf-8") as file:
            for number, text in enumerate(file, start=1):
                if not text.endswith("\n"):
                    continue  # a last line cut short by a crash: the tool skips it too
                event = json.loads(text)
                event["_line"] = number
                if event.get("device", "device") == "device":
                    events.append(event)
        ranks[rank] = events
    return ranks


def expected_peak(events):
    """(bytes, line) of the first alloc after which live bytes are highest: the page's definition of the peak."""
    live, peak, peak_line = 0, 0, 0
    for event in events:
        if event["kind"] == "alloc":
            live += event["bytes"]
            if live > peak or peak_line == 0:
                peak, peak_line = live, event["_line"]
        elif event["kind"] == "free":
            live -= event["bytes"]
    return peak, peak_line


def expected_reserved(events, peak_line):
    """From the segment lines alone: (reserved peak bytes, its line, number of segment lines, reserved bytes and live
    segment count at the allocated peak's line)."""
    peak, peak_at, count, segments, at_peak = 0, 0, 0, set(), (0, 0)
    reserved = 0
    for event in events:
        if event["kind"] in ("segment_alloc", "segment_free"):
            count += 1
            reserved = event["reserved"]
            (segments.add if event["kind"] == "segment_alloc" else segments.discard)(event["addr"])
            if reserved > peak:
                peak, peak_at = reserved, event["_line"]
        if event["_line"] == peak_line:
            at_peak = (reserved, len(segments))
    return peak, peak_at, count, at_peak


def open_page(browser, page_path):
    """Loads the page and waits until it has drawn; returns milliseconds from navigation to drawn."""
    browser.enable()
    started = time.time()
    browser.navigate("file://" + os.path.abspath(page_path))
    if not browser.wait_for("document.body && document.body.dataset.ready === '1'", 30):
        raise RuntimeError("the page did not draw within 30 s (no <body data-ready='1'>)")
    return 1000 * (time.time() - started)


def select_rank(browser, index):
    browser.evaluate(f"(() => {{ const s = document.getElementById('rank-select'); s.value = '{index}';"
                     " s.dispatchEvent(new Event('change')); })()")
    return browser.evaluate("(() => { const svg = document.getElementById('timeline'); return {"
                            " rank: Number(svg.dataset.rank), allocations: Number(svg.dataset.allocations),"
                            " bands: svg.querySelectorAll('path.band').length,"
                            " filled: [...svg.querySelectorAll('path.band')].filter(p => p.getAttribute('d')"
                            "   && p.getAttribute('fill')).length,"
                            " peak_bytes: Number(svg.dataset.peakBytes), peak_line: Number(svg.dataset.peakLine),"
                            " reserved_peak: Number(svg.dataset.reservedPeak),"
                            " reserved_line: Number(svg.dataset.reservedPeakLine),"
                            " reserved_steps: Number(svg.dataset.reservedSteps),"
                            " reserved_path: (svg.querySelector('path.reserved')?.getAttribute('d') ?? '')"
                            ".split('V').length - 1,"
                            " heading: document.querySelector('#fragmentation h2')?.textContent ?? '',"
                            " segment_rows: document.querySelectorAll('#segments tr').length - 1,"
                            " render_ms: Number(svg.dataset.renderMs) }; })()")


def check_ranks(browser, ranks, report):
    render_times = []
    for rank, events in ranks.items():
        drawn = select_rank(browser, rank)
        render_times.append(drawn["render_ms"])
        allocs = sum(1 for event in events if event["kind"] == "alloc")
        peak, peak_line = expected_peak(events)
        problems = []
        if drawn["rank"] != rank:
            problems.append(f"selected rank {rank} but the SVG shows rank {drawn['rank']}")
        if not drawn["bands"] == drawn["filled"] == drawn["allocations"] == allocs:
            problems.append(f"rank{rank}.jsonl has {allocs} alloc lines; the page drew {drawn['bands']} bands "
                            f"({drawn['filled']} with a shape and a color), data-allocations {drawn['allocations']}")
        if (drawn["peak_bytes"], drawn["peak_line"]) != (peak, peak_line):
            problems.append(f"page peak {drawn['peak_bytes']} B at line {drawn['peak_line']}, "
                            f"recomputed {peak} B at line {peak_line}")
        (reserved_peak, reserved_line, segment_lines,
         (reserved_then, live_segments)) = expected_reserved(events, peak_line)
        found = (drawn["reserved_peak"], drawn["reserved_line"], drawn["reserved_steps"], drawn["reserved_path"])
        if found != (reserved_peak, reserved_line, segment_lines, segment_lines):
            problems.append(f"reserved (peak, line, steps, path vertical moves) {found}, the JSONL has "
                            f"{(reserved_peak, reserved_line, segment_lines, segment_lines)}")
        heading = drawn["heading"].replace("\u2212", "-")
        wanted = f"(line {peak_line:,}): reserved"
        if wanted not in heading or drawn["segment_rows"] != live_segments:
            problems.append(f"fragmentation heading {heading!r} (wanted {wanted!r}), {drawn['segment_rows']} segment "
                            f"rows; {live_segments} segments live at line {peak_line} ({reserved_then} B reserved)")
        report.check(f"rank {rank}: {drawn['bands']} bands, one per allocation; peak {peak} B at line {peak_line}; "
                     f"reserved line with {segment_lines} steps, peak {reserved_peak} B; {live_segments} segments in "
                     "the fragmentation table", problems)
    return render_times


def check_hover(browser, report):
    """Moves the mouse onto the biggest band of rank 0 and reads the side panel."""
    select_rank(browser, 0)
    target = browser.evaluate(
        "(() => { const data = JSON.parse(document.getElementById('run-data').textContent);"
        " const rank = data.ranks[0]; let best = -1;"
        " rank.allocations.forEach((a, i) => { if (best < 0 || a[2] > rank.allocations[best][2]) best = i; });"
        " if (best < 0) return null;"
        " const path = document.querySelector(`path.band[data-index='${best}']`);"
        " const box = path.getBoundingClientRect();"
        " for (let fx = 0.5; fx < 1; fx += 0.05) for (const fy of [0.5, 0.3, 0.7]) {"
        "   const x = box.left + box.width * fx, y = box.top + box.height * fy;"
        "   if (document.elementFromPoint(x, y) === path) return {x, y, owner: data.strings[rank.allocations[best][4]],"
        "     category: data.categories[rank.allocations[best][3]], bytes: rank.allocations[best][2]}; }"
        " return null; })()")
    if target is None:
        report.check("hover: a band to hover", [] if browser.evaluate(
            "document.getElementById('timeline').dataset.allocations === '0'")
            else ["no allocation band could be found under a point"])
        return
    browser.send("Input.dispatchMouseEvent", type="mouseMoved", x=target["x"], y=target["y"])
    panel = browser.evaluate("document.getElementById('details').innerText")
    wanted = [target["owner"], target["category"], f"{target['bytes']:,}", "ShardState", "HandleTrainingState"]
    missing = [text for text in wanted if text not in panel]
    report.check(f"hover on {target['owner']}: the panel shows owner, category, bytes and the FSDP state",
                 [f"panel lacks {text!r}; it reads: {panel[:300]!r}" for text in missing])
    browser.send("Input.dispatchMouseEvent", type="mouseMoved", x=2, y=2)


def check_zoom(browser, report):
    """Drags across the middle fifth of rank 0's plot, then double-clicks: x narrows, every band stays, x resets."""
    select_rank(browser, 0)
    state = ("(() => { const svg = document.getElementById('timeline'), clip = svg.querySelector('#plot-clip rect'),"
             " box = svg.getBoundingClientRect(); return { from: Number(svg.dataset.from), to: Number(svg.dataset.to),"
             " bands: svg.querySelectorAll('path.band').length, allocations: Number(svg.dataset.allocations),"
             " left: box.left + Number(clip.getAttribute('x')), width: Number(clip.getAttribute('width')),"
             " y: box.top + Number(clip.getAttribute('y')) + Number(clip.getAttribute('height')) / 2 }; })()")
    before = browser.evaluate(state)
    if before["to"] - before["from"] < 20:
        report.check("zoom: too few lines to zoom into", [])
        return
    start, end = before["left"] + 0.4 * before["width"], before["left"] + 0.6 * before["width"]
    for kind, x in (("mousePressed", start), ("mouseMoved", end), ("mouseReleased", end)):
        browser.send("Input.dispatchMouseEvent", type=kind, x=x, y=before["y"], button="left", clickCount=1)
    zoomed = browser.evaluate(state)
    browser.evaluate("document.getElementById('timeline').dispatchEvent(new MouseEvent('dblclick', {bubbles: true}))")
    reset = browser.evaluate(state)
    problems = []
    span, zoomed_span = before["to"] - before["from"], zoomed["to"] - zoomed["from"]
    if not 0.1 * span < zoomed_span < 0.3 * span:
        problems.append(f"x range {before['from']}..{before['to']} became {zoomed['from']}..{zoomed['to']}")
    if zoomed["bands"] != zoomed["allocations"]:
        problems.append(f"zoomed: {zoomed['bands']} bands for {zoomed['allocations']} allocations")
    if (reset["from"], reset["to"]) != (before["from"], before["to"]):
        problems.append(f"double-click left x at {reset['from']}..{reset['to']}")
    report.check(f"zoom: lines {before['from']}..{before['to']} -> {zoomed['from']}..{zoomed['to']} and back",
                 problems)


def check_labels(browser, events, report):
    """Every step and micro-batch label of rank 0 lies inside the span it names: after the step event before its own
    (the previous whole step's for a step label; the plot's left edge for the first) and before its own step event,
    the line that ends it. The spans come from the JSONL's step events; x from the plot's scale."""
    select_rank(browser, 0)
    drawn = browser.evaluate(
        "(() => { const svg = document.getElementById('timeline'), clip = svg.querySelector('#plot-clip rect');"
        " return { from: Number(svg.dataset.from), to: Number(svg.dataset.to), left: Number(clip.getAttribute('x')),"
        " width: Number(clip.getAttribute('width')), labels: [...svg.querySelectorAll('text.step-label,"
        " text.micro-label')].map(t => { const b = t.getBBox(); return {text: t.textContent, line:"
        " Number(t.dataset.line), left: b.x, right: b.x + b.width}; }) }; })()")
    x = lambda line: drawn["left"] + (line - drawn["from"]) / (drawn["to"] - drawn["from"]) * drawn["width"]
    steps = [event for event in events if event["kind"] == "step"]
    problems = []
    for label in drawn["labels"]:
        at = next((i for i, event in enumerate(steps) if event["_line"] == label["line"]), None)
        if at is None:
            problems.append(f"label {label['text']!r} names line {label['line']}, not a step event")
            continue
        event = steps[at]
        whole = event["micro"] < 0
        wanted = f"step {event['step']}" if whole else f"s{event['step']} mb{event['micro']}"
        before = [e["_line"] for e in steps[:at] if e["micro"] < 0 or not whole]
        start = max(x(before[-1]) if before else drawn["left"], drawn["left"])
        end = min(x(event["_line"]), drawn["left"] + drawn["width"])
        if label["text"] != wanted:
            problems.append(f"the label at line {label['line']} reads {label['text']!r}, its step event is {wanted!r}")
        if not (start - 0.5 <= label["left"] and label["right"] <= end + 0.5):
            problems.append(f"{label['text']!r} spans x {label['left']:.0f}..{label['right']:.0f}, its span "
                            f"(lines {before[-1] if before else drawn['from']}..{event['_line']}) is x "
                            f"{start:.0f}..{end:.0f}")
    if not drawn["labels"] and 0 < len(steps) <= 50:
        problems.append(f"no step or micro-batch label drawn for {len(steps)} step events")
    report.check(f"rank 0: {len(drawn['labels'])} step and micro-batch labels, each within the span it names",
                 problems)


def check_top(browser, report, width=1400, height=900):
    """At a 1,400 x 900 window: the subtitle lines end inside the SVG (not cut), and the key to the vertical lines
    and the legend are above the fold."""
    browser.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
    try:
        browser.evaluate("render()")
        found = browser.evaluate(
            "(() => { const svg = document.getElementById('timeline'), width = svg.getBoundingClientRect().width;"
            " const subtitles = [...svg.querySelectorAll('text.subtitle')].map(t => ({text: t.textContent,"
            " right: t.getBBox().x + t.getBBox().width, squeezed: t.hasAttribute('textLength')}));"
            " const key = document.getElementById('lines-key'), legend = document.getElementById('legend');"
            " return {width, subtitles, key: key ? key.textContent : '', keyBottom: key ? key.getBoundingClientRect()"
            ".bottom : 1e9, legendBottom: legend ? legend.getBoundingClientRect().bottom : 1e9,"
            " swatches: legend ? legend.querySelectorAll('.swatch').length : 0, inner: window.innerHeight}; })()")
    finally:
        browser.send("Emulation.clearDeviceMetricsOverride")
        browser.evaluate("render()")
    problems = []
    if not found["subtitles"]:
        problems.append("no subtitle")
    for line in found["subtitles"]:
        if line["right"] > found["width"] - 2:
            problems.append(f"subtitle ends at x {line['right']:.0f}, the SVG is {found['width']:.0f} wide: "
                            f"{line['text']!r}")
    if "solid line ends an optimizer step" not in found["key"] or "micro-batch" not in found["key"] \
            or "reserved" not in found["key"]:
        problems.append(f"the key to the lines reads {found['key']!r}")
    if max(found["keyBottom"], found["legendBottom"]) > found["inner"]:
        problems.append(f"the key ends at y {found['keyBottom']:.0f}, the legend at {found['legendBottom']:.0f}, "
                        f"below the fold ({found['inner']} px)")
    if found["swatches"] < 12:
        problems.append(f"the legend at the top has {found['swatches']} swatches")
    report.check(f"at {width} px: {len(found['subtitles'])} subtitle lines inside the plot's width, the lines "
                 "explained and the legend above the fold", problems)


def screenshot(browser, path):
    metrics = browser.send("Page.getLayoutMetrics")
    size = metrics.get("cssContentSize") or metrics["contentSize"]
    clip = {"x": 0, "y": 0, "width": max(size["width"], VIEWPORT[0]), "height": size["height"], "scale": 1}
    shot = browser.send("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)
    with open(path, "wb") as file:
        file.write(base64.b64decode(shot["data"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rundir")
    parser.add_argument("--screenshot", help="where to save the PNG (default <rundir>/memory.png)")
    parser.add_argument("--chromium", help="the browser (default $CHROMIUM or /usr/bin/chromium)")
    args = parser.parse_args()
    chromium = require_chromium(args.chromium)
    page_path = os.path.join(args.rundir, "memory.html")
    if not os.path.exists(page_path):
        print(f"FAIL {page_path} does not exist (make it with: trace/fsdptrace memory {args.rundir})")
        return 1
    ranks = rank_files(args.rundir)
    report = Report()
    browser = Browser(chromium, VIEWPORT)
    try:
        load_ms = open_page(browser, page_path)
        render_times = check_ranks(browser, ranks, report)
        check_hover(browser, report)
        check_zoom(browser, report)
        check_labels(browser, ranks[0], report)
        check_top(browser, report)
        select_rank(browser, 0)
        shot_path = args.screenshot or os.path.join(args.rundir, "memory.png")
        screenshot(browser, shot_path)
        report.check("no console errors or uncaught exceptions", browser.errors())
    finally:
        browser.close()
    print(f"page: {page_path}, {os.path.getsize(page_path):,} bytes; navigation to drawn {load_ms:.0f} ms; "
          f"drawing one rank {max(render_times):.1f} ms at most")
    print(f"screenshot: {shot_path}")
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
