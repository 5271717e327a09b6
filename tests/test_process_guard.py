"""A flow process started as `python flows/<stage>.py` without PREFECT_API_URL (so Prefect starts its ephemeral
API server) leaves no process behind when it is SIGKILLed: trinity.process_guard's guardian stops the server.
Everything runs under tests/process_supervisor.py, which ends whatever is left when the test does."""
import os
import signal
import sys
import time
from pathlib import Path

import psutil

from process_supervisor import Supervisor, alive

FLOWS = Path(__file__).resolve().parents[1] / "flows"

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


def test_sigkilled_flow_leaves_no_process(tmp_path):
    with Supervisor() as sup:
        flow_pid, log = _start_flow(sup, tmp_path)
        tree = sup.descendants()
        servers = [p for p in tree if "uvicorn" in _cmdline(p) and "prefect.server" in _cmdline(p)]
        assert servers, [_cmdline(p) for p in tree]  # the ephemeral API server the run started
        os.kill(flow_pid, signal.SIGKILL)
        left = _gone_within(tree, 15)
        assert left == [], f"left behind after SIGKILL of the flow: {[(p, _cmdline(p)) for p in left]}"
    assert "stopped the 1 process(es) it left" in log.read_text(), log.read_text()[-2000:]
