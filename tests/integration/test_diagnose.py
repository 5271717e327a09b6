"""`trinity diagnose` on a tiny finished run built here: the fake OpenAI-compatible pool answers the episodes the
loop plays (so the store holds real requests under the pool's keys), a hash encoder's states, a checkpoint, the
episodes table, the evaluation's rows, the history and a pickled sep-CMA state. The diagnosis prints Q1..Q5, walks
every stored training episode and evaluation path through the rebuilt trees under the loop's rule (all found,
rewards recomputed exactly) and reads nothing it could write to."""
from __future__ import annotations

import asyncio
import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fixtures.fake_openai_server import FakeOpenAIServer
from fixtures.scripted_pool import HashEncoder

from trinity import cli
from trinity.config import load_settings
from trinity.coordinator.checkpoint_meta import CheckpointMeta
from trinity.coordinator.episode import Episode, StateCache, episode_rng, play_episodes
from trinity.coordinator.policy import save_checkpoint
from trinity.coordinator.role_sampling import RoleSampling
from trinity.coordinator.roles import allowed_roles, coordinator_text
from trinity.evolve.loop import RunState
from trinity.evolve.sep_cma import SepCMA
from trinity.grading import grade
from trinity.pool.runtime import build_pool
from trinity.records import Task
from trinity.store import Store, text_key

pytestmark = pytest.mark.timeout(300)

TASKS = {"train": [Task(id=f"g/{i}", source="gsm8k", prompt=(q,), grader="math", answer="42")
                   for i, q in enumerate(["What is 7 times 6?", "What is 40 plus 2?", "What is 50 minus 9?"])],
         "in_distribution": [Task(id="g/9", source="gsm8k", prompt=("What is 6 times 7?",), grader="math",
                                  answer="42")],
         "heldout": [Task(id="h/1", source="math500", prompt=("What is 84 halved?",), grader="math", answer="42")]}


def reply(messages) -> str:
    """Thinkers suggest a Worker, Verifiers accept, Workers answer 42 to questions with a 7 or a 2 in them."""
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    if "strategic thinker" in system:
        return "<suggestion>Compute it.</suggestion><suggested_role>worker</suggested_role>"
    if "strict verifier" in system:
        return "Fine.\nVerdict: ACCEPT"
    question = str(messages[-1]["content"]).split("\n\n")[0]
    return "so \\boxed{42}" if ("7" in question or "2" in question) else "so \\boxed{41}"


def write_params(root, base_url):
    members = "\n".join(f"    - {{name: {name}, backend: openai, model: '{model}', base_url: '{base_url}', "
                        f"max_retries: 0, timeout_s: 20}}" for name, model in (("alpha", "fake-a"), ("beta", "fake-b")))
    (root / "params.yaml").write_text(
        f"pool:\n  members:\n{members}\ncoordinator:\n  max_turns: 3\n  answer_rule: first\n"
        f"  thinker_max_tokens: 32\n  verifier_max_tokens: 16\nevolve:\n  sigma0: 0.5\n")


def play(episodes, heads, pool, states, settings):
    co = settings.coordinator
    asyncio.run(play_episodes(episodes, heads, pool, states, co.max_turns, settings.reward,
                              lambda task, answer: float(grade(task, answer)), stop_on_outage=True,
                              roles=allowed_roles(co), answer_rule=co.answer_rule,
                              role_sampling=RoleSampling.of(settings)))


def eval_row(method, ep):
    return {"method": method, "task_id": ep.task.id, "benchmark": ep.task.source, "path": ep.path,
            "turns": [{"conversation_turn": 1, "model": t.model, "role": t.role.value, "text": t.text, "ok": t.ok,
                       "verdict": t.verdict} for t in ep.turns],
            "score": ep.correct, "answer": ep.answer, "verifier_first": False, "judge": []}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    fake = FakeOpenAIServer(reply=reply).start()
    root = tmp_path_factory.mktemp("run")
    try:
        write_params(root, fake.base_url)
        settings = load_settings(root / "params.yaml")
        data = root / "data"
        for d in ("prepared", "encode", "eval", "evolve", "store", "checkpoints"):
            (data / d).mkdir(parents=True)
        for split, tasks in TASKS.items():
            (data / "prepared" / f"{split}.jsonl").write_text("".join(json.dumps(t.to_json()) + "\n" for t in tasks))
        store = Store(data / "store" / "trinity.duckdb")
        pool = build_pool(settings.pool, store)
        states = StateCache(HashEncoder(), store)
        n_models, dim = len(pool), HashEncoder.dim
        rng = np.random.default_rng(0)
        W = rng.normal(size=(n_models + 3, dim)) * 2
        train = TASKS["train"]
        for g in range(2):  # two generations of four candidates around W
            heads = [W + 0.5 * rng.normal(size=W.shape) for _ in range(4)]
            eps = [Episode(task=t, candidate=c, rng=episode_rng(0, g, c, t.id)) for c in range(4) for t in train]
            play(eps, heads, pool, states, settings)
            store.put_episodes({"run_id": "run-test", "generation": g, "candidate": e.candidate, "task_id": e.task.id,
                                "path": e.path_json, "reward": e.reward, "correct": e.correct, "cost_usd": e.cost_usd}
                               for e in eps)
        rows = []
        evaluated = TASKS["in_distribution"] + TASKS["heldout"] + train
        argmax = [Episode(task=t, candidate=0, rng=None) for t in evaluated]
        play(argmax, [W], pool, states, settings)
        rows += [eval_row("trinity", e) for e in argmax]
        random = [Episode(task=t, candidate=0, rng=episode_rng(settings.evaluate.random_routing_seed, "random", t.id))
                  for t in evaluated]
        play(random, [np.zeros_like(W)], pool, states, settings)
        rows += [eval_row("random-routing", e) for e in random]
        (data / "eval" / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        all_tasks = [t for ts in TASKS.values() for t in ts]
        texts = [coordinator_text(t, ()) for t in all_tasks]
        pq.write_table(pa.table({"task_id": [t.id for t in all_tasks], "key": [text_key(x) for x in texts],
                                 "state": [list(map(float, v)) for v in states.raw_states(texts)]}),
                       data / "encode" / "root_states.parquet")
        (data / "evolve" / "history.json").write_text(json.dumps(
            [{"generation": g, "saved_fitness": 0.5, "saved_accuracy": 0.5} for g in range(2)]))
        save_checkpoint(data / "checkpoints" / "coordinator", W.ravel(), CheckpointMeta.model_validate({
            "pool": [{"name": m.name, "model_id": m.model_id} for m in pool.members], "encoder": HashEncoder.encoder_id,
            "dim": dim, "train_tasks": [t.id for t in train], "code_version": "test",
            "saved_fitness": 0.5, "saved_accuracy": 0.5}))
        optimizer = SepCMA(W.size, settings.evolve.sigma0, 4, 0, x0=W.ravel())
        with open(data / "store" / "evolve_state.pkl", "wb") as f:
            pickle.dump(RunState(fingerprint="test", optimizer=optimizer, generation=2), f)
        store.close()
    finally:
        fake.stop()  # the diagnosis calls nothing: the pool's server is gone before it runs
    return root


def test_diagnose_prints_every_question_from_the_run_files(finished_run, capsys):
    before = {p: p.stat().st_mtime_ns for p in finished_run.rglob("*") if p.is_file()}
    assert cli.main(["diagnose", "--root", str(finished_run), "--heads", "5"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    for q in ("Q1. ", "Q2. ", "Q3. ", "Q4. ", "Q5. "):
        assert q in out
    n_train = 2 * 4 * len(TASKS["train"])
    assert f"max |diff| = 0.00e+00 over {n_train} episodes" in out  # every training episode walked and rewarded
    n_eval = sum(len(ts) for ts in TASKS.values())
    assert (f"saved head's argmax path == eval trinity path on {n_eval}/{n_eval} items; zero head replayed with "
            f"the eval seeds == random-routing path on {n_eval}/{n_eval} items") in out
    assert "'disallowed'" not in out and "'missing'" not in out
    assert {p: p.stat().st_mtime_ns for p in finished_run.rglob("*") if p.is_file()} == before  # read-only


def test_diagnose_without_a_finished_run_says_what_is_missing(tmp_path, capsys):
    assert cli.main(["diagnose", "--root", str(tmp_path)]) == cli.EXIT_NOT_FOUND
    assert "no finished run" in capsys.readouterr().err
