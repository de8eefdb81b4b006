#!/bin/sh
# Run the VM test alone: the .deb under a real systemd in a QEMU guest (tests/packaging/test_vm_systemd.py,
# docs/install.md "Tested under systemd"). Needs root and network access to deb.debian.org.
# Extra arguments go to pytest, e.g. scripts/vm-test.sh -k watchdog (the VM runs once anyway).
# GPUWATCHD_VM_ACCEL=kvm tries KVM instead of TCG; GPUWATCHD_VM_MIRROR picks the mirror.
set -eu
cd "$(dirname "$0")/.."
scripts/test.sh --setup
exec .venv/bin/pytest -p no:cacheprovider -m vm -s tests/packaging/test_vm_systemd.py "$@"
