#!/bin/sh
# The test command (README, CI). First the install step: the first run's setup
# (scripts/bootstrap.sh), the test lab's Debian packages (the real Prometheus, Alertmanager,
# Slurm, journald, Chromium, QEMU and kernel the tests start themselves, the .deb build
# tools, the compilers for systemd-python) through scripts/apt-install.sh, which starts and
# enables no system service, and the development extras in .venv/; quick when all is there.
# Then lint, type-check, and run every test that needs no GPU. Tests that need a real GPU
# are marked `gpu`; run them with `scripts/test.sh -m gpu` on a GPU host. Extra arguments
# go to pytest; `scripts/test.sh --setup` only installs.
set -eu
cd "$(dirname "$0")/.."

LAB_PACKAGES="python3-dev gcc pkg-config libsystemd-dev \
prometheus prometheus-alertmanager systemd-journal-remote systemd \
debhelper dh-python lintian build-essential fakeroot man-db python3-yaml python3-systemd \
python3-pyudev python3-anyio python3-sniffio python3-idna python3-certifi \
slurmctld slurmd slurm-client python3-bcrypt openssl curl \
python3-prometheus-client python3-httpx \
qemu-system-x86 linux-image-amd64 linux-headers-amd64 mmdebstrap e2fsprogs make \
chromium-headless-shell"

scripts/bootstrap.sh
# shellcheck disable=SC2086 # one word per package
scripts/apt-install.sh $LAB_PACKAGES
STAMP=.venv/.gpuwatchd-install
HASH=$(sha256sum pyproject.toml | cut -d' ' -f1)
if ! grep -q "^$HASH dev" "$STAMP" 2>/dev/null; then
    .venv/bin/python -m pip install -q -e '.[dev]'
    echo "$HASH dev" >"$STAMP"
fi
if [ "${1:-}" = "--setup" ]; then
    echo "test.sh: test lab ready"
    exit 0
fi

.venv/bin/ruff check gpuwatchd tests bench tools
.venv/bin/ruff format --check gpuwatchd tests bench tools
.venv/bin/mypy
# Tests marked `speed` assert a wall-clock budget (how fast, not what): a loaded CI host
# misses those, so they are left out here; `scripts/test.sh -m speed` on a quiet host.
if [ "$#" -eq 0 ]; then set -- -m "not gpu and not speed"; fi
exec .venv/bin/pytest "$@"
