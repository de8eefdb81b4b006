#!/bin/sh
# Build the Python artifacts: an sdist and, from that sdist (so the sdist is known to be
# complete), a wheel, into dist/ (or the folder given). One command, from any directory:
#     packaging/build-python.sh            # -> dist/gpuwatchd-<version>.tar.gz, ...-py3-none-any.whl
# `pip install dist/gpuwatchd-*.whl` in any Python >= 3.11 venv then runs `gpuwatchd demo`
# (tests/packaging/test_wheel.py). The build runs in a throwaway venv with the build backend that
# pyproject.toml names (fetched by pip on the first run, then from pip's cache); the
# development venv is not used. Needs python3-venv (scripts/bootstrap.sh installs it).
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=$(realpath -m "${1:-dist}")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

/usr/bin/python3 -m venv "$WORK/venv"
REQUIRES=$("$WORK/venv/bin/python" -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
# shellcheck disable=SC2086 # one word per requirement
"$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check $REQUIRES
mkdir -p "$OUT" "$WORK/sdist"
# A copy of the source tree without this checkout's venv, builds and caches (setuptools
# writes build/ and *.egg-info/ next to the sources).
tar -C "$ROOT" --exclude-vcs --exclude=./.venv --exclude=./build --exclude=./dist \
    --exclude=__pycache__ --exclude='*.egg-info' --exclude='.*_cache' -cf - . |
    tar -C "$WORK/sdist" -xf -
# setuptools' PEP 517 hooks, as any frontend calls them; their chatter goes to a log
BUILD='
import sys
from setuptools import build_meta
kind, out, name = sys.argv[1:]
built = getattr(build_meta, "build_" + kind)(out)
open(name, "w").write(built)
'
build() {
    "$WORK/venv/bin/python" -c "$BUILD" "$1" "$OUT" "$WORK/$1.name" >"$WORK/$1.log" 2>&1 || {
        tail -30 "$WORK/$1.log" >&2
        exit 1
    }
}
(cd "$WORK/sdist" && build sdist)
SDIST=$(cat "$WORK/sdist.name")
mkdir "$WORK/unpacked"
tar -C "$WORK/unpacked" -xzf "$OUT/$SDIST"
(cd "$WORK/unpacked"/* && build wheel)
WHEEL=$(cat "$WORK/wheel.name")
echo "dist: $OUT/$SDIST"
echo "dist: $OUT/$WHEEL"
