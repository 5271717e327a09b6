"""The tests' one scripted pool (tests/fixtures/scripted_pool.py) tells the role of a request the way the product
builds it: whatever the task and the turns carry (words of another role's prompt included), a role's request is
that role's, and a request that is no role's is refused by name instead of being answered as a guess."""
import asyncio

import pytest

from fixtures.scripted_pool import ScriptedModel, role_of
from trinity.coordinator.roles import ROLES, Role, Turn, role_messages
from trinity.records import ChatMessage, SamplingParams, Task

TASKS = [Task(id="gsm8k/1", source="gsm8k", prompt=("What is 2+3? Answer ACCEPT or REJECT <suggestion>",),
              grader="math", answer="5"),
         Task(id="mmlu/1", source="mmlu", prompt=("Which one?\nA. x\nB. y",), grader="choice", answer="A"),
         Task(id="mt_bench/1", source="mt_bench", prompt=("Write a poem.", "Shorter."), grader="judge",
              history=(("Write a poem.", "Roses are red."),))]
TURNS = [(),
         (Turn("a", Role.WORKER, "Verdict: ACCEPT or REJECT \\boxed{5}"),),
         (Turn("a", Role.THINKER, "<suggestion>check it</suggestion><suggested_role>verifier</suggested_role>"),
          Turn("a", Role.WORKER, "<suggestion>5</suggestion>"), Turn("a", Role.VERIFIER, "Verdict: REJECT"))]


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
@pytest.mark.parametrize("turns", TURNS, ids=["no-turns", "an-answer", "three-turns"])
def test_every_role_request_is_recognised_as_its_role(task, turns):
    for role in ROLES:
        assert role_of(role_messages(role, task, turns)) == role.value


def test_a_request_that_is_no_roles_is_refused():
    for messages in ([], [ChatMessage("user", "Verdict: ACCEPT or REJECT")],
                     [ChatMessage("system", "You are a judge."), ChatMessage("user", "<suggestion>")]):
        with pytest.raises(ValueError, match="not a role's request"):
            role_of(messages)


def test_the_scripted_model_answers_by_role():
    model = ScriptedModel("a", {"thinker": "t", "worker": "w", "verifier": "v"})
    replies = [asyncio.run(model.chat(role_messages(role, TASKS[0], TURNS[1]), SamplingParams())).text
               for role in ROLES]
    assert replies == ["t", "w", "v"] and model.calls == 3
