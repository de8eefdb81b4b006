"""Row types of the generated XID catalog (``catalog_data.py``).

Each type holds one row of a sheet of NVIDIA's XID catalog workbook, text cleaned but not
interpreted. ``catalog.py`` interprets them; ``tools/gen_xid_catalog.py`` writes them.
"""

from __future__ import annotations

from typing import NamedTuple


class XidRow(NamedTuple):
    """Sheet "Xids": one XID code."""

    code: int
    mnemonic: str
    description: str
    applies_to: tuple[tuple[str, bool], ...]  # (product, applies), workbook column order
    immediate: str  # resolution bucket, immediate action ("" when the workbook has none)
    investigatory: str  # resolution bucket, investigatory action
    xid154_linkage: str
    trigger: str  # "Trigger Conditions" text


class BucketRow(NamedTuple):
    """Sheet "Resolution Buckets": what a bucket name asks the operator to do."""

    name: str
    text: str


class NvlinkDecodeRow(NamedTuple):
    """Sheet "Xid 144-150 Decode": one rule for NVLink5 XIDs 144-150.

    ``intrinfo_v1``/``intrinfo_v2`` are 32-character bit masks over the first register in
    the message's parentheses (bit 31 first, ``-`` = any), for drivers before R575 (V1)
    and from R575 on (V2). ``error_status`` is the second register (hex, ``/`` between
    alternatives, empty = any). When ``action2`` is set, a register matching the
    ``action2_intrinfo_*`` mask takes that action instead of ``immediate``.
    """

    xid: int
    subcode: str
    intrinfo_v1: str
    intrinfo_v2: str
    error_status: str
    immediate: str
    action2_intrinfo_v1: str
    action2_intrinfo_v2: str
    action2: str
    investigatory: str
    severity: str
    hw_sw: str
    local_remote: str


class RecoveryActionRow(NamedTuple):
    """An XID 154 recovery-action code (``0x2`` in "... to 0x2 (Node Reboot Required)").

    ``code`` and ``nvml_name`` are NVML's ``nvmlDeviceGpuRecoveryAction_t``; ``workbook_text``
    is the wording the catalog workbook gives for it ("" when the workbook does not
    name it). Drivers have changed the words (R610 prints "PF FLR" for 0x1), never the code.
    """

    code: int
    nvml_name: str
    workbook_text: str


class ColumnNote(NamedTuple):
    """Sheet "Customer User Guide": what a column of another sheet means."""

    sheet: str
    column: str
    text: str
