"""NVIDIA XIDs: find them in kernel-log text, and say what they mean.

- ``parse_line`` finds one ``NVRM: Xid``, NVSwitch ``SXid`` or "fallen off the bus" report
  in a line of any common log format; ``XidStream`` does the same over a sequence of
  lines and adds what needs context (GPU UUIDs, dmesg's split multi-line printk).
- ``parse_kmsg_record`` opens a raw /dev/kmsg record (facility, level, sequence number).
- ``Catalog`` / ``lookup`` give NVIDIA's catalog entry for a code with gpuwatchd's severity
  and action; ``Catalog.classify`` rates one report, decoding XID 154 and 144-150.

docs/xid.md describes the accepted line forms, the severities and the catalog.
"""

from __future__ import annotations

from gpuwatchd.xid.catalog import (
    Action,
    Catalog,
    CatalogEntry,
    NvlinkMatch,
    RecoveryChange,
    Verdict,
    XidSeverity,
    lookup,
    nvlink5_registers,
    parse_recovery_change,
    recovery_actions,
)
from gpuwatchd.xid.parser import (
    FALLEN_OFF_BUS_XID,
    GpuIdentity,
    KmsgRecord,
    ParsedXid,
    XidKind,
    XidStream,
    normalize_pci,
    parse_gpu_identity,
    parse_kmsg_record,
    parse_line,
)

__all__ = [
    "FALLEN_OFF_BUS_XID",
    "Action",
    "Catalog",
    "CatalogEntry",
    "GpuIdentity",
    "KmsgRecord",
    "NvlinkMatch",
    "ParsedXid",
    "RecoveryChange",
    "Verdict",
    "XidKind",
    "XidSeverity",
    "XidStream",
    "lookup",
    "normalize_pci",
    "nvlink5_registers",
    "parse_gpu_identity",
    "parse_kmsg_record",
    "parse_line",
    "parse_recovery_change",
    "recovery_actions",
]
