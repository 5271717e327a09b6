"""Serving the pool safely (`trinity.serving.server` runs the server): the API key (TRINITY_API_KEY, registered as
a secret), log lines written only through the `RedactingFilter`, and the refusal to listen beyond loopback without
an API key unless explicitly allowed (`check_exposure`).
"""
from __future__ import annotations

import ipaddress
import logging
import os
import sys

from trinity.redact import RedactingFilter, register_secret_env_names

API_KEY_ENV = "TRINITY_API_KEY"


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback interface: localhost or a loopback address (127.0.0.0/8, ::1). Any other name
    or address (0.0.0.0, ::, a hostname) may be reachable from elsewhere."""
    if host.strip().lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


class ExposureError(ValueError):
    """A server that would listen beyond loopback without an API key, not explicitly allowed."""


def check_exposure(host: str, api_key: str | None, allow_unauthenticated: bool = False) -> None:
    """ExposureError when serving on `host` would hand anyone who reaches it the pool's members: a host beyond
    loopback, no API key, and no explicit `allow_unauthenticated`."""
    if api_key or allow_unauthenticated or is_loopback(host):
        return
    raise ExposureError(f"refusing to serve on {host} without an API key: anyone who reaches it could spend the "
                        f"pool's members. Set {API_KEY_ENV} (clients then send 'Authorization: Bearer <key>'), or "
                        "pass --allow-unauthenticated to serve it open")


def configure_logging(level: str = "info") -> None:
    """Log lines to stderr, every one through `RedactingFilter` (uvicorn's own loggers included)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for name in ("trinity", "uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
        lg.setLevel(level.upper())


def api_key_from_env() -> str | None:
    """TRINITY_API_KEY (registered as a secret: redacted wherever it might be written)."""
    register_secret_env_names([API_KEY_ENV])
    return os.environ.get(API_KEY_ENV) or None
