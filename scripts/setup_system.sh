#!/usr/bin/env bash
# System packages Trinity needs: bubblewrap (the sandbox for model-written code) with util-linux's prlimit and
# setpriv, git (DVC), and a C/C++ toolchain and cmake (to build llama.cpp once per CPU). As root with apt-get, the
# missing ones are installed, then checked for real (scripts/preflight.py --system-only: the compilers build a
# program, bwrap starts a sandbox). Otherwise nothing is installed: `make` ran scripts/preflight.py before this, and
# it has already stopped, one line per package, on whatever this machine lacks and needs.
# Usage: bash scripts/setup_system.sh [preflight options, e.g. --llama-version 0.3.36]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
{ command -v prlimit && command -v setpriv && command -v flock; } >/dev/null || need+=(util-linux)
command -v git >/dev/null || need+=(git)
command -v cmake >/dev/null || need+=(cmake)
command -v cc >/dev/null || need+=(gcc)
command -v c++ >/dev/null || need+=(g++)
command -v tar >/dev/null || need+=(tar)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "setup_system: not installing ${need[*]} (not root with apt-get); scripts/preflight.py says which are needed" >&2
  exit 0
fi
echo "setup_system: apt-get install ${need[*]}"
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
"${PREFLIGHT_PYTHON:-python3}" "$ROOT/scripts/preflight.py" --system-only "$@"
