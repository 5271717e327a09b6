"""The report's reading is computed from the run's own results: verdict, picks, budget; and the stage dispatch."""
import json

import pytest

from trinity import stages


def _res(trinity_acc: float, best_acc: float) -> dict:
    return {"n_items": 4, "methods": [
        {"method": "trinity", "accuracy": trinity_acc}, {"method": "alone:a", "accuracy": best_acc},
        {"method": "alone:b", "accuracy": 0.0}, {"method": "random-routing", "accuracy": 0.25}]}


META = {"pool": [{"name": "a"}, {"name": "b"}]}
HISTORY = [{"episodes": 30}, {"episodes": 30}]


@pytest.mark.parametrize("mine,best,verdict", [(0.5, 0.25, "it beat its best single member"),
                                               (0.25, 0.25, "it tied its best single member"),
                                               (0.0, 0.25, "it did **not** beat its best single member")])
def test_reading_states_the_verdict_from_the_numbers(tmp_path, mine, best, verdict):
    paths = stages.Paths(tmp_path)
    text = "\n".join(stages._reading(_res(mine, best), META, HISTORY, paths))
    assert verdict in text and f"{mine:.3f}" in text and "`alone:a`" in text and "0.250 for random routing" in text
    assert "60 episodes (2 generations)" in text and "31,680" in text


def test_reading_counts_the_coordinators_picks(tmp_path):
    paths = stages.Paths(tmp_path)
    paths.eval_dir.mkdir(parents=True)
    rows = [{"method": "trinity", "path": [["1", "thinker"], ["0", "worker"]]},
            {"method": "trinity", "path": [["1", "worker"]]},
            {"method": "random-routing", "path": [["0", "verifier"]]}]
    (paths.eval_dir / "episodes.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    text = "\n".join(stages._reading(_res(0.5, 0.25), META, HISTORY, paths))
    assert "Its 3 held-out turns went to: b 2, a 1; roles: worker 2, thinker 1." in text


def test_unknown_stage_is_named():
    with pytest.raises(ValueError, match="unknown stage 'evolv'.*prepare, encode, evolve"):
        stages.run_stage("evolv", None)
