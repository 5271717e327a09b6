"""Response-store hit path: lookups/s on a store of 20k responses (goal >= 10k/s).
Compared with a plain dict lookup of the same keys in the same run (the floor of any in-process cache)."""
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from trinity.records import ChatMessage, ChatResponse, SamplingParams
from trinity.store import Store, response_key


def main():
    n = 20_000
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s.duckdb"
        sp = SamplingParams()
        keys = []
        with Store(path) as s:
            s.con.execute("BEGIN")
            for i in range(n):
                msgs = [ChatMessage("user", f"question {i}")]
                k = response_key("m", msgs, sp)
                keys.append((msgs, k))
                s.con.execute("INSERT INTO responses (key, model_id, role, messages, sampling, text, ok) "
                              "VALUES (?, 'm', 'worker', '[]', '{}', ?, true)", [k, f"answer {i}"])
            s.con.execute("COMMIT")
        with Store(path) as s:  # reopen: lookups served after a cold start
            plain = {k: ChatResponse(text="x") for _, k in keys}
            store_rates, dict_rates = [], []
            for _ in range(5):
                t0 = time.perf_counter()
                for msgs, _k in keys:  # the full hit path: hash the request, then look it up
                    assert s.get_response(response_key("m", msgs, sp)) is not None
                store_rates.append(n / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                for msgs, _k in keys:
                    assert plain.get(response_key("m", msgs, sp)) is not None
                dict_rates.append(n / (time.perf_counter() - t0))
    fig = statistics.median(store_rates)
    print(json.dumps({"name": "store_lookup", "figure": round(fig), "unit": "lookups/s", "goal": ">= 10000",
                      "compared_to": "hashing the request + a plain dict lookup (same keys, same run)",
                      "detail": {"store_lookups_per_s": [round(x) for x in store_rates],
                                 "dict_lookups_per_s": [round(x) for x in dict_rates], "stored_responses": n}}))


if __name__ == "__main__":
    sys.exit(main())
