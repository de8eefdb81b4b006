"""Who owns the other end of a TCP connection on this host: the answer ``SO_PEERCRED``
gives for a unix socket, read for loopback TCP from ``/proc/net/tcp`` and ``tcp6``.

The kernel lists every TCP socket there with the uid that created it; the socket the
server accepted for our connection inherits its listener's uid, so finding the row whose
local address is our peer's and whose remote address is ours tells who listens. Used by
``gpuwatchd check`` and ``status`` to prove that the process behind the daemon's port is
the daemon (it runs as the owner of the state directory) before trusting an answer or
sending a password: a user who binds the port while the daemon is down runs as someone
else.
"""

from __future__ import annotations

import ipaddress
import socket

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
MAX_TABLE = 64 << 20  # bytes read from one table at most


def _hex_address(host: str, port: int) -> tuple[str, str]:
    """``(address, port)`` as ``/proc/net/tcp`` prints them: each 32-bit word of the
    address in host (little-endian) order, then hex digits."""
    ip = ipaddress.ip_address(host)
    raw = ip.packed
    words = [raw[i : i + 4] for i in range(0, len(raw), 4)]
    text = "".join(f"{int.from_bytes(w, 'little'):08X}" for w in words)
    return text, f"{port:04X}"


def _forms(host: str, port: int) -> set[str]:
    """The ways one endpoint can appear (an IPv4 address also as IPv6-mapped)."""
    out = {":".join(_hex_address(host, port))}
    ip = ipaddress.ip_address(host)
    if isinstance(ip, ipaddress.IPv4Address):
        out.add(":".join(_hex_address(f"::ffff:{host}", port)))
    elif ip.ipv4_mapped is not None:
        out.add(":".join(_hex_address(str(ip.ipv4_mapped), port)))
    return out


def peer_uid(sock: socket.socket) -> int | None:
    """The uid owning the far end of the connected TCP socket ``sock`` when it is on this
    host (found in the kernel's table), else None (another host, or no table to read)."""
    mine = sock.getsockname()
    theirs = sock.getpeername()
    local = _forms(str(theirs[0]), int(theirs[1]))  # the server's row: its local end...
    remote = _forms(str(mine[0]), int(mine[1]))  # ...is connected to ours
    for table in TABLES:
        try:
            with open(table, encoding="ascii", errors="replace") as fh:
                text = fh.read(MAX_TABLE)
        except OSError:
            continue
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 8:
                continue
            if fields[1] in local and fields[2] in remote and fields[7].isdigit():
                return int(fields[7])
    return None
