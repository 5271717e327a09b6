"""The report's figures (matplotlib, no pyplot state): scores with their intervals per benchmark, the
coordinator's turns as a model x role heatmap, fitness over generations, and score against compute."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from trinity.coordinator.roles import ROLES
from trinity.evaluation.report.format import (SPLITS, cell_of, method_label, ordered_benchmarks, ordered_methods,
                                              split_label)
from trinity.evaluation.results import HELDOUT, HELDOUT_OTHER, IN_DISTRIBUTION, Benchmark, EvalResults, Method

ROLE_NAMES = tuple(role.value for role in ROLES)
"""Columns of the usage heatmap, in the order of the head's role logits."""

PLOTS = (("scores", "Scores with 95% intervals, per benchmark"),
         ("usage", "The coordinator's turns: model x role, per benchmark"),
         ("fitness", "Fitness over generations"),
         ("score_vs_compute", "Average score against tokens per task"))
"""(file stem under plots/, caption) of the report's figures, in the order summary.md shows them."""

DPI = 110
PNG_METADATA = {"Software": None}
"""No version text chunk in the PNGs (Agg writes no timestamp): a rerun on the same files gives the same bytes."""

_OTHER_METHOD_COLOURS = ("tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
                         "tab:cyan")

PANELS_PER_ROW = 4


def usage_counts(rows: list[dict], pool_names: list[str], method: str = "trinity") -> dict[str, np.ndarray]:
    """Per benchmark, how many of `method`'s turns went to each (model, role): an array of shape
    (len(pool_names), len(ROLE_NAMES)), rows in pool order, columns in ROLE_NAMES order."""
    counts: dict[str, np.ndarray] = {}
    for row in rows:
        if row["method"] != method:
            continue
        table = counts.setdefault(row["benchmark"], np.zeros((len(pool_names), len(ROLE_NAMES)), dtype=int))
        for turn in row.get("turns") or []:
            if turn["model"] not in pool_names or turn["role"] not in ROLE_NAMES:
                raise ValueError(f"{row['task_id']}: turn by {turn['model']!r} as {turn['role']!r} is outside the "
                                 f"pool {pool_names} / roles {ROLE_NAMES} (episodes of another checkpoint?)")
            table[pool_names.index(turn["model"]), ROLE_NAMES.index(turn["role"])] += 1
    return counts


def _grid_shape(n_panels: int) -> tuple[int, int]:
    """(rows, columns) of a grid of `n_panels` panels, at most PANELS_PER_ROW a row."""
    columns = max(1, min(PANELS_PER_ROW, n_panels))
    return max(1, -(-n_panels // columns)), columns


def _panels(figure: Figure, n_panels: int, **subplot_kw) -> list:
    """`n_panels` axes in a grid, row-major; the unused cells of the last row are hidden."""
    axes = list(figure.subplots(*_grid_shape(n_panels), squeeze=False, **subplot_kw).ravel())
    for unused in axes[n_panels:]:
        unused.set_visible(False)
    return axes[:n_panels]


def method_colours(methods: list[Method]) -> dict[str, str]:
    """A colour per method, the same in every plot: the coordinator blue, the oracle light grey, the rest in turn."""
    others = iter(_OTHER_METHOD_COLOURS * (1 + len(methods) // len(_OTHER_METHOD_COLOURS)))
    return {m.id: "tab:blue" if m.kind == "coordinator" else "lightgrey" if m.is_oracle else next(others)
            for m in methods}


def scores_figure(results: EvalResults) -> Figure:
    """One panel per benchmark (in-distribution first): each method's score as a bar with its 95% interval;
    the oracle grey and hatched."""
    benchmarks, methods = ordered_benchmarks(results), ordered_methods(results)
    rows, columns = _grid_shape(len(benchmarks))
    figure = Figure(figsize=(3.4 * columns + 2.2, (0.38 * len(methods) + 1.2) * rows), layout="constrained")
    positions = np.arange(len(methods))[::-1]
    colours = method_colours(methods)
    for ax, benchmark in zip(_panels(figure, len(benchmarks), sharey=True), benchmarks):
        for y, method in zip(positions, methods):
            entry = cell_of(results, method.id, benchmark.name)
            score, ci95 = entry.score, entry.ci95
            if score is None:
                ax.text(0, y, " no score", va="center", fontsize=8, color="dimgrey")
                continue
            oracle = method.is_oracle
            ax.barh(y, score, color=colours[method.id], hatch="//" if oracle else None,
                    edgecolor="dimgrey" if oracle else "none")
            error = [[max(0.0, score - ci95[0])], [max(0.0, ci95[1] - score)]] if ci95 else None
            ax.errorbar(score, y, xerr=error, fmt="o", markersize=3, color="black", capsize=3)
        ax.set_xlim(0, benchmark.scale)
        ax.set_title(f"{benchmark.name} — {split_label(benchmark)}\nn={benchmark.n}, {benchmark.metric}", fontsize=9)
        ax.set_yticks(positions, [method_label(m) for m in methods], fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    figure.suptitle("Scores with 95% bootstrap intervals (grey hatched: oracle, chosen in hindsight)", fontsize=10)
    return figure


def usage_figure(counts: dict[str, np.ndarray], pool_names: list[str], benchmarks: list[Benchmark]) -> Figure:
    """Per benchmark, a model x role heatmap of the coordinator's turns, each cell annotated with its count."""
    rows, columns = _grid_shape(len(benchmarks))
    figure = Figure(figsize=(3.3 * columns + 1.0, (0.45 * len(pool_names) + 1.4) * rows), layout="constrained")
    for ax, benchmark in zip(_panels(figure, len(benchmarks)), benchmarks):
        table = counts.get(benchmark.name, np.zeros((len(pool_names), len(ROLE_NAMES)), dtype=int))
        ax.imshow(table, cmap="Blues", vmin=0, vmax=max(1, int(table.max())), aspect="auto")
        for (model, role), count in np.ndenumerate(table):
            ax.text(role, model, str(count), ha="center", va="center", fontsize=9,
                    color="white" if count > table.max() / 2 else "black")
        ax.set_xticks(range(len(ROLE_NAMES)), ROLE_NAMES, fontsize=8)
        ax.set_yticks(range(len(pool_names)), pool_names, fontsize=8)
        ax.set_title(f"{benchmark.name} ({split_label(benchmark)}), {int(table.sum())} turns", fontsize=9)
    figure.suptitle("The coordinator's turns: model x role", fontsize=10)
    return figure


FITNESS_CURVES = (("saved_fitness", "CMA mean, training (same episodes each generation)", "-", "o"),
                  ("mean_fitness", "candidates mean, training", "--", "s"),
                  ("best_candidate_fitness", "best candidate, training (noisy max)", ":", "^"),
                  ("validation_mean", "CMA mean, validation", "-", "D"),
                  ("validation_selected", "saved (best so far), validation", "-", "*"),
                  ("validation_best_member", "best member alone, validation", ":", ""))
"""(key of a history.json row, legend label, line style, marker)."""


def fitness_figure(history: list[dict]) -> Figure:
    figure = Figure(figsize=(6.4, 3.8), layout="constrained")
    ax = figure.subplots()
    if history:
        generations = [row.get("generation") for row in history]
        for key, label, style, marker in FITNESS_CURVES:
            values = [np.nan if row.get(key) is None else row[key] for row in history]
            if not np.isnan(values).all():  # a run without a validation slice has no validation curves
                ax.plot(generations, values, linestyle=style, marker=marker or None, label=label)
        ax.set_xticks(generations)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no generations recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("generation")
    ax.set_ylabel("fitness (reward) / validation accuracy")
    ax.set_title("Learning curves: training fitness and validation", fontsize=10)
    ax.grid(alpha=0.3)
    return figure


_SPLIT_MARKERS = {IN_DISTRIBUTION: ("^", False), HELDOUT: ("o", True), HELDOUT_OTHER: ("D", True)}
"""The score-against-compute marker of each split's average: (matplotlib marker, filled)."""


def score_vs_compute_figure(results: EvalResults) -> Figure:
    """Each method at (tokens per task, average normalised score), per split (tokens per task over that split's
    items): in-distribution hollow triangles, the mission's held-out filled circles, other held-out benchmarks filled
    diamonds; one colour per method named in the legend (labels beside the points would overlap)."""
    figure = Figure(figsize=(7.6, 4.4), layout="constrained")
    ax = figure.subplots()
    methods = ordered_methods(results)
    colours = method_colours(methods)
    tokens_of = {(m.id, split): results.mean_per_item(m.id, "tokens_per_task", split)
                 for m in methods for split, _, _ in SPLITS}
    plotted = [m for m in methods if any(tokens_of[(m.id, split)] is not None for split, _, _ in SPLITS)]

    def marker_style(split: str, colour: str) -> dict:
        marker, filled = _SPLIT_MARKERS[split]
        return ({"marker": marker, "color": colour, "edgecolors": "dimgrey"} if filled else
                {"marker": marker, "facecolors": "none", "edgecolors": colour, "linewidths": 1.5})

    for method in plotted:
        name, colour = method.id, colours[method.id]
        for split, _, _ in SPLITS:
            average = results.average(name, split)
            if average is not None and tokens_of[(name, split)] is not None:
                ax.scatter(tokens_of[(name, split)], average, s=70, **marker_style(split, colour))
        ax.scatter([], [], marker="s", color=colour, label=method_label(method))
    for split, label, _ in SPLITS:
        if any(results.average(m.id, split) is not None for m in plotted):
            ax.scatter([], [], label=f"{label} average", **marker_style(split, "grey"))
    shown = [v for v in tokens_of.values() if v is not None]
    smallest = min(shown, default=0)
    if smallest > 0 and max(shown) > 10 * smallest:
        ax.set_xscale("log")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    ax.set_xlabel("tokens per task (mean over the split's items)")
    ax.set_ylabel("average score / scale")
    ax.set_title("Score against compute", fontsize=10)
    ax.grid(alpha=0.3)
    return figure
