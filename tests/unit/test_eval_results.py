"""`EvalResults`, the one reader of data/eval/results.json: it writes back the bytes it read, its typed views say
what the file says, the DVC metrics come from it, and a file off the schema is refused naming the file and field."""
import copy
import json
from pathlib import Path

import pytest

from test_report_module import _results
from trinity.evaluation.results import (HELDOUT, IN_DISTRIBUTION, Cell, EvalResults, ResultsFormatError,
                                        metrics_average, metrics_benchmarks, schema_page)
from trinity.files import write_json

COMMITTED = Path(__file__).resolve().parents[2] / "data" / "eval"


def test_writing_gives_the_bytes_write_json_gives_for_the_dict(tmp_path):
    data = _results()
    results = EvalResults.from_dict(data)
    assert results.to_json() is data
    results.write(tmp_path / "record.json")
    write_json(tmp_path / "dict.json", data)
    assert (tmp_path / "record.json").read_bytes() == (tmp_path / "dict.json").read_bytes()
    again = EvalResults.read(tmp_path / "record.json")
    assert again == results and again.to_json() == data


@pytest.mark.skipif(not (COMMITTED / "results.json").is_file(), reason="no committed run (dvc pull)")
def test_the_committed_run_reads_and_writes_back_byte_for_byte(tmp_path):
    results = EvalResults.read(COMMITTED / "results.json")
    results.write(tmp_path / "results.json")
    assert (tmp_path / "results.json").read_bytes() == (COMMITTED / "results.json").read_bytes()
    write_json(tmp_path / "metrics.json", results.dvc_metrics())
    assert (tmp_path / "metrics.json").read_bytes() == (COMMITTED.parents[1] / "reports/metrics/evaluate.json").read_bytes()


def test_typed_views_say_what_the_file_says():
    results = EvalResults.from_dict(_results())
    assert [b.name for b in results.in_split(None)] == ["math500", "mmlu", "aime", "mt_bench"]
    mt_bench = results.benchmark("mt_bench")
    assert mt_bench.judged and mt_bench.turns == 2 and mt_bench.split_key == HELDOUT and mt_bench.common_units == 3
    assert not results.benchmark("math500").judged
    trinity = results.cell("trinity", "mt_bench")
    assert (trinity.score, trinity.ci95, trinity.n, trinity.items) == (6.5, (5.0, 8.0), 4, 2)
    assert trinity.turn(1).score == 7.0 and trinity.turn(3) == Cell() and trinity.turn(None) is trinity
    assert results.cell("alone:beta", "aime").score is None and results.cell("nobody", "aime") is None
    assert results.average("trinity", IN_DISTRIBUTION) == 0.583 and results.average("nobody", HELDOUT) is None
    (oracle,) = [m for m in results.methods if m.is_oracle]
    assert oracle.picks["mmlu"] == "alone:beta"
    assert [c.outcome for c in results.comparisons("aime")] == ["loses", "ties"] and results.comparisons("mt_bench") == ()
    pooled = results.pooled_paired[HELDOUT]
    assert pooled.benchmarks == ("aime", "mt_bench") and pooled.scores["alone:beta"] is None
    assert [(c.b, c.a_better, c.b_better) for c in pooled.comparisons] == [("alone:alpha", 1, 3),
                                                                            ("random-routing", 2, 1)]
    assert results.judge.unparseable == 3 and results.bootstrap.resamples == 2000
    assert results.checkpoint.to_json()["method"] == "sep_cma" and results.never_trained_on.items == 4
    # compute per task: weighted by items (math500 3 x 900 tokens, mmlu 2 x 300), counts summed over the split
    assert results.mean_per_item("trinity", "tokens_per_task", IN_DISTRIBUTION) == pytest.approx(660.0)
    assert results.total("trinity", "calls_new", HELDOUT) == 4


def test_dvc_metrics_are_scores_and_averages_without_nulls():
    results = EvalResults.from_dict(_results())
    metrics = results.dvc_metrics()
    assert metrics["alone:beta"] == {"math500": 0.0, "mmlu": 0.5, "mt_bench": 4.0, "avg_in_distribution": 0.25,
                                     "avg_heldout": 0.4}  # no aime: nothing scored
    assert metrics_benchmarks(metrics["alone:beta"]) == ["math500", "mmlu", "mt_bench"]
    assert metrics_average(metrics["trinity"], HELDOUT) == 0.325 and metrics_average({}, HELDOUT) is None


def _broken(edit) -> dict:
    data = copy.deepcopy(_results())
    edit(data)
    return data


@pytest.mark.parametrize("edit,field", [
    (lambda d: d["scores"]["trinity"]["math500"].update(score="0.5"), 'scores["trinity"]["math500"].score'),
    (lambda d: d["scores"]["trinity"]["math500"].update(ci95=[0.0, 0.5, 1.0]), 'scores["trinity"]["math500"].ci95'),
    (lambda d: d["scores"]["trinity"]["mt_bench"]["turns"].update(first={}), 'scores["trinity"]["mt_bench"].turns'),
    (lambda d: d["benchmarks"][1].pop("scale"), "benchmarks[1].scale"),
    (lambda d: d["methods"][2].update(method=None), "methods[2].method"),
    (lambda d: d["paired"]["aime"][0].pop("outcome"), 'paired["aime"][0].outcome'),
    (lambda d: d["pooled_paired"]["heldout"]["comparisons"][1].update(n=6.5),
     'pooled_paired["heldout"].comparisons[1].n'),
    (lambda d: d["averages"]["trinity"].update(heldout="high"), 'averages["trinity"]["heldout"]'),
    (lambda d: d.update(judge={"verdicts": 3}), "judge.name"),
    (lambda d: d.pop("scores"), "scores"),
    (lambda d: d["scores"]["trinity"]["mt_bench"]["turns"]["2"].pop("score"),
     'scores["trinity"]["mt_bench"].turns["2"].score'),
    (lambda d: d["scores"]["trinity"]["aime"].update(n=None), 'scores["trinity"]["aime"].n'),  # optional, not null
    (lambda d: d.update(bootstrap=5), "bootstrap"),
])
def test_a_file_off_the_schema_names_the_file_and_the_field(tmp_path, edit, field):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_broken(edit)))
    with pytest.raises(ResultsFormatError) as error:
        EvalResults.read(path)
    assert str(error.value).startswith(f"{path}: {field}: "), str(error.value)


def test_the_schema_page_is_the_one_the_models_give():
    page = Path(__file__).resolve().parents[2] / "docs" / "eval_results_schema.md"
    assert page.read_text() == schema_page(), "regenerate it: python -m trinity.evaluation.results --schema"


def test_not_json_names_the_file(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("{not json")
    with pytest.raises(ResultsFormatError, match=f"{path}: not JSON"):
        EvalResults.read(path)


def test_the_nightly_record_reads_the_scores_as_fractions_of_scale_without_the_oracle():
    from trinity.ops.nightly import NightlyRecord

    record = NightlyRecord.from_results(EvalResults.from_dict(_results()), run="night-1", results_path="r.json")
    assert "oracle:best-single" not in record.scores and "oracle:best-single" not in record.averages
    assert record.scores["trinity"]["mt_bench"] == pytest.approx(0.65) and "aime" not in record.scores["alone:beta"]
    assert record.splits["mmlu"] == IN_DISTRIBUTION and record.checkpoint["run_fingerprint"] == "f" * 64
    assert record.averages["trinity"] == {"in_distribution": 0.583, "heldout": 0.325}


def test_the_prefect_table_has_a_row_per_benchmark_and_method():
    from trinity.ops.prefect_artifacts import eval_scores_table

    rows = eval_scores_table(EvalResults.from_dict(_results()))
    assert len(rows) == 5 * 4 and [r["split"] for r in rows][:10] == [HELDOUT] * 10
    row = next(r for r in rows if r["method"] == "trinity" and r["benchmark"] == "math500")
    assert row == {"benchmark": "math500", "split": IN_DISTRIBUTION, "method": "trinity", "score": 2 / 3,
                   "ci95_low": 0.0, "ci95_high": 1.0, "n": 3, "calls_new": 2}
