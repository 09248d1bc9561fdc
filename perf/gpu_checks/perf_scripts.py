"""Part 3: the performance scripts' own `main`, their figures parsed from the output."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import time
import traceback
from typing import Any, Callable

from .models import free
from .record import Recorder, call_with_timeout, log


def _float(m: re.Match | None, group: int = 1) -> float | None:
    return float(m.group(group)) if m else None


def parse_decode_vs_generate(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for block in re.split(r"\n(?=batch size \d+)", text)[1:]:
        bs = int(re.match(r"batch size (\d+)", block).group(1))
        tok_s = {m.group(1): float(m.group(2)) for m in
                 re.finditer(r"^\s+(generate|decode|decode-norecord)\s+wall .*?([\d.]+) tok/s wall", block, re.M)}
        out[f"bs{bs}"] = {
            "tokens_identical": "tokens identical across variants: True" in block,
            "tok_s_wall": tok_s,
            "decode_over_generate": _float(re.search(r"decode / generate throughput: ([\d.]+)x", block)),
            "recording_overhead_pct": _float(re.search(r"recording overhead .*?: ([+-][\d.]+)%", block)),
            "record_alone_pct_of_step": _float(re.search(r"record alone: .*?= ([\d.]+)% of a step", block)),
            "at_equal_forward_time": _float(re.search(r"at equal forward time: decode / generate ([\d.]+)x", block)),
            "host_ms_per_step_outside_forward": _per_variant(
                re.search(r"host time outside it: (.*?)   target", block), r" ([\d.]+) ms"),
            "decode_host_ms_without_statistics_arithmetic": _float(
                re.search(r"without the statistics' arithmetic .*?: decode ([\d.]+) ms", block)),
            "syncs_per_step_outside_forward": _per_variant(
                re.search(r"synchronisations per step, outside the forward pass \(inside it\): (.*)", block),
                r" ([\d.]+) \("),
            "record_launches_per_step": _launches(re.search(
                r"record launches per step: eager (\d+), as the loop runs it (\d+) \((.*)\)", block)),
            "cuda_syncs_per_step_outside_forward": _per_variant(
                re.search(r"by CUDA's sync debug mode: (.*)", block), r" ([\d.]+) \("),
        }
    return out


def _launches(line: re.Match | None) -> dict[str, Any]:
    return {"eager": int(line.group(1)), "as_run": int(line.group(2)), "way": line.group(3)} if line else {}


def _per_variant(line: re.Match | None, number: str) -> dict[str, float]:
    """{variant: figure} from a line listing "generate <figure>, decode <figure>, ...". """
    if not line:
        return {}
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r"(generate|decode-norecord|decode)" + number, line.group(1))}


def parse_interventions(text: str) -> dict[str, Any]:
    m = re.search(r"summary: C-gated ([+-][\d.]+)% end to end \(([+-][\d.]+)% measured in the head; trigger rate "
                  r"([\d.]+)%\), C-ungated ([+-][\d.]+)%, global-fp32 ([+-][\d.]+)%", text)
    if not m:
        return {}
    return {"C_gated_pct": float(m.group(1)), "C_gated_in_head_pct": float(m.group(2)),
            "C_gated_trigger_rate_pct": float(m.group(3)), "C_ungated_pct": float(m.group(4)),
            "global_fp32_pct": float(m.group(5)), "paper_C_gated_pct": "< 4"}


def parse_cache_off(text: str) -> dict[str, Any]:
    rows = {}
    for m in re.finditer(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", text, re.M):
        rows[m.group(1)] = {"on_ms_per_token": float(m.group(2)), "off_ms_per_token": float(m.group(3)),
                            "off_over_on": float(m.group(4))}
    fit = re.search(r"cache-off step time = ([-\d.]+) ms \+ ([-\d.]+) ms per token of context \(R\^2 ([-\d.]+)\)",
                    text)
    out: dict[str, Any] = {"per_new_tokens": rows}
    if fit:
        out.update(off_step_ms_intercept=float(fit.group(1)), off_step_ms_per_context_token=float(fit.group(2)),
                   off_fit_r2=float(fit.group(3)))
    return out


def perf_runs(args) -> list[tuple[str, list[str], float, Callable[[str], dict]]]:
    """(script, arguments, share of the part's time, parser) of each performance script."""
    if args.device == "cuda":
        model = ["--model", "random-7b", "--layers", str(args.perf_layers)]
        return [("decode_vs_generate", [*model, "--new-tokens", "48", "--rounds", "2", "--probe-rounds", "2",
                                        "--batch-sizes", "1", "8", "32"], 0.55, parse_decode_vs_generate),
                ("interventions", [*model, "--new-tokens", "64", "--rounds", "3", "--prompts", "4"], 0.30,
                 parse_interventions),
                ("cache_off_scaling", [*model, "--lengths", "32", "64", "128"], 0.15, parse_cache_off)]
    model = ["--model", "random-small"]
    return [("decode_vs_generate", [*model, "--new-tokens", "4", "--rounds", "1", "--batch-sizes", "1", "8"], 0.45,
             parse_decode_vs_generate),
            ("interventions", [*model, "--new-tokens", "4", "--rounds", "1", "--prompts", "1"], 0.35,
             parse_interventions),
            ("cache_off_scaling", [*model, "--lengths", "4", "8"], 0.20, parse_cache_off)]


class _Tee(io.TextIOBase):
    """Writes to the log and keeps a copy to parse."""

    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


def part_perf(rec: Recorder, args) -> None:
    """The performance scripts' own `main`, in this process, each with its share of the time."""
    import importlib

    runs = perf_runs(args)
    rec.data.update(model="random-7b" if args.device == "cuda" else "random-small",
                    layers=args.perf_layers if args.device == "cuda" else None)
    for i, (script, script_args, share, parse) in enumerate(runs):
        rest = sum(r[2] for r in runs[i:])
        timeout = rec.left() * share / rest
        if timeout < 5:
            rec.skip(script, f"{rec.left():.0f} s left")
            continue
        argv = [*script_args, "--device", args.device]
        log(f"  {script}: {' '.join(argv)} (at most {timeout:.0f} s)")
        module = importlib.import_module(script)
        buffer = io.StringIO()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(_Tee(sys.stdout, buffer)):
                rc, timed_out = call_with_timeout(lambda: module.main(argv), timeout)
            error = None
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - recorded; the next script runs
            rc, timed_out, error = None, False, f"{type(exc).__name__}: {exc}"
            log(traceback.format_exc())
        seconds = time.perf_counter() - t0
        free(args.device)
        text = buffer.getvalue()
        try:
            figures = parse(text)
        except Exception as exc:  # noqa: BLE001 - the raw output is kept
            figures = {"parse_error": str(exc)}
        status = ("timeout" if timed_out else "error" if error else
                  "pass" if rc == 0 and figures else "fail")
        rec.add({"name": script, "status": status, "returncode": rc, "error": error, "seconds": round(seconds, 1),
                 "arguments": argv, "figures": figures,
                 "summary": [line for line in text.splitlines() if line.startswith(("summary:", "machine:"))],
                 "output_tail": text[-2500:] if status != "pass" else None})
        log(f"  {script}: {status.upper()} ({seconds:.1f} s)")
    rec.finish()
