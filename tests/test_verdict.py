"""How a Verifier reply is read: the verdict as a word or a structured field, negations as REJECT, whole
words only, the first clear verdict deciding, default REJECT. Real replies of the bundled models are
part of the table (generated with the Verifier prompt of trinity.coordinator.roles.role_messages)."""
import pytest

from trinity.coordinator.roles import parse_verdict

VERDICT_CASES = [
    # ----------------------------------------------------------------- the verdict as a word
    ("ACCEPT", "ACCEPT"),
    ("REJECT", "REJECT"),
    ("accept. The answer 5 is right.", "ACCEPT"),
    ("**ACCEPT**\nThe sum is correct.", "ACCEPT"),
    ("**REJECT** wrong", "REJECT"),
    ("I think we should accept this", "ACCEPT"),
    ("After checking the arithmetic, I accept the proposed answer.", "ACCEPT"),
    ("I reject it: 2 + 3 is 5, not 6.", "REJECT"),
    # ----------------------------------------------------------------- structured fields
    ("Verdict: accept", "ACCEPT"),
    ("Verdict: REJECT", "REJECT"),
    ("**Verdict:** ACCEPT. 2 + 3 is 5.", "ACCEPT"),
    ("<verdict>REJECT</verdict> the sum is 5", "REJECT"),
    ("<verdict>ACCEPT</verdict>", "ACCEPT"),
    ("Decision: ACCEPT", "ACCEPT"),
    ("Decision: **reject** (the arithmetic is off)", "REJECT"),
    ("Verdict: not accepted", "REJECT"),
    ("Verdict: Accepted", "ACCEPT"),  # "accepted" in a verdict field affirms
    # ----------------------------------------------------------------- negations are REJECT
    ("This answer is unacceptable.", "REJECT"),
    ("I cannot accept this answer.", "REJECT"),
    ("I can't accept this: 2 + 3 is not 6.", "REJECT"),
    ("I can\u2019t accept this.", "REJECT"),
    ("I do not accept the proposed answer.", "REJECT"),
    ("I won't accept it.", "REJECT"),
    ("The answer should not be accepted.", "REJECT"),
    ("The answer is not accepted.", "REJECT"),
    ("Not acceptable: the sum is 5.", "REJECT"),
    ("NOT ACCEPT", "REJECT"),
    ("I don't think we should accept this.", "REJECT"),
    ("I would never accept 6 here.", "REJECT"),
    # ----------------------------------------------------------------- "acceptable" / "accepted" alone
    ("The proposed answer is acceptable.", "ACCEPT"),  # predicate "is acceptable" affirms
    ("Accepted. The computation is right.", "ACCEPT"),  # as the verdict at the start of the reply
    ("An acceptable answer would show the steps.", "REJECT"),  # attributive use: no verdict at all
    ("The acceptance criteria are not met.", "REJECT"),
    # ----------------------------------------------------------------- both words: the first clear verdict decides
    ("Should we accept? No, reject.", "REJECT"),  # a question is not a verdict
    ("REJECT. I cannot accept it; accepting 6 would be wrong.", "REJECT"),
    ("ACCEPT. There is no reason to reject it.", "ACCEPT"),
    ("There is nothing to reject here; I accept it.", "ACCEPT"),  # a negated reject is no verdict
    ("Reject. Even though the format is acceptable, the value is wrong.", "REJECT"),
    ("The reasoning is fine and I would accept the method.\nVerdict: REJECT", "REJECT"),  # a field beats prose
    ("ACCEPT or REJECT: ACCEPT", "ACCEPT"),  # the prompt's "ACCEPT or REJECT" echoed back is no verdict
    ("ACCEPT or REJECT? REJECT", "REJECT"),
    ("<think>Should I accept? It says 6, I reject that.</think>\nREJECT", "REJECT"),
    ("<think>I was going to reject, but 5 is right.</think>\nACCEPT", "ACCEPT"),
    # ----------------------------------------------------------------- real Verifier replies of the bundled models
    # (role_messages(Role.VERIFIER, ...) after one Worker turn; temperature 0.7, top_p 0.95, max_tokens 48)
    # qwen2.5-coder-1.5b, verifier, seed 0; "A shop sells pens at 3 dollars each. ..." with a right proposed answer
    ("ACCEPT", "ACCEPT"),
    # qwen2.5-coder-1.5b, verifier, seed 0; "What is 7 + 5?" with a right proposed answer
    ("ACCEPT\nThe proposed answer is correct.", "ACCEPT"),
    # qwen2.5-coder-1.5b, verifier, seed 0; "What is the square root of 81?" with a wrong proposed answer  (wrong too, still what was said)
    ("ACCEPT\nThe proposed answer is correct. The square root of 81 is indeed 8, as \\(8^2 = 64\\) and \\(9^2 = 81\\).", "ACCEPT"),
    # qwen2.5-coder-1.5b, verifier, seed 0; "What is 6 * 4?" with a wrong proposed answer  (the proposed 20 was wrong: the verdict is what was said)
    ("ACCEPT.\nThe proposed answer is correct.", "ACCEPT"),
    # qwen2.5-coder-0.5b, verifier, seed 0; "What is 7 + 5?" with a right proposed answer
    ("REJECT\n\nThe proposed answer is incorrect. The correct answer is indeed 12.", "REJECT"),
    # qwen2.5-coder-1.5b, verifier, seed 0; "What is 7 + 5?" with a wrong proposed answer
    ("REJECT\nThe proposed answer is incorrect. The correct answer to 7 + 5 is 12, not 13.", "REJECT"),
    # qwen2.5-coder-1.5b, verifier, seed 0; "What is 15 - 9?" with a right proposed answer
    ("REJECT. The proposed answer is incorrect. The correct answer is 15 - 9 = 6.", "REJECT"),
    # smollm2-135m, verifier, seed 0; "What is 7 + 5?" with a right proposed answer  (no verdict word)
    ("The correct answer is 12.", "REJECT"),
    # smollm2-135m, verifier, seed 0; "What is the square root of 81?" with a wrong proposed answer  (no verdict word)
    ("The proposed answer is correct, but it's not. The square root of 81 is indeed 8.\n\nTo confirm, I'll provide the correct answer:\n\nThe square root of 81 is indeed 8", "REJECT"),
    # gemma-3-270m, verifier, seed 0; "What is 7 + 5?" with a right proposed answer  (conditions, not verdicts)
    (" Accept if correct.\n\nAnswer: REJECT if correct.\n\nIf you need to send a more detailed answer, please follow the instructions in the comments.\n\nAnswer: Accept if correct.\n\nAnswer: REJECT if correct.\n\nAnswer", "REJECT"),
    # gemma-3-270m, verifier, seed 0; "What is the square root of 81?" with a right proposed answer  (conditions, not verdicts)
    (" Accept if correct.\n\nAnswer: Reject if incorrect.", "REJECT"),
    # gemma-3-270m, verifier, seed 0; "A shop sells pens at 3 dollars each. ..." with a right proposed answer  (the prompt echoed back is no verdict)
    (" Accept: $12.\n\nIs the proposed answer correct? Reply with ACCEPT or REJECT first, then one sentence why.\n\nAnswer: Accept: $12.\n\nIs the proposed answer correct? Reply with ACCEPT or REJECT", "ACCEPT"),
    # gemma-3-270m, verifier, seed 0; "What is 6 * 4?" with a right proposed answer  (the prompt echoed back is no verdict)
    (" 24\n\nIs the proposed answer correct? Reply with ACCEPT or REJECT first, then one sentence why.\n\nAnswer: 24\n\nIs the proposed answer correct? Reply with ACCEPT or REJECT first, then one sentence why", "REJECT"),
    # gemma-3-270m, verifier, seed 0; "A shop sells pens at 3 dollars each. ..." with a wrong proposed answer  (a leading "Accept" is read as the verdict)
    (" Accept the answer and explain why.\n\nAnswer: \\boxed{3}", "ACCEPT"),
    # ----------------------------------------------------------------- whole words only, default REJECT
    ("ACCEPTANCE", "REJECT"),
    ("hmm", "REJECT"),
    ("", "REJECT"),
    ("The proposed answer is correct.", "REJECT"),  # no verdict word: default REJECT
]


@pytest.mark.parametrize("reply,want", VERDICT_CASES)
def test_parse_verdict(reply, want):
    assert parse_verdict(reply) == want
