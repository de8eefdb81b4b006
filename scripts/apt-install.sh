#!/bin/sh
# Install the Debian packages named as arguments that are not installed yet, and leave every
# system service as it was: nothing a package ships is started (a policy-rc.d that refuses
# every start while apt runs; invoke-rc.d and deb-systemd-invoke ask it) and nothing is left
# enabled at boot (the enablement links the packages' scripts made are removed afterwards,
# which Debian's upgrade scripts respect). Quick when everything is installed. Needs root for
# apt (or sudo). Used by scripts/bootstrap.sh and scripts/test.sh.
set -eu

missing=""
for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -n "$missing" ] || exit 0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
POLICY=/usr/sbin/policy-rc.d
SAVED="$POLICY.gpuwatchd-saved"
WORK=$(mktemp -d)

enable_links() {
    # every boot-time enablement: systemd's *.wants/*.requires links and SysV start links
    find /etc/systemd/system /etc/rc1.d /etc/rc2.d /etc/rc3.d /etc/rc4.d /etc/rc5.d \
        -type l 2>/dev/null | grep -E '\.(wants|requires)/|/rc[1-5]\.d/S' | sort || true
}

restore_policy() {
    $SUDO rm -f "$POLICY"
    if [ -e "$SAVED" ]; then $SUDO mv "$SAVED" "$POLICY"; fi
    rm -rf "$WORK"
}
trap restore_policy EXIT
trap 'exit 1' HUP INT TERM

if [ -e "$POLICY" ]; then $SUDO mv "$POLICY" "$SAVED"; fi
printf '#!/bin/sh\n# scripts/apt-install.sh: no service starts while it installs\nexit 101\n' >"$WORK/policy"
$SUDO install -m 0755 "$WORK/policy" "$POLICY"

enable_links >"$WORK/before"
echo "apt-install: installing:$missing"
$SUDO apt-get update -qq
# shellcheck disable=SC2086 # one word per package
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null

# Whatever the new packages enabled is disabled again; links that were there stay.
enable_links | comm -13 "$WORK/before" - >"$WORK/new"
# SysV start links: one `update-rc.d NAME disable` per script (it turns S links into K
# links, which later upgrades keep); systemd's *.wants links are removed.
sed -n 's|^/etc/rc[1-5]\.d/S[0-9]*||p' "$WORK/new" | sort -u >"$WORK/sysv"
while read -r name; do
    $SUDO update-rc.d "$name" disable >/dev/null 2>&1 || $SUDO rm -f /etc/rc[1-5].d/S[0-9][0-9]"$name"
done <"$WORK/sysv"
grep -v '^/etc/rc[1-5]\.d/' "$WORK/new" | while read -r link; do
    $SUDO rm -f "$link"
done
disabled=$(sed 's|.*/||; s|^S[0-9]*||' "$WORK/new" | sort -u | tr '\n' ' ')
[ -z "$disabled" ] || echo "apt-install: left disabled at boot (not started): $disabled"
