"""How a Verifier reply is read: only its verdict field counts (DESIGN.md, Verifier). The field is the last line
`Verdict: ACCEPT` / `Verdict: REJECT` (or the "verdict" member of a JSON reply under response_format); a reply
without it is no verdict (None), and a Verifier turn without a verdict does not end the episode. Prose is never
read as a verdict: the word list this replaces read "It is impossible to accept this answer." as ACCEPT, and a
false ACCEPT ends an episode on an unchecked answer. The real models under the grammar: test_pool_local.py."""
import asyncio
import json

import pytest

from trinity.config import PoolMember, RewardSettings
from trinity.coordinator.episode import Episode, StateCache, play_episodes
from trinity.coordinator.role_sampling import RoleSampling
from trinity.coordinator.roles import Role, Turn, make_turn, role_messages
from trinity.verdict import parse_verdict
from trinity.pool.runtime import Pool
from trinity.records import SamplingParams, Task
from trinity.store import Store

from fixtures.scripted_pool import ScriptedModel, TurnCountEncoder, scripted_head

VERDICT_CASES = [
    # ----------------------------------------------------------------- the field
    ("The sum 2 + 3 is 5.\nVerdict: ACCEPT", "ACCEPT"),
    ("2 + 3 is 5, not 6.\nVerdict: REJECT", "REJECT"),
    ("Verdict: REJECT", "REJECT"),
    ("Verdict: accept", "ACCEPT"),  # any case
    ("The arithmetic holds.\n**Verdict:** ACCEPT", "ACCEPT"),  # markdown bold
    ("The arithmetic holds.\n**Verdict: REJECT**", "REJECT"),
    ("Wrong sum.\n`Verdict: REJECT`", "REJECT"),  # backticks
    ("Right.\nVerdict: `ACCEPT`.", "ACCEPT"),  # a trailing full stop
    ("  Right.  \n   Verdict :  ACCEPT   \n\n", "ACCEPT"),  # whitespace
    # the last field decides, prose after it aside
    ("Verdict: ACCEPT\nOn second thought the carry is wrong.\nVerdict: REJECT", "REJECT"),
    ("Verdict: REJECT\nVerdict: ACCEPT", "ACCEPT"),
    ("ACCEPT. On reflection the carry is off.\nVerdict: REJECT", "REJECT"),  # the word list: a leading ACCEPT decides
    ("Verdict: REJECT\nThe proposed answer is 6, the sum is 5.", "REJECT"),
    # ----------------------------------------------------------------- the JSON form (response_format)
    ('{"reason": "2 + 3 = 5", "verdict": "ACCEPT"}', "ACCEPT"),
    ('{"reason": "the sum is 5, not 6", "verdict": "REJECT"}', "REJECT"),
    ('```json\n{"reason": "ok", "verdict": "accept"}\n```', "ACCEPT"),
    ('{"reason": "I accept it", "verdict": "MAYBE"}', None),  # the field's value is not a verdict
    ('{"reason": "I accept it"}', None),  # no field
    ('{"reason": "x", "verdict": true}', None),
    # ----------------------------------------------------------------- no field: no verdict
    ("It is impossible to accept this answer.", None),  # the word list read ACCEPT
    ("I accept.", None),
    ("ACCEPT", None),
    ("REJECT. 2 + 3 is 5, not 6.", None),
    ("I cannot accept this answer.", None),
    ("The proposed answer is correct.", None),
    ("", None),
    ("hmm", None),
    # a Verdict line whose value is not exactly ACCEPT or REJECT
    ("Verdict: ACCEPT because 2 + 3 = 5", None),
    ("Verdict: I cannot accept this", None),
    ("Verdict: accepted", None),
    ("Verdict:", None),
    ("Verdict: ACCEPT or REJECT", None),
    ("Verdict: REJECT\nVerdict: maybe", None),  # the last field decides, and says nothing
    # the field must start its line: the prompt echoed back names both and gives none
    ("Reply with at most two short sentences of reasoning, then end with your verdict, ACCEPT or REJECT, on a last "
     "line of the form `Verdict: ACCEPT` or `Verdict: REJECT`.", None),
    ("So it is right. Verdict: ACCEPT", None),
    ("Final verdict: ACCEPT", None),
    # ----------------------------------------------------------------- reasoning models: only the reply after </think>
    ("<think>Verdict: ACCEPT? No, 6 is wrong.</think>\nThe sum is 5.\nVerdict: REJECT", "REJECT"),
    ("<think>It says 6. Verdict: REJECT</think>\nI reject it.", None),  # the field was in the thoughts
    ("<think>Checking... Verdict: ACCEPT", None),  # cut while thinking
    ("<think>Verdict: ACCEPT</think>", None),
    # ----------------------------------------------------------------- HEAD's real replies of the bundled models
    # (the old prompt "Reply with ACCEPT or REJECT first, then one sentence why", max_tokens 48): no field
    ("ACCEPT\nThe proposed answer is correct.", None),
    ("REJECT\nThe proposed answer is incorrect. The correct answer to 7 + 5 is 12, not 13.", None),
    (" Accept if correct.\n\nAnswer: Reject if incorrect.", None),
    # replies under the verdict grammar (test_pool_local.py)
    (" The answer is CORRECT.\nVerdict: ACCEPT", "ACCEPT"),
    ("I'll leave it to you to decide. I will leave it to you to decide whether to make\nVerdict: ACCEPT", "ACCEPT"),
]


@pytest.mark.parametrize("reply,want", VERDICT_CASES)
def test_parse_verdict(reply, want):
    assert parse_verdict(reply) == want


def test_verifier_prompt_asks_for_the_field():
    from trinity.coordinator.roles import VERIFIER_INSTRUCTION

    task = Task(id="t/1", source="gsm8k", prompt=("What is 2+3?",), grader="math", answer="5")
    msgs = role_messages(Role.VERIFIER, task, (Turn("a", Role.WORKER, "\\boxed{5}"),))
    assert msgs[-1].content.endswith(VERIFIER_INSTRUCTION)
    assert "`Verdict: ACCEPT` or `Verdict: REJECT`" in VERIFIER_INSTRUCTION
    assert parse_verdict(msgs[-1].content) is None  # the prompt, echoed back, is no verdict


def test_turn_without_field_has_no_verdict():
    assert make_turn("m", Role.VERIFIER, "It is impossible to accept this answer.", True).verdict is None
    assert make_turn("m", Role.VERIFIER, "Off by one.\nVerdict: REJECT", True).verdict == "REJECT"
    assert make_turn("m", Role.VERIFIER, '{"reason": "fine", "verdict": "ACCEPT"}', True).verdict == "ACCEPT"


# ------------------------------------------------------------------------------------- the episode goes on
TASK = Task(id="t/1", source="gsm8k", prompt=("What is 2+3?",), grader="math", answer="5")
W, V = Role.WORKER, Role.VERIFIER


def _episode(tmp_path, verifier_reply: str, max_turns: int = 4) -> tuple[Episode, ScriptedModel]:
    """One argmax episode W, V, W, V on a one-member scripted pool whose Verifier says `verifier_reply`."""
    model = ScriptedModel("a", {"worker": "2+3=5 so \\boxed{5}", "verifier": verifier_reply, "thinker": "-"})
    with Store(tmp_path / "s.duckdb") as store:
        pool = Pool([model], [PoolMember(name="a", backend="local", model="x")], store)
        ep = Episode(task=TASK, candidate=0, rng=None)
        asyncio.run(play_episodes([ep], [scripted_head([(0, W), (0, V), (0, W), (0, V)], n_models=1)], pool,
                                  StateCache(TurnCountEncoder(), store), max_turns, RewardSettings(),
                                  lambda task, text: 1.0 if "\\boxed{5}" in text else 0.0))
    assert ep.done
    return ep, model


@pytest.mark.parametrize("reply", ["It is impossible to accept this answer.", "I accept.", "ACCEPT"])
def test_verifier_without_field_does_not_end_the_episode(tmp_path, reply):
    ep, _ = _episode(tmp_path, reply)
    assert [t.role for t in ep.turns] == [W, V, W, V]  # played on to max_turns
    assert [t.verdict for t in ep.turns if t.role is V] == [None, None]


def test_verdict_field_accept_ends_the_episode(tmp_path):
    ep, model = _episode(tmp_path, "2 + 3 is 5.\nVerdict: ACCEPT")
    assert [t.role for t in ep.turns] == [W, V] and ep.turns[-1].verdict == "ACCEPT" and model.calls == 2


def test_each_role_asks_its_own_sampling_and_the_store_records_the_role(tmp_path):
    """The pool knows no roles: an episode asks each role's sampling (`coordinator.role_sampling`: the Verifier's
    cap and the verdict format) and labels each request with its role, which the store records."""
    model = ScriptedModel("a", {"worker": "2+3=5 so \\boxed{5}", "verifier": "Fine.\nVerdict: ACCEPT", "thinker": "-"})
    with Store(tmp_path / "s.duckdb") as store:
        pool = Pool([model], [PoolMember(name="a", backend="local", model="x")], store)
        assert pool.sampling(0) == SamplingParams(temperature=0.7, top_p=0.95, max_tokens=256)  # the member's own
        ready = SamplingParams(temperature=0.0, max_tokens=5)
        assert pool.sampling(0, ready) is ready and pool.request(0, [], ready).sampling is ready  # taken as is
        ep = Episode(task=TASK, candidate=0, rng=None)
        asyncio.run(play_episodes([ep], [scripted_head([(0, W), (0, V)], n_models=1)], pool,
                                  StateCache(TurnCountEncoder(), store), 4, RewardSettings(), lambda task, text: 1.0,
                                  role_sampling=RoleSampling.capped({"verifier": 48})))
        rows = store.con.execute("SELECT role, sampling FROM responses").fetchall()
    asked = sorted((role, json.loads(s)["max_tokens"], json.loads(s)["output_format"]) for role, s in rows)
    assert asked == [("verifier", 48, "verdict"), ("worker", 256, None)]


# ------------------------------------------------------------------------------------- store keys
# Keys computed with the code before the verdict field existed (HEAD e1ae8e5): requests of the other roles keep
# their stored replies.
HEAD_KEYS = {
    "worker": "e404930634571fd71bca3129b240cf71ee8eaf0549c81c971e9e766e93f2222e",
    "thinker": "1d8c631116fd1abd3e341d188ff587290901d013cc49de432d16a9265035d851",
    None: "ca7c9cd034f95250f4a336a6b44fb2bfc38585e3baf3106bc28d97589c4f3c1b",
}


def test_other_roles_keep_their_store_keys():
    pool = Pool([ScriptedModel("a", {})], [PoolMember(name="a", backend="local", model="x")], None)
    roles = RoleSampling.capped({"thinker": 160, "verifier": 48})
    turns = (Turn("a", W, "2+3=5 so \\boxed{5}"),)
    assert roles.key(pool, 0, role_messages(W, TASK, turns), W) == HEAD_KEYS["worker"]
    assert roles.key(pool, 0, role_messages(Role.THINKER, TASK, turns), Role.THINKER) == HEAD_KEYS["thinker"]
    assert roles.key(pool, 0, role_messages(W, TASK, ()), None) == HEAD_KEYS[None]
    assert roles.sampling(pool, 0, W).output_format is None
    assert roles.sampling(pool, 0, V) == SamplingParams(temperature=0.7, top_p=0.95, max_tokens=48,
                                                          output_format="verdict")
    assert "output_format" not in SamplingParams().key_fields()
    assert SamplingParams(output_format="verdict").key_fields()["output_format"] == "verdict"
    with pytest.raises(ValueError, match="output_format"):
        SamplingParams(output_format="yaml")
