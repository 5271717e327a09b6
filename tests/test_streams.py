"""Episode streams seeded in bulk draw exactly what np.random.default_rng(seed parts) draws."""
import numpy as np

from trinity.coordinator.episode import episode_rng, episode_rngs
from trinity.coordinator.streams import episode_streams


def test_bulk_streams_match_numpy_default_rng():
    rng = np.random.default_rng(1)
    parts = []
    for _ in range(1500):
        k = int(rng.integers(1, 8))  # 1..7 parts: entropy shorter and longer than the pool of 4 words
        parts.append(tuple((int(rng.integers(0, 1 << 62)) >> int(rng.choice([0, 14, 29, 30, 31, 40, 61])))
                           * (1 << int(rng.choice([0, 0, 0, 5, 40]))) if rng.random() < 0.9 else 0 for _ in range(k)))
    for p, s in zip(parts, episode_streams(parts)):
        g = np.random.default_rng(list(p))
        assert [s.random() for _ in range(6)] == [g.random() for _ in range(6)], p


def test_bulk_episode_rngs_equal_episode_rng():
    parts = [(3, g, c, f"math500/{t}") for g in (0, 9) for c in range(5) for t in range(3)]
    for p, bulk in zip(parts, episode_rngs(parts)):
        one = episode_rng(*p)
        assert [bulk.random() for _ in range(6)] == [one.random() for _ in range(6)]
