"""Which of the config's ``fields`` (extra NVML field ids) the GPUs do not answer.

An id the installed driver does not know answers INVALID_ARGUMENT or NOT_SUPPORTED and the
field is simply absent from the samples. That must not go unseen: a rule on it would never
fire. ``unanswered`` says, per configured field, which answering GPUs lack it in their
latest sample; the daemon logs it once per field (``FieldCheck``), /metrics counts it
(``gpuwatchd_field_unanswered_gpus``) and the status API lists it (``fields``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from gpuwatchd.core.families import Families
from gpuwatchd.core.fields import ExtraField
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.core.records import GpuStatus

log = logging.getLogger(__name__)


def unanswered(
    view: NodeView, extra: tuple[ExtraField, ...]
) -> list[tuple[ExtraField, list[int], int]]:
    """``(field, GPUs whose latest sample lacks it, GPUs that answered)`` for each
    configured field; a GPU that does not answer its polls counts in neither."""
    answering = [
        (g.info.index, g.sample.fields)
        for g in view.gpus
        if g.sample is not None and g.status is GpuStatus.OK
    ]
    return [
        (e, [index for index, fields in answering if e.name not in fields], len(answering))
        for e in extra
    ]


def field_families(view: NodeView, extra: tuple[ExtraField, ...], fams: Families) -> None:
    if not extra:
        return
    fam = fams.get(
        "gpuwatchd_field_unanswered_gpus",
        "gauge",
        "GPUs whose latest poll lacks this field of the config's fields section (an id the "
        "driver does not know or the GPU does not support); 0 when every GPU answers it.",
        ["field", "id"],
    )
    for e, missing, _ in unanswered(view, extra):
        fam.add([e.name, str(e.field_id)], float(len(missing)))


def field_status(view: NodeView, extra: tuple[ExtraField, ...]) -> list[dict[str, object]]:
    """The status API's ``fields``: each configured field and the GPUs that lack it."""
    return [
        {"id": e.field_id, "name": e.name, "answered": not missing, "missing_gpus": missing}
        for e, missing, _ in unanswered(view, extra)
    ]


@dataclass
class FieldCheck:
    """Logs a configured field that no answering GPU reports (once, until it answers)."""

    extra: tuple[ExtraField, ...]
    _warned: set[str] = field(default_factory=set)

    def check(self, view: NodeView) -> None:
        if not self.extra:
            return
        for e, missing, answering in unanswered(view, self.extra):
            if answering and len(missing) == answering and e.name not in self._warned:
                self._warned.add(e.name)
                log.warning(
                    "fields: id %d (%s) is answered by no GPU: the driver does not know it or "
                    "the GPUs do not support it; rules on %s cannot fire",
                    e.field_id,
                    e.name,
                    e.name,
                )
            elif not missing and e.name in self._warned:
                self._warned.discard(e.name)
                log.info("fields: id %d (%s) is answered now", e.field_id, e.name)
