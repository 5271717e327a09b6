"""The plain-language reading under summary.md's paired comparisons (`reading`): per opponent, where the
coordinator wins, ties or loses (or, with too few paired items, which way the point estimate points), and its
average per split against the best member alone, the learned router, random routing and the hindsight oracle."""
from __future__ import annotations

from trinity.evaluation.report.format import SPLITS, ordered_benchmarks, small_sample_below, score_text
from trinity.evaluation.results import Benchmark, Comparison, EvalResults
from trinity.evaluation.stats import MIN_ITEMS_FOR_OUTCOME


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _outcome_sentence(label: str, comparisons: list[tuple[Benchmark, Comparison]]) -> str:
    """'Against the random routing, the coordinator wins on a (+0.500); **loses on b (-0.300)**.' from
    (benchmark, comparison) pairs; the opponent is named when it changes from benchmark to benchmark (as the best
    single member does)."""
    name_opponent = len({c.b for _, c in comparisons}) > 1
    by_outcome: dict[str, list[str]] = {}
    for benchmark, c in comparisons:
        detail = score_text(c.diff, None, benchmark.scale, signed=True)
        if name_opponent:
            detail += f" vs `{c.b}`"
        outcome = c.outcome
        if outcome == "too few items":  # no call at this size: say which way the point estimate points
            diff = c.diff or 0.0
            outcome = "behind" if diff < 0 else "ahead" if diff > 0 else "level"
        by_outcome.setdefault(outcome, []).append(f"{benchmark.name} ({detail})")
    called = [f"{outcome} on {_join(by_outcome[outcome])}" for outcome in ("wins", "ties") if outcome in by_outcome]
    if "loses" in by_outcome:
        called.append(f"**loses on {_join(by_outcome['loses'])}**")
    elif called:
        called.append("loses on none")
    if "no data" in by_outcome:
        called.append(f"has no data on {_join(by_outcome['no data'])}")
    point = [f"{word} on {_join(by_outcome[key])}" for key, word in
             (("ahead", "is ahead"), ("behind", "**is behind**"), ("level", "is level")) if key in by_outcome]
    sentences = [f"Against the {label}, the coordinator " + "; ".join(called) + "."] if called else []
    if point:
        lead = "On the point estimate only" if called else f"Against the {label}, on the point estimate only"
        sentences.append(f"{lead} (too few paired items to call a win or a loss), the coordinator "
                         + "; ".join(point) + ".")
    return " ".join(sentences)


def _averages_sentence(results: EvalResults, split: str, split_label: str) -> str | None:
    mine = results.average("trinity", split)
    if mine is None:
        return None
    singles = [(m.id, results.average(m.id, split)) for m in results.methods if m.kind == "single"]
    singles = [(name, value) for name, value in singles if value is not None]
    others = []  # (who, their average, what the figure in brackets says besides the value)
    if singles:
        best_name, best = max(singles, key=lambda s: s[1])
        others.append((f"`{best_name}`", best, ", the best member alone on this average"))
    for method, who in (("router", "the learned router"), ("random-routing", "random routing")):
        value = results.average(method, split)
        if value is not None:
            others.append((who, value, ""))
    comparisons = [f"{'above' if mine > value else 'below' if mine < value else 'equal to'} {who} ({value:.3f}{note})"
                   for who, value, note in others]
    oracle = [results.average(m.id, split) for m in results.methods if m.is_oracle]
    oracle_note = f"; the hindsight oracle reaches {oracle[0]:.3f}" if oracle and oracle[0] is not None else ""
    return (f"On the {split_label} average the coordinator scores {mine:.3f}"
            + (": " + _join(comparisons) if comparisons else "") + oracle_note + ".")


def reading(results: EvalResults) -> str:
    """Plain-language reading computed from this run's outcomes and averages (no fixed verdict)."""
    by_label: dict[str, list[tuple[Benchmark, Comparison]]] = {}
    for benchmark in ordered_benchmarks(results):
        for c in results.comparisons(benchmark.name):
            by_label.setdefault(c.label, []).append((benchmark, c))
    sentences = [_outcome_sentence(label, comparisons) for label, comparisons in by_label.items()]
    if not sentences:
        sentences.append("There is no paired comparison to read.")
    sentences += [s for key, label, _ in SPLITS if (s := _averages_sentence(results, key, label))]
    sentences.append("Wins and losses are per benchmark: the paired 95% interval of the difference lies above or "
                     f"below 0; with n < {small_sample_below(results)} items most differences read as ties, and with "
                     f"fewer than {MIN_ITEMS_FOR_OUTCOME} paired items none is called (even if every item went the same "
                     "way, a sign test could not tell at the 5% level).")
    return "**Reading it.** " + " ".join(sentences)
