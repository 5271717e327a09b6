"""Long work is never silent: a batch of new pool calls reports its progress on stderr (so it reaches the
terminal under `dvc repro`, where Prefect would swallow a print below its log level)."""
import asyncio

from fixtures.scripted_pool import ScriptedModel
from trinity.config import PoolMember
from trinity.coordinator.roles import Role, role_messages
from trinity.pool import runtime
from trinity.records import Task


def worker_request(question: str):
    """What a Worker is asked about `question` (the scripted pool answers by role)."""
    return role_messages(Role.WORKER, Task(id=question, source="gsm8k", prompt=(question,), grader="math"), ())


def test_a_long_batch_reports_calls_failures_hits_and_eta(monkeypatch, capsys):
    monkeypatch.setattr(runtime, "PROGRESS_EVERY_S", 0.0)
    model = ScriptedModel("a", {"worker": "w", "thinker": "t", "verifier": "v"})
    pool = runtime.Pool([model], [PoolMember(name="a", backend="local", model="x")], None)
    sp = pool.sampling(0)
    reqs = [(0, "worker", f"k{i}", worker_request(f"q{i}"), sp) for i in range(4)] + [(0, "worker", "k0", [], sp)]
    asyncio.run(pool.complete_many(reqs))
    err = capsys.readouterr().err
    assert "[pool] 1/4 new calls of this batch, ETA" in err and "[pool] 3/4" in err
    assert "so far 3 calls paid (0 failed, 0 outages), 1 store hits" in err
    assert "4/4" not in err  # the batch's end is not a progress line


def test_a_short_batch_is_quiet(capsys):
    model = ScriptedModel("a", {"worker": "w", "thinker": "t", "verifier": "v"})
    pool = runtime.Pool([model], [PoolMember(name="a", backend="local", model="x")], None)
    asyncio.run(pool.complete_many([(0, "worker", "k", worker_request("q"), pool.sampling(0))]))
    assert "[pool]" not in capsys.readouterr().err
