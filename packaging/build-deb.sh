#!/bin/sh
# Build dist/gpuwatchd_<version>_all.deb (Debian 12). One command, from any directory:
#     packaging/build-deb.sh
# Needs: debhelper dh-python build-essential fakeroot (scripts/test.sh --setup installs them)
# and, on the first run, pip to fetch the pinned wheels of packaging/vendor.txt into
# build/wheels/ (reused afterwards; put them there by hand for an offline build).
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
# Debian's own python3 and tools first: the build must not see a development venv.
PATH=/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
VERSION=$(/usr/bin/python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
SRC="$ROOT/build/deb/gpuwatchd-$VERSION"

rm -rf "$ROOT/build/deb"
mkdir -p "$SRC" "$ROOT/dist"
# The source tree dpkg-buildpackage sees: what the package installs, nothing else.
tar -C "$ROOT" --exclude=__pycache__ -cf - gpuwatchd rules scenarios systemd packaging README.md \
    docs/*.md docs/runbooks/*.md bench/README.md | tar -C "$SRC" -xf -
cp -r packaging/debian "$SRC/debian"
/usr/bin/python3 packaging/vendor.py "$ROOT/build/wheels" "$SRC/vendor"

# The changelog carries the version from pyproject.toml (the one place it is set).
DATE=$(date -R -d "@${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}")
cat > "$SRC/debian/changelog" <<CHANGELOG
gpuwatchd ($VERSION) unstable; urgency=medium

  * Release $VERSION (see the project history).

 -- gpuwatchd maintainers <gpuwatchd@example.org>  $DATE
CHANGELOG

(cd "$SRC" && dpkg-buildpackage -us -uc -b --no-sign >"$ROOT/build/deb/build.log" 2>&1) || {
    tail -40 "$ROOT/build/deb/build.log" >&2
    exit 1
}
mv "$ROOT/build/deb/gpuwatchd_${VERSION}_all.deb" "$ROOT/dist/"
echo "dist/gpuwatchd_${VERSION}_all.deb"
