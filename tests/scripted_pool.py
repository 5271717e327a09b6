"""Scripted pool parts for tests where the protocol, not model quality, is under test: a ChatModel whose reply
depends on the role it is asked for, an encoder whose state is a hash of the transcript, and an encoder + head
pair that plays a scripted sequence of (model, role) picks."""
import hashlib

import numpy as np

from trinity.coordinator.roles import ROLES
from trinity.records import ChatResponse


def role_of(messages) -> str:
    """Which role prompt (trinity.coordinator.roles.role_messages) a request carries."""
    text = messages[-1].content
    return "verifier" if "ACCEPT or REJECT" in text else "thinker" if "<suggestion>" in text else "worker"


class ScriptedModel:
    """replies: role → reply text, or a whole ChatResponse (e.g. a failed call) returned as is."""

    def __init__(self, name, replies):
        self.name, self.model_id, self.replies, self.calls = name, f"scripted:{name}", replies, 0

    async def chat(self, messages, sampling):
        self.calls += 1
        reply = self.replies[role_of(messages)]
        if isinstance(reply, ChatResponse):
            return reply
        return ChatResponse(text=reply, model=self.model_id, prompt_tokens=10, completion_tokens=5)


class HashEncoder:
    encoder_id, dim = "hash-encoder", 8

    def encode(self, texts):
        return np.stack([np.frombuffer(hashlib.sha256(t.encode()).digest(), dtype=np.uint8)[:8].astype(np.float32)
                         / 255 - 0.5 for t in texts])


class TurnCountEncoder:
    """State = one-hot of the number of turns played so far, so a head can script its argmax pick turn by turn."""
    encoder_id, dim = "turn-count-encoder", 8

    def encode(self, texts):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            n = sum(part.startswith(("thinker: ", "worker: ", "verifier: ")) for part in t.split("\n\n"))
            out[i, min(n, self.dim - 1)] = 1.0
        return out


def scripted_head(script, n_models: int, dim: int = 8) -> np.ndarray:
    """A head whose argmax at turn i, under TurnCountEncoder states, is script[i] = (model, role)."""
    W = np.zeros((n_models + 3, dim))
    for i, (model, role) in enumerate(script):
        W[model, i] = 10.0
        W[n_models + ROLES.index(role), i] = 10.0
    return W
