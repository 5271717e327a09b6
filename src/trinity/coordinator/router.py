"""The learned router: the baseline a user would pick instead of a coordinator. RouteLLM and Avengers-Pro pick one
member per question; this is that, trained the way the coordinator is, so the comparison isolates what multi-turn,
multi-role coordination adds over a learned per-question model choice.

It is the coordinator with one turn and one role (`router_settings`: `coordinator.max_turns` 1, `coordinator.roles`
["worker"]): the same encoder and head reading the question's hidden state, the same sep-CMA-ES, training items,
budget (generations x popsize x episodes_per_candidate) and reward, its own seeded run. The head's role rows exist
but are never read. SVF is off for it (a head only, the paper's default). The `router` stage trains it beside the
coordinator (data/router/router.{npy,json}); the evaluation plays it as the method `router` on every item.

Cost: a router episode is one Worker call on the question, the same request as the coordinator's first Worker turn
on it and as a member's `alone:` answer, so most of its training and all of its evaluation are store hits."""
from __future__ import annotations

from trinity.config import Settings

ROUTER = "router"
"""The method id of the learned router in the evaluation's tables."""


def router_settings(settings: Settings) -> Settings:
    """`settings` with the coordinator cut down to the router: one turn, Worker only, no SVF."""
    co = settings.coordinator.model_copy(update={"max_turns": 1, "roles": ["worker"], "svf_layer": None})
    return settings.model_copy(update={"coordinator": co})
