"""Switches read from the environment (standard library only: the sandbox imports it too)."""
from __future__ import annotations

import os

ENV_TRUE = ("1", "true", "yes", "on")


def env_flag(name: str) -> bool:
    """Whether the environment variable `name` switches something on (1, true, yes or on, any case); unset,
    empty or anything else: off."""
    return os.environ.get(name, "").strip().lower() in ENV_TRUE
