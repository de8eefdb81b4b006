"""Every kernel-log source kind, in the order ``sources.kernel_log: auto`` tries them.

Adding a kind: write ``sources/kernel/<kind>.py`` (its reader and a ``KIND``: see
``kind.KernelLogKind``) and add its ``KIND`` here; ``XidIntake`` picks it up from this
list. Its name is a value of ``sources.kernel_log`` (``config/loader.py``'s
``KERNEL_LOG_CHOICES``, which tests/test_kernel_log_kinds.py checks against this list).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpuwatchd.sources.kernel import journald, kmsg, scenario
from gpuwatchd.sources.kernel.kind import KernelLogKind

KINDS: tuple[KernelLogKind, ...] = (
    scenario.KIND,
    journald.KIND,
    kmsg.KIND,
)

BY_NAME: Mapping[str, KernelLogKind] = MappingProxyType({k.name: k for k in KINDS})
