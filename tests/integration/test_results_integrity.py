"""Results that mean what they say (issue 12): a code change is a new run, an outage is not a sample, a local
member's stored reply answers the same question, the reported fitness is the saved vector's, there is one
definition of the answer, and DVC knows what every stage reads (readers work while a writer runs).

The pool members here are scripted ChatModels or a fault-injecting HTTP server on 127.0.0.1 where the
behaviour under test is the protocol; the local-member tests run the bundled GGUFs for real."""
import ast
import asyncio
import multiprocessing as mp
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from fixtures.fake_openai_server import FakeOpenAIServer
from fixtures.scripted_pool import HashEncoder, ScriptedModel
from trinity import code_version as cv
from trinity.config import (CoordinatorSettings, EvolveSettings, PoolMember, PoolSettings, PROJECT_ROOT,
                            RewardSettings, Settings)
from trinity.coordinator.episode import Episode, StateCache, play_episodes
from trinity.coordinator.roles import Role
from trinity.evolve import loop
from trinity.pool.openai_compat import OpenAICompatibleChatModel
from trinity.pool.runtime import Pool
from trinity.records import ChatMessage, ChatResponse, SamplingParams, Task
from trinity.store import Store

TASK = Task(id="t/1", source="gsm8k", prompt=("What is 2+3?",), grader="math", answer="5")
TASKS = [TASK, Task(id="t/2", source="gsm8k", prompt=("What is 1+4?",), grader="math", answer="5"),
         Task(id="t/3", source="gsm8k", prompt=("What is 9-4?",), grader="math", answer="5")]


def grade(task, text):
    return 1.0 if "\\boxed{5}" in (text or "") else 0.0


GOOD = {"worker": "2+3=5 so \\boxed{5}", "verifier": "check again\nVerdict: REJECT",
        "thinker": "<suggestion>add</suggestion><suggested_role>worker</suggested_role>"}
WRONG = {**GOOD, "worker": "it is \\boxed{7}"}


def scripted_pool(store, replies=(GOOD, WRONG)):
    models = [ScriptedModel(n, r) for n, r in zip("ab", replies)]
    return Pool(models, [PoolMember(name=m.name, backend="local", model="x") for m in models], store), models


def settings(**evolve) -> Settings:
    ev = {"generations": 3, "popsize": 6, "episodes_per_candidate": 2, **evolve}
    return Settings(pool=PoolSettings(members=[PoolMember(name=n, backend="local", model="x") for n in "ab"]),
                    coordinator=CoordinatorSettings(max_turns=3), evolve=EvolveSettings(**ev))


def run_evolve(tmp_path, s, resume=True):
    with Store(tmp_path / "s.duckdb") as store:
        pool, models = scripted_pool(store)
        res = loop.evolve(s, TASKS, pool, StateCache(HashEncoder(), store), grade,
                             resume_path=tmp_path / "state.pkl" if resume else None, store=store)
    return res, sum(m.calls for m in models)


# ------------------------------------------------------------------ 1. a code change is a new run
def _copy_package(tmp_path) -> Path:
    dst = tmp_path / "trinity"
    shutil.copytree(cv.PACKAGE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path}: {old!r} not found"
    path.write_text(text.replace(old, new, 1))


def test_code_version_changes_with_behaviour_not_with_comments(tmp_path):
    pkg = _copy_package(tmp_path)
    base = cv.raw_code_version(pkg)
    assert base == cv.raw_code_version(cv.PACKAGE)
    episode = pkg / "coordinator" / "episode.py"
    # comments, docstrings and layout are not behaviour
    _edit(episode, '"""Correctness + diversity bonus', '"""(reworded docstring) Correctness + diversity bonus')
    _edit(episode, "    if ep.outage:\n        return None\n",
          "    # a comment\n    if ep.outage:\n\n        return None\n")
    _edit(pkg / "pool" / "task_runner.py", "def in_prefect_flow() -> bool:", "def in_prefect_flow(  ) -> bool:  # x")
    _edit(pkg / "config.py", '"""What the head reads:', '"""(a setting\'s attribute docstring, reworded) What the head reads:')
    assert cv.raw_code_version(pkg) == base
    # where calls run is not behaviour either (pool/task_runner.py is runtime-only)
    _edit(pkg / "pool" / "task_runner.py", "SCHEDULER_TIMEOUT_S = 10.0", "SCHEDULER_TIMEOUT_S = 11.0\n_UNUSED = 1")
    assert cv.raw_code_version(pkg) == base
    # the reward shaping, a role prompt, a grader, the optimiser, a base model's template: each is a new version
    edits = [(episode, "((max(n_turns, 1) - 1) / max_turns) / 4", "((max(n_turns, 1) - 1) / max_turns) / 5"),
             (pkg / "coordinator" / "roles.py", "You are a strict verifier.", "You are a lenient verifier."),
             (pkg / "grading" / "math.py", "DEFAULT_TIMEOUT_S = 5", "DEFAULT_TIMEOUT_S = 6"),
             (pkg / "evolve" / "sep_cma.py", '"CMA_diagonal": True', '"CMA_diagonal": False'),
             (pkg / "pool" / "local.py", "What is 12 + 30?", "What is 12 + 31?")]
    seen = {base}
    for path, old, new in edits:
        _edit(path, old, new)
        v = cv.raw_code_version(pkg)
        assert v not in seen, f"editing {path.name} did not change the code version"
        seen.add(v)


def test_declared_compatible_refactor_resolves_to_the_old_version():
    assert cv.resolve_compatible("c", {"c": "b", "b": "a"}) == "a"
    assert cv.resolve_compatible("z", {"c": "b"}) == "z"
    with pytest.raises(ValueError, match="cycle"):
        cv.resolve_compatible("a", {"a": "b", "b": "a"})


def test_code_change_starts_a_new_run_and_refactor_declared_compatible_resumes(tmp_path, monkeypatch):
    s = settings()
    first, calls1 = run_evolve(tmp_path, s)
    assert first.resumed_from == 0 and len(first.history) == 3 and calls1 > 0
    again, _ = run_evolve(tmp_path, s)  # same code: the finished run is resumed, nothing is replayed
    assert again.resumed_from == 3 and np.array_equal(again.params, first.params)

    raw = cv.raw_code_version()
    changed = "0123456789abcdef"
    monkeypatch.setattr(cv, "raw_code_version", lambda package=cv.PACKAGE: changed)  # the code was edited
    cv.code_version.cache_clear()
    try:
        new, calls2 = run_evolve(tmp_path, s)
        assert new.resumed_from == 0 and len(new.history) == 3  # trained again, not the old result re-saved
        assert calls2 == 0  # ... from the stored samples: no call paid twice
        assert new.fingerprint != first.fingerprint
        # the edit is declared a pure refactor of the original code: the original run resumes
        monkeypatch.setattr(cv, "COMPATIBLE_REFACTORS", {**cv.COMPATIBLE_REFACTORS, changed: raw})
        cv.code_version.cache_clear()
        back, _ = run_evolve(tmp_path, s)
        assert back.fingerprint == first.fingerprint
        assert back.resumed_from == 0  # the pickle now holds the 'changed' run; it started over ...
        resumed, _ = run_evolve(tmp_path, s)
        assert resumed.resumed_from == 3 and np.array_equal(resumed.params, first.params)  # ... and is resumable
    finally:
        cv.code_version.cache_clear()


def test_run_id_and_fingerprint_carry_the_code_version(monkeypatch):

    s = settings()
    a = cv.run_id(s, "evolve")
    monkeypatch.setattr(cv, "raw_code_version", lambda package=cv.PACKAGE: "feedfacefeedface")
    cv.code_version.cache_clear()
    try:
        assert cv.run_id(s, "evolve") != a and cv.run_id(s, "evolve").endswith("feedface")
    finally:
        cv.code_version.cache_clear()


# ------------------------------------------------------------------ 2. an outage is not a sample
def _http_pool(srv, store, model="test-model", retries=0):
    m = PoolMember(name="api", backend="openai", model=model, base_url=srv.base_url, max_retries=retries,
                   timeout_s=5.0)
    member = OpenAICompatibleChatModel(m, transport="httpx", backoff_base_s=0.01, backoff_max_s=0.02)
    return Pool([member], [m], store)


ASK = [ChatMessage("user", "What is 2+3?")]


def _ask(pool):
    return asyncio.run(pool.complete(0, ASK, label="worker"))


@pytest.mark.parametrize("outage", ["503", "429", "drop", "truncated", "500"])
def test_outage_is_recorded_but_asked_again_next_run(tmp_path, outage):
    db = tmp_path / "s.duckdb"
    with FakeOpenAIServer(script=[outage, "ok"]) as srv:
        with Store(db) as store:
            pool = _http_pool(srv, store)
            r = _ask(pool)
            assert not r.ok and r.failure == "transient"
            assert pool.stats.calls_made == 1 and pool.stats.failures == 1 and pool.stats.transient_failures == 1
            assert store.get_response(pool.key(0, ASK)) is None
            assert store.failure_counts() == {"transient": 1}
        with Store(db) as store:  # the next run asks again and stores the real answer
            pool = _http_pool(srv, store)
            r = _ask(pool)
            assert r.ok and srv.request_count == 2 and pool.stats.calls_made == 1
        with Store(db) as store:  # ... which is now the sample: no call
            pool = _http_pool(srv, store)
            assert _ask(pool).ok and srv.request_count == 2 and pool.stats.store_hits == 1
            assert store.failure_counts() == {"transient": 1}  # the outage stays on record


def test_deterministic_failure_is_stored_and_retry_flag_asks_again(tmp_path):
    db = tmp_path / "s.duckdb"
    with FakeOpenAIServer(default_mode="400") as srv:
        with Store(db) as store:
            r = _ask(_http_pool(srv, store, retries=3))
            assert not r.ok and r.failure == "deterministic" and "http 400" in r.error
            assert srv.request_count == 1  # not retried: the same request fails the same way
        with Store(db) as store:
            pool = _http_pool(srv, store)
            assert _ask(pool).failure == "deterministic" and pool.stats.calls_made == 0 and srv.request_count == 1
        with Store(db, retry_failures=True) as store:  # the flag: every stored failure is asked again
            pool = _http_pool(srv, store)
            _ask(pool)
            assert pool.stats.calls_made == 1 and srv.request_count == 2


def test_retry_failures_env_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("TRINITY_RETRY_FAILURES", "1")
    with Store(tmp_path / "s.duckdb") as store:
        assert store.retry_failures


def test_failure_stored_by_an_older_version_is_retried(tmp_path):
    """Stores written before failure kinds existed hold outages as answers: they are not served."""
    db = tmp_path / "s.duckdb"
    with FakeOpenAIServer() as srv:
        with Store(db) as store:
            key = _http_pool(srv, store).key(0, ASK)
            store.con.execute("INSERT INTO responses (key, model_id, role, messages, sampling, text, ok, error) "
                              "VALUES (?, 'm', 'worker', '[]', '{}', '', false, 'timeout after 120s')", [key])
        with Store(db) as store:
            pool = _http_pool(srv, store)
            assert _ask(pool).ok and pool.stats.calls_made == 1


def test_in_run_outage_is_retried_by_the_next_generation(tmp_path):
    """Within a run the rollout trees keep each edge's reply; an outage must not stick to the edge."""
    from trinity.coordinator.episode import RolloutTrees

    with FakeOpenAIServer(script=["503"]) as srv:
        with Store(tmp_path / "s.duckdb") as store:
            pool = _http_pool(srv, store)
            trees = RolloutTrees()
            W = np.zeros((1 + 3, HashEncoder.dim))  # uniform logits: argmax picks model 0 as the first role, thinker
            states = StateCache(HashEncoder(), store)

            def play():
                ep = Episode(task=TASK, candidate=0, rng=None)
                asyncio.run(play_episodes([ep], [W], pool, states, 1, RewardSettings(), grade, trees=trees))
                return ep

            first = play()
            assert not first.turns[0].ok
            second = play()
            assert second.turns[0].ok and srv.request_count == 2


# ------------------------------------------------------------------ 4. a stored reply answers the same question
def _local(model: str, **kw) -> PoolMember:
    return PoolMember(name="m", backend="local", model=model, max_tokens=kw.pop("max_tokens", 4), **kw)


def _local_pool(store, member: PoolMember) -> Pool:
    from trinity.pool.local import LocalChatModel

    return Pool([LocalChatModel(member)], [member], store)


def test_local_member_is_keyed_by_template_file_and_decoding(tmp_path, monkeypatch):
    from trinity.pool import local

    gemma = _local("gemma-3-270m")  # a base model: completion-style prompt with a few-shot example
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        pool = _local_pool(store, gemma)
        r = asyncio.run(pool.complete(0, ASK, label="worker"))
        assert pool.stats.calls_made == 1 and r.model.startswith("gguf:gemma-3-270m@sha256:a5fd3b62")
    with Store(db) as store:  # unchanged template: a hit
        pool = _local_pool(store, gemma)
        assert asyncio.run(pool.complete(0, ASK, label="worker")).text == r.text and pool.stats.calls_made == 0
    key = _local_pool(None, gemma).key(0, ASK)
    monkeypatch.setattr(local, "COMPLETION_EXAMPLE", "Question: What is 2 + 2?\n\nAnswer: \\boxed{4}.")
    with Store(db) as store:  # an edited few-shot example: a miss, the model is asked again
        pool = _local_pool(store, gemma)
        assert pool.key(0, ASK) != key
        asyncio.run(pool.complete(0, ASK, label="worker"))
        assert pool.stats.calls_made == 1
    monkeypatch.undo()
    assert _local_pool(None, gemma).key(0, ASK) == key
    monkeypatch.setattr(local, "COMPLETION_STOP", ("\n\nQ:",))
    assert _local_pool(None, gemma).key(0, ASK) != key  # stop strings
    monkeypatch.undo()
    for changed in (gemma.model_copy(update={"n_ctx": 2048}), gemma.model_copy(update={"n_threads": 1})):
        assert _local_pool(None, changed).key(0, ASK) != key
    smol = _local("smollm2-135m-instruct")  # a chat model, prompted completion-style on request
    assert (_local_pool(None, smol).key(0, ASK)
            != _local_pool(None, smol.model_copy(update={"prompt_style": "completion"})).key(0, ASK))
    assert _local_pool(None, gemma.model_copy(update={"name": "renamed"})).key(0, ASK) == key


def test_user_gguf_is_keyed_by_content_not_name(tmp_path, monkeypatch):
    from trinity.pool.bundled import model_path

    monkeypatch.setenv("TRINITY_MODEL_CACHE", str(tmp_path / "cache"))
    mine = tmp_path / "mine.gguf"
    shutil.copyfile(model_path("smollm2-135m-instruct"), mine)
    k1 = _local_pool(None, _local(str(mine))).key(0, ASK)
    assert _local_pool(None, _local(str(mine))).key(0, ASK) == k1  # (sha cached by path+size+mtime)
    with open(mine, "r+b") as f:  # same name, other weights
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    assert _local_pool(None, _local(str(mine))).key(0, ASK) != k1


def test_prompt_too_long_for_the_context_is_a_deterministic_failure():
    from trinity.pool.local import LocalChatModel

    m = LocalChatModel(_local("smollm2-135m-instruct", n_ctx=64))
    r = m.generate([ChatMessage("user", "count: " + " ".join(str(i) for i in range(200)))], SamplingParams(max_tokens=4))
    assert not r.ok and r.failure == "deterministic" and "context window" in r.error


# ------------------------------------------------------------------ 5. reported fitness describes the saved vector
def test_saved_fitness_is_the_saved_vectors_own_score(tmp_path):
    s = settings(saved_fitness_samples=3)
    res, _ = run_evolve(tmp_path, s, resume=False)
    with Store(tmp_path / "s.duckdb") as store:
        pool, _ = scripted_pool(store)
        states = StateCache(HashEncoder(), store)
        layout = loop.param_layout(s, len(pool), states)
        from trinity.coordinator.episode import RolloutTrees

        scoring = loop.saved_fitness_episodes(s, TASKS)
        assert len(scoring) == len(TASKS) * 3
        own = loop.score_params(res.params, layout, scoring, s, pool, states, grade, RolloutTrees())
    assert res.saved_fitness == pytest.approx(own[0]) and res.history[-1].saved_accuracy == pytest.approx(own[1])
    assert not np.array_equal(res.params, res.best_candidate_params)  # the saved vector is the CMA mean
    assert all(h.best_candidate_fitness >= h.mean_fitness for h in res.history)


class _FixedMean:
    """An optimiser whose answer never moves while its candidates do (to see what saved_fitness measures)."""

    method, needs_features = "fixed", False

    def __init__(self, n):
        self.n, self.g = n, 0

    def ask(self):
        self.g += 1
        rng = np.random.default_rng(self.g)
        return [rng.standard_normal(self.n) * 3 for _ in range(6)]

    def tell(self, X, fitness, episodes):
        pass

    params = property(lambda self: np.zeros(self.n))
    sigma = property(lambda self: 0.0)

    def resume(self):
        pass


def test_saved_fitness_is_measured_on_the_same_episodes_every_generation(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "make_optimizer", lambda settings, layout, x0=None: _FixedMean(layout.n_params))
    shaped = settings(generations=4).model_copy(update={"reward": RewardSettings(diversity_weight=0.15,
                                                                                 turn_penalty_weight=0.1)})
    res, _ = run_evolve(tmp_path, shaped, resume=False)  # the shaped reward: candidates' figures spread out
    saved = [h.saved_fitness for h in res.history]
    assert len(set(saved)) == 1  # the same vector on the same episodes scores the same
    assert len({h.best_candidate_fitness for h in res.history}) > 1  # while the candidates' figures move


# ------------------------------------------------------------------ 6. one definition of the answer
def test_a_failed_worker_reply_is_never_the_answer(tmp_path):
    from trinity.evaluation.run import evaluate

    failed_worker = {**WRONG, "worker": ChatResponse(text="\\boxed{7} (cut off", ok=False, error="http 503")}
    with Store(tmp_path / "s.duckdb") as store:
        pool, _ = scripted_pool(store, (GOOD, failed_worker))
        rng = np.random.default_rng(1)
        heads = [rng.standard_normal((5, 8)) * 4 for _ in range(60)]
        eps = [Episode(task=TASK, candidate=c, rng=np.random.default_rng([c])) for c in range(60)]
        asyncio.run(play_episodes(eps, heads, pool, StateCache(HashEncoder(), store), 3, RewardSettings(), grade))
        rows = [{"answer": e.answer} for e in eps]
        # episodes whose last Worker turn failed after a good one: the answer is the good one, and it is graded
        late_fail = [(e, r) for e, r in zip(eps, rows)
                     if [t.ok for t in e.turns if t.role is Role.WORKER][-2:] == [True, False]]
        assert late_fail, "no episode with an ok then a failed Worker turn: change the seeds"
        for e, r in late_fail:
            assert e.answer == GOOD["worker"] == r["answer"] and e.correct == 1.0
        only_failed = [(e, r) for e, r in zip(eps, rows)
                       if any(t.role is Role.WORKER for t in e.turns) and not any(t.ok for t in e.turns
                                                                                  if t.role is Role.WORKER)]
        assert only_failed
        for e, r in only_failed:
            assert e.answer is None and r["answer"] is None and e.correct == 0.0
        run = evaluate(settings(), np.zeros(5 * 8), {"heldout": [TASK]}, pool, StateCache(HashEncoder(), store), grade,
                       methods=["alone:" + pool.names[1]])
        alone = run.items[0].row()
        # an outage (http 503) is not a sample: the item is unscored, with the reason, not scored as wrong
        assert alone["answer"] is None and alone["score"] is None and alone["turns"][0]["ok"] is False
        assert alone["error"].startswith("outage: b as worker failed")


# ------------------------------------------------------------------ 7. DVC knows what a stage reads
PIPELINE_STAGES = ("prepare", "encode", "evolve", "evaluate", "report")
"""The stages of dvc.yaml; each runs flows/<stage>.py."""


def _trinity_imports(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trinity"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("trinity"))
    return out


DISPLAY_ONLY = ("ops/tracking.py", "ops/wandb_report.py", "ops/prefect_artifacts.py")
"""W&B logging and the Prefect UI's artifacts: they write no DVC output (a run's log is not a result), so neither
they nor their imports are deps."""
ORCHESTRATION = ("ops/stage_flow.py", "ops/process_guard.py")
"""How a stage runs (its Prefect tasks, their retry policy, the cleanup of what a run leaves), never what it
computes: not deps (with flows/_bootstrap.py), so editing them re-runs nothing. The stage's own code, which
stage_flow calls, is reached from the stage's `run`."""


def _stage_reads(stage: str) -> set[Path]:
    """The source files a stage can run: its flow, the stage's `run` in stages/<stage>.py (and the helpers of
    that module it calls), then every trinity module those import, transitively (any import anywhere in a module): the walk
    of `trinity.code_version.imported_files`, entered at the stage function and at the flow's own imports."""
    flows = (PROJECT_ROOT / "flows/_bootstrap.py", PROJECT_ROOT / f"flows/{stage}.py")
    mods = set().union(*(_trinity_imports(ast.parse(f.read_text())) for f in flows)) - {"trinity.stages"}
    entries = [f"stages.{stage}:run", *(m.removeprefix("trinity.") for m in mods
                                     if cv._module_file(cv.PACKAGE, m) is not None)]
    return {flows[1], *cv.imported_files(cv.PACKAGE, entries, stop=DISPLAY_ONLY + ORCHESTRATION)}


def test_dvc_deps_cover_every_file_a_stage_runs():
    dvc = yaml.safe_load((PROJECT_ROOT / "dvc.yaml").read_text())["stages"]
    missing = {}
    for stage in PIPELINE_STAGES:
        deps = [PROJECT_ROOT / d for d in dvc[stage]["deps"] if not d.startswith("${")]
        for f in _stage_reads(stage):
            if f.name == "__init__.py" and f.parent == PROJECT_ROOT / "src/trinity":
                continue  # trinity/__init__.py: process settings (OpenMP waits), no results
            if not any(f == d or d in f.parents for d in deps):
                missing.setdefault(stage, []).append(str(f.relative_to(PROJECT_ROOT)))
    assert not missing, f"dvc.yaml deps miss files their stage runs: {missing}"
    assert "${data.root}" in dvc["prepare"]["deps"], "prepare must depend on the benchmark files it reads"
    for stage in ("evolve", "evaluate"):
        assert {"data/checkpoints/coordinator.npy", "data/prepared/train.jsonl"} & set(dvc[stage]["deps"])
    orchestration = {"flows/_bootstrap.py", *(f"src/trinity/{f}" for f in ORCHESTRATION)}
    leaked = {stage: orchestration & set(dvc[stage]["deps"]) for stage in PIPELINE_STAGES}
    assert not any(leaked.values()), f"orchestration code is no dep: {leaked}"


def test_dvc_params_are_every_setting_of_a_stage_but_the_runtime_only_ones():
    """No stage's params name a key of `RUNTIME_ONLY_SETTINGS` (they never change what a stage computes), and a
    stage that reads a section holding such keys lists every other key of it (a new setting must be listed, or
    declared runtime-only)."""
    from trinity.config import RUNTIME_ONLY_SETTINGS, Settings

    dvc = yaml.safe_load((PROJECT_ROOT / "dvc.yaml").read_text())["stages"]
    for stage in PIPELINE_STAGES:
        listed = dvc[stage].get("params", [])
        keys = set()
        for k in listed:
            section, _, field = k.partition(".")
            fields = Settings.model_fields[section].annotation.model_fields
            assert not field or field in fields, f"{stage}: {k} is no setting"
            keys |= {k} if field else {f"{section}.{f}" for f in fields}
        runtime_sections = {k.split(".")[0] for k in RUNTIME_ONLY_SETTINGS}
        for section in {k.split(".")[0] for k in listed} & runtime_sections:  # listed key by key to leave those out
            every = {f"{section}.{f}" for f in Settings.model_fields[section].annotation.model_fields}
            assert every - RUNTIME_ONLY_SETTINGS <= keys, f"{stage}: unlisted {every - RUNTIME_ONLY_SETTINGS - keys}"
        assert not keys & RUNTIME_ONLY_SETTINGS, f"{stage} tracks runtime-only {keys & RUNTIME_ONLY_SETTINGS}"


def _hold_writer(db: str, ready, release) -> None:
    with Store(db) as store:
        store.put_response("late", "m", "worker", ASK, SamplingParams(), ChatResponse(text="written while you read"))
        ready.set()
        release.wait(60)


def _report_inputs(paths) -> None:
    """The smallest real inputs of the report stage."""
    import json

    from trinity.coordinator.roles import make_turn
    from trinity.evaluation.items import EvalRun, ItemResult
    from trinity.evaluation.summary import summarise

    paths.eval_dir.mkdir(parents=True)
    paths.evolve_dir.mkdir(parents=True)
    paths.checkpoint.parent.mkdir(parents=True)
    items = [ItemResult(method=m, task=TASK, split="heldout", score=0.0, answer="7", path=[["0", "worker"]],
                        turns=[(1, make_turn("a", Role.WORKER, "it is \\boxed{7}", True))])
             for m in ("trinity", "alone:a")]
    results = summarise(EvalRun(items, {}, 1.0), resamples=100, seed=0)
    (paths.eval_dir / "results.json").write_text(json.dumps(results))
    (paths.eval_dir / "episodes.jsonl").write_text("".join(json.dumps(i.row()) + "\n" for i in items))
    paths.checkpoint.with_suffix(".json").write_text(json.dumps({
        "pool": [{"name": "a"}], "encoder": "hash-encoder", "head_shape": [4, 8], "generations": 1, "seed": 0,
        "method": "sep_cma", "saved_fitness_episodes": 2, "run_fingerprint": "f" * 64, "code_version": "c" * 64}))
    (paths.evolve_dir / "history.json").write_text(json.dumps([{
        "generation": 0, "saved_fitness": 0.1, "saved_accuracy": 0.0, "mean_fitness": 0.05,
        "best_candidate_fitness": 0.2, "sigma": 0.03, "calls_made": 1, "store_hits": 0, "episodes": 2}]))


def test_readers_work_while_a_writer_holds_the_store(tmp_path):
    from trinity.stages import paths as stage_paths, run_stage

    paths = stage_paths.Paths(tmp_path)
    db = paths.store
    with Store(db) as store:
        store.put_response("k", "m", "worker", ASK, SamplingParams(), ChatResponse(text="hello"))
        store.put_states("enc", ["s1"], np.ones((1, 4), np.float32))
    _report_inputs(paths)
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    writer = ctx.Process(target=_hold_writer, args=(str(db), ready, release))
    writer.start()
    try:
        assert ready.wait(60)
        with pytest.raises(RuntimeError, match="one writer process"):
            Store(db)
        with Store(db, read_only=True) as reader:
            assert reader.get_response("k").text == "hello"
            assert reader.get_response("late").text == "written while you read"  # committed by the writer
            assert reader.get_states("enc", ["s1"])["s1"].tolist() == [1.0] * 4
            reader.put_response("new", "m", "worker", ASK, SamplingParams(), ChatResponse(text="kept in memory"))
            assert reader.get_response("new").text == "kept in memory" and reader.unsaved_writes == 1
        with Store.open_or_read(db) as shared:  # `trinity ask`'s way in
            assert shared.read_only
        out = run_stage("report", settings(), paths)  # the report stage, while the writer runs (it reads no store)
        assert Path(out["summary"]).exists()
        from trinity.cli import main as trinity_cli

        assert trinity_cli(["export", "--root", str(tmp_path)]) == 0  # `trinity export`, a reader
        import pyarrow.parquet as pq

        assert set(pq.read_table(paths.exports / "responses.parquet").column("key").to_pylist()) == {"k", "late"}
        assert (paths.exports / "failures.parquet").exists()
    finally:
        release.set()
        writer.join(60)
    assert writer.exitcode == 0
    with Store(db) as store:  # the reader wrote nothing
        assert store.get_response("new") is None and store.get_response("late") is not None


# ------------------------------------------------------------------ the shaped reward: can no answer beat an answer?
@pytest.mark.parametrize("n_models,max_turns", [(4, 3), (7, 5)])  # the embedded default; the paper's shape
def test_a_correct_episode_always_outearns_an_incorrect_one(n_models, max_turns):
    """Per episode, the paper's shaping cannot rank a wrong (or absent) answer above a right one: the diversity
    bonus is at most 0.15 ln(max_turns) (0.165 at 3 turns, 0.241 at 5) and the turn penalty at most 0.025.
    What it can do is pay an episode with *no* answer (a Thinker-only path) — see the README on reward."""
    import itertools

    from trinity.coordinator.episode import shaped_reward
    from trinity.coordinator.roles import Turn

    w = RewardSettings(diversity_weight=0.15, turn_penalty_weight=0.1)  # the shaping (the default is binary)
    best_wrong, worst_right, best_no_answer = -np.inf, np.inf, -np.inf
    for n in range(1, max_turns + 1):
        for models in itertools.product(range(n_models), repeat=n):
            for roles in ((Role.WORKER,) * n, (Role.THINKER,) * n):  # the reward reads roles only via answers
                ep = Episode(task=TASK, candidate=0, rng=None)
                ep.picks = list(zip(models, roles))
                ep.turns = tuple(Turn(str(m), r, "x") for m, r in ep.picks)
                for correct in (0.0, 1.0):
                    ep.correct = correct
                    r = shaped_reward(ep, max_turns, w)
                    if correct:
                        worst_right = min(worst_right, r) if Role.WORKER in roles else worst_right
                    else:
                        best_wrong = max(best_wrong, r)
                        if Role.WORKER not in roles:
                            best_no_answer = max(best_no_answer, r)
    assert worst_right > 0.97 and best_wrong < 0.25 and worst_right > best_wrong
    assert best_wrong == pytest.approx(0.15 * np.log(max_turns) - 0.1 * ((max_turns - 1) / max_turns) / 4)
    assert best_no_answer == pytest.approx(best_wrong)  # an answerless episode earns the full bonus
