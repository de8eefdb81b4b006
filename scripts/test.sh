#!/bin/sh
# The test command (README, CI): set up what the tests need (scripts/bootstrap.sh: apt
# packages for the real services the tests start, and .venv/; quick when all is there),
# then lint, type-check, and run every test that needs no GPU. Tests that need a real GPU
# are marked `gpu`; run them with `scripts/test.sh -m gpu` on a GPU host. Extra arguments
# go to pytest.
set -eu
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
.venv/bin/ruff check gpuwatchd tests bench tools
.venv/bin/ruff format --check gpuwatchd tests bench tools
.venv/bin/mypy
if [ "$#" -eq 0 ]; then set -- -m "not gpu"; fi
exec .venv/bin/pytest "$@"
