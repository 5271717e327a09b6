"""The embedded pool on a real model (SmolLM2-135M GGUF through llama-cpp-python)."""
import asyncio
import time

import pytest

from trinity.config import PoolMember, PoolSettings
from trinity.coordinator.role_sampling import RoleSampling
from trinity.coordinator.roles import Role, role_messages
from trinity.pool.bundled import BUNDLED, ModelAssemblyError, model_path, resolve_gguf
from trinity.pool.runtime import build_pool
from trinity.records import ChatMessage, Task
from trinity.store import Store

TASK = Task(id="t/1", source="gsm8k", prompt=("What is 7 times 6?",), grader="math", answer="42")
SMOL = PoolMember(name="smol", backend="local", model="smollm2-135m-instruct", max_tokens=24, temperature=0.7,
                  engine="in-process")  # this file: the in-process engine (llama-server's: test_pool_llama_server.py)
VERIFIER_8, VERIFIER_48 = RoleSampling.capped({"verifier": 8}), RoleSampling.capped({"verifier": 48})


def test_bundled_models_are_pinned_and_verified():
    for mid in BUNDLED:
        p = model_path(mid)
        assert p.exists() and p.with_suffix(p.suffix + ".sha256").read_text().strip()
    with pytest.raises(ModelAssemblyError, match="neither a bundled model"):
        resolve_gguf("no-such-model")


def test_tampered_cache_is_reassembled(tmp_path, monkeypatch):
    monkeypatch.setenv("TRINITY_MODEL_CACHE", str(tmp_path))
    p = model_path("smollm2-135m-instruct")
    marker = p.with_suffix(p.suffix + ".sha256")
    marker.write_text("0" * 64 + "\n")  # a stale/tampered marker is not trusted
    assert model_path("smollm2-135m-instruct") == p
    assert marker.read_text().strip() == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_calls_are_stored_and_never_repeated(tmp_path):
    msgs = role_messages(Role.WORKER, TASK, ())
    with Store(tmp_path / "s.duckdb") as store:
        pool = build_pool(PoolSettings(members=[SMOL]), store)

        async def go():
            a, b = await asyncio.gather(VERIFIER_8.complete(pool, 0, msgs, Role.WORKER), VERIFIER_8.complete(pool, 0, msgs, Role.WORKER))
            return a, b
        a, b = asyncio.run(go())
        assert a.ok and a.text and a is b  # identical in-flight requests share one call
        assert pool.stats.calls_made == 1 and pool.stats.completion_tokens > 0
        v = asyncio.run(VERIFIER_8.complete(pool, 0, msgs, Role.VERIFIER))  # role cap changes sampling → a new key
        assert pool.stats.calls_made == 2 and v.completion_tokens <= 8
    with Store(tmp_path / "s.duckdb") as store:
        pool = build_pool(PoolSettings(members=[SMOL]), store)
        again = asyncio.run(VERIFIER_8.complete(pool, 0, msgs, Role.WORKER))
        asyncio.run(VERIFIER_8.complete(pool, 0, msgs, Role.VERIFIER))
        assert pool.stats.calls_made == 0 and pool.stats.store_hits == 2
        assert again.text == a.text


def test_local_call_does_not_block_event_loop(tmp_path):
    pool = build_pool(PoolSettings(members=[SMOL.model_copy(update={"max_tokens": 48})]), None)
    ticks = []

    async def heartbeat(stop):
        while not stop.is_set():
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.02)

    async def go():
        stop = asyncio.Event()
        hb = asyncio.create_task(heartbeat(stop))
        r = await pool.complete(0, [ChatMessage("user", "Write a haiku about the sea.")])
        stop.set()
        await hb
        return r

    r = asyncio.run(go())
    assert r.ok
    assert len(ticks) >= 5  # the loop kept running while the model decoded in a worker thread


def test_base_model_gets_completion_prompt():
    gemma = PoolMember(name="gemma", backend="local", model="gemma-3-270m", max_tokens=24, temperature=0.0,
                       engine="in-process")
    pool = build_pool(PoolSettings(members=[gemma]), None)
    assert pool.members[0].gguf.completion_style
    r = asyncio.run(pool.complete(0, role_messages(Role.WORKER, TASK, ())))
    assert r.ok and r.completion_tokens > 0


VERIFY_CASES = [  # (question, proposed answer): right and wrong answers of the three answer formats
    (TASK, "7 times 6 is 42, so the answer is \\boxed{42}."),
    (TASK, "7 times 6 is 36, so the answer is \\boxed{36}."),
    (Task(id="t/2", source="mmlu", prompt=("Which planet is largest? A) Mars B) Jupiter C) Venus D) Mercury",),
          grader="choice", answer="B"), "Jupiter is the largest planet.\nAnswer: B"),
    (Task(id="t/3", source="mmlu", prompt=("What is the chemical symbol of gold? A) Ag B) Au C) Gd D) Go",),
          grader="choice", answer="B"), "Gold is Ag.\nAnswer: A"),
    (Task(id="t/4", source="mbpp", prompt=("Write a function add(a, b) that returns a + b.",), grader="code"),
     "```python\ndef add(a, b):\n    return a - b\n```"),
    (Task(id="t/5", source="gsm8k", prompt=("Tom has 3 apples and buys 4 more. How many apples?",),
          grader="math", answer="7"), "3 + 4 = 7. \\boxed{7}"),
]


def test_verifier_grammar_always_gives_the_field():
    """Under the verdict grammar every Verifier reply of a real model ends with the field, within the Verifier's
    token cap (params.yaml coordinator.verifier_max_tokens = 48): a chat-template member and the completion-style
    base member. Free text from these models mostly has no field (reports/evidence/verdict_field.md)."""
    from trinity.coordinator.roles import Turn
    from trinity.verdict import parse_verdict

    gemma = PoolMember(name="gemma", backend="local", model="gemma-3-270m", max_tokens=128, temperature=0.7,
                       engine="in-process")
    pool = build_pool(PoolSettings(members=[SMOL.model_copy(update={"max_tokens": 320}), gemma]), None)
    asks = [(0, task, answer) for task, answer in VERIFY_CASES] + [(1, task, answer) for task, answer in VERIFY_CASES[:2]]

    async def go():
        return await asyncio.gather(*(VERIFIER_48.complete(pool, i, role_messages(Role.VERIFIER, task,
                                                                                  (Turn("w", Role.WORKER, a),)),
                                                           Role.VERIFIER) for i, task, a in asks))
    for (i, task, _), r in zip(asks, asyncio.run(go())):
        assert r.ok and r.completion_tokens <= 48, (pool.names[i], task.id, r)
        last = r.text.rstrip("\n").splitlines()[-1]
        assert last in ("Verdict: ACCEPT", "Verdict: REJECT"), (pool.names[i], task.id, r.text)
        assert parse_verdict(r.text) in ("ACCEPT", "REJECT")


def test_verdict_grammar_is_in_the_key(monkeypatch):
    """The grammar text is part of a Verifier request's identity (editing it asks again); a Worker request's
    identity is what it was before output formats existed."""
    from trinity import verdict
    from trinity.pool import local
    from trinity.store import response_key

    pool = build_pool(PoolSettings(members=[SMOL]), None)
    member, msgs = pool.members[0], role_messages(Role.WORKER, TASK, ())
    assert member.request_identity(msgs, VERIFIER_48.sampling(pool, 0, Role.WORKER)) == {
        "prompt_style": "chat", "stop": [], "n_ctx": SMOL.n_ctx, "n_threads": local.IN_PROCESS_THREADS,
        "llama_cpp": local.binding_version()}
    verifier = VERIFIER_48.sampling(pool, 0, Role.VERIFIER)
    identity = member.request_identity(msgs, verifier)
    assert identity["grammar"] == verdict.verdict_grammar(verifier.max_tokens)
    assert '"Verdict: " ("ACCEPT" | "REJECT")' in identity["grammar"]
    assert VERIFIER_48.key(pool, 0, msgs, Role.VERIFIER) == response_key(member.model_id, msgs, verifier, identity)
    before = VERIFIER_48.key(pool, 0, msgs, Role.VERIFIER)
    monkeypatch.setattr(verdict, "VERDICT_REASON_CHARS_PER_TOKEN", 3)
    assert VERIFIER_48.key(pool, 0, msgs, Role.VERIFIER) != before
