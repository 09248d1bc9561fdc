"""The README and the reference pages in docs/ link each other, and nothing links nowhere.

What each page says is kept true by the tests that read it: docs/papers.md by
test_paper_rows.py (every papers row with its population), docs/extending.md's examples by
test_extending.py (taken from that page and run)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex

from conftest import REPO

# A Markdown link: its target (empty for one on the same page) and its anchor, if any.
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)")


def _local_links(path):
    return [m.group(1) for m in LINK.finditer(path.read_text(encoding="utf-8"))
            if m.group(1) and "://" not in m.group(1)]


def test_every_docs_page_is_linked_from_the_readme():
    linked = {target for target in _local_links(REPO / "README.md")
              if target.startswith("docs/") and target.endswith(".md")}
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages and pages == linked, (pages, linked)


def test_no_local_link_leads_nowhere():
    broken = [(page.name, target) for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
              for target in _local_links(page) if not (page.parent / target).exists()]
    assert not broken, broken


DOC_PAGES = [REPO / "README.md", REPO / "config" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.M)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped (hyphens
    and underscores kept), spaces as hyphens; inline code and links read as their text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path) -> set[str]:
    """Every heading's anchor on a page (a repeated heading gets -1, -2, … as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    for heading in HEADING.findall(text):
        slug = github_anchor(heading)
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def test_github_anchors_are_made_as_github_makes_them():
    assert github_anchor("What a study costs: `tokenflip plan --cost`") == "what-a-study-costs-tokenflip-plan---cost"
    assert github_anchor("A live vLLM server (config/endpoint.yaml)") == "a-live-vllm-server-configendpointyaml"
    assert github_anchor("What `make test` needs") == "what-make-test-needs"


def test_every_link_anchor_names_a_heading_of_its_page():
    broken = []
    for page in DOC_PAGES:
        for target, anchor in LINK.findall(page.read_text(encoding="utf-8")):
            if not anchor or "://" in target:
                continue
            linked = (page.parent / target) if target else page
            if linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(REPO)}: {target or '(this page)'}#{anchor}")
    assert broken == []


FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)
INLINE = re.compile(r"`(tokenflip [^`]+)`")


def documented_commands() -> list[tuple[str, str]]:
    """Every `tokenflip …` command the README and docs show: in shell blocks (comments and
    line continuations read as a shell reads them) and in inline code."""
    found = []
    for page in DOC_PAGES:
        text = page.read_text(encoding="utf-8")
        for lang, block in FENCE.findall(text):
            if lang not in ("", "bash", "sh", "console"):
                continue
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                    words = words[1:]  # VARIABLE=value before the command
                if words and words[0] == "tokenflip":
                    found.append((str(page.relative_to(REPO)), shlex.join(words)))
        for command in INLINE.findall(re.sub(r"```.*?```", "", text, flags=re.S)):
            found.append((str(page.relative_to(REPO)), command))
    return found


# What the documented shell variables stand for, so that their commands parse as a user's would.
EXAMPLE_VALUES = {"$ENDPOINT_URL": "https://llm.example.com/v1", "$MODEL": "my-model", "${GATE:-0.05}": "0.05",
                  "${BUDGET:-30 min}": "30 min", "${MAX_TOKENS:-256}": "256", "${PROMPTS:-320}": "320"}


def test_every_documented_command_parses_with_the_command_line():
    """A span that only names a command (`tokenflip audit`) names one that exists; every
    longer one is a whole command line that the parser takes as written."""
    from tokenflip.cli.main import build_parser

    commands = documented_commands()
    assert any("tokenflip audit http" in c for _, c in commands) and any("tokenflip gate" in c for _, c in commands)
    names = set(build_parser()._subparsers._group_actions[0].choices)
    refused = []
    for page, command in commands:
        words = [EXAMPLE_VALUES.get(w, w) for w in shlex.split(command)[1:]]
        if len(words) == 1 and words[0] in names:
            continue
        if any(re.fullmatch(r"<[\w ]+>", w) for w in words):
            continue  # a value the rules generate, such as a job spec (`'<json>'`), shown as a placeholder
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                build_parser().parse_args(words)
        except SystemExit:
            refused.append(f"{page}: {command}")
    assert refused == []


def test_commands_are_written_one_way():
    """`tokenflip …`, with the environment active (the README says so once), never
    `.venv/bin/tokenflip …` beside it."""
    assert [str(p.relative_to(REPO)) for p in DOC_PAGES if ".venv/bin/tokenflip" in p.read_text()] == []


def test_the_readme_is_read_in_ten_minutes_and_keeps_the_commands_users_run():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 400
    assert "snakemake --cores all --resources gpu=1" in text
    assert "--profile workflow/profiles/slurm" in text


def test_the_config_readme_lists_every_shipped_config():
    listed = set(re.findall(r"\[`([\w.-]+\.yaml)`\]", (REPO / "config" / "README.md").read_text()))
    assert listed == {p.name for p in (REPO / "config").glob("*.yaml")}
    assert "config/README.md" in _local_links(REPO / "README.md")


def _duration(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(round(seconds % 60))} s"


def test_the_defaults_figures_are_its_runs_own_record():
    """What the README and config/README say of the default (its machine, time, cells and each
    comparison's verdict and prompts) is what a run of it recorded (`perf/run_record.py`, kept
    in docs/records/), so the two cannot disagree."""
    import json

    records = sorted((REPO / "docs" / "records").glob("default-*.json"))
    assert records
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    config_readme = (REPO / "config" / "README.md").read_text(encoding="utf-8")
    for path in records:
        record = json.loads(path.read_text())
        assert record["device"]["name"] in readme and f"docs/records/{path.name}" in readme
        extensions = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in record["device"]["extensions"].items())
        assert extensions in readme
        assert _duration(record["all_in_seconds"]) in readme and _duration(record["all_in_seconds"]) in config_readme
        assert f"| {record['cells']}, {record['pairs']} |" in config_readme
        for c in record["comparisons"]:
            line = f"{c['comparison']}: **{c['verdict']}** after {c['prompts']} prompts ({c['parted']} of {c['n']} parted"
            assert line in readme, line
        for f in record["floors"]:
            assert f"{f['parted']} of {f['n']} prompts parted when the same setting ran again" in readme
        # Where the jobs' time went, as the findings page says it.
        findings = (REPO / "docs" / "findings.md").read_text(encoding="utf-8")
        share = (f"Decoding took {record['generation_share']:.0%} of the jobs' time ({record['decoding_seconds']} of "
                 f"{sum(record['job_seconds'].values()):.0f} job-seconds; {record['jobs']['generate']} generation jobs")
        assert share in " ".join(findings.split()), share
