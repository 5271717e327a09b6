"""DVC remotes as users configure them (`dvc remote add`): a remote whose storage plugin this venv cannot import is
refused by the pre-flight (trinity.ops.dvc_remote.resolve_dvc_remote, what weekly-retrain and flows/deploy.py call
before anything runs), naming the project's install extra; the extras exist and pin DVC's own plugin packages."""
import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from trinity.ops.dvc_remote import DvcRemoteError, resolve_dvc_remote
from trinity.ops.dvc_remote import FS_LIBRARIES, PLUGIN_EXTRAS, plugin_package

PROJECT = Path(__file__).resolve().parents[2]
DVC = [sys.executable, "-m", "dvc"]


def _importable(*modules: str) -> bool:
    try:
        for m in modules:
            importlib.import_module(m)
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A git + DVC repository with one remote of each kind, added with the dvc CLI."""
    root = tmp_path_factory.mktemp("dvc-remotes")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*DVC, "init", "-q"], cwd=root, check=True)
    for name, url in [("s3store", "s3://bucket/trinity"), ("gsstore", "gs://bucket/trinity"),
                      ("azstore", "azure://container/trinity"), ("web", "https://example.org/trinity"),
                      ("disk", str(root.parent / "storage")), ("s3sub", "remote://s3store/sub")]:
        subprocess.run([*DVC, "remote", "add", name, url], cwd=root, check=True, capture_output=True)
    subprocess.run([*DVC, "remote", "default", "s3store"], cwd=root, check=True, capture_output=True)
    return root


@pytest.mark.parametrize("name,scheme", [("s3store", "s3"), ("gsstore", "gs"), ("azstore", "azure"),
                                         ("s3sub", "s3")])
def test_a_remote_whose_plugin_is_missing_is_refused_naming_the_extra(repo, name, scheme):
    plugin = plugin_package(scheme).replace("-", "_")
    if _importable(plugin, FS_LIBRARIES[scheme]):  # this venv has the extra: the same check must pass
        assert resolve_dvc_remote(repo, name) == name
        return
    with pytest.raises(DvcRemoteError) as e:
        resolve_dvc_remote(repo, name)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"DVC remote {name!r}" in msg and plugin_package(scheme) in msg
    assert f"pip install -e '.[{PLUGIN_EXTRAS[scheme]}]' -c requirements.lock" in msg


def test_the_default_remote_is_the_one_checked(repo):
    if _importable("dvc_s3", "s3fs"):
        assert resolve_dvc_remote(repo, None) == "s3store"
    else:
        with pytest.raises(DvcRemoteError, match=r"'s3store' \(s3://bucket/trinity\) needs dvc-s3"):
            resolve_dvc_remote(repo, None)


@pytest.mark.parametrize("name", ["web", "disk"])
def test_remotes_dvc_speaks_to_itself_pass(repo, name):
    assert resolve_dvc_remote(repo, name) == name


def test_the_cli_checks_before_a_push(repo):
    ok = subprocess.run([sys.executable, "-m", "trinity.ops.dvc_remote", "disk"], cwd=repo, capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip().endswith("storage: plugin ok")
    if not _importable("dvc_azure", "adlfs"):
        bad = subprocess.run([sys.executable, "-m", "trinity.ops.dvc_remote", "azstore", "--root", str(repo)],
                             capture_output=True, text=True)
        assert bad.returncode == 1
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert "pip install -e '.[azure]'" in bad.stderr


def test_the_extras_pin_the_plugins_dvc_names():
    """pyproject.toml's [s3], [gs], [azure] are exactly DVC's plugin packages for those schemes (dvc_objects'
    registry), pinned."""
    extras = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for scheme, extra in PLUGIN_EXTRAS.items():
        (pin,) = extras[extra]
        package, _, version = pin.partition("==")
        assert package == plugin_package(scheme) and version, pin
