"""The report in a real browser: headless Chromium loads reports/<run>/index.html from
file://, driven over the DevTools protocol (--remote-debugging-pipe, so no websocket
library and no TCP port). It must run without console errors or exceptions, request
nothing but the file itself, show every section and draw every figure, and print the same
numbers as the summary tables and the CSV files written beside it. A full-page screenshot
lands in test-artifacts/report.png.

The run directory is built in-process, job by job, with the command the Snakemake rules
run (`tokenflip.cli.main.main`: prepare-model, generate, compare, probe, summarize, report) on a
tiny random Llama with tests/system/test_workflow.py's configuration (longer answers, so that some
prompts diverge). About 40 s on two cores, a few of them Chromium's.

Chromium: $CHROMIUM or `chromium` on PATH (`bash .ci/system-packages.sh` installs Debian's);
without one the browser tests fail when CI=true and are skipped otherwise."""

from __future__ import annotations

import base64
import csv
import fcntl
import html as markup
import json
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from test_workflow import MODEL_A, _Rates, write_config

from conftest import REPO
from tokenflip.report import _fmt

pytestmark = pytest.mark.slow

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                  "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
                  "--remote-debugging-pipe"]
VIEWPORT = (1280, 900)
NARROW = 720


def find_chromium() -> str:
    """Path of a Chromium binary, or fail (CI) / skip (elsewhere) with how to get one."""
    for name in (os.environ.get("CHROMIUM"), *CHROMIUM_CANDIDATES):
        if name and (path := shutil.which(name)):
            return path
    message = ("headless Chromium not found (looked for $CHROMIUM, " + ", ".join(CHROMIUM_CANDIDATES)
               + "); install it with `bash .ci/system-packages.sh` (Debian's `chromium` package)")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def chromium() -> str:
    """Looked up before the run is built, so that a missing browser costs nothing."""
    return find_chromium()


# ----------------------------------------------------------------------------- the run


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict[str, Any]:
    """A real tiny run, built in this process by the command the Snakemake rules call
    (`tokenflip.cli.main.main`, job by job): prepared model, cells, pairs, probes, summaries,
    and the rendered report with its CSV tables."""
    from tokenflip.cli import main as cli
    from tokenflip.core.layout import RunLayout
    from tokenflip.study import config as cfg
    from tokenflip.study.plan import cell_job, expand_cells, expand_pairs, probe_job, probe_targets

    root = tmp_path_factory.mktemp("browser-run")
    raw = yaml.safe_load(write_config(root, {"tiny-llama": MODEL_A}).read_text())
    # Longer answers than test_workflow's, so that bf16 and fp32 part on some prompts and
    # the first-divergence and margin figures have something to draw.
    raw["benchmarks"]["arith"].update(n=6, max_new_tokens=16)
    # fp32 with the cache on, run again: the noise floor the verdicts are judged against.
    raw["grids"].append({"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "repeat": [2]})
    raw["comparisons"].append({"axis": "repeat", "a": "default", "b": 2})
    config = cfg.validate(raw)
    config_json = json.dumps(config, sort_keys=True)
    layout = RunLayout(config["run"], root=str(root))
    models = {name: layout.model_dir(name) for name in config["models"]}
    cells = expand_cells(config)
    jobs = [["prepare-model", "--spec", json.dumps(spec), "--out", models[name]]
            for name, spec in config["models"].items()]
    jobs += [["generate", "--quiet", "--job", cell_job(config, cell).dumps(),
              "--model-dir", models[cell.model], "--out", layout.cell(cell.id)] for cell in cells]
    jobs += [["compare", layout.cell(pair.a.id), layout.cell(pair.b.id),
              "--pair-id", pair.id, "--out", layout.pair(pair.id)]
             for pair in expand_pairs(config, cells)]
    probe_jobs = [probe_job(config, *target) for target in probe_targets(config)]
    jobs += [["probe", "--job", job.dumps(), "--model-dir", models[job.model_name],
              "--out-dir", layout.probe_dir(job.probe, job.model_name, job.benchmark_name),
              "--pairs", *(layout.pair(pair_id) for pair_id in job.explains)] for job in probe_jobs]
    jobs += [["summarize", "--config-json", config_json, "--root", str(root)],
             ["report", "--config-json", config_json, "--root", str(root)]]
    for argv in jobs:
        assert cli.main(argv) == 0, argv
    return {"root": root, "config": config, "summary": Path(layout.summary_dir), "report": Path(layout.report)}


# ------------------------------------------------------------------ DevTools over a pipe


class DevTools:
    """Minimal Chrome DevTools Protocol client over --remote-debugging-pipe: the browser
    reads NUL-terminated JSON commands on fd 3 and writes responses and events on fd 4."""

    def __init__(self, binary: str, user_data_dir: Path):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def child_fds():
            # Through copies above 4: where the pipes themselves got fds 3 and 4 (a process
            # with few files open), dup2 onto themselves would keep them close-on-exec.
            read_end = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            write_end = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}",
             f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
            preexec_fn=child_fds, close_fds=False)  # exec closes every fd but 0-4 (PEP 446)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._responses: dict[int, dict] = {}
        self._inbox: queue.Queue = queue.Queue()
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        while chunk := os.read(self._from_browser, 1 << 16):
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for raw in messages:
                self._inbox.put(json.loads(raw))
        self._inbox.put(None)

    def _pump(self, timeout: float) -> None:
        msg = self._inbox.get(timeout=timeout)
        if msg is None:
            raise RuntimeError(f"Chromium closed the DevTools pipe:\n{self.stderr()}")
        if "id" in msg:
            self._responses[msg["id"]] = msg
        else:
            self.events.append(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30) -> dict:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while self._next_id not in self._responses:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no answer to {method} within {timeout}s")
            self._pump(remaining)
        answer = self._responses.pop(self._next_id)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    def wait_for(self, method: str, session: str | None = None, timeout: float = 30) -> dict:
        seen = 0
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events[seen:]:
                if event["method"] == method and (session is None or event.get("sessionId") == session):
                    return event
            seen = len(self.events)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {method} within {timeout}s")
            try:
                self._pump(remaining)
            except queue.Empty:
                pass

    def settle(self, quiet: float = 0.5) -> None:
        """Drain events until none has arrived for `quiet` seconds."""
        while True:
            try:
                self._pump(quiet)
            except queue.Empty:
                return

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-4000:]

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        self._stderr.close()


# What the page reports about itself once loaded (evaluated in the page, returned as JSON).
PAGE_PROBE = """(() => {
  const box = el => { const r = el.getBoundingClientRect(); return [r.width, r.height]; };
  const text = el => el ? el.textContent.trim() : null;
  const tables = {};
  for (const t of document.querySelectorAll("table[id]")) {
    tables[t.id] = {headers: [...t.querySelectorAll("thead th")].map(text),
                    rows: [...t.querySelectorAll("tbody tr")].map(tr => [...tr.cells].map(text))};
  }
  return {
    title: document.title,
    sections: [...document.querySelectorAll("main > section[id]")].map(s => s.id),
    navTargets: [...document.querySelectorAll("nav a")].map(a => a.getAttribute("href")),
    svgs: [...document.querySelectorAll("figure svg")].map(box),
    figures: document.querySelectorAll("figure").length,
    svgsPerSection: Object.fromEntries([...document.querySelectorAll("main > section[id]")].map(
      sec => [sec.id, sec.querySelectorAll("figure svg").length])),
    rates: Object.fromEntries([...document.querySelectorAll("tr[data-pair]")].map(
      tr => [tr.dataset.pair, text(tr.querySelector("td.rate"))])),
    tables,
    pageWidth: document.documentElement.scrollWidth,
    viewportWidth: window.innerWidth,
    overflowing: [...document.querySelectorAll("main table, main pre, main figure")]
      .filter(el => el.getBoundingClientRect().right > window.innerWidth + 1)
      .map(el => el.id || el.tagName),
    unwrapped: [...document.querySelectorAll("main table")]
      .filter(t => !t.parentElement.classList.contains("table-wrap")).map(t => t.id || "(no id)"),
  };
})()"""


# What the page shows before any click: the first screen (the findings and the first
# figures), the folded tables (a summary line with the row count, the table hidden until it is
# opened, then sortable and filterable), and the navigation, which stays in view to the end.
FIRST_SCREEN_PROBE = """(() => {
  const top = el => el ? el.getBoundingClientRect().top + scrollY : null;
  // The page's own row count (tables.js shows 100 rows at a time), else the rows in the DOM.
  const rows = t => +(t.dataset.rows || (t.tBodies[0] ? t.tBodies[0].rows.length : 0));
  const out = {viewport: innerHeight, headline: top(document.getElementById("headline")),
               firstFigure: top(document.querySelector("main figure svg")),
               sections: [...document.querySelectorAll("main > section[id]")].map(s => s.id),
               folds: [...document.querySelectorAll("details.fold")].map(d => {
                 const t = d.querySelector("table");
                 return {id: t.id, rows: rows(t), summary: d.querySelector("summary").textContent.trim(),
                         open: d.open, visible: t.checkVisibility()};
               }),
               unfolded: [...document.querySelectorAll("main table[id]")].filter(t => !t.closest("details.fold"))
                 .map(t => [t.id, rows(t)])};
  const fold = document.getElementById("pairs-table") && document.getElementById("pairs-table").closest("details.fold");
  if (fold) {
    fold.open = true;
    const table = fold.querySelector("table"), filter = fold.querySelector(".table-filter");
    const head = table.tHead.rows[0].cells;
    const shown = () => [...table.tBodies[0].rows].filter(r => r.checkVisibility());
    const before = shown().map(r => r.dataset.pair);
    head[2].click(); head[2].click();  // "axis: a vs b", descending
    out.opened = {visible: table.checkVisibility(), rows: before.length, filterVisible: !!filter && filter.checkVisibility(),
                  resorted: shown().map(r => r.dataset.pair).join() !== before.join()};
    fold.open = false;
  }
  const nav = document.querySelector("nav");
  scrollTo(0, document.documentElement.scrollHeight);
  const box = nav.getBoundingClientRect();
  out.navAtEnd = {top: box.top, height: box.height, scrolled: scrollY};
  scrollTo(0, 0);
  return out;
})()"""


# A click on a pair's diverged count in the pairs table: afterwards, the block it opened (the
# two texts with the first differing token marked, that step's candidates) and where it is.
DIVERGED_PROBE = """new Promise(done => {
  const link = document.querySelector("#pairs-table tbody a[href^='#diverged-']");
  window.addEventListener("hashchange", () => setTimeout(() => {
    const block = document.getElementById(location.hash.slice(1));
    const prompt = block.querySelector(".diverged-prompt");
    const text = el => el ? el.textContent : null;
    done({hash: location.hash, pair: link.closest("tr").dataset.pair, linkText: link.textContent.trim(),
          open: block.open, top: block.getBoundingClientRect().top,
          sides: [...prompt.querySelectorAll(".side")].map(side => ({
            label: text(side.querySelector(".side-label")), prefix: text(side.querySelector(".prefix")),
            mark: text(side.querySelector("mark.first-diff")), rest: text(side.querySelector(".rest")),
            markVisible: side.querySelector("mark.first-diff").checkVisibility()})),
          head: text(prompt.querySelector(".diverged-head")),
          candidates: [...prompt.querySelectorAll("table.candidates tbody tr")].map(tr => [...tr.cells].map(
            td => text(td.querySelector("code") || td))),
          tied: [...prompt.querySelectorAll("table.candidates tbody tr")].map(tr => [...tr.cells].map(
            td => td.classList.contains("tied") && td.querySelector(".tie-mark") !== null)),
          chosen: [...prompt.querySelectorAll("table.candidates td.chosen")].map(td => [td.cellIndex,
            td.querySelector("code").textContent])});
  }, 0), {once: true});
  link.click();
})"""

# Every section scrolled to the top of a 1280 x 900 window, for its screenshot.
SECTIONS_PROBE = """[...document.querySelectorAll("main > section[id]")].map(s => s.id)"""


NARROW_PROBE = """(() => (document.querySelectorAll("details.fold").forEach(d => { d.open = true; }), {
  pageWidth: document.documentElement.scrollWidth,
  viewportWidth: window.innerWidth,
  scrolling: [...document.querySelectorAll(".table-wrap")].filter(w => w.scrollWidth > w.clientWidth)
    .map(w => w.querySelector("table").id || "(no id)"),
}))()"""


def open_page(tools: DevTools, path: Path, viewport: tuple[int, int] = VIEWPORT) -> tuple[str, int, float]:
    """Open `path` from file:// in a new tab of that size with the Runtime, Log, Network and
    Page events on; returns (session, index of its first event, seconds until loaded)."""
    target = tools.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = tools.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Runtime", "Log", "Network", "Page"):
        tools.send(f"{domain}.enable", session=session)
    tools.send("Emulation.setDeviceMetricsOverride", {"width": viewport[0], "height": viewport[1],
                                                      "deviceScaleFactor": 1, "mobile": False}, session=session)
    start = len(tools.events)
    t0 = time.monotonic()
    nav = tools.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
    assert "errorText" not in nav, nav
    tools.wait_for("Page.loadEventFired", session=session, timeout=60)
    loaded = time.monotonic() - t0
    tools.settle()
    return session, start, loaded


def page_problems(events: list[dict], url: str) -> dict[str, list]:
    """Console errors, exceptions, error log entries and requests for anything but `url`
    (data: URLs, the figures' embedded images, are part of the file)."""
    return {
        "console": [e["params"] for e in events if e["method"] == "Runtime.consoleAPICalled"
                    and e["params"]["type"] in ("error", "assert")],
        "exceptions": [e["params"]["exceptionDetails"] for e in events if e["method"] == "Runtime.exceptionThrown"],
        "log": [e["params"]["entry"] for e in events if e["method"] == "Log.entryAdded"
                and e["params"]["entry"]["level"] == "error"],
        "requests": [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"
                     and e["params"]["request"]["url"] != url
                     and not e["params"]["request"]["url"].startswith("data:")],
    }


@pytest.fixture(scope="module")
def browser_page(chromium, run, tmp_path_factory) -> dict[str, Any]:
    """Load the report in headless Chromium; returns what the page and the protocol saw."""
    tools = DevTools(chromium, tmp_path_factory.mktemp("chromium-profile"))
    try:
        url = run["report"].resolve().as_uri()
        session, start, _ = open_page(tools, run["report"])
        probe = tools.send("Runtime.evaluate", {"expression": PAGE_PROBE, "returnByValue": True},
                           session=session)
        assert "exceptionDetails" not in probe, probe["exceptionDetails"]
        page = probe["result"]["value"]
        first = tools.send("Runtime.evaluate", {"expression": FIRST_SCREEN_PROBE, "returnByValue": True},
                           session=session)
        assert "exceptionDetails" not in first, first["exceptionDetails"]
        first_screen = tools.send("Page.captureScreenshot", {"format": "png"}, session=session, timeout=60)
        diverged = tools.send("Runtime.evaluate", {"expression": DIVERGED_PROBE, "returnByValue": True,
                                                   "awaitPromise": True}, session=session, timeout=60)
        assert "exceptionDetails" not in diverged, diverged["exceptionDetails"]
        sections = {}
        for section in tools.send("Runtime.evaluate", {"expression": SECTIONS_PROBE, "returnByValue": True},
                                  session=session)["result"]["value"]:
            tools.send("Runtime.evaluate", {"expression": f"document.getElementById({json.dumps(section)})"
                                                          ".scrollIntoView()"}, session=session)
            shot = tools.send("Page.captureScreenshot", {"format": "png"}, session=session, timeout=60)
            sections[section] = base64.b64decode(shot["data"])
        tools.send("Runtime.evaluate", {"expression": "scrollTo(0, 0)"}, session=session)

        # A narrow window: wide tables scroll inside their wrappers, the page does not.
        tools.send("Emulation.setDeviceMetricsOverride", {"width": NARROW, "height": VIEWPORT[1],
                                                          "deviceScaleFactor": 1, "mobile": False},
                   session=session)
        narrow = tools.send("Runtime.evaluate", {"expression": NARROW_PROBE, "returnByValue": True},
                            session=session)["result"]["value"]

        # Full page screenshot at the viewport width.
        tools.send("Emulation.setDeviceMetricsOverride", {"width": VIEWPORT[0], "height": VIEWPORT[1],
                                                          "deviceScaleFactor": 1, "mobile": False},
                   session=session)
        height = tools.send("Page.getLayoutMetrics", session=session)["cssContentSize"]["height"]
        tools.send("Emulation.setDeviceMetricsOverride", {"width": VIEWPORT[0], "height": int(height) + 1,
                                                          "deviceScaleFactor": 1, "mobile": False},
                   session=session)
        shot = tools.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                          session=session, timeout=60)
        events = [e for e in tools.events[start:] if e.get("sessionId") == session]
    finally:
        tools.close()
    return {"url": url, "page": page, "narrow": narrow, "events": events, "png": base64.b64decode(shot["data"]),
            "first": first["result"]["value"], "first_png": base64.b64decode(first_screen["data"]),
            "diverged": diverged["result"]["value"], "sections": sections}


# ------------------------------------------------------------------------------ the tests


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def test_report_loads_cleanly_in_chromium(browser_page, artifacts_dir):
    (artifacts_dir / "report.png").write_bytes(browser_page["png"])
    problems = page_problems(browser_page["events"], browser_page["url"])
    assert not problems["console"], problems["console"]
    assert not problems["exceptions"], problems["exceptions"]
    assert not problems["log"], problems["log"]
    # Nothing but the file itself (its figures' embedded images are data: URLs).
    assert not problems["requests"], f"the report must request nothing but itself: {problems['requests']}"
    requested = [e["params"]["request"]["url"] for e in browser_page["events"]
                 if e["method"] == "Network.requestWillBeSent"]
    assert requested[0] == browser_page["url"], requested[:3]
    assert browser_page["png"][:8] == b"\x89PNG\r\n\x1a\n"


def test_every_section_and_figure_renders(browser_page, run):
    page = browser_page["page"]
    expected = {"headline", "overview", "drilldown", "verdicts", "pairs", "figures", "cells", "provenance",
                "definitions"}
    if (run["summary"] / "kv_steps.parquet").exists() and pq.read_metadata(run["summary"] / "kv_steps.parquet").num_rows:
        expected.add("kv-cache")
    pairs = pq.read_table(run["summary"] / "pairs.parquet").to_pylist()
    if any(p["axis"] == "precision" and p["status"] == "done" for p in pairs):
        expected.add("precision")
    assert expected <= set(page["sections"]), page["sections"]
    # Every navigation link leads to a section on the page.
    assert {href.lstrip("#") for href in page["navTargets"]} <= set(page["sections"])
    # Figures are drawn: one SVG per figure, each with a visible box.
    assert page["figures"] >= 3 and len(page["svgs"]) == page["figures"], page["svgs"]
    assert all(w > 100 and h > 50 for w, h in page["svgs"]), page["svgs"]
    first_div = pq.read_table(run["summary"] / "first_divergence.parquet")
    assert first_div.num_rows > 0, "the tiny run should diverge somewhere, or the figures go untested"
    assert page["svgsPerSection"]["figures"] == 2, page["svgsPerSection"]
    assert page["svgsPerSection"]["verdicts"] == 1, page["svgsPerSection"]  # the first-divergence curve
    if "kv-cache" in expected:
        assert page["svgsPerSection"]["kv-cache"] >= 1, page["svgsPerSection"]
    # Wide tables scroll inside their wrapper instead of widening the page.
    assert not page["unwrapped"], page["unwrapped"]
    assert page["pageWidth"] <= page["viewportWidth"], (page["pageWidth"], page["overflowing"])
    narrow = browser_page["narrow"]
    assert narrow["pageWidth"] <= narrow["viewportWidth"], narrow
    assert "pairs-table" in narrow["scrolling"], narrow


def test_dom_numbers_match_the_summary_tables(browser_page, run):
    page = browser_page["page"]
    pairs = pq.read_table(run["summary"] / "pairs.parquet").to_pylist()
    assert page["rates"] == {p["pair_id"]: _pct(p["divergence_rate"]) for p in pairs if p["status"] == "done"}
    cells = pq.read_table(run["summary"] / "cells.parquet").to_pylist()
    dom_cells = {row[0]: row for row in page["tables"]["cells-table"]["rows"]}
    assert set(dom_cells) == {c["cell_id"] for c in cells}
    for c in cells:
        row = dom_cells[c["cell_id"]]
        assert row[1] == c["status"]
        unmeasured = c["n_cut_no_answer"] > c["n_prompts"] / 2
        assert row[3] == ("not measured" if unmeasured else _pct(c["accuracy"]))
        assert row[8] == str(int(c["generated_tokens"]))
        assert row[4:6] == [str(int(c["n_stopped"])), str(int(c["n_no_answer"]))]
        cut = (f"{int(c['n_cut'])} ({int(c['n_cut_no_answer'])} no answer) at {int(c['max_new_tokens'])}"
               if c["n_cut"] else "0")
        assert row[6] == cut
        assert row[7] == str(int(c["n_sandbox_errors"]))
        assert row[11].rstrip("…") == c["token_stream_sha256"][:16]


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_tables_are_written_beside_the_report_as_csv(run):
    """No browser needed: the CSV files against the HTML text and the summary tables."""
    tables = run["report"].parent / "tables"
    written = sorted(p.name for p in tables.iterdir())
    assert {"pairs.csv", "cells.csv", "kv_cache.csv", "precision.csv", "interventions.csv"} <= set(written)
    # One CSV per table with an id in the report (the provenance tables are metadata, not data).
    html = run["report"].read_text()
    table_ids = re.findall(r'<table id="([^"]+)"', html)
    assert len(written) == len(table_ids), (written, table_ids)
    rows = _read_csv(tables / "pairs.csv")
    pairs = pq.read_table(run["summary"] / "pairs.parquet").to_pylist()
    assert len(rows) == len(pairs) and {r["pair_id"] for r in rows} == {p["pair_id"] for p in pairs}
    # The CSV holds the full-precision numbers the HTML shows rounded.
    parser = _Rates()
    parser.feed(html)
    assert parser.rates == {r["pair_id"]: _pct(float(r["divergence_rate"])) for r in rows if r["status"] == "done"}
    by_id = {p["pair_id"]: p for p in pairs}
    assert all(float(r["divergence_rate"]) == by_id[r["pair_id"]]["divergence_rate"] for r in rows)
    assert [r["cell_id"] for r in _read_csv(tables / "cells.csv")] == sorted(
        c["cell_id"] for c in pq.read_table(run["summary"] / "cells.parquet").to_pylist())


def test_csv_tables_match_the_rendered_dom(browser_page, run):
    tables = run["report"].parent / "tables"
    kv = _read_csv(tables / "kv_cache.csv")
    dom_kv = browser_page["page"]["tables"]["kv-table"]["rows"]
    assert [(r[2], r[4], r[6], r[10]) for r in dom_kv] == [
        (r["engine"], r["precision"], f"{int(float(r['n_diverged']))} / {int(float(r['n_prompts']))}",
         _fmt(float(r["max_abs_dlogit"])))
        for r in kv]
    precision = _read_csv(tables / "precision.csv")
    dom_prec = browser_page["page"]["tables"]["precision-table"]["rows"]
    assert [r[6].split(" ")[0] for r in dom_prec] == [_pct(float(r["exact_agreement"])) for r in precision]


# ------------------------------------------------------------------- a large study's report


LARGE_VIEWPORT = (1400, 900)

# Per overview figure: its box and, for every pair of its text elements (tick labels, cell
# annotations, titles: matplotlib writes each as <g id="text_N">) whose boxes intersect by
# more than a pixel each way, their texts' ids.
OVERVIEW_PROBE = """(() => {
  const out = {};
  for (const fig of document.querySelectorAll("#overview figure")) {
    const svg = fig.querySelector("svg"), box = svg.getBoundingClientRect();
    const texts = [...svg.querySelectorAll('g[id^="text_"]')].filter(g => !g.querySelector('g[id^="text_"]'))
      .map(g => [g.id, g.getBoundingClientRect()]).filter(([, r]) => r.width > 0 && r.height > 0);
    const overlaps = [];
    for (let i = 0; i < texts.length; i++)
      for (let j = i + 1; j < texts.length; j++) {
        const [a, r] = texts[i], [b, s] = texts[j];
        const dx = Math.min(r.right, s.right) - Math.max(r.left, s.left);
        const dy = Math.min(r.bottom, s.bottom) - Math.max(r.top, s.top);
        if (dx > 1 && dy > 1) overlaps.push([a, b]);
      }
    out[fig.id] = {width: box.width, height: box.height, right: box.right, texts: texts.length, overlaps,
                   links: [...svg.querySelectorAll("a")].map(a => a.getAttribute("xlink:href") || a.getAttribute("href"))};
  }
  return {figures: out, viewportWidth: innerWidth, pageWidth: document.documentElement.scrollWidth};
})()"""

# A click on a model's name in the divergence heatmap: afterwards, the pair rows shown and
# the drill-down's status line.
DRILL_PROBE = """new Promise(done => {
  window.addEventListener("hashchange", () => setTimeout(() => done({
    hash: location.hash,
    first: [...document.querySelectorAll("#pairs-table tbody tr")].map(tr => tr.dataset.pair),
    count: document.querySelector("#pairs .table-tools span").textContent,
    pairs: (document.querySelector("#pairs .show-all").click(),
            [...document.querySelectorAll("#pairs-table tbody tr")].map(tr => tr.dataset.pair)),
    drill: [...document.querySelectorAll("#drilldown-table tbody tr")].map(tr => tr.cells[0].textContent.trim()),
    cells: [...document.querySelectorAll("#cells-table tbody tr")].map(tr => tr.cells[0].textContent.trim()),
    status: document.getElementById("drill-status").textContent,
    title: document.getElementById("drill-title").textContent,
    drilldownTop: document.getElementById("drilldown").getBoundingClientRect().top,
    drillOpen: [...document.querySelectorAll("#drilldown details.fold")].map(d => d.open),
  }), 0), {once: true});
  const link = [...document.querySelectorAll("#ov-divergence svg a")]
    .find(a => (a.getAttribute("xlink:href") || a.getAttribute("href")) === "#model=m3");
  link.dispatchEvent(new MouseEvent("click", {bubbles: true, cancelable: true}));
})"""


@pytest.fixture(scope="module")
def large_report(tmp_path_factory) -> dict[str, Any]:
    """perf/report_scale.py's synthetic study (960 cells, 1,520 pairs, both probes at 30
    layers x 10 models) as summary tables, rendered by `tokenflip.report.render`."""
    import sys

    from tokenflip.report import render

    sys.path.insert(0, str(REPO / "perf"))
    import report_scale

    root = tmp_path_factory.mktemp("large-report")
    config = report_scale.write_synthetic_summaries(root / "summary")
    _write_synthetic_diverged(root / "summary")
    t0 = time.monotonic()
    report = render(root / "summary", root / "report" / "index.html", config)
    return {"report": report, "summary": root / "summary", "seconds": time.monotonic() - t0}


@pytest.fixture(scope="module")
def large_page(chromium, large_report, tmp_path_factory) -> dict[str, Any]:
    """The large report in Chromium at 1400 px: the overview's figures, sorting and filtering
    the pairs table, a drill-down from the overview, and a screenshot of the overview."""
    import report_scale

    tools = DevTools(chromium, tmp_path_factory.mktemp("chromium-profile-large"))
    try:
        url = large_report["report"].resolve().as_uri()
        session, start, _ = open_page(tools, large_report["report"], LARGE_VIEWPORT)

        def evaluate(expression: str) -> Any:
            answer = tools.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                     "awaitPromise": True}, session=session, timeout=60)
            assert "exceptionDetails" not in answer, answer["exceptionDetails"]
            return answer["result"]["value"]

        overview = evaluate(OVERVIEW_PROBE)
        top, height = evaluate("(() => { const r = document.getElementById('overview').getBoundingClientRect();"
                               " return [r.top + scrollY, r.height]; })()")
        shot = tools.send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": LARGE_VIEWPORT[0], "height": top + height, "scale": 1}},
            session=session, timeout=60)
        first = evaluate(FIRST_SCREEN_PROBE)
        interaction = evaluate(report_scale.INTERACTION_PROBE)
        drill = evaluate(DRILL_PROBE)
        events = [e for e in tools.events[start:] if e.get("sessionId") == session]
    finally:
        tools.close()
    return {"url": url, "overview": overview, "interaction": interaction, "drill": drill, "first": first,
            "problems": page_problems(events, url), "png": base64.b64decode(shot["data"])}


def _write_synthetic_diverged(summary: Path) -> None:
    """The synthetic study's diverged prompts as text: every first-divergence row with two
    completions of about 500 tokens (2,000 characters) and a top-8 on both sides."""
    import pandas as pd
    import pyarrow as pa

    from tokenflip.analysis.texts import COLUMNS
    from tokenflip.core import storage

    first = pq.read_table(summary / "first_divergence.parquet").to_pandas()
    topk = json.dumps([[f" tok{i}", i, 10.0 - i / 8] for i in range(8)])
    rows = first.assign(a="fp16", b="bf16", engine="transformers", step=first["first_div_step"].astype(int),
                        prefix_chars=700, token_a=" She", token_b=" Every",
                        text_a="Janet's ducks lay 16 eggs per day. " * 20 + " She" + " eats three for breakfast " * 52,
                        text_b="Janet's ducks lay 16 eggs per day. " * 20 + " Every" + " morning she bakes " * 72,
                        token_id_a=0, token_id_b=1, margin_a=0.01, margin_b=0.02,
                        topk_a=topk, topk_b=topk, correct_a=True, correct_b=False, verdict_a="right",
                        verdict_b="wrong", extracted_a="18", extracted_b="16", finish_a="eos", finish_b="length",
                        n_tokens_a=500, n_tokens_b=512)
    frame = rows.reindex(columns=COLUMNS)
    storage.write_table(pa.Table.from_pandas(pd.DataFrame(frame), preserve_index=False),
                        summary / "diverged.parquet", {"kind": "summary", "table": "diverged", "run": "large"})


def test_large_report_renders_within_its_size(large_report):
    # Its render time is a goal of perf/report_scale.py (a ratio-free budget there), not asserted here.
    # Every diverged prompt is in tables/diverged.csv; the page shows a bounded number as text.
    from tokenflip.report.diverged import INDEX_ROWS, SHOWN_IN_ALL

    assert large_report["report"].stat().st_size < 10e6
    html = large_report["report"].read_text()
    diverged = pq.read_metadata(large_report["summary"] / "diverged.parquet").num_rows
    assert diverged > INDEX_ROWS and html.count('<div class="diverged-prompt">') == SHOWN_IN_ALL
    with open(large_report["report"].parent / "tables" / "diverged.csv", newline="") as fh:
        assert sum(1 for _ in csv.DictReader(fh)) == diverged
    pairs = pq.read_metadata(large_report["summary"] / "pairs.parquet").num_rows
    cells = pq.read_metadata(large_report["summary"] / "cells.parquet").num_rows
    assert (cells, pairs) == (960, 1520)


def test_large_report_overview_is_legible(large_page, artifacts_dir):
    (artifacts_dir / "report-large-overview.png").write_bytes(large_page["png"])
    assert large_page["png"][:8] == b"\x89PNG\r\n\x1a\n"
    problems = large_page["problems"]
    assert not any(problems.values()), problems
    overview = large_page["overview"]
    figures = overview["figures"]
    assert {"ov-divergence", "ov-ear", "ov-lift", "ov-kv-drift", "ov-precision-drift", "ov-grafting",
            "ov-lens"} <= set(figures), list(figures)
    assert overview["pageWidth"] <= overview["viewportWidth"]
    for name, fig in figures.items():
        assert fig["texts"] > 10, (name, fig)
        assert not fig["overlaps"], (name, fig["overlaps"])
        assert fig["height"] <= 2 * LARGE_VIEWPORT[1] and fig["right"] <= overview["viewportWidth"], (name, fig)
        # Every model's row label leads to its drill-down.
        assert {f"#model=m{i}" for i in range(10)} <= set(fig["links"]), (name, fig["links"])


def test_large_pairs_table_sorts_and_filters_a_bounded_page_of_rows(large_page):
    # How fast that is, is a goal of perf/report_scale.py (200 ms), not asserted here: what
    # keeps it fast is that a sort or a filter never puts more than a page of rows in the page.
    i = large_page["interaction"]
    assert i["rows"] == 1520
    assert i["sortShown"] == [100] * 5, i
    # 'm3' matches its 152 pairs; 100 rows at a time are shown, the rest behind "show all".
    assert i["filteredRows"] == "100 shown; 152 of 1520 rows, first 100 shown", i
    assert i["clearedRows"] == "100 shown; 1520 rows, first 100 shown", i


def test_large_report_drills_down_to_a_model_from_the_overview(large_page, large_report):
    drill = large_page["drill"]
    pairs = pq.read_table(large_report["summary"] / "pairs.parquet", columns=["pair_id", "model"]).to_pylist()
    assert drill["hash"] == "#model=m3"
    assert drill["count"] == "152 of 1520 rows, first 100 shown" and len(drill["first"]) == 100
    assert sorted(drill["pairs"]) == sorted(p["pair_id"] for p in pairs if p["model"] == "m3")
    assert drill["drill"] and set(drill["drill"]) == {"m3"}
    assert drill["cells"] and all(c.startswith("m3/") for c in drill["cells"])
    assert "model m3" in drill["status"] and drill["title"] == "model m3"
    assert abs(drill["drilldownTop"]) < 60, drill["drilldownTop"]  # scrolled to the drill-down
    assert drill["drillOpen"] == [True]  # its folded table opened: its rows are the answer


def test_the_first_screen_shows_the_findings_and_the_first_figures(browser_page, artifacts_dir):
    (artifacts_dir / "report-first-screen.png").write_bytes(browser_page["first_png"])
    first = browser_page["first"]
    assert first["headline"] < first["viewport"] and first["firstFigure"] < first["viewport"], first
    # A study on a model of neither paper is no reproduction: its own sections come first, the
    # papers rows with data after its figures, folded.
    sections = first["sections"]
    assert sections.index("paper") > sections.index("figures"), sections
    paper = [f for f in first["folds"] if f["id"] == "paper-table"]
    assert paper and not paper[0]["open"] and paper[0]["summary"].startswith(f"{paper[0]['rows']} rows"), paper


def test_long_tables_are_folded_with_their_row_count_and_open_sortable(browser_page, large_page):
    for first in (browser_page["first"], large_page["first"]):
        folds = {f["id"]: f for f in first["folds"]}
        wrong = {name: f for name, f in folds.items() if name != "paper-table" and not (
            f["rows"] > 15 and f["summary"].startswith(f"{f['rows']} ") and not f["open"] and not f["visible"])}
        assert not wrong, wrong
        assert all(rows <= 15 for name, rows in first["unfolded"]), first["unfolded"]
    folds = {f["id"]: f for f in large_page["first"]["folds"]}
    assert {"pairs-table", "cells-table", "drilldown-table"} <= set(folds), list(folds)
    assert folds["pairs-table"]["summary"].startswith("1520 pairs")
    # Opened, the pairs table shows its first 100 rows (the rest behind "show all"), its filter,
    # and sorts on a click.
    opened = large_page["first"]["opened"]
    assert opened["visible"] and opened["rows"] == 100 and opened["filterVisible"] and opened["resorted"], opened


def test_the_navigation_stays_in_view_while_scrolling(browser_page):
    nav = browser_page["first"]["navAtEnd"]
    assert nav["scrolled"] > 1000 and nav["top"] == 0 and nav["height"] > 10, nav


# ------------------------------------------------------------ what changed, as text


def _diverged_rows(run) -> list[dict[str, Any]]:
    return pq.read_table(run["summary"] / "diverged.parquet").to_pylist()


def test_diverged_texts_are_the_prepared_tokenizers_decoding_of_the_stored_ids(run):
    """No browser needed: every diverged prompt's two texts, split at the first differing
    token, are exactly the prepared tokenizer's decoding of the ids the cells stored (and
    the text the cells scored); the candidates are the stored top-k of that step."""
    from tokenflip.analysis import texts as completions
    from tokenflip.core import storage
    from tokenflip.core.layout import RunLayout
    from tokenflip.models.prepare import load_tokenizer

    rows = _diverged_rows(run)
    first_div = pq.read_table(run["summary"] / "first_divergence.parquet").to_pylist()
    assert rows and sorted((r["pair_id"], r["prompt_id"], r["step"]) for r in rows) == sorted(
        (r["pair_id"], r["prompt_id"], r["first_div_step"]) for r in first_div)
    layout = RunLayout(run["config"]["run"], root=str(run["root"]))
    pairs = {p["pair_id"]: p for p in pq.read_table(run["summary"] / "pairs.parquet").to_pylist()}
    tokenizers = {}
    for row in rows:
        row.update(completions.parts(row))
        pair = pairs[row["pair_id"]]
        tokenizer = tokenizers.setdefault(pair["model"], load_tokenizer(layout.model_dir(pair["model"])))
        cells = {}
        for side in "ab":
            table, _ = storage.read_cell(layout.cell(pair[f"cell_{side}"]))
            cells[side] = next(r for r in table.to_pylist() if r["prompt_id"] == row["prompt_id"])
        step = row["step"]
        assert cells["a"]["token_ids"][:step] == cells["b"]["token_ids"][:step]
        assert cells["a"]["token_ids"][step:step + 1] != cells["b"]["token_ids"][step:step + 1]
        for side in "ab":
            stored = cells[side]
            decoded = tokenizer.decode(stored["token_ids"], skip_special_tokens=True)
            assert row["prefix"] + row[f"token_{side}"] + row[f"rest_{side}"] == decoded == row[f"text_{side}"]
            assert decoded == stored["text"]
            assert row[f"token_id_{side}"] == stored["token_ids"][step]
            assert [c[1] for c in json.loads(row[f"topk_{side}"])] == list(stored["top_ids"][step])
            assert [c[0] for c in json.loads(row[f"topk_{side}"])] == [
                tokenizer.decode([i], skip_special_tokens=True) for i in stored["top_ids"][step]]
    written = _read_csv(run["report"].parent / "tables" / "diverged.csv")
    assert sorted((r["pair_id"], r["prompt_id"], r["text_a"], r["text_b"]) for r in written) == sorted(
        (r["pair_id"], r["prompt_id"], r["text_a"], r["text_b"]) for r in rows)


def test_every_diverged_prompt_is_labelled_and_every_pair_judged(run):
    """No browser needed: each diverged prompt's label holds for the stored cells (a near-tie
    is a margin within one step of its side's precision between its top two logits; anything
    else has both margins wider), a rejoin is four tokens of a again in b, every finished pair
    has a verdict against the floor the repeat measured, and the page says both."""
    from tokenflip.analysis.causes import CAUSES, step_between
    from tokenflip.analysis.compare import cause_column
    from tokenflip.core import storage
    from tokenflip.core.layout import RunLayout

    rows = _diverged_rows(run)
    layout = RunLayout(run["config"]["run"], root=str(run["root"]))
    pairs = {p["pair_id"]: p for p in pq.read_table(run["summary"] / "pairs.parquet").to_pylist()}
    assert rows
    for row in rows:
        assert row["cause"] in CAUSES and row["cause"] not in ("sampled", "no logits"), row["cause"]
        pair = pairs[row["pair_id"]]
        cells = {}
        for side in "ab":
            table, meta = storage.read_cell(layout.cell(pair[f"cell_{side}"]))
            cells[side] = (next(r for r in table.to_pylist() if r["prompt_id"] == row["prompt_id"]),
                           meta["cell"]["precision"])
        step = int(row["step"])
        if row["cause"] == "ended":
            assert min(len(c["token_ids"]) for c, _ in cells.values()) == step
            continue
        slack = [c["margin"][step] - step_between(*sorted((c["top_logits"][step][0], c["top_logits"][step][1]),
                                                          key=abs, reverse=True), prec)
                 for c, prec in cells.values()]
        tie = min(c["margin"][step] for c, _ in cells.values()) == 0
        assert tie == (row["cause"] == "exact tie")
        assert (min(slack) <= 0 and not tie) == (row["cause"] == "near-tie"), (row["cause"], slack)
        a, b = cells["a"][0]["token_ids"], cells["b"][0]["token_ids"]
        if row["rejoin_step"] is not None:
            r = int(row["rejoin_step"])
            run_of_a = a[r:r + 4]
            assert len(run_of_a) == 4 and any(b[j:j + 4] == run_of_a for j in range(step, len(b)))
    done = [p for p in pairs.values() if p["status"] == "done"]
    assert all(p["verdict"] for p in done)
    floor = next(p for p in done if p["axis"] == "repeat")
    assert floor["verdict"] == "noise floor"
    judged = [p for p in done if floor["cell_a"] in (p["cell_a"], p["cell_b"]) and p["axis"] != "repeat"]
    assert judged and all(p["verdict"] != "no floor" for p in judged)
    for p in done:
        assert sum(p[cause_column(c)] for c in CAUSES) == p["n_diverged"]
    repeats = pq.read_table(run["summary"] / "repeats.parquet").to_pylist()
    assert [(r["cell_id"], r["runs"]) for r in repeats] == [(floor["cell_a"], 2)]
    html = run["report"].read_text()
    assert 'id="noise-floor-table"' in html and 'id="fig-still-identical"' in html
    body = re.search(r'<table id="diverged-table">.*?<tbody>(.*?)</tbody>', html, re.S).group(1)
    shown = [_text(re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)[9]) for tr in re.findall(r"<tr>(.*?)</tr>", body, re.S)]
    assert sorted(shown) == sorted(r["cause"] for r in rows)


def _headline(html: str) -> list[str]:
    block = re.search(r'<section id="headline">(.*?)</section>', html, re.S).group(1)
    return [_text(li) for li in re.findall(r"<li>(.*?)</li>", block, re.S)]


def _text(fragment: str) -> str:
    """An HTML fragment's text, as the browser shows it (tags dropped, entities decoded,
    white space collapsed)."""
    return re.sub(r"\s+", " ", markup.unescape(re.sub(r"<[^>]+>", "", fragment))).strip()


def test_a_study_whose_completions_are_all_cut_says_so(run):
    """The tiny random model never stops (a base model's habit): every completion is cut at
    max_new_tokens before any answer, and the findings, the accuracies and "same answer" say so."""
    cells = pq.read_table(run["summary"] / "cells.parquet").to_pylist()
    assert all(c["n_cut"] == c["n_cut_no_answer"] == c["n_prompts"] for c in cells), cells
    limit = run["config"]["benchmarks"]["arith"]["max_new_tokens"]
    html = run["report"].read_text()
    assert _headline(html)[0] == (
        f"In {len(cells)} of {len(cells)} cells most completions were cut at the token limit ({limit} tokens) "
        "before any answer: their accuracy is not measured (the Cells table's \"cut\" column; raise max_new_tokens).")
    pairs = [p for p in pq.read_table(run["summary"] / "pairs.parquet").to_pylist() if p["status"] == "done"]
    assert all(p["n_agree_without_answer"] == p["n_prompts"] for p in pairs)
    assert html.count("with no answer on either side)") == len(pairs)
    assert html.count('<small class="cut"') == 2 * len(pairs) + len(cells)


def _table_rows(html: str, table_id: str) -> list[list[str]]:
    body = re.search(rf'<table id="{table_id}">.*?<tbody>(.*?)</tbody>', html, re.S).group(1)
    return [[_text(td) for td in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
            for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)]


def test_an_engines_study_never_pools_two_engines(run, tmp_path):
    """The KV-cache table and bullets of a study with two engines: an engine column, and one
    bullet per model, engine and precision (rendered from the tiny run's summaries with each
    cache pair's row repeated as another engine's)."""
    import pandas as pd
    import pyarrow as pa

    from tokenflip.core import storage
    from tokenflip.report import render

    summary = tmp_path / "summary"
    shutil.copytree(run["summary"], summary)
    table, meta = storage.read_table(summary / "pairs.parquet")
    pairs = table.to_pandas()
    other = pairs[pairs["axis"] == "cache"].assign(engine="llama.cpp", n_diverged=1,
                                                   pair_id=lambda d: d["pair_id"] + "-llama.cpp")
    storage.write_table(pa.Table.from_pandas(pd.concat([pairs, other], ignore_index=True), preserve_index=False),
                        summary / "pairs.parquet", {k: meta[k] for k in ("kind", "table", "run")})
    html = render(summary, tmp_path / "index.html", run["config"]).read_text()
    kv = _table_rows(html, "kv-table")
    assert sorted((r[2], r[4]) for r in kv) == sorted(
        [("transformers", p) for p in pairs.loc[pairs["axis"] == "cache", "precision"]]
        + [("llama.cpp", p) for p in other["precision"]])
    claims = re.search(r'<ul class="headline" id="kv-claims">(.*?)</ul>', html, re.S).group(1)
    bullets = [_text(li) for li in re.findall(r"<li[^>]*>(.*?)</li>", claims, re.S)]
    per_group = [b for b in bullets if " prompts diverged;" in b]
    assert {b.split(":")[0] for b in per_group} == {f"tiny-llama, {e}, {p}" for e in ("transformers", "llama.cpp")
                                                     for p in set(pairs.loc[pairs["axis"] == "cache", "precision"])}
    lines = [line for line in _headline(html) if line.startswith("KV cache on vs off")]
    assert len(lines) == 2 and sum("inference engine llama.cpp" in line for line in lines) == 1, lines


def test_a_diverged_pair_opens_side_by_side_from_the_pairs_table(browser_page, run):
    from tokenflip.analysis.texts import parts
    from tokenflip.report.diverged import PREFIX_CHARS, visible

    got = browser_page["diverged"]
    assert got["hash"].startswith("#diverged-") and got["open"] and abs(got["top"]) < 60, got
    rows = sorted((r for r in _diverged_rows(run) if r["pair_id"] == got["pair"]),
                  key=lambda r: (r["step"], r["prompt_id"]))
    pair = next(p for p in pq.read_table(run["summary"] / "pairs.parquet").to_pylist() if p["pair_id"] == got["pair"])
    assert got["linkText"] == str(pair["n_diverged"]) == str(len(rows))
    first = {**rows[0], **parts(rows[0])}
    assert f"prompt {first['prompt_id']} · parted at step {first['step']}" in re.sub(r"\s+", " ", got["head"])
    for side, shown in zip("ab", got["sides"]):
        assert shown["label"] == f"{side}: {first[side]}"
        assert shown["prefix"] == first["prefix"][-PREFIX_CHARS:]
        assert shown["mark"] == (first[f"token_{side}"] or "(ended)") and shown["markVisible"]
        assert first[f"rest_{side}"].startswith(shown["rest"])
    candidates = json.loads(first["topk_a"])
    assert [row[1] for row in got["candidates"]] == [visible(c[0]) for c in candidates]
    assert [row[2] for row in got["candidates"]] == [_fmt(c[2], 4) for c in candidates]
    chosen = {index: text for index, text in got["chosen"]}
    assert chosen[1] == visible(next(c[0] for c in candidates if c[1] == first["token_id_a"]))
    assert chosen[3] == visible(next(c[0] for c in json.loads(first["topk_b"]) if c[1] == first["token_id_b"]))
    # Exact ties of a side's top logit are marked in that side's column, and nothing else is.
    for column, side in ((1, "a"), (3, "b")):
        logits = [c[2] for c in json.loads(first[f"topk_{side}"])]
        tied = [logit == max(logits) and logits.count(max(logits)) > 1 for logit in logits]
        assert [row[column] for row in got["tied"]] == tied
        assert not any(row[column + 1] for row in got["tied"])


def test_every_section_has_a_screenshot_at_1280_by_900(browser_page, artifacts_dir):
    sections = browser_page["sections"]
    assert {"headline", "pairs", "diverged", "cells", "provenance"} <= set(sections), list(sections)
    for name, png in sections.items():
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert int.from_bytes(png[16:20], "big") == VIEWPORT[0] and int.from_bytes(png[20:24], "big") == VIEWPORT[1]
        (artifacts_dir / f"report-section-{name}.png").write_bytes(png)


# ------------------------------------------------------ text that would act on its reader


HYPERLINK = '=HYPERLINK("http://example.invalid/","open me")'
HOSTILE = {"text_a": HYPERLINK + " then \u202egnp.exe\0 after a NUL", "token_a": "=HYPERLINK(",
           "text_b": "+cmd|' /C calc'!A0 and more", "token_b": "+cmd", "extracted_a": "@SUM(1+1)",
           "extracted_b": "-5", "margin_a": -0.5}


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory) -> dict[str, Any]:
    """A report whose diverged completions start with spreadsheet formulas and hold a bidi
    override and a NUL: perf/report_scale.py's synthetic summaries of one model, with the
    first two diverging pairs' prompts as `HOSTILE` texts (split at the first character)."""
    import sys

    import pandas as pd
    import pyarrow as pa

    from tokenflip.analysis.texts import COLUMNS
    from tokenflip.core import storage
    from tokenflip.report import render

    sys.path.insert(0, str(REPO / "perf"))
    import report_scale

    root = tmp_path_factory.mktemp("hostile-report")
    summary = root / "summary"
    config = report_scale.write_synthetic_summaries(summary, models=1, missing_cells=0)
    first = pq.read_table(summary / "first_divergence.parquet").to_pandas()
    first = first[first["pair_id"].isin(first["pair_id"].drop_duplicates().head(2))]
    topk = json.dumps([["=1+1", 0, 10.0], [" \u202ex", 1, 9.5]])
    rows = first.assign(a="fp16", b="bf16", engine="transformers", step=first["first_div_step"].astype(int),
                        prefix_chars=0, token_id_a=0, token_id_b=1, margin_b=0.02, topk_a=topk, topk_b=topk,
                        correct_a=True, correct_b=False, verdict_a="right", verdict_b="wrong", finish_a="eos",
                        finish_b="length", n_tokens_a=12, n_tokens_b=16, **HOSTILE)
    storage.write_table(pa.Table.from_pandas(pd.DataFrame(rows.reindex(columns=COLUMNS)), preserve_index=False),
                        summary / "diverged.parquet", {"kind": "summary", "table": "diverged", "run": config["run"]})
    report = render(summary, root / "report" / "index.html", config)
    return {"report": report, "tables": report.parent / "tables", "rows": len(rows)}


def test_a_reports_csv_files_open_in_a_spreadsheet_as_text(hostile_report):
    """No browser needed: every CSV beside the report, opened as a spreadsheet opens it
    (tests/report/test_exports.py: each field into an openpyxl cell, a number where it reads as
    one), has no formula, and the completions read as written."""
    from test_exports import _formulas, _spreadsheet

    pytest.importorskip("openpyxl")
    tables = sorted(hostile_report["tables"].glob("*.csv"))
    assert "diverged.csv" in {p.name for p in tables} and len(tables) > 5
    for path in tables:
        assert _formulas(_spreadsheet(path)) == [], path.name
    sheet = _spreadsheet(hostile_report["tables"] / "diverged.csv")
    header = [cell.value for cell in sheet[1]]
    rows = [dict(zip(header, [cell.value for cell in r])) for r in list(sheet.iter_rows())[1:]]
    assert len(rows) == hostile_report["rows"] > 1
    for row in rows:
        assert row["text_a"] == "'" + HYPERLINK + " then ⟨U+202E⟩gnp.exe after a NUL"
        assert row["text_b"] == "'+cmd|' /C calc'!A0 and more" and row["extracted_a"] == "'@SUM(1+1)"
        assert row["extracted_b"] == -5 and row["margin_a"] == -0.5  # numbers stay numbers
    html = hostile_report["report"].read_text()
    assert "\u202e" not in html and "\0" not in html and 'href="http://example.invalid' not in html
    assert 'id="csv-safety"' in html


HOSTILE_PROBE = """(() => {
  const prompt = document.querySelector(".diverged-prompt");
  const side = s => prompt.querySelector(".side-" + s + " .completion");
  const body = document.body.textContent;
  return {a: side("a").textContent, b: side("b").textContent,
          marks: [...prompt.querySelectorAll("mark.first-diff")].map(m => m.textContent),
          candidates: [...prompt.querySelectorAll("table.candidates code")].map(c => c.textContent),
          links: [...document.querySelectorAll("a[href]")].map(a => a.getAttribute("href"))
            .filter(h => h.includes("example.invalid")),
          controls: [...body].filter(ch => /[\\u0000\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069]/.test(ch)).length,
          shown: body.includes("⟨U+202E⟩"), csvNote: document.getElementById("csv-safety").nextElementSibling.textContent};
})()"""


def test_a_completion_that_starts_with_a_formula_shows_as_text_in_chromium(chromium, hostile_report,
                                                                           tmp_path_factory):
    tools = DevTools(chromium, tmp_path_factory.mktemp("chromium-profile-hostile"))
    try:
        url = hostile_report["report"].resolve().as_uri()
        session, start, _ = open_page(tools, hostile_report["report"])
        answer = tools.send("Runtime.evaluate", {"expression": HOSTILE_PROBE, "returnByValue": True}, session=session)
        assert "exceptionDetails" not in answer, answer["exceptionDetails"]
        events = [e for e in tools.events[start:] if e.get("sessionId") == session]
    finally:
        tools.close()
    page = answer["result"]["value"]
    assert not any(page_problems(events, url).values()), page_problems(events, url)
    assert page["marks"] == ["=HYPERLINK(", "+cmd"]
    assert page["a"] == HYPERLINK + " then ⟨U+202E⟩gnp.exe⟨U+0000⟩ after a NUL"
    assert page["b"] == "+cmd|' /C calc'!A0 and more"
    assert page["candidates"] == ["=1+1", "=1+1", "␣⟨U+202E⟩x", "␣⟨U+202E⟩x"]  # rank by rank, a then b
    assert page["links"] == [] and page["controls"] == 0 and page["shown"]
    assert "leading '" in " ".join(page["csvNote"].split())
