"""SVF in training: with coordinator.svf_layer set, the flat vector is [δ…, head…]; each candidate's δ gives
its transcripts their own hidden states (encoded under an adapter-specific encoder id, so stored apart and
found again on a rerun), and the trained vector evaluates with the same layout."""
import numpy as np
import pytest

from trinity.config import Settings
from trinity.coordinator.episode import StateCache
from trinity.coordinator.head import HeadShape, ParamLayout
from trinity.coordinator.roles import coordinator_text
from trinity.evolve.loop import evolve, param_layout
from trinity.records import Task
from trinity.store import Store

SETTINGS = {
    "pool": {"members": [
        {"name": "smol-a", "backend": "local", "model": "smollm2-135m-instruct", "max_tokens": 12, "temperature": 0.8},
        {"name": "smol-b", "backend": "local", "model": "smollm2-135m-instruct", "max_tokens": 8, "temperature": 0.3},
    ]},
    "coordinator": {"max_turns": 2, "thinker_max_tokens": 8, "verifier_max_tokens": 4, "max_encode_tokens": 256,
                    "svf_layer": -2},
    "evolve": {"generations": 1, "popsize": 4, "episodes_per_candidate": 1, "sigma0": 0.5},
}
TASKS = [Task(id="g/1", source="gsm8k", prompt=("What is 7 times 6?",), grader="math", answer="42")]


def test_paper_parameter_count():
    # L=7, d=1024: head (7+3) x 1024 = 10,240; + 9,216 SVF scales = 19,456 (< 20K)
    layout = ParamLayout(HeadShape(n_models=7, dim=1024), n_svf=9216)
    assert layout.head.n_params == 10240 and layout.n_params == 19456


def test_svf_candidates_train_with_their_own_states(tmp_path):
    from trinity.grading import grade
    from trinity.pool.runtime import build_pool
    from trinity.coordinator.policy import make_encoder

    s = Settings.model_validate(SETTINGS)
    encoder = make_encoder(s)
    # bundled SmolLM2 (d=576, 9 heads, 3 kv heads of 64, MLP 1536): one block's q,o,gate,up,down have
    # min(rows, cols) = 576 singular values each, k and v 192 → 5*576 + 2*192 = 3,264 SVF scales
    assert dict(encoder.svf_layout) == {"self_attn.q_proj": 576, "self_attn.k_proj": 192, "self_attn.v_proj": 192,
                                        "self_attn.o_proj": 576, "mlp.gate_proj": 576, "mlp.up_proj": 576,
                                        "mlp.down_proj": 576}
    base_id = encoder.encoder_id
    with Store(tmp_path / "s.duckdb") as store:
        pool = build_pool(s.pool, store)  # evolve asks the role caps of s
        states = StateCache(encoder, store)
        layout = param_layout(s, len(pool), states)
        assert (layout.n_svf, layout.head.n_params, layout.n_params) == (3264, 2880, 6144)
        res = evolve(s, TASKS, pool, states, grade, store=store, run_id="svf")
        assert res.params.shape == (6144,) and res.layout == layout
        ids = [r[0] for r in store.con.execute("SELECT DISTINCT encoder_id FROM states").fetchall()]
        svf_ids = [i for i in ids if i.startswith(base_id + "/svf")]
        # one adapter per candidate (every δ differs), and the CMA mean's, scored as the saved vector
        assert len(svf_ids) == 4 + 1
        # the same transcript, two candidates' δ: different hidden states
        root = [coordinator_text(TASKS[0], ())]
        d1, d2 = np.random.default_rng(1).normal(0, 0.3, (2, 3264))  # (a uniform δ is renormalised away)
        h1 = states.lookup(["k"], root.__getitem__, adapter=d1)
        h2 = states.lookup(["k"], root.__getitem__, adapter=d2)
        assert not np.allclose(h1, h2)
        rows = store.con.execute("SELECT candidate, path, reward FROM episodes ORDER BY ALL").fetchall()

    # rerun from the store: nothing encoded, nothing called, the same generation
    with Store(tmp_path / "s.duckdb") as store:
        pool = build_pool(s.pool, store)  # evolve asks the role caps of s
        states = StateCache(encoder, store)
        again = evolve(s, TASKS, pool, states, grade, store=store, run_id="svf2")
        assert states.encoded == 0 and pool.stats.calls_made == 0
        assert store.con.execute("SELECT candidate, path, reward FROM episodes WHERE run_id='svf2' ORDER BY ALL"
                                 ).fetchall() == rows
        np.testing.assert_array_equal(again.params, res.params)

        # the trained vector evaluates with its δ (argmax policy)
        from trinity.evaluation.run import evaluate
        out = evaluate(s, res.params, {"in_distribution": TASKS}, pool, states, grade, methods=["trinity"])
        assert [(i.method, i.task.id) for i in out.items] == [("trinity", TASKS[0].id)]
        assert encoder.encoder_id.startswith(base_id + "/svf")  # evaluation encoded with the trained δ

    with pytest.raises(NotImplementedError, match="head only"):
        evolve(Settings.model_validate({**SETTINGS, "evolve": {**SETTINGS["evolve"], "method": "reinforce"}}),
               TASKS, pool, StateCache(encoder, None), grade)
