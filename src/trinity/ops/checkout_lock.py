"""One Trinity run at a time on a checkout, and one writer of its store.

nightly-eval reads the checkpoint that weekly-retrain rewrites, and both write under data/: two runs of them at once
on one checkout would evaluate a half-written model or interleave two pipelines. Two Prefect mechanisms keep them
apart, both set up at deploy time (`flows/deploy.py`):

- each deployment's own concurrency limit (prefect.yaml: `concurrency_limit: {limit: 1, collision_strategy:
  CANCEL_NEW}`): a second run of the same deployment while one runs is Cancelled by the server
  ("Deployment concurrency limit reached.");
- the checkout's global concurrency limit (`checkout_limit_name`: one per checkout directory, limit 1, created by
  `ensure_checkout_limit`): both flows hold it for their whole run (`holding_checkout`); a run that cannot take
  it within `REFUSE_AFTER_S` ends Cancelled, naming the limit (`CheckoutBusy`). The slot is a lease the holder
  renews: a run that dies loses it when the lease expires, so a crash cannot lock the checkout for good.

The limit is taken strictly: a limit that does not exist (or was deactivated) excludes nothing, so a run of a
deployment that finds it missing is refused — it ends Failed, which notifies (trinity.ops.alerts), with a message
naming the limit, the API and `python flows/deploy.py`, which creates it (`CheckoutLimitMissing`). A run outside a
deployment (`python flows/nightly_eval.py`, `python flows/weekly_retrain.py`) creates the limit itself when the
API it reports to lacks it (an ephemeral API, or a server nobody deployed to), says so on its first line, and then
takes it like any run: a manual run never overlaps a scheduled one, and no run is unguarded. A lease its holder
cannot renew (the API gone for longer than the lease) ends the run rather than let it continue unguarded.

`trinity serve` is the other writer of a checkout: it holds the response store (data/store/trinity.duckdb; DuckDB
lets one process write a file) for as long as it serves, and `dvc repro` — what weekly-retrain runs — writes that
store in every stage that calls a model. A Prefect limit is the wrong tool for it: a server runs for days, often
with no Prefect API at all; it does not conflict with nightly-eval (whose store is its own, under
data/nightly/runs/), so it must not take the checkout's slot; and a server that dies must free the store at once,
not after a lease expires. So the store has a file lock of its own (`StoreLock`: an exclusive `flock` on
`<store>.writer.lock` beside the store, released by the kernel when its holder exits, however it exits), which
`trinity serve` holds for its whole life and weekly-retrain holds for its whole run (`holding_store`): whichever
comes second is refused at once, naming the holder (what it is, its pid, since when) — a retrain fails (and
notifies) before it fetches or reproduces anything, instead of failing hours into `dvc repro` on DuckDB's lock;
a server exits with status 2 before it loads anything, instead of taking the store between two stages of a
retrain and breaking the next one.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

CHECKOUT_LIMIT_PREFIX = "trinity-checkout-"
REFUSE_AFTER_S = 10.0
"""How long a run waits for the checkout before it is refused (long enough for a slot released a moment ago)."""
STORE_LOCK_SUFFIX = ".writer.lock"


class CheckoutBusy(RuntimeError):
    """Another run holds this checkout's concurrency limit."""


class CheckoutLimitMissing(RuntimeError):
    """The checkout's global concurrency limit does not exist (or is inactive) on the Prefect API."""


class StoreBusy(RuntimeError):
    """Another process (`trinity serve`, a weekly-retrain run) holds the store's writer lock."""


def checkout_limit_name(root: Path) -> str:
    """The checkout's global concurrency limit: a hash of its absolute path (one limit per checkout)."""
    return CHECKOUT_LIMIT_PREFIX + hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:12]


def checkout_limit_status(client, root: Path) -> str:
    """"ok" (1 slot or more, active), "inactive" or "missing", on the API `client` talks to."""
    from prefect.exceptions import ObjectNotFound

    try:
        limit = client.read_global_concurrency_limit_by_name(checkout_limit_name(root))
    except ObjectNotFound:
        return "missing"
    return "ok" if limit.active and limit.limit >= 1 else "inactive"


def ensure_checkout_limit(client, root: Path) -> str:
    """Create the checkout's limit (1 slot) on the API `client` talks to, or set an existing one back to 1 slot;
    returns its name."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectNotFound

    name = checkout_limit_name(root)
    try:
        limit = client.read_global_concurrency_limit_by_name(name)
    except ObjectNotFound:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1, active=True))
        return name
    if limit.limit != 1 or not limit.active:
        client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=1, active=True))
    return name


def _api_url() -> str:
    from prefect.settings import get_current_settings

    return get_current_settings().api.url or "the ephemeral Prefect API of this process"


def missing_limit_message(root: Path, status: str = "missing") -> str:
    name = checkout_limit_name(root)
    what = "does not exist" if status == "missing" else "is inactive (or has no slot)"
    return (f"the checkout's global concurrency limit {name!r} {what} on {_api_url()}: without it nothing keeps "
            f"nightly-eval and weekly-retrain apart on {Path(root).resolve()}, so this run is refused. Run "
            "`python flows/deploy.py` in the checkout (it creates the limit, with the automations) against that "
            "API, then run this deployment again")


def run_holding_checkout(root: Path, tag: str, fn, *args):
    """`fn(*args)` while holding the checkout's limit (a flow's body). Returns the Prefect state the flow ends in
    when it cannot: Cancelled naming the limit when another run holds it, Failed naming `python flows/deploy.py`
    when a deployment's run finds the limit missing (both printed under `[tag]` too). Outside a deployment the
    limit is created when missing (module doc)."""
    from prefect.runtime import deployment
    from prefect.states import Cancelled, Failed

    try:
        if deployment.get_id() is None:
            _ensure_limit_outside_deployment(root, tag)
        with holding_checkout(root):
            return fn(*args)
    except CheckoutBusy as e:
        print(f"[{tag}] {e}")
        return Cancelled(message=str(e))
    except CheckoutLimitMissing as e:
        print(f"[{tag}] {e}")
        return Failed(message=str(e))


def _ensure_limit_outside_deployment(root: Path, tag: str) -> None:
    """Create (or reactivate) the limit for a run outside a deployment, and say so: a warning in the run's log,
    shown at the flows' default log level (WARNING) too."""
    from prefect.client.orchestration import get_client
    from prefect.logging import get_run_logger

    with get_client(sync_client=True) as client:
        status = checkout_limit_status(client, root)
        if status == "ok":
            return
        name = ensure_checkout_limit(client, root)
    get_run_logger().warning(
        f"[{tag}] not a deployment's run: the checkout's concurrency limit {name!r} was {status} on {_api_url()}; "
        f"{'created' if status == 'missing' else 'reactivated'} it (1 slot), as `python flows/deploy.py` does, and "
        "this run holds it like a scheduled one")


@contextlib.contextmanager
def holding_checkout(root: Path, wait_s: float = REFUSE_AFTER_S) -> Iterator[str]:
    """Hold the checkout's limit for the block, strictly: CheckoutLimitMissing when the limit does not exist or
    is inactive, CheckoutBusy when another run holds it for longer than `wait_s`."""
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.concurrency.asyncio import ConcurrencySlotAcquisitionError

    name = checkout_limit_name(root)
    with get_client(sync_client=True) as client:
        status = checkout_limit_status(client, root)
    if status != "ok":
        raise CheckoutLimitMissing(missing_limit_message(root, status))
    entered = False
    try:
        with concurrency(name, occupy=1, timeout_seconds=wait_s, strict=True):
            entered = True
            yield name
    except TimeoutError:
        if entered:
            raise
        raise CheckoutBusy(f"another Trinity run holds this checkout ({Path(root).resolve()}): its Prefect global "
                           f"concurrency limit {name!r} stayed full for {wait_s:.0f} s; this run is refused rather "
                           "than overlap it") from None
    except ConcurrencySlotAcquisitionError as e:
        if entered:
            raise
        # deleted or deactivated between the check above and the acquisition: still nothing to hold
        raise CheckoutLimitMissing(f"{missing_limit_message(root)} ({e})") from None


# ------------------------------------------------------------------------------------------ the store's writer lock

def store_lock_path(store: Path) -> Path:
    store = Path(store)
    return store.with_name(store.name + STORE_LOCK_SUFFIX)


class StoreLock:
    """The store's writer lock, held from construction until `release` (or the end of a `with` block): an
    exclusive, non-blocking `flock` on `<store>.writer.lock`, which records who holds it. Raises StoreBusy naming
    the holder when another process holds it. The file is never removed (a removed lock file would let two
    processes lock two different files of the same name)."""

    def __init__(self, store: Path, holder: str):
        import fcntl

        self.store = Path(store)
        self.path = store_lock_path(self.store)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held_by = _read_holder(fd)
            os.close(fd)
            raise StoreBusy(f"the store {self.store} is being written by {held_by} (its writer lock "
                            f"{self.path} is taken)") from None
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        record = {"holder": holder, "pid": os.getpid(), "host": socket.gethostname(),
                  "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)

    def release(self) -> None:
        import fcntl

        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> "StoreLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (ValueError, OSError):
        record = {}
    if not record.get("pid"):
        return "another process (it has not recorded itself yet)"
    return f"{record.get('holder', 'another process')} (pid {record['pid']} on {record.get('host', '?')}, " \
           f"since {record.get('since', '?')})"


@contextlib.contextmanager
def holding_store(store: Path, holder: str) -> Iterator[StoreLock]:
    """Hold the store's writer lock for the block (StoreBusy, naming the holder, when another process has it)."""
    lock = StoreLock(store, holder)
    try:
        yield lock
    finally:
        lock.release()
