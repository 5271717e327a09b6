"""A flow process started as `python flows/<stage>.py` without PREFECT_API_URL (so Prefect starts its ephemeral
API server) leaves no process behind when it is SIGKILLed: trinity.ops.process_guard's guardian stops the server.
Everything runs under tests/fixtures/process_supervisor.py, which ends whatever is left when the test does."""
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from fixtures.process_supervisor import Supervisor, alive

FLOWS = Path(__file__).resolve().parents[2] / "flows"

SLEEPER_FLOW = """
import sys, time
sys.path.insert(0, {flows!r})
from _bootstrap import main  # what every flows/<stage>.py runs
from prefect import flow


@flow(name="sleeper")
def sleeper(params: str = "params.yaml"):
    print("FLOW-RUNNING", flush=True)
    time.sleep(600)


main(sleeper)
"""


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def _start_flow(sup: Supervisor, tmp_path: Path) -> tuple[int, Path]:
    script = tmp_path / "sleeper_flow.py"
    script.write_text(SLEEPER_FLOW.format(flows=str(FLOWS)))
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # → Prefect's ephemeral server
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    log = tmp_path / "flow.log"
    pid = sup.start("flow", [sys.executable, str(script)], env, str(tmp_path), str(log))
    deadline = time.monotonic() + 240
    while "FLOW-RUNNING" not in (log.read_text() if log.exists() else ""):
        assert alive([pid]) and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)
    return pid, log


def _gone_within(pids, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])  # SIGTERM skipped Prefect's exit handler too
def test_killed_flow_leaves_no_process(tmp_path, sig):
    with Supervisor() as sup:
        flow_pid, log = _start_flow(sup, tmp_path)
        tree = sup.descendants()
        servers = [p for p in tree if "uvicorn" in _cmdline(p) and "prefect.server" in _cmdline(p)]
        assert servers, [_cmdline(p) for p in tree]  # the ephemeral API server the run started
        os.kill(flow_pid, sig)
        left = _gone_within(tree, 15)
        assert left == [], f"left behind after {sig.name} of the flow: {[(p, _cmdline(p)) for p in left]}"
    assert "stopped the 1 process(es) it left" in log.read_text(), log.read_text()[-2000:]


def test_unreachable_prefect_api_fails_before_the_flow(tmp_path):
    import socket
    import subprocess

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/api"
    script = tmp_path / "sleeper_flow.py"
    script.write_text(SLEEPER_FLOW.format(flows=str(FLOWS)))
    r = subprocess.run([sys.executable, str(script)], env={**os.environ, "PREFECT_API_URL": url}, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert f"error: the Prefect API at {url} (PREFECT_API_URL) is unreachable" in r.stderr
    assert "FLOW-RUNNING" not in r.stdout
