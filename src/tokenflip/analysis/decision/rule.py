"""The rule itself: the betting capital from counts, its interval, e-BH, a comparison's looks
round by round and the exact early stop (the package's docstring says why each is so)."""

from __future__ import annotations

import math
from dataclasses import dataclass

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


def deciding_counts(counts: list[tuple[int, int, int]]) -> tuple[int, int, int]:
    """Of a comparison's counts against each floor, those of the floor that decides it: the one
    it is least shown to exceed (the smallest K⁺(0))."""
    return min(counts, key=lambda c: float(log_capital_above(*c, 0.0)))


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

    def deciding(self) -> tuple[int, int, int]:
        """The counts against the floor that decides: the one with the smallest K⁺(0)."""
        return deciding_counts(self.counts)

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
           gates: dict[str, float] | None = None, through: int | None = None,
           stops: dict[str, int] | None = None) -> dict[str, Decision]:
    """Every judged comparison's decision, round by round: `comparisons` gives each one's paired
    outcomes against each floor, in the benchmark's drawn order; `looks` the prompts it has at
    each round (its benchmark's block ends; one look: a study without rounds); `gates` the bound
    of each comparison the study gates. At each round the open comparisons are looked at; e-BH
    runs over every comparison's e-value (one declared keeps the value it was declared with, a
    closed one the value it closed with); a comparison is decided, stopped where no
    continuation could decide it, or goes on, and a gated one goes on after its verdict until
    its interval lies above the bound or at most it. The last round's e-BH is the study's: it
    rejects every comparison an earlier round declared, and perhaps more. `through`: stop after
    that round (a study in progress: its later rounds have no prompts yet). `stops`: the round
    each comparison was stopped in from outside the rule (the study's time budget): its last."""
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
            # the maximum, the data ran out, or the study's budget stopped it here
            last = number >= len(mine) or look.n < mine[number - 1] or (stops or {}).get(key) == number
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


def gated(gate: dict | None, axis: str, label: str) -> float | None:
    """The bound a study's declared gate (its config's `gate: {max_divergence, comparisons}`)
    holds this comparison to (None: not gated); every comparison where no list names axes or
    labels."""
    gate = gate or {}
    names = gate.get("comparisons")
    if gate.get("max_divergence") is None or (names and axis not in names and label not in names):
        return None
    return float(gate["max_divergence"])


def accuracy_drops(counts: dict[str, tuple[int, int, int]], alpha: float = ALPHA) -> set:
    """The comparisons whose accuracy is shown to drop from a to b, e-BH over those scored:
    counts per comparison of (a right and b wrong, same, a wrong and b right)."""
    return e_bh({k: float(np.exp(log_capital_above(*c, 0.0))) for k, c in counts.items()}, alpha)


def guarantee(intervals: int, judged: int, alpha: float = ALPHA) -> str:
    """The study's guarantee in one sentence, with its numbers."""
    return GUARANTEE.format(level=1 - alpha, intervals=intervals, each=alpha / (2 * max(1, intervals)),
                            judged=f"{judged} comparison{'s' if judged != 1 else ''}", alpha=alpha)
