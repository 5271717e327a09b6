#!/usr/bin/env bash
# Build llama.cpp's OpenAI-compatible server (`llama-server`) once per CPU, from the llama.cpp sources vendored in the
# llama-cpp-python sdist the Makefile pins (LLAMA_CPP_VERSION, default 0.3.36): the same llama.cpp as the binding that
# runs `in-process` pool members, which is compiled only where it is used (`make setup-in-process`: the tests).
#
# Like the Makefile's wheel, the binary is compiled for the CPU that builds it (GGML_NATIVE, -march=native) without
# AMX (a VM may advertise it and fault on its first instruction; see the Makefile) and is kept per CPU, keyed by a
# hash of the CPU's flags computed exactly as the Makefile's CPU_KEY:
#     ~/.cache/trinity/llama-server/cpu-<CPU_KEY>/llama-server
# The sources a binary was built from are recorded beside it (llama-server.source: `llama-cpp-python==<version>`): the
# pool names a local member's engine by it in every response's store key (trinity.pool.llama_server.server_build), so
# the binding need not be installed to name the server. Idempotent: a binary whose record names $VERSION is not rebuilt;
# one of another version, or with no record, is rebuilt (delete it to rebuild). The sdist is downloaded once (pip download)
# into ~/.cache/trinity/llama-server/sdist. Statically linked against llama.cpp/ggml (BUILD_SHARED_LIBS=OFF), so the
# cached binary does not depend on the build tree, which is deleted afterwards. No web UI, no curl, no OpenSSL: the
# server is only spoken to over loopback HTTP. About 4 min on 2 cores.
#
# Usage: bash scripts/build_llama_server.sh        (env: JOBS=2, PIP=.venv/bin/pip, LLAMA_CPP_VERSION=0.3.36)
#        bash scripts/build_llama_server.sh --sdist   (only the sdist: downloaded once, its path printed; the
#                                                       Makefile's binding wheel is built from the same file)
# Build output goes to stderr; the last (and only) line on stdout is the binary's (or the sdist's) path.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
PIP="${PIP:-$ROOT/.venv/bin/pip}"
JOBS="${JOBS:-2}"
CPU_KEY="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | md5sum | cut -c1-12)"
CACHE="$HOME/.cache/trinity/llama-server"
DEST="$CACHE/cpu-$CPU_KEY"
BIN="$DEST/llama-server"
SOURCE_RECORD="$BIN.source"
SOURCE="llama-cpp-python==$VERSION"
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

exec 3>&1 1>&2  # the build talks on stderr; only the path goes to stdout

built_from() { [ -x "$BIN" ] && [ "$(cat "$SOURCE_RECORD" 2>/dev/null)" = "$SOURCE" ]; }

SDIST="$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz"
# The sdist alone, once: `--no-binary llama-cpp-python`, not `:all:`, which would build every build dependency of
# the sdist's metadata step (scikit-build-core, hatchling, pluggy, ...) from source too: minutes on an empty pip
# cache, where this takes seconds.
ensure_sdist() {
    if [ ! -f "$SDIST" ]; then
        mkdir -p "$CACHE/sdist"
        echo "downloading the llama-cpp-python $VERSION sdist"
        local tmp
        tmp="$(mktemp -d "$CACHE/sdist/.dl.XXXXXX")"
        "$PIP" download -q "llama-cpp-python==$VERSION" --no-binary llama-cpp-python --no-deps -d "$tmp"
        mv -f "$tmp/llama_cpp_python-$VERSION.tar.gz" "$SDIST"
        rm -rf "$tmp"
    fi
}

if [ "${1:-}" = "--sdist" ]; then
    ensure_sdist
    echo "$SDIST" >&3
    exit 0
fi

if built_from; then
    echo "llama-server for this CPU (cpu-$CPU_KEY) already built from $SOURCE"
    echo "$BIN" >&3
    exit 0
fi

mkdir -p "$DEST" "$CACHE/sdist"
# one build at a time per CPU key (two concurrent setups would both compile, then race on the rename)
exec 9>"$DEST/.build.lock"
flock 9
if built_from; then
    echo "$BIN" >&3
    exit 0
fi
if [ -x "$BIN" ]; then
    echo "$BIN was built from $(cat "$SOURCE_RECORD" 2>/dev/null || echo 'unrecorded sources'), not $SOURCE: rebuilding"
fi

ensure_sdist

WORK="$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
tar -xzf "$SDIST" -C "$WORK" "llama_cpp_python-$VERSION/vendor/llama.cpp"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"

echo "building llama-server (llama.cpp vendored in llama-cpp-python $VERSION) into $DEST (once, ~4 min on 2 cores)"
start=$(date +%s)
GENERATOR=()
if command -v ninja >/dev/null 2>&1; then GENERATOR=(-G Ninja); fi
cmake -S "$SRC" -B "$SRC/build" "${GENERATOR[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DGGML_NATIVE=ON \
    -DCMAKE_C_FLAGS="$NO_AMX" \
    -DCMAKE_CXX_FLAGS="$NO_AMX"
cmake --build "$SRC/build" --target llama-server -j "$JOBS"
"$SRC/build/bin/llama-server" --version

install -m 755 "$SRC/build/bin/llama-server" "$BIN.tmp.$$"
rm -f "$SOURCE_RECORD"  # no record while the binary changes: an interrupted install is rebuilt, never misnamed
mv -f "$BIN.tmp.$$" "$BIN"  # atomic: a half-copied binary is never at $BIN
echo "$SOURCE" > "$SOURCE_RECORD.tmp.$$" && mv -f "$SOURCE_RECORD.tmp.$$" "$SOURCE_RECORD"
echo "built in $(( $(date +%s) - start )) s"
echo "$BIN" >&3
