#!/bin/sh
# The test command (README, CI): lint, type-check, then every test that needs no GPU.
# Tests that need a real GPU are marked `gpu`; run them with `scripts/test.sh -m gpu` on a
# GPU host. Extra arguments go to pytest.
set -eu
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "no .venv: run scripts/bootstrap.sh first" >&2; exit 2; }
.venv/bin/ruff check gpuwatchd tests bench tools
.venv/bin/ruff format --check gpuwatchd tests bench tools
.venv/bin/mypy
if [ "$#" -eq 0 ]; then set -- -m "not gpu"; fi
exec .venv/bin/pytest "$@"
