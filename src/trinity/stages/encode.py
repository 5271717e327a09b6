"""encode: the coordinator LM's hidden state of every task's opening transcript (the root of its rollout tree),
into the store and data/encode/root_states.parquet (params `coordinator.encoder*`)."""
from __future__ import annotations

import time

from trinity.config import Settings
from trinity.files import write_json
from trinity.coordinator import policy
from trinity.stages.common import load_tasks
from trinity.stages.paths import Paths


def run(settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    from trinity.coordinator.episode import StateCache
    from trinity.coordinator.roles import coordinator_text
    from trinity.store import Store, text_key

    tasks = [t for split in load_tasks(paths) for t in split]
    encoder = policy.make_encoder(settings)
    t0 = time.perf_counter()
    with Store(paths.store) as store:
        cache = StateCache(encoder, store)
        texts = [coordinator_text(t, ()) for t in tasks]
        H = cache.states(texts)
        paths.encoded.mkdir(parents=True, exist_ok=True)
        import pyarrow as pa
        import pyarrow.parquet as pq

        tbl = pa.table({"task_id": [t.id for t in tasks], "key": [text_key(x) for x in texts],
                        "state": [row.tolist() for row in H]})
        pq.write_table(tbl, paths.encoded / "root_states.parquet")
    summary = {"encoder_id": encoder.encoder_id, "dim": int(encoder.dim), "transcripts": len(texts),
               "newly_encoded": cache.encoded, "wall_s": round(time.perf_counter() - t0, 3)}
    write_json(paths.metrics("encode"), summary)
    return summary
