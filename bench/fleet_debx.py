#!/usr/bin/env python3
"""Unpack .deb files into a directory, like ``dpkg -x``, on a machine without dpkg.

A .deb is an ``ar`` archive whose ``data.tar.*`` member holds the files. This reads the ar
members itself and unpacks the data member with ``tarfile`` (or the ``tar`` command when
this Python lacks the member's compression module). Only regular files, directories and
symbolic links are written, and every name must stay inside the target directory.
bench/fleet_storm_remote.sh uses it when ``dpkg`` is missing.

    python3 bench/fleet_debx.py TARGET_DIR pkg1.deb pkg2.deb ...
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

AR_MAGIC = b"!<arch>\n"
MAX_MEMBER = 256 * 1024 * 1024  # a .deb member larger than this is not one of ours


def data_member(deb: Path) -> tuple[str, bytes]:
    """(member name, bytes) of the deb's ``data.tar.*``."""
    raw = deb.read_bytes()
    if not raw.startswith(AR_MAGIC):
        raise ValueError(f"{deb}: not a .deb (no ar header)")
    pos = len(AR_MAGIC)
    while pos + 60 <= len(raw):
        header = raw[pos : pos + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        if size > MAX_MEMBER:
            raise ValueError(f"{deb}: member {name!r} is {size} bytes")
        body = raw[pos + 60 : pos + 60 + size]
        if name.startswith("data.tar"):
            return name, body
        pos += 60 + size + (size & 1)
    raise ValueError(f"{deb}: no data.tar member")


def safe_members(tar: tarfile.TarFile, target: Path) -> list[tarfile.TarInfo]:
    keep = []
    root = target.resolve()
    for m in tar.getmembers():
        dest = (root / m.name).resolve()
        if dest != root and root not in dest.parents:
            raise ValueError(f"member {m.name!r} leaves {target}")
        if m.isfile() or m.isdir() or m.issym():
            keep.append(m)
    return keep


def unpack(deb: Path, target: Path) -> None:
    name, body = data_member(deb)
    try:
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
            tar.extractall(target, members=safe_members(tar, target), filter="tar")
    except (tarfile.CompressionError, tarfile.ReadError):
        flag = {"data.tar.xz": "-J", "data.tar.zst": "--zstd", "data.tar.gz": "-z"}.get(name, "")
        cmd = ["tar", "-x", *([flag] if flag else []), "-C", str(target), "-f", "-"]
        subprocess.run(cmd, input=body, check=True)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    target = Path(argv[0])
    target.mkdir(parents=True, exist_ok=True)
    for deb in argv[1:]:
        unpack(Path(deb), target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
