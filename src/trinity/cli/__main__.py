"""`python -m trinity.cli`: the `trinity` command."""
import sys

from trinity.cli import main

sys.exit(main())
