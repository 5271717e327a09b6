"""A DVC remote's storage plugin, imported before anything runs: a push that cannot happen fails in seconds, not
after a whole `dvc repro`.

DVC itself speaks to local paths and HTTP(S) (dvc-http) only; every other remote type is a plugin that `dvc push`
imports when it starts pushing: dvc-s3 for s3://, dvc-gs for gs://, dvc-azure for azure://, ... This project
installs the three common ones as extras of its own, pinned for its DVC (pyproject.toml):

    .venv/bin/pip install -e '.[s3]' -c requirements.lock        (or [gs], [azure])

`remote_plugin_problem` asks DVC's own resolution for the remote's filesystem class (so `remote://other/path`
is checked as `other`'s type, and a malformed remote section is reported as DVC would), then imports the fsspec
library that class uses when it connects (s3fs, gcsfs, adlfs), without connecting. `resolve_dvc_remote`
(below) calls it, so weekly-retrain (before `dvc repro`) and `python flows/deploy.py` (for every
deployment's dvc_remote) refuse a remote whose plugin is missing. Before a `dvc push` of your own:

    python -m trinity.ops.dvc_remote [NAME]      # exit 0: "NAME URL: plugin ok"; 1: one line naming the fix
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from urllib.parse import urlparse

PLUGIN_EXTRAS = {"s3": "s3", "gs": "gs", "azure": "azure"}
"""URL scheme -> this project's install extra (pyproject.toml) that brings its DVC plugin."""

FS_LIBRARIES = {"s3": "s3fs", "gs": "gcsfs", "azure": "adlfs"}
"""URL scheme -> the fsspec library the plugin's filesystem imports only when it connects."""


def _remote_url(conf, name: str) -> tuple[str, str]:
    """(the remote's own url, the url its storage type comes from: a `remote://base/path` chain followed)."""
    url = conf["remote"][name]["url"]
    base, seen = url, {name}
    while urlparse(base).scheme == "remote":
        ref = urlparse(base).netloc
        if ref in seen or ref not in conf["remote"]:
            break  # DVC reports a bad reference itself (get_cloud_fs below)
        seen.add(ref)
        base = conf["remote"][ref]["url"]
    return url, base


def plugin_package(scheme: str) -> str | None:
    """The PyPI package of DVC's plugin for a URL scheme (dvc_objects' registry: s3 -> dvc-s3), None when DVC
    handles it itself."""
    from dvc_objects.fs import known_implementations

    impl = known_implementations.get(scheme)
    if not impl or "err" not in impl:
        return None
    return impl["class"].split(".")[0].replace("_", "-")


def install_hint(scheme: str, root: Path) -> str:
    """The command that installs the plugin for `scheme` into this environment."""
    pip = Path(sys.executable).parent / "pip"
    extra = PLUGIN_EXTRAS.get(scheme)
    if extra:
        return f"cd {root} && {pip} install -e '.[{extra}]' -c requirements.lock"
    pkg = plugin_package(scheme) or f"dvc-{scheme}"
    return f"{pip} install {pkg} (this project has no extra for {scheme}://)"


def remote_plugin_problem(root: Path, name: str) -> str | None:
    """None when DVC remote `name` of the checkout at root can be pushed to as far as this environment goes (its
    plugin and the library under it import); else one line: the remote, what is missing, the command that
    installs it."""
    from dvc.config import Config
    from dvc.fs import get_cloud_fs

    conf = Config(dvc_dir=str(Path(root) / ".dvc"))
    url, base = _remote_url(conf, name)
    scheme = urlparse(base).scheme
    try:
        get_cloud_fs(conf, name=name)
        if scheme in FS_LIBRARIES:
            importlib.import_module(FS_LIBRARIES[scheme])
    except ImportError as e:
        pkg = plugin_package(scheme) or "its plugin"
        return (f"DVC remote {name!r} ({url}) needs {pkg}, which this environment ({sys.prefix}) cannot import "
                f"({e}): {install_hint(scheme, Path(root).resolve())}")
    except Exception as e:  # noqa: BLE001 - a malformed remote section: DVC's own message
        return f"DVC remote {name!r} ({url}) is not usable: {e}"
    return None


class DvcRemoteError(ValueError):
    """The DVC remote a flow pushes to is not configured in the checkout, or its plugin is not installed."""



def resolve_dvc_remote(root: Path, remote: str | None) -> str:
    """The DVC remote `remote` (None: the checkout's default remote), checked to exist in root/.dvc/config
    (and .dvc/config.local) and its storage plugin to import (`remote_plugin_problem`); raises DvcRemoteError
    naming what is missing and where, or the command that installs the plugin."""
    from dvc.config import Config

    config_file = Path(root) / ".dvc" / "config"
    if not config_file.exists():
        raise DvcRemoteError(f"{root} is not a DVC project ({config_file} is missing)")
    conf = Config(dvc_dir=str(Path(root) / ".dvc"))
    remotes = sorted(conf.get("remote", {}))
    name = remote or conf.get("core", {}).get("remote")
    if not name:
        raise DvcRemoteError(f"no DVC remote to push to: {config_file} sets no default remote (`dvc remote add -d "
                             f"<name> <url>`), and no dvc_remote was given; configured remotes: {remotes or 'none'}")
    if name not in remotes:
        raise DvcRemoteError(f"DVC remote {name!r} is not configured in {config_file} (or config.local); "
                             f"configured remotes: {remotes or 'none'}")
    problem = remote_plugin_problem(root, name)  # its plugin (dvc-s3, ...) imports: `dvc push` would fail, last
    if problem:
        raise DvcRemoteError(problem)
    return name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trinity.ops.dvc_remote",
                                 description="Check that a DVC remote is configured and its plugin imports.")
    ap.add_argument("remote", nargs="?", default=None, help="remote name (default: the checkout's default remote)")
    ap.add_argument("--root", default=".", help="the DVC checkout (default: the current directory)")
    args = ap.parse_args(argv)
    from dvc.config import Config


    root = Path(args.root).resolve()
    try:
        name = resolve_dvc_remote(root, args.remote)
    except DvcRemoteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    url = Config(dvc_dir=str(root / ".dvc"))["remote"][name]["url"]
    print(f"{name} {url}: plugin ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
