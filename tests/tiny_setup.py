"""The tiny real setup several training tests share: two SmolLM2-135M members with different sampling (so
the head has a real choice to make, at ~70 tok/s), short role caps, and arithmetic tasks whose answer is 42."""
from trinity.records import Task

# in-process: these tests compare fresh runs byte for byte (threads vs Dask, resumed vs uninterrupted), which only
# the engine without batching guarantees; the llama-server engine has its own tests (test_pool_llama_server.py)
SMOL_PAIR_POOL = {"local_engine": "in-process", "members": [
    {"name": "smol-a", "backend": "local", "model": "smollm2-135m-instruct", "max_tokens": 16, "temperature": 0.8},
    {"name": "smol-b", "backend": "local", "model": "smollm2-135m-instruct", "max_tokens": 12, "temperature": 0.3},
]}
SHORT_COORDINATOR = {"max_turns": 2, "thinker_max_tokens": 12, "verifier_max_tokens": 4, "max_encode_tokens": 384}
ROLE_CAPS = {"thinker": 12, "verifier": 4}
ARITHMETIC_TASKS = [Task(id="g/1", source="gsm8k", prompt=("What is 7 times 6?",), grader="math", answer="42"),
                    Task(id="g/2", source="gsm8k", prompt=("What is 12 plus 30?",), grader="math", answer="42"),
                    Task(id="g/3", source="gsm8k", prompt=("What is 50 minus 8?",), grader="math", answer="42")]
