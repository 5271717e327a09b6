"""The `trinity` command line: every command and option documented, `ask` (answer on stdout, trace table on stderr,
meaningful exit codes), `trace` on a real store, and the answer path behind ask and serve (`Coordinator.answer`),
with the real encoder and pool members served over HTTP by tests/fixtures/fake_openai_server.py (the setup of
tests/integration/test_serve.py)."""
from __future__ import annotations

import json
import re

import pytest
import typer
from fixtures.fake_openai_server import FakeOpenAIServer
from test_serve import MEMBERS, THINKER_REPLY, PoolReplies, worker_reply, write_checkpoint, write_params

from trinity import cli

from trinity.coordinator import policy

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project directory: params (the fake pool), data/checkpoints/coordinator, the store under data/store."""
    replies = PoolReplies()
    fake = FakeOpenAIServer(reply=replies).start()
    root = tmp_path_factory.mktemp("cli")
    params = write_params(root / "params.yaml", fake.base_url)
    from trinity.config import load_settings

    encoder = policy.make_encoder(load_settings(params))  # loaded once for the module's in-process runs
    write_checkpoint(root / "data" / "checkpoints" / "coordinator", encoder=encoder.encoder_id)
    yield {"root": root, "params": params, "fake": fake, "encoder": encoder, "replies": replies}
    fake.stop()


@pytest.fixture
def run(project, capsys, monkeypatch):
    """`trinity ARGS` in process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(policy, "make_encoder", lambda settings: project["encoder"])
    monkeypatch.setenv("COLUMNS", "200")

    def go(*args: str, root: bool = True) -> tuple[int, str, str]:
        extra = ["--root", str(project["root"])] if root else []
        code = cli.main([*args, *extra])
        out = capsys.readouterr()
        return code, out.out, out.err

    return go


def test_help_documents_every_command_and_option(capsys):
    assert cli.main(["--help"]) == 0
    top = capsys.readouterr().out
    for cmd in ("ask", "trace", "serve", "stage", "report", "export", "diagnose", "store", "check-graders"):
        assert cmd in top
    assert "Exit codes" in top and "3 a pool failure" in top
    group = typer.main.get_command(cli.app)
    assert sorted(group.commands) == ["ask", "check-graders", "diagnose", "export", "report", "serve", "stage", "store",
                                      "trace"]
    store = group.commands.pop("store")
    assert sorted(store.commands) == ["export", "import"]
    for name, command in store.commands.items():
        assert command.help, name
        assert all(getattr(p, "help", None) for p in command.params if p.param_type_name == "option"), name
        assert cli.main(["store", name, "--help"]) == 0
        assert "Usage: trinity store " + name in capsys.readouterr().out
    for name, command in group.commands.items():
        assert command.help, name
        for param in command.params:
            if param.param_type_name == "option":
                assert getattr(param, "help", None), f"{name} {param.opts}: no help"
        if name != "check-graders":  # (passes --help on to the grader check)
            assert cli.main([name, "--help"]) == 0
            assert "Usage: trinity " + name in capsys.readouterr().out
    assert cli.main(["ask"]) == cli.EXIT_USAGE  # missing question
    assert cli.main(["nonsense"]) == cli.EXIT_USAGE


def test_ask_prints_the_answer_and_a_trace_table_and_trace_renders_it(project, run):
    q = "What is 35 plus 7?"
    code, out, err = run("ask", q, "--params", str(project["params"]))
    assert code == 0, err
    assert out == worker_reply(q) + "\n"  # stdout: the answer alone
    assert re.search(r"1 .*alpha .*thinker .*fresh", err) and re.search(r"2 .*alpha .*worker", err)
    assert "answered by alpha; 3 turn(s), 3 fresh" in err  # test_serve's params: the latest answer, 3 turns
    episode = re.search(r"episode (ep-[0-9a-f]{16})", err).group(1)

    code, out, err = run("ask", q, "--params", str(project["params"]))
    assert code == 0 and out == worker_reply(q) + "\n" and "0 fresh repl(ies), 3 from the store" in err

    code, out, _ = run("ask", q, "--params", str(project["params"]), "--json")
    trace = json.loads(out)
    assert trace["episode_id"] == episode and trace["answer"] == worker_reply(q)
    assert [t["role"] for t in trace["turns"]] == ["thinker", "worker", "thinker"]

    code, out, err = run("trace", episode)
    assert code == 0, err
    for piece in (q, THINKER_REPLY, worker_reply(q), "turn 2: worker (alpha)", "answered by alpha"):
        assert piece in out
    code, out, _ = run("trace")
    assert code == 0 and episode in out and "answered" in out


def test_ask_with_a_system_message_and_an_answer_format(project, run):
    code, out, err = run("ask", "What is 2 + 40?", "--system", "Be terse.", "-f", "math",
                         "--params", str(project["params"]))
    assert code == 0, err
    # the system text leads the first user message; the math answer format follows the question
    assert out == worker_reply("Be terse.") + "\n"
    worker = [m for m in project["replies"].seen if m[0]["content"].startswith("You are a careful expert")][-1]
    assert worker[-1]["content"].startswith("Be terse.\n\nWhat is 2 + 40?") and "\\boxed{}" in worker[-1]["content"]


def test_exit_codes_say_what_went_wrong(project, run, tmp_path):
    params = str(project["params"])
    code, _, err = run("ask", "hi", "--params", params, "--checkpoint", str(tmp_path / "nowhere"))
    assert code == cli.EXIT_USAGE and "nowhere" in err

    other = write_checkpoint(tmp_path / "other" / "coordinator", members=("x", "y"))
    code, _, err = run("ask", "hi", "--params", params, "--checkpoint", str(other.parent))
    assert code == cli.EXIT_USAGE and "trained on pool ['x', 'y']" in err and str(list(MEMBERS)) in err
    other = write_checkpoint(tmp_path / "other-encoder" / "coordinator", encoder="another-encoder")
    code, _, err = run("ask", "hi", "--params", params, "--checkpoint", str(other.parent))
    assert code == cli.EXIT_USAGE and "checkpoint encoder 'another-encoder' differs from configured" in err

    code, _, err = run("ask", "hi", "--params", str(tmp_path / "missing.yaml"))
    assert code == cli.EXIT_USAGE and "missing.yaml" in err

    keyed = tmp_path / "keyed.yaml"
    keyed.write_text(project["params"].read_text().replace("max_retries: 0", "api_key_env: TRINITY_TEST_UNSET_KEY, "
                                                                           "max_retries: 0", 1))
    code, _, err = run("ask", "hi", "--params", str(keyed))
    assert code == cli.EXIT_USAGE and "TRINITY_TEST_UNSET_KEY" in err

    code, _, err = run("ask", "hi", "-f", "essay", "--params", params)
    assert code == cli.EXIT_USAGE and "essay" in err

    fake = project["fake"]
    with fake._lock:
        fake.scripts["fake-a"] = ["503"] * 3
    code, out, err = run("ask", "What is 41 plus 1?", "--params", params)
    assert code == cli.EXIT_POOL_FAILURE and out == ""
    assert "pool member 'alpha' failed: http 503: upstream failure 503" in err

    verifier_first = write_checkpoint(tmp_path / "verifier" / "coordinator", role=2,
                                      encoder=project["encoder"].encoder_id)
    n0 = fake.request_count
    code, out, err = run("ask", "What is 39 plus 3?", "--params", params, "--checkpoint", str(verifier_first.parent))
    # a head that always picks the Verifier still answers: a Verifier is not an action until there is an answer
    assert code == 0 and out.strip() and fake.request_count > n0

    code, _, err = run("trace", "ep-0000000000000000")
    assert code == cli.EXIT_NOT_FOUND and "ep-0000000000000000" in err
    code, _, err = run("trace", "--store", str(tmp_path / "none.duckdb"), root=False)
    assert code == cli.EXIT_USAGE and "does not exist" in err


def test_every_other_failure_is_one_line_and_exit_5_with_the_traceback_under_debug(tmp_path, capsys, monkeypatch):
    import trinity.stages

    root = tmp_path / "proj"
    root.mkdir()
    from pathlib import Path

    params = (Path(__file__).parents[2] / "params.yaml").read_text()
    (root / "params.yaml").write_text(params.replace("root: ../shared/benchmarks", "root: /nonexistent/bench"))
    monkeypatch.chdir(tmp_path)  # --params params.yaml is read from --root, not from here
    monkeypatch.delenv("TRINITY_DATA_DIR", raising=False)  # it would override data.root (.ci/run may set it)
    assert cli.main(["stage", "prepare", "--root", str(root)]) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("trinity: DataError: /nonexistent/bench/") and "--debug prints the traceback" in err
    assert cli.main(["--debug", "stage", "prepare", "--root", str(root)]) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.rstrip().endswith("(benchmark root /nonexistent/bench)")

    assert cli.main(["serve", "--log-level", "loud"]) == cli.EXIT_USAGE  # a choice
    assert "'loud' is not one of 'critical', 'error', 'warning', 'info', 'debug'" in capsys.readouterr().err

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(trinity.stages, "run_stage", interrupted)
    assert cli.main(["stage", "prepare", "--root", str(root)]) == cli.EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err == "trinity: interrupted\n"


def test_relative_paths_are_read_from_root(project, run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run("ask", "What is 36 plus 6?", "--params", "params.yaml", "--checkpoint", "data/checkpoints",
                         "--store", "data/store/trinity.duckdb")
    assert code == 0 and out == worker_reply("What is 36 plus 6?") + "\n", err
    code, out, err = run("export", "--out", "exports")
    assert code == 0 and (project["root"] / "exports" / "responses.parquet").is_file(), err
    assert not (tmp_path / "exports").exists()


def test_episodes_play_off_the_event_loop_and_report_turns_on_it(project, tmp_path, monkeypatch):
    """The answer path behind ask and serve: encodes run on the episodes' threads (so a server's event loop is never
    held by the encoder), turns are reported on the caller's loop, concurrent episodes share one encoder."""
    import asyncio
    import threading

    from trinity.serving.conversation import Coordinator
    from trinity.serving.messages import task_from_messages

    encoder = project["encoder"]
    encode_threads: list[str] = []
    original = encoder.encode

    def recording(texts):
        encode_threads.append(threading.current_thread().name)
        return original(texts)

    monkeypatch.setattr(encoder, "encode", recording)
    qs = [f"What is {n} plus {42 - n}?" for n in (11, 12, 13)]
    with Coordinator.load(project["root"] / "data" / "checkpoints", project["params"], tmp_path / "store.duckdb",
                          encoder=encoder) as coordinator:
        reported: list[str] = []

        async def run():
            tasks = [task_from_messages([{"role": "user", "content": q}]) for q in qs]
            results = await asyncio.gather(*(coordinator.answer(
                t, on_turn=lambda turn: reported.append(threading.current_thread().name)) for t in tasks))
            return threading.current_thread().name, results

        loop_thread, results = asyncio.run(run())
    assert [r.answer for r in results] == [worker_reply(q) for q in qs]
    assert encode_threads and all(n.startswith("trinity-episode") for n in encode_threads)
    assert reported == [loop_thread] * 9  # 3 episodes x 3 turns, each reported on the caller's loop
    assert coordinator.states.encoded == 9  # one StateCache: each of the 9 transcripts encoded once
