#!/usr/bin/env bash
# Build the Python environment that graded code runs in for BigCodeBench (the Hard subset).
#
# BigCodeBench's tests import pandas, matplotlib, sklearn, tensorflow, ... . Those live in a venv of
# their own so the project venv stays lean; the sandbox binds this venv read-only and runs the
# model's code with its interpreter (see trinity.grading.sandbox.sandbox_python).
#
# Pins: bigcode-project/bigcodebench Requirements/requirements-eval.txt (the official evaluation
# environment, Python 3.10), restricted to the packages that the 148 Hard tasks and their tests
# import. Python 3.10 is what those pins are built for (numpy 1.21 / scipy 1.7 / tensorflow 2.11
# have no wheels for 3.11).
#
# Usage: scripts/setup_sandbox_env.sh [VENV_DIR]
#   VENV_DIR defaults to $TRINITY_SANDBOX_VENV, else ${XDG_CACHE_HOME:-~/.cache}/trinity/sandbox-venv.
#   PYTHON=/path/to/python3.10 overrides the interpreter search.
# Idempotent: a venv whose stamp matches this script (its hash) and interpreter is left as it is.
# System package the sandbox itself needs (Debian): bubblewrap. (The one Hard task that imports pytesseract
# mocks it; no tesseract binary is needed.)
set -euo pipefail

VENV="${1:-${TRINITY_SANDBOX_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/trinity/sandbox-venv}}"

PINS=(
  "numpy==1.21.2"
  "pandas==2.0.3"
  "scipy==1.7.2"
  "matplotlib==3.7.0"
  "seaborn==0.13.2"
  "scikit-learn==1.3.1"
  "statsmodels==0.14.0"
  "tensorflow==2.11.0"
  "keras==2.11.0"
  "nltk==3.8"
  "gensim==4.3.2"
  "librosa==0.10.1"
  "numba==0.55.0"
  "soundfile==0.12.1"
  "opencv-python-headless==4.9.0.80"
  "Pillow==10.3.0"
  "wordcloud==1.9.3"
  "pytesseract==0.3.10"
  "geopandas==0.13.2"
  "shapely==2.0.4"
  "requests==2.31.0"
  "requests_mock==1.11.0"
  "beautifulsoup4==4.8.2"
  "lxml==4.9.3"
  "pyquery==1.4.3"
  "flask==3.0.3"
  "Werkzeug==3.0.1"
  "flask_login==0.6.3"
  "flask_wtf==1.2.1"
  "WTForms==3.1.2"
  "Flask-Mail==0.9.1"
  "Faker==20.1.0"
  "pycryptodome==3.14.1"
  "cryptography==38.0.0"
  "rsa==4.9"
  "psutil==5.9.5"
  "pytz==2023.3.post1"
  "python-dateutil==2.9.0"
  "openpyxl==3.1.2"
  "xlwt==1.3.0"
  "xlrd==2.0.1"
  "python-docx==1.1.0"
  "Levenshtein==0.25.0"
  "chardet==5.2.0"
  "regex"
)

find_python() {
  if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"; return; fi
  local c real
  for c in python3.10 "$HOME"/.pyenv/versions/3.10.*/bin/python3.10 /usr/local/bin/python3.10 /usr/bin/python3.10; do
    command -v "$c" >/dev/null 2>&1 || continue
    # Resolve shims (pyenv, asdf) to the real interpreter; skip ones that do not run.
    real="$("$c" -c 'import sys; assert sys.version_info[:2] == (3, 10); print(sys.executable)' 2>/dev/null)" || continue
    echo "$real"; return
  done
  return 1
}

PY="$(find_python)" || {
  echo "setup_sandbox_env: Python 3.10 not found (BigCodeBench's pinned eval requirements need it)." >&2
  echo "  install one (e.g. 'pyenv install 3.10' or 'uv python install 3.10') or set PYTHON=/path/to/python3.10" >&2
  exit 1
}

# The stamp: interpreter version + this script's own hash (pins and build steps).
STAMP_WANT="$("$PY" -c 'import sys; print(sys.version.split()[0])') $(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)"
if [[ -f "$VENV/.trinity-stamp" && "$(cat "$VENV/.trinity-stamp")" == "$STAMP_WANT" ]]; then
  echo "setup_sandbox_env: $VENV is up to date"
  exit 0
fi

echo "setup_sandbox_env: building $VENV with $PY"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade "pip==24.0" "setuptools<70" wheel
# The project's pip constraints (if any) are about the project's venv, not this one.
PIP_CONSTRAINT= "$VENV/bin/python" -m pip install --quiet --prefer-binary "${PINS[@]}"
"$VENV/bin/python" -c 'import numpy, pandas, matplotlib, sklearn, scipy, tensorflow; print("setup_sandbox_env: imports ok")'
# matplotlib's font list, built once; the sandbox seeds each run's MPLCONFIGDIR with it (~1 s saved per run).
mkdir -p "$VENV/share/trinity/mplconfig"
MPLCONFIGDIR="$VENV/share/trinity/mplconfig" MPLBACKEND=Agg "$VENV/bin/python" -c 'import matplotlib.pyplot'
# NLTK corpora (stopwords, punkt) that 3 Hard tasks need come from NLTK's own server, not from PyPI:
# fetched only when asked (TRINITY_NLTK_DOWNLOAD=1, needs internet); without them those tasks fail.
if [[ "${TRINITY_NLTK_DOWNLOAD:-0}" == "1" ]]; then
  "$VENV/bin/python" -m nltk.downloader -d "$VENV/nltk_data" stopwords punkt \
    || echo "setup_sandbox_env: warning: NLTK data download failed" >&2
fi
# The venv is read by an unprivileged uid inside the sandbox.
chmod -R a+rX "$VENV"
echo "$STAMP_WANT" > "$VENV/.trinity-stamp"
echo "setup_sandbox_env: done ($VENV)"
