"""The evaluation report, rendered from files only.

Reads what the pipeline wrote (the contract is docs/eval_results_schema.md):

- `data/eval/results.json` (as `trinity.evaluation.results.EvalResults`), `data/eval/episodes.jsonl` (the
  evaluate stage),
- `data/evolve/history.json`, `data/checkpoints/coordinator.json` (the evolve stage),

and writes `summary.md` (`tables`; its plain-language reading: `reading`), `traces.md` (`traces`) and PNG plots
under `plots/` (`plots`); `format`
holds the row order, labels and number formats they share. Nothing here calls a model, opens the store or reads
settings, and nothing is timestamped: the same files render the same bytes.
"""
from __future__ import annotations

import json
from pathlib import Path

from trinity.coordinator.checkpoint_meta import CheckpointMeta
from trinity.evaluation.report.format import ordered_benchmarks
from trinity.evaluation.report.plots import (DPI, PLOTS, PNG_METADATA, fitness_figure, score_vs_compute_figure,
                                             scores_figure, usage_counts, usage_figure)
from trinity.evaluation.report.tables import summary_markdown
from trinity.evaluation.report.traces import TRACES_PER_BENCHMARK, traces_markdown
from trinity.evaluation.results import EvalResults


def _require(path: Path, stage: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the `{stage}` stage writes it (run that stage first)")
    return path


def _read_json(path: Path, stage: str):
    return json.loads(_require(path, stage).read_text())


def _read_jsonl(path: Path, stage: str) -> list[dict]:
    return [json.loads(line) for line in _require(path, stage).read_text().splitlines() if line.strip()]


def write_report(eval_dir: Path, evolve_dir: Path, checkpoint_meta: Path, reports_dir: Path, *,
                 traces_per_benchmark: int = TRACES_PER_BENCHMARK) -> dict[str, Path]:
    """Render the evaluation report from the pipeline's files: reports_dir/summary.md, reports_dir/traces.md and
    reports_dir/plots/*.png. Returns {name: path}: "summary", "traces" and the plot stems of PLOTS."""
    results = EvalResults.read(_require(Path(eval_dir) / "results.json", "evaluate"))
    episodes = _read_jsonl(Path(eval_dir) / "episodes.jsonl", "evaluate")
    history = _read_json(Path(evolve_dir) / "history.json", "evolve")
    meta = CheckpointMeta.from_json(_read_json(Path(checkpoint_meta), "evolve"), str(checkpoint_meta))

    pool_names = meta.pool_names
    figures = {"scores": scores_figure(results),
               "usage": usage_figure(usage_counts(episodes, pool_names), pool_names, ordered_benchmarks(results)),
               "fitness": fitness_figure(history),
               "score_vs_compute": score_vs_compute_figure(results)}
    reports_dir = Path(reports_dir)
    plots_dir = reports_dir / "plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    written = {"summary": reports_dir / "summary.md", "traces": reports_dir / "traces.md"}
    written["summary"].write_text(summary_markdown(results, meta, history, episodes))
    written["traces"].write_text(traces_markdown(results, episodes, traces_per_benchmark))
    for stem, _ in PLOTS:
        written[stem] = plots_dir / f"{stem}.png"
        figures[stem].savefig(written[stem], dpi=DPI, metadata=PNG_METADATA)
    return written


__all__ = ["PLOTS", "write_report"]
