#!/bin/sh
# Set up a development checkout on Debian 12: system packages, then .venv/ with gpuwatchd
# installed in editable mode. Safe to run again. Needs root for apt (or sudo).
set -eu
cd "$(dirname "$0")/.."

APT_PACKAGES="python3-venv python3-dev gcc pkg-config libsystemd-dev \
prometheus prometheus-alertmanager systemd-journal-remote systemd \
debhelper dh-python lintian build-essential fakeroot man-db python3-yaml python3-systemd \
python3-pyudev python3-anyio python3-sniffio python3-idna python3-certifi \
slurmctld slurmd slurm-client python3-bcrypt openssl curl \
python3-prometheus-client python3-httpx \
qemu-system-x86 linux-image-amd64 linux-headers-amd64 mmdebstrap e2fsprogs make \
chromium-headless-shell"

missing=""
for p in $APT_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "bootstrap: installing apt packages:$missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
echo "bootstrap: ready (.venv/bin/gpuwatchd)"
