"""Your own benchmark (a JSONL of items declared in params.yaml): every item type loads and grades through the real
graders (code in the real sandbox), a bad item is named by file, line and field, the contamination guard holds for
it as for a staged benchmark, and its items go through the evaluation (open questions to the judge, one turn or two)."""
import json

import numpy as np
import pytest

from trinity.config import PROJECT_ROOT, ConfigError, DataSettings, PoolMember, Settings, load_settings
from trinity.data.loaders import DataError
from trinity.data.loaders.user import load_user_benchmark
from trinity.data.splits import ContaminationError, build_all_splits, splits_from_settings
from trinity.grading import grade
from trinity.records import ChatResponse

EXAMPLE = PROJECT_ROOT / "benchmarks" / "example.jsonl"
EXAMPLE_OPEN = PROJECT_ROOT / "benchmarks" / "example_open.jsonl"


def write(tmp_path, *items, name="mine.jsonl"):
    p = tmp_path / name
    p.write_text("".join((json.dumps(i) if not isinstance(i, str) else i) + "\n" for i in items))
    return p


def test_the_shipped_example_loads_every_item_type_and_its_right_answers_grade_right():
    tasks = {t.id: t for t in [*load_user_benchmark(EXAMPLE, "example"), *load_user_benchmark(EXAMPLE_OPEN, "chat")]}
    assert {t.grader for t in tasks.values()} == {"math", "choice", "code", "judge"}
    assert all(t.id.startswith(f"{t.source}/") for t in tasks.values())
    assert grade(tasks["example/add-1"], "So 7 x 12 = \\boxed{84}.") == 1.0
    assert grade(tasks["example/add-1"], "\\boxed{85}") == 0.0
    assert grade(tasks["example/frac-1"], "\\boxed{\\dfrac{3}{4}}") == 1.0
    assert grade(tasks["example/cap-1"], "Mercury orbits closest.\nAnswer: B") == 1.0
    assert grade(tasks["example/cap-1"], "Answer: A") == 0.0
    assert "B) Mercury" in tasks["example/cap-1"].query
    # code: run by the project's sandbox against the item's own tests
    good = "```python\ndef sum_even(xs):\n    return sum(x for x in xs if x % 2 == 0)\n```"
    assert grade(tasks["example/code-1"], good) == 1.0
    assert grade(tasks["example/code-1"], good.replace("== 0", "== 1")) == 0.0
    assert grade(tasks["example/code-2"], "```python\ndef reverse(s):\n    return s[::-1]\n```") == 1.0
    assert grade(tasks["example/code-2"], "```python\ndef reverse(s):\n    return s\n```") == 0.0
    assert tasks["chat/open-2"].prompt[1].startswith("Now give one situation")


@pytest.mark.parametrize("item, says", [
    ({"id": "a", "type": "essay", "question": "q"}, "line 2 (id 'a'): field 'type' is 'essay'; it must be one of"),
    ({"id": "a", "type": "math", "question": "q"}, "line 2 (id 'a'): missing field 'answer'"),
    ({"id": "a", "type": "math", "question": "q", "answr": "1"}, "line 2 (id 'a'): unknown field 'answr'"),
    ({"id": "a", "type": "math", "question": " ", "answer": "1"}, "field 'question' is empty"),
    ({"id": "a", "type": "choice", "question": "q", "choices": ["x", "y"], "answer": "C"},
     "field 'answer' is 'C'; it must be one of A, B"),
    ({"id": "a", "type": "choice", "question": "q", "choices": ["x"] * 5, "answer": "A"}, "has 5 options; give 2 to 4"),
    ({"id": "a", "type": "choice", "question": "q", "choices": "xy", "answer": "A"}, "field 'choices' should be list"),
    ({"id": "a", "type": "code", "question": "q", "tests": "assert f()", "entry_point": "not a name"},
     "field 'entry_point' 'not a name' is not a Python function name"),
    ({"id": "a", "type": "code", "question": "q", "tests": "assert f()", "entry_point": "f",
      "test_format": "humaneval"}, "defines no check(candidate)"),
    ({"id": "a", "type": "open", "question": "q", "category": "math"}, "category 'math' is judged against a reference"),
    ({"id": "a", "type": "open", "turns": ["1", "2", "3"]}, "field 'turns' should be a list of one or two"),
    ({"id": "a", "type": "open", "question": "q", "turns": ["q"]}, "exactly one of 'question'"),
    ({"id": "a", "type": "open", "question": "q", "category": "poetry"}, "field 'category' is 'poetry'"),
    ({"type": "math", "question": "q", "answer": "1"}, "line 2: missing field 'id'"),
    ("[1, 2]", "line 2: expected a JSON object, got list"),
    ('{"id": "a", "type": ', "line 2: not valid JSON"),
])
def test_a_bad_item_is_named_by_file_line_and_field(tmp_path, item, says):
    path = write(tmp_path, {"id": "ok", "type": "math", "question": "1+1?", "answer": "2"}, item)
    with pytest.raises(DataError) as e:
        load_user_benchmark(path, "mine")
    assert str(e.value).startswith(f"{path}: ") and says in str(e.value), str(e.value)


def test_duplicate_ids_mixed_scales_an_empty_file_and_a_missing_file_are_errors(tmp_path):
    item = {"id": "x", "type": "math", "question": "1+1?", "answer": "2"}
    with pytest.raises(DataError, match="item 'o': a benchmark is scored on one scale"):
        load_user_benchmark(write(tmp_path, item, {"id": "o", "type": "open", "question": "Why?"}), "mine")
    with pytest.raises(DataError, match="duplicate record id 'mine/x'"):
        load_user_benchmark(write(tmp_path, item, item), "mine")
    with pytest.raises(DataError, match="no items"):
        load_user_benchmark(write(tmp_path, name="empty.jsonl"), "mine")
    with pytest.raises(DataError, match="file not found .*data.user_benchmarks"):
        load_user_benchmark(tmp_path / "nope.jsonl", "mine")


def test_params_declare_it_by_name_and_a_bad_declaration_names_the_key(tmp_path):
    p = tmp_path / "params.yaml"
    with pytest.raises(ValueError, match="data.user_benchmarks.mmlu: 'mmlu' is a staged benchmark's name"):
        splits_from_settings(DataSettings(train={"mmlu": 1}, user_benchmarks={"mmlu": str(EXAMPLE)}))
    p.write_text("data:\n  user_benchmarks: {My-Bench: benchmarks/example.jsonl}\n")
    with pytest.raises(ConfigError, match="data.user_benchmarks.My-Bench: a name is lower-case"):
        load_settings(p)
    assert DataSettings(user_benchmarks={"mine": "benchmarks/example.jsonl"}).resolved_user_benchmarks() == {
        "mine": EXAMPLE}


def _items(n):
    return [{"id": f"q{i}", "type": "math", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(n)]


def test_splits_draw_it_like_a_staged_benchmark_and_the_guard_holds(root, tmp_path):
    mine = write(tmp_path, *_items(10))
    user = {"mine": mine}
    s = build_all_splits(root, {"mine": 4}, {"mine": 3}, {"gpqa": 1}, seed=0, user_benchmarks=user)
    assert len(s.train) == 4 and len(s.in_distribution) == 3
    assert not {t.id for t in s.train} & {t.id for t in s.in_distribution}  # in-distribution: what training left
    again = build_all_splits(root, {"mine": 4}, {"mine": 3}, {"gpqa": 1}, seed=0, user_benchmarks=user)
    assert [t.id for t in again.train] == [t.id for t in s.train]  # seeded
    held = build_all_splits(root, {"math500": 2}, {}, {"mine": -1}, seed=0, user_benchmarks=user)
    assert len(held.heldout) == 10
    # declared held out: never trained on, never drawn in-distribution
    with pytest.raises(ContaminationError, match="held-out benchmarks in the training set: \\['mine'\\]"):
        build_all_splits(root, {"mine": 2}, {}, {"mine": 2}, seed=0, user_benchmarks=user)
    with pytest.raises(ValueError, match="data.in_distribution.mine: mine is a held-out benchmark"):
        build_all_splits(root, {"math500": 2}, {"mine": 2}, {"mine": 2}, seed=0, user_benchmarks=user)
    # an item that repeats a training prompt of a staged benchmark is caught by text, as between staged ones
    train = build_all_splits(root, {"math500": 3}, {}, {}, seed=0, math500_max_level=2).train
    copy = write(tmp_path, {"id": "dup", "type": "math", "question": train[0].metadata["problem"], "answer": "1"},
                 name="copy.jsonl")
    with pytest.raises(ContaminationError, match="same prompt text as a training task"):
        build_all_splits(root, {"math500": 3}, {}, {"copy": 1}, seed=0, math500_max_level=2,
                         user_benchmarks={"copy": copy})
    with pytest.raises(ValueError, match="unknown benchmark 'mein' .*yours, data.user_benchmarks: \\['mine'\\]"):
        build_all_splits(root, {"mein": 2}, {}, {}, seed=0, user_benchmarks=user)
    with pytest.raises(ValueError, match="no split/subset variants"):
        build_all_splits(root, {"mine:train": 2}, {}, {}, seed=0, user_benchmarks=user)
    with pytest.raises(ValueError, match="data.train.chat: chat is judged .*list it under data.heldout"):
        build_all_splits(root, {"chat": 1}, {}, {}, seed=0, user_benchmarks={"chat": EXAMPLE_OPEN})
    d = DataSettings(root=str(root), train={"math500": 2}, heldout={"mine": 5}, math500_max_level=2,
                     user_benchmarks={"mine": str(mine)})
    assert len(splits_from_settings(d).heldout) == 5


def test_its_items_go_through_the_evaluation_and_open_questions_to_the_judge(tmp_path):
    from fixtures.scripted_pool import HashEncoder, ScriptedModel
    from trinity.coordinator.episode import StateCache
    from trinity.evaluation.run import evaluate
    from trinity.evaluation.summary import summarise
    from trinity.grading.judge import MTBenchJudge, judge_member, load_judge_prompts
    from trinity.pool.runtime import Pool
    from trinity.store import Store

    tasks = [*load_user_benchmark(EXAMPLE, "example"), *load_user_benchmark(EXAMPLE_OPEN, "chat")]

    class Knows(ScriptedModel):
        """Answers every example item right."""

        def __init__(self):
            super().__init__("knows", {})

        async def chat(self, messages, sampling):
            self.calls += 1
            q = messages[-1].content
            text = ("\\boxed{84}" if "crate" in q else "\\boxed{\\frac{3}{4}}" if "Simplify" in q
                    else "Answer: B" if "planet" in q
                    else "```python\ndef sum_even(xs):\n    return sum(x for x in xs if x % 2 == 0)\n```"
                    if "sum_even" in q else "```python\ndef reverse(s):\n    return s[::-1]\n```" if "reverse" in q
                    else f"A thoughtful answer to: {q[:40]}")
            return ChatResponse(text=text, prompt_tokens=10, completion_tokens=5)

    class Judge:
        name, model_id, calls = "judge", "scripted:judge", 0

        async def chat(self, messages, sampling):
            self.calls += 1
            return ChatResponse(text="Clear and correct. Rating: [[9]]")

    judge_model = Judge()
    settings = Settings.model_validate({"pool": {"members": [{"name": "knows", "backend": "local", "model": "x"}]},
                                        "coordinator": {"max_turns": 2}, "evaluate": {"judge": "knows"}})
    with Store(tmp_path / "s.duckdb") as store:
        pool = Pool([Knows()], [PoolMember(name="knows", backend="local", model="x")], store)
        jpool = Pool([judge_model], [judge_member(PoolMember(name="judge", backend="local", model="x"), 64)], store)
        judge = MTBenchJudge(jpool, load_judge_prompts(DataSettings().resolved_root()))
        run = evaluate(settings, np.zeros(1 * 8 + 3 * 8), {"heldout": tasks}, pool, StateCache(HashEncoder(), store),
                       grade, judge=judge, methods=["alone:knows"])
    by = {i.task.id: i for i in run.items}
    assert all(by[t.id].score == 1.0 for t in tasks if t.grader != "judge")
    assert by["chat/open-1"].score == 9.0 and [j["turn"] for j in by["chat/open-1"].judge] == [1]
    assert by["chat/open-2"].score == 9.0 and [j["turn"] for j in by["chat/open-2"].judge] == [1, 2]
    assert judge_model.calls == 3  # one judgement per conversation turn
    table = summarise(run, resamples=100, seed=0)
    assert {b["name"]: b["metric"] for b in table["benchmarks"]} == {"example": "accuracy",
                                                                     "chat": "judge score (1-10)"}
    assert table["scores"]["alone:knows"]["example"]["score"] == 1.0
    assert table["scores"]["alone:knows"]["chat"]["score"] == 9.0
