#!/usr/bin/env bash
# System packages Trinity needs: bubblewrap (the sandbox for model-written code), a C/C++ toolchain and
# cmake (to build llama-cpp-python once). Installs with apt-get when missing and we are root.
set -euo pipefail
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v cmake >/dev/null || need+=(cmake)
command -v g++ >/dev/null || need+=(g++)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing system packages: ${need[*]} (install them with your package manager, then rerun make)" >&2
  exit 1
fi
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
