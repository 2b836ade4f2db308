#!/usr/bin/env python3
"""check_player.py: opens a run's player.html in headless Chromium and checks what it shows against the JSONL.

    python3 tests/check_player.py <rundir> [--screenshot PATH] [--chromium PATH]

The events of every rank<R>.jsonl are merged here as the page says it merges them (by ts, ties by rank then line; a
line before the last "t0" mark, or with a negative ts, counts as ts 0, as trace/run.h reads it) and each rank's state
at a moment is replayed here from the lines alone: every unit's ShardState, HandleTrainingState and TrainingState
(SHARDED, IDLE, IDLE before its first transition), live bytes per category (the `category_live` of the rank's last
alloc/free) and the line of the rank's last event. The page is driven by key events (→, Shift+→, c, p) and by
window.player.seek, and its window.player.state() must equal the replay at: a few steps from the start, the first
`_pre_forward` of the root, mid-backward, the optimizer step, the last event and (--expect-overlap, a prefetching
run) the first moment two units other than root are UNSHARDED on one rank. The peak jump (player.peak(r),
and the p key for the highest rank) must land on rank r's alloc where live bytes peak, equal to summary.txt's "peak
memory". As opened, the page shows the first hook's state event, boxes reading "training <state> · shard
<state>" and the 'next hook' and 'jump to the peak' buttons in the window. The colours of every category and state,
read from both pages as rendered (player.html, then memory.html), equal trace/palette.h's; no state has a category's
colour; trace.json's memory counter lists the categories in that order. No console errors. A screenshot goes to
PATH (default <rundir>/player.png). Exit 0 when every check passes, 1 when one fails, 77 ("skipped: <reason>") when
Chromium or websocket-client is missing.
"""
import argparse
import json
import os
import re
import sys

from browser import Browser, require_chromium
from check_memory_page import VIEWPORT, expected_peak, open_page, rank_files, screenshot
from check_report import Report

MACHINES = ("ShardState", "HandleTrainingState", "TrainingState")
INITIAL = ("SHARDED", "IDLE", "IDLE")


def merged(ranks):
    """[(ts, rank, line, event)] of every event but the meta line, in the page's order."""
    rows = []
    for rank, events in ranks.items():
        last_t0 = max((e["_line"] for e in events if e["kind"] == "mark" and e.get("text") == "t0"), default=0)
        for event in events:
            if event["kind"] == "meta":
                continue
            ts = event["ts"] if event["_line"] >= last_t0 and event["ts"] >= 0 else 0.0
            rows.append((ts, rank, event["_line"], event))
    rows.sort(key=lambda row: row[:3])
    return rows


def replay(rows, upto, world):
    """Each rank's state after rows[0..upto]: {rank: {line, units, memory, live}}."""
    units = []
    for _, _, _, event in rows:
        if event["kind"] == "state" and event["unit"] not in units:
            units.append(event["unit"])
    state = {rank: {"line": 0, "units": {u: dict(zip(MACHINES, INITIAL)) for u in units}, "memory": {}, "live": 0}
             for rank in range(world)}
    for _, rank, line, event in rows[:upto + 1]:
        each = state[rank]
        each["line"] = line
        if event["kind"] == "state":
            each["units"][event["unit"]][event["machine"]] = event["to"]
        elif event["kind"] in ("alloc", "free"):
            each["memory"][event["category"]] = event["category_live"]
            each["live"] = event["live"]
    return state


def compare(shown, wanted, rows, index):
    problems = []
    ts, rank, line, _ = rows[index]
    if shown["index"] != index or (shown["event"]["rank"], shown["event"]["line"]) != (rank, line):
        at = shown["event"]
        problems.append(f"page at index {shown['index']} (rank {at['rank']} line {at['line']}), "
                        f"wanted {index} (rank {rank} line {line})")
    for each in shown["ranks"]:
        want = wanted[each["rank"]]
        if each["line"] != want["line"]:
            problems.append(f"rank {each['rank']}: last line {each['line']}, the JSONL {want['line']}")
        if each["units"] != want["units"]:
            differ = [u for u in want["units"] if each["units"].get(u) != want["units"][u]]
            page, jsonl = [each["units"].get(u) for u in differ[:2]], [want["units"][u] for u in differ[:2]]
            problems.append(f"rank {each['rank']}: unit states differ for {differ[:4]}: page {page}, JSONL {jsonl}")
        memory = {c: b for c, b in each["memory"].items() if b or c in want["memory"]}
        if memory != {c: b for c, b in want["memory"].items() if b or c in memory} or each["live"] != want["live"]:
            problems.append(f"rank {each['rank']}: live {each['live']} {memory}, "
                            f"the JSONL {want['live']} {want['memory']}")
    return problems


def summary_peaks(rundir):
    """{rank: peak bytes} from summary.txt's '== rank R' sections' 'peak memory: N B' lines."""
    peaks, rank = {}, None
    with open(os.path.join(rundir, "summary.txt"), encoding="utf-8") as file:
        for text in file:
            found = re.match(r"== rank (\d+)", text)
            if found:
                rank = int(found.group(1))
            found = re.match(r"peak memory: ([\d,]+) B", text)
            if found and rank is not None and rank not in peaks:
                peaks[rank] = int(found.group(1).replace(",", ""))
    return peaks


def key(browser, name, code, shift=False):
    modifiers = 8 if shift else 0
    for kind in ("keyDown", "keyUp"):
        browser.send("Input.dispatchKeyEvent", type=kind, key=name, code=code, modifiers=modifiers,
                     windowsVirtualKeyCode={"ArrowRight": 39, "ArrowLeft": 37, "c": 67, "p": 80, " ": 32}[name])


def state(browser):
    return browser.evaluate("window.player.state()")


def first_overlap(rows, world):
    """The first index after which a rank has two units other than root UNSHARDED (prefetching), or None."""
    unsharded = {rank: set() for rank in range(world)}
    for index, (_, rank, _, event) in enumerate(rows):
        if event["kind"] == "state" and event["machine"] == "ShardState" and event["unit"] != "root":
            (unsharded[rank].add if event["to"] == "UNSHARDED" else unsharded[rank].discard)(event["unit"])
            if len(unsharded[rank]) >= 2:
                return index
    return None


def check_moments(browser, rows, world, report, expect_overlap):
    def check_at(title, index):
        shown = state(browser)
        problems = compare(shown, replay(rows, index, world), rows, index)
        ts, rank, line, event = rows[index]
        where = browser.evaluate("document.getElementById('where').textContent")
        verbatim = browser.evaluate("document.getElementById('json').textContent")
        if f"rank {rank}, line {line} of rank{rank}.jsonl" not in where:
            problems.append(f"the event panel says {where!r}")
        if verbatim != open_line(rank, line):
            problems.append(f"the JSON shown is not line {line} of rank{rank}.jsonl verbatim: {verbatim[:120]!r}")
        report.check(f"{title}: index {index}, rank {rank} line {line} ({event['kind']}): every rank's unit states, "
                     f"memory by category and last line equal the JSONL; caption {shown['caption']!r}", problems)

    browser.evaluate("window.player.seek(0)")
    for _ in range(5):
        key(browser, "ArrowRight", "ArrowRight")
    check_at("→ five times", 5)
    key(browser, "ArrowLeft", "ArrowLeft")
    check_at("← once", 4)

    indices = {name: None for name in ("root _pre_forward", "mid-backward", "optimizer step")}
    backward = [i for i, row in enumerate(rows) if row[3]["kind"] == "compute" and row[3].get("phase") == "backward"]
    for i, (_, _, _, event) in enumerate(rows):
        if indices["root _pre_forward"] is None and event["kind"] == "state" and event["unit"] == "root" \
                and event.get("hook") == "_pre_forward":
            indices["root _pre_forward"] = i
        if indices["optimizer step"] is None and event["kind"] == "compute" and event.get("phase") == "optimizer":
            indices["optimizer step"] = i
    if backward:
        indices["mid-backward"] = backward[len(backward) // 2]
    for name, index in indices.items():
        if index is None:
            report.check(f"{name}: the run has one", [f"no {name} event in the run"])
            continue
        browser.evaluate(f"window.player.seek({index})")
        check_at(name, index)
    browser.evaluate(f"window.player.seek({len(rows) - 1})")
    check_at("the last event", len(rows) - 1)
    if expect_overlap:
        overlap = first_overlap(rows, world)
        if overlap is None:
            report.check("several units unsharded at once", ["no moment has two units but root UNSHARDED on a rank"])
        else:
            browser.evaluate(f"window.player.seek({overlap})")
            check_at("the first moment two units but root are UNSHARDED on one rank", overlap)

    # Shift+→ lands on a hook's state event; c on a collective.
    browser.evaluate("window.player.seek(0)")
    key(browser, "ArrowRight", "ArrowRight", shift=True)
    shown = state(browser)
    event = rows[shown["index"]][3]
    first_hook = next(i for i, row in enumerate(rows)
                      if row[3]["kind"] == "state" and str(row[3].get("hook", "")).startswith("_"))
    report.check(f"Shift+→ from the start: the first hook's state event (index {first_hook})",
                 [] if shown["index"] == first_hook else [f"landed on index {shown['index']} ({event['kind']})"])
    key(browser, "c", "KeyC")
    shown = state(browser)
    first_collective = next(i for i, row in enumerate(rows) if row[3]["kind"] == "collective" and i > first_hook)
    drawn = any(group["ranks"][rows[first_collective][1]] for group in shown["inFlight"])
    report.check(f"c: the next collective (index {first_collective}), drawn in flight",
                 [] if shown["index"] == first_collective and drawn
                 else [f"landed on index {shown['index']} ({rows[shown['index']][3]['kind']}), "
                       f"in flight {shown['inFlight']}"])


def check_peaks(browser, ranks, rows, rundir, report):
    summary = summary_peaks(rundir)
    position = {(rank, line): i for i, (_, rank, line, _) in enumerate(rows)}
    best = None
    for rank, events in ranks.items():
        peak, line = expected_peak(events)
        index = browser.evaluate(f"window.player.peak({rank})")
        shown = state(browser)
        live = shown["ranks"][rank]["live"]
        problems = []
        if index != position.get((rank, line)):
            problems.append(f"landed on index {index} (rank {shown['event']['rank']} line {shown['event']['line']}), "
                            f"the peak is rank {rank} line {line}")
        if not live == shown["ranks"][rank]["peak"] == peak == summary.get(rank):
            problems.append(f"live there {live}, page peak {shown['ranks'][rank]['peak']}, JSONL {peak}, "
                            f"summary.txt {summary.get(rank)}")
        report.check(f"peak of rank {rank}: line {line}, {peak:,} B as summary.txt says", problems)
        if best is None or peak > best[0]:
            best = (peak, position.get((rank, line)))
    browser.evaluate("window.player.seek(0)")
    key(browser, "p", "KeyP")
    index = browser.evaluate("window.player.index()")
    report.check("p: the highest rank's peak", [] if index == best[1] else [f"landed on {index}, wanted {best[1]}"])


PALETTE_H = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "trace", "palette.h")


def palette_tables():
    """({category: '#rrggbb'}, {state: '#rrggbb'}) as trace/palette.h defines them, in its order."""
    with open(PALETTE_H, encoding="utf-8") as file:
        text = file.read()
    states_at = text.index("palette_states[")
    row = re.compile(r'\{"(\w+)", "(#[0-9a-fA-F]{6})"\}')
    return dict(row.findall(text[:states_at])), dict(row.findall(text[states_at:]))


def rgb(color):
    return "rgb({}, {}, {})".format(*(int(color[i:i + 2], 16) for i in (1, 3, 5)))


# Each page's colours as the browser renders them: the legend's swatches at the top, and what is drawn with them
# (player: a category's live bar, the unit boxes' fill and left edge; memory: the bands, the SVG legend, the lanes).
PLAYER_COLORS = """(() => {
  const style = node => getComputedStyle(node);
  const legend = {};
  for (const s of document.querySelectorAll('#legend .swatch')) legend[s.dataset.name] = style(s).backgroundColor;
  const drawn = {};
  for (const bar of document.querySelectorAll('.mem .live[data-category]'))
    drawn[bar.dataset.category] = style(bar).backgroundColor;
  const boxes = [...document.querySelectorAll('.unit .box')].map(box => ({fill: style(box.querySelector('.fill'))
    .backgroundColor, edge: style(box).borderLeftColor, text: box.textContent}));
  return {legend, drawn, boxes};
})()"""
MEMORY_COLORS = """(() => {
  const data = JSON.parse(document.getElementById('run-data').textContent);
  const legend = {};
  for (const s of document.querySelectorAll('#legend .swatch')) legend[s.dataset.name] = getComputedStyle(s)
    .backgroundColor;
  const drawn = {};
  for (const band of document.querySelectorAll('path.band')) {
    const name = data.categories[data.ranks[0].allocations[Number(band.dataset.index)][3]];
    drawn[name] = getComputedStyle(band).fill;
  }
  const lanes = [...new Set([...document.querySelectorAll('.lanes rect')].map(r => getComputedStyle(r).fill))];
  return {legend, drawn, lanes};
})()"""


def check_first_frame(browser, rows, report):
    """As opened: the first hook of step 1 (not the allocator's settings), the boxes naming their two states, and the
    'next hook' and 'jump to the peak' buttons in the window without scrolling."""
    shown = state(browser)
    first_hook = next(i for i, row in enumerate(rows)
                      if row[3]["kind"] == "state" and str(row[3].get("hook", "")).startswith("_"))
    event = rows[shown["index"]][3]
    problems = []
    if shown["index"] != first_hook:
        problems.append(f"opens on index {shown['index']} ({event['kind']}), the first hook is index {first_hook}")
    if event["kind"] != "state" or not str(event.get("hook", "")).startswith("_"):
        problems.append(f"the first frame's event is {event['kind']} {event.get('hook')!r}, not a hook's")
    found = browser.evaluate(
        "(() => { const buttons = [...document.querySelectorAll('#controls button')].map(b => ({text: b.textContent,"
        " bottom: b.getBoundingClientRect().bottom, right: b.getBoundingClientRect().right}));"
        " return {buttons, inner: window.innerHeight, width: window.innerWidth,"
        " box: document.querySelector('.unit .box')?.textContent ?? ''}; })()")
    for wanted in ("next hook", "jump to the peak"):
        button = next((b for b in found["buttons"] if wanted in b["text"]), None)
        if button is None:
            problems.append(f"no {wanted!r} button; buttons {[b['text'] for b in found['buttons']]}")
        elif button["bottom"] > found["inner"] or button["right"] > found["width"]:
            problems.append(f"{wanted!r} is outside the window at ({button['right']:.0f}, {button['bottom']:.0f})")
    if not re.fullmatch(r"training \w+ \u00b7 shard (UN)?SHARDED", found["box"]):
        problems.append(f"a unit's box reads {found['box']!r}, not 'training <state> \u00b7 shard <state>'")
    report.check(f"opened: the first hook (index {first_hook}, rank {rows[first_hook][1]} line {rows[first_hook][2]}), "
                 f"boxes reading {found['box']!r}, 'next hook' and 'jump to the peak' in the window", problems)


def check_palette(browser, rundir, report):
    """One colour per category and per state, read from both pages as rendered: each equals trace/palette.h's, in
    player.html and memory.html alike, no state has a category's colour, and trace.json's memory counter lists the
    categories in palette.h's order."""
    categories, states = palette_tables()
    player = browser.evaluate(PLAYER_COLORS)
    browser.navigate("file://" + os.path.abspath(os.path.join(rundir, "memory.html")))
    if not browser.wait_for("document.body && document.body.dataset.ready === '1'", 30):
        report.check("palette: memory.html draws", ["memory.html did not draw within 30 s"])
        return
    memory = browser.evaluate(MEMORY_COLORS)
    problems = []
    for name, color in {**categories, **states}.items():
        wanted = rgb(color)
        seen = {"player.html legend": player["legend"].get(name), "player.html bar": player["drawn"].get(name),
                "memory.html legend": memory["legend"].get(name), "memory.html band": memory["drawn"].get(name)}
        if name in categories and (seen["player.html legend"] is None or seen["memory.html legend"] is None):
            problems.append(f"{name}: missing from a legend ({seen})")
        if name in states and name in ("UNSHARDED", "FORWARD", "BACKWARD_PRE", "BACKWARD_POST") \
                and (seen["player.html legend"] is None or seen["memory.html legend"] is None):
            problems.append(f"state {name}: missing from a legend ({seen})")
        wrong = {where: found for where, found in seen.items() if found is not None and found != wanted}
        if wrong:
            problems.append(f"{name}: palette.h {color} ({wanted}), but {wrong}")
    clash = sorted(set(categories.values()) & set(states.values()))
    if clash:
        problems.append(f"a state has a category's colour: {clash}")
    state_rgbs = {rgb(color) for color in states.values()}
    for box in player["boxes"]:
        if box["fill"] not in state_rgbs or box["edge"] not in state_rgbs:
            problems.append(f"a unit box's fill {box['fill']} or edge {box['edge']} is no state's colour")
            break
    lanes = set(memory["lanes"]) - state_rgbs
    if lanes:
        problems.append(f"memory.html's unit lanes use {sorted(lanes)}, no state's colour")
    with open(os.path.join(rundir, "trace.json"), encoding="utf-8") as file:
        trace = json.load(file)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    counter = next((e for e in events if e.get("ph") == "C" and set(e.get("args", {})) >= set(categories)), None)
    if counter is None or [name for name in counter["args"] if name in categories] != list(categories):
        problems.append(f"trace.json's memory counter series {list(counter['args']) if counter else None}, "
                        f"palette.h's order {list(categories)}")
    report.check(f"one colour per category ({len(categories)}) and state ({len(states)}): palette.h's, the same in "
                 f"player.html and memory.html ({len(player['drawn'])} bars, {len(memory['drawn'])} band categories "
                 "read), in trace.json's order", problems)


LINES = {}


def open_line(rank, line):
    return LINES[rank][line - 1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rundir")
    parser.add_argument("--screenshot", help="where to save the PNG (default <rundir>/player.png)")
    parser.add_argument("--expect-overlap", action="store_true",
                        help="the run prefetches: check a moment with two units but root UNSHARDED on one rank")
    parser.add_argument("--chromium", help="the browser (default $CHROMIUM or /usr/bin/chromium)")
    args = parser.parse_args()
    chromium = require_chromium(args.chromium)
    page_path = os.path.join(args.rundir, "player.html")
    if not os.path.exists(page_path):
        print(f"FAIL {page_path} does not exist (make it with: trace/fsdptrace player {args.rundir})")
        return 1
    ranks = rank_files(args.rundir)
    for rank in ranks:
        with open(os.path.join(args.rundir, f"rank{rank}.jsonl"), encoding="utf-8") as file:
            LINES[rank] = file.read().split("\n")
    rows = merged(ranks)
    report = Report()
    browser = Browser(chromium, VIEWPORT)
    try:
        load_ms = open_page(browser, page_path)
        count = browser.evaluate("window.player.count()")
        report.check(f"the page holds every event of every rank ({len(rows)})",
                     [] if count == len(rows) else [f"window.player.count() is {count}"])
        check_first_frame(browser, rows, report)
        check_moments(browser, rows, len(ranks), report, args.expect_overlap)
        check_peaks(browser, ranks, rows, args.rundir, report)
        shot_path = args.screenshot or os.path.join(args.rundir, "player.png")
        browser.evaluate("window.player.peak(); window.player.nextCollective()")
        screenshot(browser, shot_path)
        check_palette(browser, args.rundir, report)
        report.check("no console errors or uncaught exceptions", browser.errors())
    finally:
        browser.close()
    print(f"page: {page_path}, {os.path.getsize(page_path):,} bytes, {len(rows)} events; navigation to drawn "
          f"{load_ms:.0f} ms")
    print(f"screenshot: {shot_path}")
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
