"""One scheduled Trinity run at a time on a checkout.

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

A flow run outside a deployment (`python flows/nightly_eval.py`) on an API where the limit was never created takes
no slot (Prefect logs that the limit does not exist).
"""
from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Iterator

CHECKOUT_LIMIT_PREFIX = "trinity-checkout-"
REFUSE_AFTER_S = 10.0
"""How long a run waits for the checkout before it is refused (long enough for a slot released a moment ago)."""


class CheckoutBusy(RuntimeError):
    """Another run holds this checkout's concurrency limit."""


def checkout_limit_name(root: Path) -> str:
    """The checkout's global concurrency limit: a hash of its absolute path (one limit per checkout)."""
    return CHECKOUT_LIMIT_PREFIX + hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:12]


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


def run_holding_checkout(root: Path, tag: str, fn, *args):
    """`fn(*args)` while holding the checkout's limit (a flow's body); when another run holds it, the Prefect
    state Cancelled naming the limit (printed under `[tag]` too), which the flow returns as its final state."""
    from prefect.states import Cancelled

    try:
        with holding_checkout(root):
            return fn(*args)
    except CheckoutBusy as e:
        print(f"[{tag}] {e}")
        return Cancelled(message=str(e))


@contextlib.contextmanager
def holding_checkout(root: Path, wait_s: float = REFUSE_AFTER_S) -> Iterator[str]:
    """Hold the checkout's limit for the block; CheckoutBusy when another run holds it for longer than `wait_s`."""
    from prefect.concurrency.sync import concurrency

    name = checkout_limit_name(root)
    entered = False
    try:
        with concurrency(name, occupy=1, timeout_seconds=wait_s, strict=False):
            entered = True
            yield name
    except TimeoutError:
        if entered:
            raise
        raise CheckoutBusy(f"another Trinity run holds this checkout ({Path(root).resolve()}): its Prefect global "
                           f"concurrency limit {name!r} stayed full for {wait_s:.0f} s; this run is refused rather "
                           "than overlap it") from None
