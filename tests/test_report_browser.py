"""The report in a real browser: headless Chromium loads reports/<run>/index.html from
file://, driven over the DevTools protocol (--remote-debugging-pipe, so no websocket
library and no TCP port). It must run without console errors or exceptions, request
nothing but the file itself, show every section and draw every figure, and print the same
numbers as the summary tables and the CSV files written beside it. A full-page screenshot
lands in test-artifacts/report.png.

The run directory is built in-process, job by job, with the command the Snakemake rules
run (`tokenflip.cli.main`: prepare-model, generate, compare, probe, summarize, report) on a
tiny random Llama with tests/test_workflow.py's configuration (longer answers, so that some
prompts diverge). About 40 s on two cores, a few of them Chromium's.

Chromium: $CHROMIUM or `chromium` on PATH (`bash .ci/system-packages.sh` installs Debian's);
without one the browser tests fail when CI=true and are skipped otherwise."""

from __future__ import annotations

import base64
import csv
import fcntl
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

from tokenflip.report import _fmt
from test_workflow import MODEL_A, _Rates, write_config

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
    (`tokenflip.cli.main`, job by job): prepared model, cells, pairs, probes, summaries,
    and the rendered report with its CSV tables."""
    from tokenflip import cli
    from tokenflip import config as cfg
    from tokenflip.layout import RunLayout
    from tokenflip.plan import cell_job, expand_cells, expand_pairs, probe_job, probe_targets

    root = tmp_path_factory.mktemp("browser-run")
    raw = yaml.safe_load(write_config(root, {"tiny-llama": MODEL_A}).read_text())
    # Longer answers than test_workflow's, so that bf16 and fp32 part on some prompts and
    # the first-divergence and margin figures have something to draw.
    raw["benchmarks"]["arith"].update(n=6, max_new_tokens=16)
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
            "first": first["result"]["value"], "first_png": base64.b64decode(first_screen["data"])}


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
    expected = {"headline", "overview", "drilldown", "pairs", "figures", "cells", "provenance", "definitions"}
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
        assert row[3] == _pct(c["accuracy"]) and row[7] == str(c["generated_tokens"])
        assert row[4:7] == [str(c["n_stopped"]), str(c["n_no_answer"]), str(c["n_sandbox_errors"])]
        assert row[10].rstrip("…") == c["token_stream_sha256"][:16]


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
    assert [(r[3], r[5], r[9]) for r in dom_kv] == [
        (r["precision"], f"{r['n_diverged']} / {r['n_prompts']}", _fmt(float(r["max_abs_dlogit"]))) for r in kv]
    precision = _read_csv(tables / "precision.csv")
    dom_prec = browser_page["page"]["tables"]["precision-table"]["rows"]
    assert [r[5].split(" ")[0] for r in dom_prec] == [_pct(float(r["exact_agreement"])) for r in precision]


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

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "perf"))
    import report_scale

    root = tmp_path_factory.mktemp("large-report")
    config = report_scale.write_synthetic_summaries(root / "summary")
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


def test_large_report_renders_within_its_size(large_report):
    # Its render time is a goal of perf/report_scale.py (a ratio-free budget there), not asserted here.
    assert large_report["report"].stat().st_size < 10e6
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


def test_large_pairs_table_sorts_and_filters_quickly(large_page):
    i = large_page["interaction"]
    assert i["rows"] == 1520
    assert max(*i["sortMs"], i["filterMs"], i["clearMs"]) < 200, i
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
