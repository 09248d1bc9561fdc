"""The one decision every reader uses (summary, rounds, report, plan, gate): a comparison
judged against its noise floors, prompt by prompt, by a test that stays valid however often
it is looked at and wherever it stops.

Each prompt gives D = (the comparison parted) − (the floor parted) ∈ {−1, 0, 1}; the excess
δ = E[D], on a prompt drawn at random from the benchmark. With Z = (D + 1)/2 and
μ = (δ + 1)/2, the capital of betting against "μ ≤ m" is a mixture over a fixed grid of
bets s (Waudby-Smith and Ramdas, "Estimating means of bounded random variables by betting",
JRSS-B 2024, §5's grid mixture):

    K⁺(m) = mean_s Π_i (1 + s (Z_i/m − 1)),   s ∈ BETS ⊂ (0, 1),

a nonnegative supermartingale while μ ≤ m, so by Ville's inequality it ever reaches 1/a with
probability at most a: an e-process. Against "μ ≥ m" the mirror (1 − Z against 1 − m). Two
properties follow that the rule is built on:

- the capital depends on the prompts only through how many gave +1, 0 and −1 (no bet
  depends on the past), so a verdict does not depend on how prompts were batched into rounds,
  and its error can be computed exactly, by enumerating counts, not simulated;
- K⁺(m) decreases in m for every s, so the δ it does not reject form an interval: the
  confidence sequence's ends are found by bisection, and "excess at most X" is the same
  statement as "the interval's upper end is at most X".

The prompts are a seeded random sample of the benchmark, without replacement
(`run.benchmarks`): the tests check by exact enumeration that the rule, built for draws with
replacement, keeps its error under sampling without replacement from finite benchmarks.

The decisions, against every floor a comparison has (intersection-union: each floor must say
so, and no level is split among floors):
- "changes outputs": e-BH (Wang and Ramdas, "False discovery rate control with e-values",
  JRSS-B 2022) over the study's judged comparisons, on each one's K⁺(δ = 0), the smallest
  over its floors; the expected share of false ones among those declared is at most α;
- the interval of each comparison's excess: both ends at α / (2m), m the intervals the study
  gives (Bonferroni), so with probability at least 1 − α every interval covers its excess at
  every round at once; "within noise" (inside ±margin) and the gate (pass: the upper end at most
  X; fail: the lower end above X) read it, so neither can contradict the other, and a lower end
  above 0 is always also "changes outputs" (its capital then passes every e-BH threshold);
- an accuracy drop: e-BH over the comparisons scored, on correct_a − correct_b.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
from scipy.special import logsumexp

ALPHA = 0.05
# The equivalence margin of `within noise` unless a study sets its own: 5 percentage points
# of divergence above or below the floor.
MARGIN = 0.05
BETS = 0.9 * np.arange(1, 21) / 20  # s: the share of the most a bet may stake (0.9: a loss keeps a tenth)
_EDGE = 1e-12  # δ = ±1 leaves nothing to bet against: the bisection stays inside
GUARANTEE = ("With probability at least {level:.0%}, every interval of a comparison's excess over its noise floor "
             "holds at every round at once ({intervals} intervals, each at {each:.2g} a side), so no "
             "\"within noise\" verdict and no gate pass or fail is wrong; among the comparisons called "
             "\"changes outputs\" (e-BH over {judged}), the expected share that do not part more often than their "
             "floor is at most {alpha:.0%}. Both are of the excess on a prompt drawn at random from the benchmark.")


def _counts(d) -> tuple[int, int, int]:
    """A sequence of paired outcomes as (+1 count, 0 count, −1 count)."""
    d = np.asarray(d, dtype=float)
    if d.size and (np.isnan(d).any() or not np.isin(d, (-1, 0, 1)).all()):
        raise ValueError("paired outcomes are -1, 0 or 1 (the comparison parted minus the floor parted)")
    return int((d == 1).sum()), int((d == 0).sum()), int((d == -1).sum())


def log_capital_above(up, level, down, delta):
    """log K⁺ against "the excess is at most `delta`", from the counts of +1, 0 and −1
    (arrays broadcast)."""
    up, level, down = (np.asarray(x, dtype=float)[..., None] for x in (up, level, down))
    m = (np.clip(np.asarray(delta, dtype=float), -1 + _EDGE, 1 - _EDGE)[..., None] + 1) / 2
    s = BETS
    logs = up * np.log1p(s * (1 / m - 1)) + level * np.log1p(s * (0.5 / m - 1)) + down * np.log1p(-s)
    return logsumexp(logs, axis=-1) - math.log(len(BETS))


def log_capital_below(up, level, down, delta):
    """log K⁻ against "the excess is at least `delta`": the mirror of `log_capital_above`."""
    return log_capital_above(down, level, up, -np.asarray(delta, dtype=float))


def _threshold(intervals: int, alpha: float) -> float:
    """log of what an interval's capital must reach: 2m/α (α/(2m) a side)."""
    return math.log(2 * max(1, intervals) / alpha)


def interval(up: int, level: int, down: int, intervals: int = 1, alpha: float = ALPHA) -> tuple[float, float]:
    """The excess's interval after these counts, each end at α/(2·intervals): every δ outside
    is rejected by the capital betting against it. An empty sample: (−1, 1)."""
    threshold = _threshold(intervals, alpha)

    def lowest(u: int, w: int) -> float:
        """The smallest δ not rejected by K⁺ (bisection; the rejected end returned, so the
        interval never leaves out a δ that was not rejected)."""
        lo, hi = -1 + _EDGE, 1 - _EDGE
        if float(log_capital_above(u, level, w, lo)) < threshold:
            return -1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if float(log_capital_above(u, level, w, mid)) >= threshold else (lo, mid)
        return lo

    return lowest(up, down), -lowest(down, up)


def e_bh(e_values: dict, alpha: float = ALPHA, family: int | None = None) -> set:
    """The keys e-BH rejects: the k* largest e-values, k* the largest k whose k-th largest is
    at least family/(α k) (`family`: the hypotheses tested, at least those given)."""
    m = max(len(e_values), family or 0)
    ranked = sorted(e_values.items(), key=lambda kv: -kv[1])
    k = max((i + 1 for i, (_, e) in enumerate(ranked) if e * alpha * (i + 1) >= m), default=0)
    return {key for key, _ in ranked[:k]}


@dataclass
class Look:
    """A comparison at one look, against each of its floors."""

    n: int
    counts: list[tuple[int, int, int]]  # per floor
    e_changes: float  # K⁺(0), the smallest over the floors
    low: float  # the interval's hull over the floors
    high: float

    @classmethod
    def of(cls, floors: list, n: int, intervals: int, alpha: float) -> "Look":
        counts = [_counts(np.asarray(d)[:n]) for d in floors]
        spans = [interval(*c, intervals=intervals, alpha=alpha) for c in counts]
        e = min(float(np.exp(log_capital_above(*c, 0.0))) for c in counts)
        return cls(n, counts, e, min(s[0] for s in spans), max(s[1] for s in spans))

    def within(self, margin: float) -> bool:
        return -margin < self.low and self.high < margin


@dataclass
class Decision:
    """A comparison's one verdict: what was decided, at which look (round) and after how many
    prompts, with the evidence of its last look (a comparison a study gates goes on after its
    verdict until its interval decides the gate, or its maximum)."""

    verdict: str | None  # "changes outputs" | "within noise" | None (undecided)
    look: Look  # the last look: its interval is the one the gate reads
    round: int | None  # the round that decided it (None: undecided)
    stopped_early: bool = False  # closed before its maximum: no continuation could decide it
    rounds: int = 1
    maximum: int = 0
    decided_n: int | None = None  # the prompts the verdict took
    open: bool = False  # still going after this round
    gate: float | None = None  # the gate's bound it went on for
    e_value: float | None = None  # "changes outputs": the e-value e-BH declared it with


def could_decide(look: Look, remaining: int, margin: float, intervals: int, judged: int,
                 alpha: float = ALPHA) -> bool:
    """Whether some continuation of `remaining` more prompts could still decide the comparison,
    either way, by its maximum. Exact against one floor: the capital depends on counts only,
    "changes outputs" is best served by every prompt parting in the comparison only (against
    e-BH's lowest threshold, 1/α, as if every comparison were declared), and "within noise" is
    searched over every split of the remaining prompts into +1, 0 and −1 (more prompts never
    hurt it: a 0 raises both its capitals). Against several floors each is asked alone, which
    can only keep a comparison open, never stop one that could be decided."""
    if remaining <= 0:
        return False
    best = math.log(1 / alpha)
    changes = all(float(log_capital_above(u + remaining, l, w, 0.0)) >= best for u, l, w in look.counts)
    if changes:
        return True
    threshold = _threshold(intervals, alpha)
    ups, downs = np.meshgrid(np.arange(remaining + 1), np.arange(remaining + 1), indexing="ij")
    fits = ups + downs <= remaining
    ups, downs = ups[fits], downs[fits]
    for u, l, w in look.counts:
        level = l + remaining - ups - downs
        lower_ok = log_capital_above(u + ups, level, w + downs, -margin) >= threshold  # the lower end above −margin
        upper_ok = log_capital_below(u + ups, level, w + downs, margin) >= threshold  # the upper end below margin
        if not (lower_ok & upper_ok).any():
            return False
    return True


def decide(comparisons: dict[str, list], looks: dict[str, list[int]], margin: float = MARGIN,
           alpha: float = ALPHA, intervals: int | None = None,
           gates: dict[str, float] | None = None, through: int | None = None) -> dict[str, Decision]:
    """Every judged comparison's decision, round by round: `comparisons` gives each one's paired
    outcomes against each floor, in the benchmark's drawn order; `looks` the prompts it has at
    each round (its benchmark's block ends; one look: a study without rounds); `gates` the bound
    of each comparison the study gates. At each round the open comparisons are looked at; e-BH
    runs over every comparison's e-value (one declared keeps the value it was declared with, a
    closed one the value it closed with); a comparison is decided, stopped where no
    continuation could decide it, or goes on, and a gated one goes on after its verdict until
    its interval lies above the bound or at most it. The last round's e-BH is the study's: it
    rejects every comparison an earlier round declared, and perhaps more. `through`: stop after
    that round (a study in progress: its later rounds have no prompts yet)."""
    judged = len(comparisons)
    intervals = judged if intervals is None else intervals
    gates = gates or {}
    state: dict[str, Decision] = {}
    current: dict[str, Look] = {}
    declared: dict[str, float] = {}
    closed: set[str] = set()
    total = max((len(v) for v in looks.values()), default=0)
    for number in range(1, min(total, through or total) + 1):
        for key, floors in comparisons.items():
            mine = looks[key]
            if key in closed or number > len(mine):
                continue
            available = min(len(d) for d in floors) if floors else 0
            current[key] = Look.of(floors, min(mine[number - 1], available), intervals, alpha)
        rejected = e_bh({k: declared.get(k, v.e_changes) for k, v in current.items()}, alpha, judged)
        for key, look in current.items():
            mine = looks[key]
            before = state.get(key)
            if key in closed:
                if key in rejected and before.verdict is None:  # closed undecided, declared by a later e-BH
                    state[key] = Decision("changes outputs", look, number, rounds=len(mine), maximum=mine[-1],
                                          decided_n=look.n, e_value=look.e_changes)
                continue
            verdict, rnd, taken = (before.verdict, before.round, before.decided_n) if before and before.verdict \
                else (None, None, None)
            if verdict is None and key in rejected:
                verdict, rnd, taken = "changes outputs", number, look.n
                declared[key] = look.e_changes
            elif verdict is None and look.within(margin):
                verdict, rnd, taken = "within noise", number, look.n
            last = number >= len(mine) or look.n < mine[number - 1]  # the maximum, or the data ran out
            bound = gates.get(key)
            gate_open = bound is not None and not (look.low > bound or look.high <= bound)
            common = dict(rounds=len(mine), maximum=mine[-1], gate=bound)
            if verdict is not None:
                going = gate_open and not last
                state[key] = Decision(verdict, look, rnd, decided_n=taken, open=going, e_value=declared.get(key),
                                      **common)
            elif last:
                state[key] = Decision(None, look, None, **common)
            elif not could_decide(look, mine[-1] - look.n, margin, intervals, judged, alpha):
                state[key] = Decision(None, look, None, stopped_early=True, **common)
            else:
                state[key] = Decision(None, look, None, open=True, **common)
            if not state[key].open:
                closed.add(key)
    return state


def gated(config: dict, axis: str, label: str) -> float | None:
    """The bound a study's declared gate holds this comparison to (None: not gated): `gate:
    {max_divergence, comparisons}`, every comparison where no list names axes or labels."""
    gate = config.get("gate") or {}
    names = gate.get("comparisons")
    if gate.get("max_divergence") is None or (names and axis not in names and label not in names):
        return None
    return float(gate["max_divergence"])


def accuracy_drops(counts: dict[str, tuple[int, int, int]], alpha: float = ALPHA) -> set:
    """The comparisons whose accuracy is shown to drop from a to b, e-BH over those scored:
    counts per comparison of (a right and b wrong, same, a wrong and b right)."""
    return e_bh({k: float(np.exp(log_capital_above(*c, 0.0))) for k, c in counts.items()}, alpha)


# --- what a rule can decide before it runs: exact, over counts -----------------------------

def _trinomial(n: int, up: float, down: float):
    """The counts of +1 and −1 among n prompts (arrays over a window holding all but ~1e-12
    of the mass) and their probabilities."""
    from scipy.stats import binom

    def window(p: float, size: int) -> np.ndarray:
        if p <= 0:
            return np.zeros(1, dtype=int)
        sd = math.sqrt(size * p * (1 - p))
        return np.arange(max(0, int(size * p - 8 * sd - 2)), min(size, int(size * p + 8 * sd + 2)) + 1)

    a = window(up, n)
    rest = down / (1 - up) if up < 1 else 0.0
    ups, downs, probs = [], [], []
    for u in a:
        c = window(rest, n - int(u))
        ups.append(np.full(len(c), u))
        downs.append(c)
        probs.append(binom.pmf(u, n, up) * binom.pmf(c, n - u, rest))
    return np.concatenate(ups), np.concatenate(downs), np.concatenate(probs)


def decides(question: str, ups, levels, downs, margin: float = MARGIN, bound: float | None = None,
            intervals: int = 1, judged: int = 1, alpha: float = ALPHA):
    """Whether the rule decides at these counts (arrays): question "verdict" (changes outputs, at
    e-BH's first threshold judged/α, or within ±margin), "changes", "within", or the gate at
    `bound` ("gate": shown above it or at most it)."""
    threshold = _threshold(intervals, alpha)
    above = log_capital_above(ups, levels, downs, 0.0) >= math.log(max(1, judged) / alpha)
    within = (log_capital_above(ups, levels, downs, -margin) >= threshold) & \
        (log_capital_below(ups, levels, downs, margin) >= threshold)
    if question == "changes":
        return above
    if question == "within":
        return within
    if question == "verdict":
        return above | within
    if question == "gate":
        return (log_capital_above(ups, levels, downs, bound) >= threshold) | \
            (log_capital_below(ups, levels, downs, bound) >= threshold)
    raise ValueError(f"no question {question!r}")


def chance_at(n: int, up: float, down: float, question: str, **levels) -> float:
    """The probability the rule decides `question` at one look after n prompts, when each
    prompt parts in the comparison only with probability `up` and in the floor only with
    `down`: summed over every count, not simulated."""
    u, w, p = _trinomial(n, up, down)
    return float(np.sum(p * decides(question, u, n - u - w, w, **levels)))


MOST_PROMPTS = 100_000


def prompts_needed(up: float, down: float, question: str = "verdict", start: int = 1, **levels) -> int | None:
    """The one estimate of "prompts needed": the fewest prompts at which the rule decides with
    even odds at these rates (None: more than MOST_PROMPTS). Exact at each n; searched by
    doubling, then bisection."""
    n = max(1, start)
    while chance_at(n, up, down, question, **levels) < 0.5:
        if n >= MOST_PROMPTS:
            return None
        n = min(MOST_PROMPTS, n * 2)
    low = max(start, n // 2)
    while n - low > 1:
        mid = (low + n) // 2
        low, n = (mid, n) if chance_at(mid, up, down, question, **levels) < 0.5 else (low, mid)
    return n


def power(looks: list[int], up: float, down: float, question: str = "verdict", **levels) -> float:
    """The probability the rule decides `question` at one of `looks` (its rounds' ends), at these
    rates: exact, over the counts at each look, what an earlier look decided taken out."""
    from scipy.signal import fftconvolve
    from scipy.stats import binom

    size = looks[-1] + 1
    mass = np.zeros((1, 1))
    mass[0, 0] = 1.0
    done, before = 0.0, 0
    for n in looks:
        step = n - before
        inc = np.zeros((step + 1, step + 1))
        for u in range(step + 1):
            rest = down / (1 - up) if up < 1 else 0.0
            inc[u, : step - u + 1] = binom.pmf(u, step, up) * binom.pmf(np.arange(step - u + 1), step - u, rest)
        mass = np.clip(fftconvolve(mass, inc)[: n + 1, : n + 1], 0, None)
        ups, downs = np.meshgrid(np.arange(mass.shape[0]), np.arange(mass.shape[1]), indexing="ij")
        ok = (ups + downs <= n)
        hit = np.zeros_like(mass, dtype=bool)
        hit[ok] = decides(question, ups[ok], n - ups[ok] - downs[ok], downs[ok], **levels)
        done += float(mass[hit].sum())
        mass[hit | ~ok] = 0.0
        before = n
    del size
    return min(1.0, done)


def guarantee(intervals: int, judged: int, alpha: float = ALPHA) -> str:
    """The study's guarantee in one sentence, with its numbers."""
    return GUARANTEE.format(level=1 - alpha, intervals=intervals, each=alpha / (2 * max(1, intervals)),
                            judged=f"{judged} comparison{'s' if judged != 1 else ''}", alpha=alpha)


# --- the summary's rows: every comparison's one verdict -----------------------------------

def repeat_floors(rows: list[dict]) -> dict[str, list[dict]]:
    """Every finished repeat pair, under each of its two runs' cell ids: the floors a cell's
    comparisons are judged against."""
    floors: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("axis") == "repeat" and row.get("status") == "done":
            for cell in (row["cell_a"], row["cell_b"]):  # a floor of both runs
                floors.setdefault(cell, []).append(row)
    return floors


def outcome_sequence(order: list, parted: set, floor_order: list, floor_parted: set) -> list[int]:
    """The comparison's outcome minus its floor's on each prompt both measured, in the
    comparison's order (1: only the comparison parted, −1: only the floor)."""
    shared = set(floor_order)
    return [int(p in parted) - int(p in floor_parted) for p in order if p in shared]


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def _needed(look: Look, margin: float, intervals: int, judged: int) -> int | None:
    """Prompts needed at the rates seen against the floor that decides (the smallest e-value)."""
    u, _, w = min(look.counts, key=lambda c: float(log_capital_above(*c, 0.0)))
    n = max(1, look.n)
    return prompts_needed(u / n, w / n, "verdict", start=look.n, margin=margin, intervals=intervals, judged=judged)


def verdict_words(decision: Decision, parted: int, margin: float, needed: int | None) -> str:
    look = decision.look
    taken = decision.decided_n or look.n
    where = (f"in round {decision.round} of {decision.rounds}, after {taken} prompts" if decision.rounds > 1 else
             f"after {taken} prompts")
    span = f"its excess over the noise floor {_pct(look.low)} to {_pct(look.high)}"
    later = (f"; it went on to {look.n} prompts for the gate at {decision.gate:.0%}"
             if decision.gate is not None and look.n > taken else "")
    if decision.verdict == "changes outputs":
        e = decision.e_value if decision.e_value is not None else look.e_changes
        return (f"changes outputs: shown {where} (e-value {e:.3g}, e-BH at 5%){later} ({parted} of "
                f"{look.n} parted; {span}, every interval of the study holding at once)")
    if decision.verdict == "within noise":
        return (f"within noise: within ±{margin:.0%} of the noise floor, shown {where}{later} ({parted} of {look.n} "
                f"parted; {span})")
    why = (f"stopped after {look.n} prompts: no continuation to its maximum of {decision.maximum} could decide it"
           if decision.stopped_early else f"at its maximum of {look.n} prompts")
    more = (f"about {needed} prompts in all would decide it at the rates seen" if needed else
            f"more than {MOST_PROMPTS:,} prompts would be needed at the rates seen")
    return f"undecided {why} ({parted} parted; {span}): {more}"


def with_decisions(rows: list[dict], outcomes: dict[str, tuple[list, set]], looks_of, margin: float = MARGIN,
                   alpha: float = ALPHA, judged: int | None = None, intervals: int | None = None,
                   correct: dict[str, list[tuple[str, bool, bool]]] | None = None,
                   gate: dict | None = None) -> list[dict]:
    """The summary's pair rows, each with its one verdict. `outcomes`: each pair's prompts in
    drawn order and those that parted; `looks_of(row)`: the prompts its benchmark has at each
    round (`[n]` without rounds); `judged` and `intervals`: the study's families (its planned
    judged comparisons and its planned pairs); `correct`: per pair, (prompt, a right, b right)
    for the scored prompts, for the accuracy rule; `gate`: the study's declared gate (its
    comparisons go on after their verdict until the gate is decided, as the rounds did)."""
    floors = repeat_floors(rows)
    comparisons, looks, floor_rows = {}, {}, {}
    for row in rows:
        if row.get("status") != "done" or row.get("axis") == "repeat" or not int(row["n_prompts"]):
            continue
        order, parted = outcomes[row["pair_id"]]
        mine = {f["pair_id"]: f for f in [*floors.get(row["cell_a"], []), *floors.get(row["cell_b"], [])]}
        seqs = [outcome_sequence(order, parted, *outcomes[f]) for f in mine]
        seqs = [s for s in seqs if s]  # a floor measured on other prompts says nothing of these
        if seqs:
            comparisons[row["pair_id"]] = seqs
            looks[row["pair_id"]] = [min(n, min(map(len, seqs))) for n in looks_of(row)] or [min(map(len, seqs))]
            floor_rows[row["pair_id"]] = list(mine.values())
    names = {r["pair_id"]: (r["axis"], r.get("label")) for r in rows}
    gates = {pid: bound for pid in comparisons if (bound := gated({"gate": gate}, *names[pid])) is not None}
    judged = max(judged or 0, len(comparisons))
    intervals = max(intervals or 0, len(rows), judged)
    decisions = decide(comparisons, looks, margin, alpha, intervals, gates)
    drops = accuracy_drops({pid: _accuracy_counts(scored, decisions[pid].look.n if pid in decisions else None,
                                                   outcomes[pid][0])
                            for pid, scored in (correct or {}).items() if scored}, alpha)
    out = []
    for row in rows:
        row = {**row, "verdict": None, "verdict_words": None, "floor_rate": None, "excess": None,
               "interval_low": None, "interval_high": None, "interval_of": None, "e_value": None,
               "comparisons_tested": None, "floors_paired": None, "round_decided": None, "prompts_decided": None,
               "prompts_needed": None, "stopped_early": None, "accuracy_dropped": row.get("pair_id") in drops,
               "intervals": intervals, "guarantee": guarantee(intervals, judged, alpha)}
        if row.get("status") != "done":
            out.append(row)
            continue
        k, n, pid = int(row["n_diverged"]), int(row["n_prompts"]), row["pair_id"]
        if pid in decisions:
            d = decisions[pid]
            deciding = min(range(len(d.look.counts)), key=lambda i: float(log_capital_above(*d.look.counts[i], 0.0)))
            u, l, w = d.look.counts[deciding]
            floor = floor_rows[pid][deciding] if deciding < len(floor_rows[pid]) else None
            needed = None if d.verdict else _needed(d.look, margin, intervals, judged)
            parted_then = sum(p in outcomes[pid][1] for p in outcomes[pid][0][: d.look.n])  # at its last look
            row.update(verdict=d.verdict or "undecided", verdict_words=verdict_words(d, parted_then, margin, needed),
                       floor_rate=(int(floor["n_diverged"]) / int(floor["n_prompts"])) if floor else None,
                       excess=(u - w) / max(1, d.look.n), interval_low=d.look.low, interval_high=d.look.high,
                       interval_of="excess",
                       e_value=d.e_value if d.e_value is not None else d.look.e_changes, comparisons_tested=judged,
                       floors_paired=json.dumps([{"n": d.look.n, "only_comparison": a, "neither_or_both": b,
                                                  "only_floor": c} for a, b, c in d.look.counts]),
                       round_decided=d.round, prompts_decided=d.decided_n or d.look.n, prompts_needed=needed,
                       stopped_early=d.stopped_early)
            out.append(row)
            continue
        low, high = interval(k, n - k, 0, intervals, alpha)  # a noise floor, or no floor: its own rate
        low = max(0.0, low)  # a rate is never below 0
        row.update(interval_low=low, interval_high=high, interval_of="rate")
        if row.get("axis") == "repeat":
            row.update(verdict="noise floor", floor_rate=k / n if n else None,
                       verdict_words=f"noise floor: {k} of {n} prompts parted when the same setting ran again "
                                     f"(the rate {low:.1%} to {high:.1%})")
        elif k == 0:
            row.update(verdict="none parted", verdict_words=f"none parted: 0 of {n} prompts, and no repeat measured "
                                                            f"this engine's noise (the rate at most {high:.1%})")
        else:
            row.update(verdict="no floor", verdict_words=f"no floor: {k} of {n} prompts parted; no repeat measured "
                                                         f"this engine's own noise, so whether that is more than its "
                                                         f"noise is not known (add repeat: [default, 2])")
        out.append(row)
    return out


def _accuracy_counts(scored: list[tuple[str, bool, bool]], n: int | None, order: list) -> tuple[int, int, int]:
    """(a right and b wrong, same, a wrong and b right) on the scored prompts among the first n."""
    kept = set(order[:n]) if n is not None else None
    pairs = [(a, b) for p, a, b in scored if kept is None or p in kept]
    return sum(a and not b for a, b in pairs), sum(a == b for a, b in pairs), sum(b and not a for a, b in pairs)
