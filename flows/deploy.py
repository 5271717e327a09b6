"""`python flows/deploy.py [--name NAME ...]`: check prefect.yaml against the Prefect API named by the
environment (PREFECT_API_URL, and PREFECT_API_KEY for Prefect Cloud), then register its deployments with
`prefect deploy` from this checkout (trinity.ops.deploy says what is checked). Exit 2 with every problem listed."""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_USER_ENV = dict(os.environ)  # before any flow module sets its hermetic defaults: `prefect deploy` gets the user's
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "flows"))


def main() -> int:
    import argparse

    from trinity.ops.deploy import DeploymentConfigError, deploy
    from trinity.ops.dvc_remote import DvcRemoteError

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prefect-file", default=str(ROOT / "prefect.yaml"))
    ap.add_argument("--name", action="append", help="deploy only this deployment (repeatable); default: all")
    args = ap.parse_args()
    try:
        deploy(ROOT, Path(args.prefect_file), args.name, env=_USER_ENV)
    except (DeploymentConfigError, DvcRemoteError) as e:
        print(f"deploy: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
