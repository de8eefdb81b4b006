#!/usr/bin/python3
"""Fetch (once) and unpack the pinned wheels of packaging/vendor.txt.

    vendor.py CACHE_DIR TARGET_DIR

Wheels already in CACHE_DIR with the right SHA-256 are used as they are (offline builds:
put them there); missing ones are fetched with `$PIP download` (default: the checkout's
.venv/bin/pip). Each wheel must be pure Python (py3-none-any) and match its pinned hash;
it is unpacked into TARGET_DIR. Standard library only: runs with Debian's python3.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LINE = re.compile(r"([A-Za-z0-9_.-]+)==([A-Za-z0-9_.+-]+)\s+--hash=sha256:([0-9a-f]{64})")


def pins() -> list[tuple[str, str, str]]:
    out = []
    for raw in (HERE / "vendor.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = LINE.fullmatch(line)
        if m is None:
            sys.exit(f"vendor.txt: cannot read {raw!r}")
        out.append((m.group(1), m.group(2), m.group(3)))
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def find(cache: Path, name: str, version: str, digest: str) -> Path | None:
    stem = re.sub(r"[-_.]+", "_", name).lower()
    for p in sorted(cache.glob("*.whl")):
        if p.name.lower().startswith(f"{stem}-{version}-") and sha256(p) == digest:
            return p
    return None


def main() -> int:
    cache, target = Path(sys.argv[1]), Path(sys.argv[2])
    cache.mkdir(parents=True, exist_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    wanted = pins()
    missing = [(n, v) for n, v, d in wanted if find(cache, n, v, d) is None]
    if missing:
        pip = os.environ.get("PIP") or str(HERE.parent / ".venv" / "bin" / "pip")
        cmd = [pip, "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.11", "--dest", str(cache)]
        subprocess.run(cmd + [f"{n}=={v}" for n, v in missing], check=True)
    for name, version, digest in wanted:
        wheel = find(cache, name, version, digest)
        if wheel is None:
            sys.exit(f"{name}=={version}: no wheel in {cache} with sha256 {digest}")
        if not wheel.name.endswith("-py3-none-any.whl"):
            sys.exit(f"{wheel.name}: not a pure-Python wheel")
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                if member.startswith("/") or ".." in Path(member).parts:
                    sys.exit(f"{wheel.name}: unsafe path {member!r}")
            zf.extractall(target)
        print(f"vendored {name} {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
