"""MT-Bench judge: FastChat prompts from the benchmark directory, a judge over real HTTP (127.0.0.1) and
a real local model; scores parsed from [[x]]; failures recorded with their reason; judge calls memoised in the
response store (a rerun pays nothing)."""
import asyncio

import pytest

from fixtures.fake_openai_server import FakeOpenAIServer
from trinity.config import DataSettings, PoolMember
from trinity.data.loaders import load_mt_bench
from trinity.grading.judge import JUDGE_ROLE, MTBenchJudge, judge_pool, load_judge_prompts, parse_score
from trinity.store import Store

ROOT = DataSettings().resolved_root()


@pytest.fixture(scope="module")
def tasks():
    return {t.metadata["category"]: t for t in load_mt_bench(ROOT)}


def test_parse_score():
    assert parse_score("Rating: [[8]]") == 8.0
    assert parse_score("I'd say [[7.5]] overall") == 7.5
    assert parse_score("score [6]") == 6.0  # FastChat's fallback pattern
    assert parse_score("no rating here") is None
    assert parse_score("[[42]]") is None


def test_prompt_choice_and_reference(tasks):
    judge = MTBenchJudge(None, load_judge_prompts(ROOT))
    name, msgs = judge.messages(tasks["writing"], ["a1"], 1)
    assert name == "single-v1" and "a1" in msgs[1].content and tasks["writing"].prompt[0] in msgs[1].content
    name, msgs = judge.messages(tasks["math"], ["a1", "a2"], 2)
    assert name == "single-math-v1-multi-turn"
    assert tasks["math"].metadata["reference"][1] in msgs[1].content and "a2" in msgs[1].content
    with pytest.raises(ValueError, match="turn 2 needs 2"):
        judge.messages(tasks["math"], ["a1"], 2)


def _member(base_url, model="judge"):
    return PoolMember(name="judge", backend="openai", model=model, base_url=base_url, timeout_s=5.0, max_retries=1)


def test_http_judge_scores_and_records_failures(tasks):
    replies = iter(["The answer is fine. Rating: [[8]]", "Hmm, I cannot decide."])

    with FakeOpenAIServer(script=["ok", "ok", "500", "500"], reply=lambda m: next(replies)) as srv:
        pool = judge_pool(_member(srv.base_url), max_tokens=64, store=None)
        judge = MTBenchJudge(pool, load_judge_prompts(ROOT))

        async def go():
            out = [await judge.judge_turn(tasks["writing"], [answer], 1) for answer in ("essay 1", "essay 2", "essay 3")]
            await pool.members[0].aclose()
            return out
        good, unparsed, failed = asyncio.run(go())
    assert good.ok and good.score == 8.0 and good.prompt_name == "single-v1"
    assert not unparsed.ok and "no [[rating]]" in unparsed.error and unparsed.raw == "Hmm, I cannot decide."
    assert not failed.ok and failed.error.startswith("judge call failed")
    sampling = pool.sampling(0)  # a judge call asks the judge member's own sampling
    assert sampling.temperature == 0.0 and sampling.max_tokens == 64  # FastChat's greedy judge


def test_judge_calls_are_memoised_in_the_store(tasks, tmp_path):
    """A rerun of the same judgement is served by the store: no second HTTP request, the same verdict."""
    with FakeOpenAIServer(reply=lambda m: "Good answer. [[7]]") as srv:
        verdicts = []
        for _ in range(2):
            with Store(tmp_path / "s.duckdb") as store:
                pool = judge_pool(_member(srv.base_url), max_tokens=64, store=store)

                async def go():
                    v = await MTBenchJudge(pool, load_judge_prompts(ROOT)).judge_turn(tasks["writing"], ["essay"], 1)
                    await pool.members[0].aclose()
                    return v
                verdicts.append((asyncio.run(go()), pool.stats.calls_made, pool.stats.store_hits))
        assert len(srv.records) == 1
    (first, calls1, hits1), (second, calls2, hits2) = verdicts
    assert first.score == second.score == 7.0 and (calls1, hits1, calls2, hits2) == (1, 0, 0, 1)
    with Store(tmp_path / "s.duckdb") as store:  # stored under the judge's label (the responses' role column)
        assert store.con.execute("SELECT role FROM responses").fetchall() == [(JUDGE_ROLE,)]


def test_local_model_as_judge(tasks):
    pool = judge_pool(PoolMember(name="smol", backend="local", model="smollm2-135m-instruct"), max_tokens=48,
                      store=None)
    judge = MTBenchJudge(pool, load_judge_prompts(ROOT))
    v = asyncio.run(judge.judge_turn(tasks["roleplay"], ["Sure, here is my answer."], 1))
    # a 135M model may or may not follow the format: either a score in range or a recorded failure
    assert (v.ok and 0 <= v.score <= 10) or (v.score is None and v.error)
    assert v.raw
