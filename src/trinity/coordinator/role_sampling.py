"""What each role asks of a pool member: the one table of the coordinator's side of a request.

The pool knows no roles (`trinity.pool.runtime`): a caller asks it for a member's sampling with a completion-token
cap and an output format (`pool.runtime.Ask`) and the pool resolves them against the member's own settings. Which
cap and which format a role asks is decided here, and every caller (the episode loop, the baselines, validation,
serving, the scripts and benches) asks through a `RoleSampling`:

- Thinker and Verifier turns are capped at `coordinator.thinker_max_tokens` / `verifier_max_tokens`
  (`RoleSampling.of(settings)`); a Worker turn and a direct call (no role) get the member's own max_tokens, unless
  serving caps a client's answers (`answers_capped`);
- a Verifier's reply must end with the verdict field (`trinity.verdict.VERDICT_FORMAT`: local members decode under
  its grammar, API members get it as structured output); every other role answers in free text.

A request carries its role's name as its label, which the response store records (the `role` column) and nothing
reads. For the same settings, member and messages, a request's sampling, and so its store key, is what it was when
the pool held the role caps itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from trinity.coordinator.roles import Role
from trinity.pool.runtime import Ask, Pool, Request
from trinity.records import ChatMessage, ChatResponse, SamplingParams
from trinity.verdict import VERDICT_FORMAT

ROLE_OUTPUT_FORMAT: dict[str, str] = {Role.VERIFIER.value: VERDICT_FORMAT}
"""The reply shape each role demands of a member (`SamplingParams.output_format`); other roles: free text."""

SIGNATURE_ROLES: tuple[str | None, ...] = (None, Role.THINKER.value, Role.WORKER.value, Role.VERIFIER.value)
"""The asks a pool's signature is taken over (`RoleSampling.signature`): a direct call, then each role."""


def _name(role: Role | str | None) -> str:
    """A role's name in the caps table ("" for a direct call)."""
    return role.value if isinstance(role, Role) else (role or "")


@dataclass(frozen=True)
class RoleSampling:
    """The completion-token cap of each role (`caps`: (role name, cap) pairs; "" is a direct call; a role without
    one, or a cap of 0, keeps the member's max_tokens) and, through `ROLE_OUTPUT_FORMAT`, its output format. The
    default caps nothing: a Verifier still asks for its verdict."""

    caps: tuple[tuple[str, int], ...] = ()

    @classmethod
    def capped(cls, caps: Mapping[str, int]) -> "RoleSampling":
        """Role sampling with these caps ({role name: max_tokens}; "" = a direct call)."""
        return cls(tuple(caps.items()))

    @classmethod
    def of(cls, settings) -> "RoleSampling":
        """The caps of a run's settings: Thinker and Verifier turns at `coordinator.thinker_max_tokens` and
        `verifier_max_tokens` (the Worker's is the member's own max_tokens)."""
        c = settings.coordinator
        return cls.capped({Role.THINKER.value: c.thinker_max_tokens, Role.VERIFIER.value: c.verifier_max_tokens})

    def ask(self, role: Role | str | None) -> Ask:
        """What `role` (None: a direct call) asks of a member's sampling."""
        name = _name(role)
        return Ask(dict(self.caps).get(name), ROLE_OUTPUT_FORMAT.get(name))

    def sampling(self, pool: Pool, idx: int, role: Role | str | None) -> SamplingParams:
        """Member `idx`'s sampling in `role`."""
        return pool.sampling(idx, self.ask(role))

    def request(self, pool: Pool, idx: int, messages: Sequence[ChatMessage], role: Role | str | None) -> Request:
        """The request of `messages` to member `idx` in `role`, labelled with the role's name (None: a direct
        call)."""
        return pool.request(idx, messages, self.ask(role), _name(role) or None)

    def key(self, pool: Pool, idx: int, messages: Sequence[ChatMessage], role: Role | str | None) -> str:
        """The response-store key of `request(pool, idx, messages, role)`."""
        return self.request(pool, idx, messages, role).key

    async def complete(self, pool: Pool, idx: int, messages: Sequence[ChatMessage],
                       role: Role | str | None) -> ChatResponse:
        """Member `idx`'s reply to `messages` in `role`, through the pool (and its store)."""
        return (await pool.complete_many([self.request(pool, idx, messages, role)]))[0]

    def answers_capped(self, max_tokens: int) -> "RoleSampling":
        """These caps with every answer capped at `max_tokens` completion tokens: Worker turns and direct calls;
        Thinker and Verifier turns keep their own caps, and a member's own lower cap still applies. Only the
        sampling of the capped requests (and so their store keys) differs. Serving honours a client's
        `max_tokens` with it."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        caps = dict(self.caps)
        for name in (Role.WORKER.value, ""):
            caps[name] = min(caps.get(name, max_tokens), max_tokens)
        return RoleSampling.capped(caps)

    def signature(self, pool: Pool) -> tuple:
        """What the store keys of `pool`'s requests in every role depend on (`Pool.signature` over a direct call
        and the three roles): a memo of request keys is valid while it holds."""
        return pool.signature([self.ask(r) for r in SIGNATURE_ROLES])
