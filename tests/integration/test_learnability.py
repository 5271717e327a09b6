"""The known-answer regression test (`python -m bench.learnability` at a small size): with a scripted pool whose experts
are known by construction (one per task family, one member that answers nothing), sep-CMA-ES on the real
encoder, head, episode loop, reward shaping and graders must learn to route each family to its expert — on
held-out tasks of those families — while every single member alone scores 1/3 and random routing far less.
A broken optimiser, head, feature path or reward (the coordinator then stays at one member, ~1/3) fails it."""
from pathlib import Path

import pytest

from trinity.verdict import parse_verdict
from trinity.evolve import known_answer as ka
from trinity.grading import grade

ROOT = Path(__file__).resolve().parents[2]


def test_scripted_pool_competence_is_known():
    train = ka.make_tasks(3, 0, "train")
    heldout = ka.make_tasks(3, 0, "heldout", exclude=train)
    assert not {t.query for t in train} & {t.query for t in heldout}
    assert ka.oracle_accuracy(heldout, grade) == 1.0
    single = ka.single_member_accuracy(heldout, grade)
    assert single == {"arith-expert": pytest.approx(1 / 3), "choice-expert": pytest.approx(1 / 3),
                      "code-expert": pytest.approx(1 / 3), "mute": 0.0}
    # The verifiers' accept rates are what they claim (a hash decides, per member, task and answer).
    model = ka.KnownAnswerModel("arith-expert", train + heldout, accept_correct=0.9, accept_wrong=0.2)
    tasks = ka.make_tasks(200, 1, "rates")
    right = sum(parse_verdict(model.reply(t, "verifier", ka.correct_answer(t))) == "ACCEPT" for t in tasks) / len(tasks)
    wrong = sum(parse_verdict(model.reply(t, "verifier", ka.wrong_answer(t, "mute"))) == "ACCEPT" for t in tasks) / len(tasks)
    assert 0.85 < right < 0.95 and 0.15 < wrong < 0.25


def _params(tmp_path, **overrides) -> Path:
    """params.yaml with coordinator / reward overrides ({section: {key: value}})."""
    import yaml

    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    for section, kv in overrides.items():
        p[section] = {**p[section], **kv}
    f = tmp_path / "params.yaml"
    f.write_text(yaml.safe_dump(p))
    return f


@pytest.mark.parametrize("rules,goal", [
    # the machinery, on the rules it was first shown to learn under (reports/evidence/learnability.md): the latest answer
    # returned, the paper's shaping; a broken optimiser, head, feature path or reward stays at ~1/3 here
    ({"coordinator": {"answer_rule": "latest"}, "reward": {"diversity_weight": 0.15, "turn_penalty_weight": 0.1}}, 0.9),
    # the defaults since issue 38 (the first answer returned, a binary reward) learn it less well at this size:
    # measured 0.667 of the oracle on this CPU (docs/results.md, "Does training learn?"); the floor, 1.5x the best
    # member, leaves room for another CPU's encoder arithmetic while a broken machine (~1/3) still fails
    ({}, 0.5),
])
def test_sep_cma_learns_the_known_routing(tmp_path, rules, goal):
    res = ka.measure_learnability(generations=10, tasks_per_generation=12, n_train=4, n_heldout=4, methods=["sep_cma"],
                           max_turns=2, params=_params(tmp_path, **rules))
    d = res["detail"]
    assert d["oracle_accuracy"] == 1.0 and d["best_single_fraction_of_oracle"] == pytest.approx(1 / 3, abs=1e-3)
    assert d["random_routing_fraction_of_oracle"] < 0.5
    curve = d["methods"]["sep_cma"]["curve"]
    assert res["figure"] >= goal, curve
    assert d["pool_calls"] > 0 and d["states_encoded"] > 0  # real episodes, real encoder
