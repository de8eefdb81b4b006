"""Every kernel-log source kind, in the order ``sources.kernel_log: auto`` tries them.

Adding a kind: write ``sources/kernel/<kind>.py`` (its reader, its own ``sources`` keys as
a ``KindSection`` with their readers, and a ``KIND``: see ``kind.KernelLogKind``) and add
its ``KIND`` here; ``XidIntake`` picks it up from this list, and the config loader takes
the values of ``sources.kernel_log`` (``KERNEL_LOG_CHOICES``) and the kinds' keys
(``SECTIONS``) from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpuwatchd.config.sections import KindSectionReader
from gpuwatchd.sources.kernel import journald, kmsg, scenario
from gpuwatchd.sources.kernel.kind import KernelLogKind

KINDS: tuple[KernelLogKind, ...] = (
    scenario.KIND,
    journald.KIND,
    kmsg.KIND,
)

BY_NAME: Mapping[str, KernelLogKind] = MappingProxyType({k.name: k for k in KINDS})

KERNEL_LOG_CHOICES: tuple[str, ...] = ("auto", *(k.name for k in KINDS if not k.scripted), "none")
"""The values of ``sources.kernel_log`` (a scripted kind runs only under ``auto``)."""
SECTIONS: Mapping[str, KindSectionReader] = MappingProxyType(
    {k.name: KindSectionReader(k.section, k.options) for k in KINDS}
)
"""Each kind's own keys of ``sources``: their type and readers, for the config loader."""
