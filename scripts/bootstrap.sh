#!/bin/sh
# The first run (README): what `gpuwatchd demo` needs and nothing else. Installs Python's
# venv module from Debian (python3, python3-venv: about 20 packages on a fresh Debian 12,
# no system service started or enabled), creates .venv/ and installs gpuwatchd into it in
# editable mode (its Python dependencies from PyPI). Safe to run again; quick when all is
# there. Needs root for apt (or sudo). The test lab (Prometheus, Alertmanager, Slurm, QEMU,
# Chromium, compilers) comes with scripts/test.sh.
set -eu
cd "$(dirname "$0")/.."

scripts/apt-install.sh python3 python3-venv

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
# .venv/.gpuwatchd-install names the pyproject.toml it was installed from (and the extras):
# the same file, nothing to do.
STAMP=.venv/.gpuwatchd-install
HASH=$(sha256sum pyproject.toml | cut -d' ' -f1)
if ! grep -q "^$HASH" "$STAMP" 2>/dev/null; then
    .venv/bin/python -m pip install -q -e .
    echo "$HASH" >"$STAMP"
fi
echo "bootstrap: ready (.venv/bin/gpuwatchd)"
