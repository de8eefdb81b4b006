"""Opt-in dcgm-exporter compatible series (``metrics.dcgm_compat: true``).

Emits the ``DCGM_FI_*`` names, units and label set of NVIDIA's dcgm-exporter for every
field gpuwatchd samples, so dashboards built for it (Grafana 12239) and the alert rules
people wrote against it keep working. Units follow DCGM (C, W, MHz, MiB, %, mJ, ns), not
Prometheus base units. DCGM counters carry no ``_total`` suffix, so they are exposed with
TYPE gauge (PromQL ``rate()`` works the same; TYPE is metadata only).

``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (a 0-1 ratio) is filled from NVML's GPU utilization,
the share of the sample period in which a kernel ran: the same question, answered by
NVML at a coarser grain than DCGM's profiling counters. Dashboard 12239's "GPU
Utilization" panel reads it. The other ``DCGM_FI_PROF_*`` fields (tensor pipes, DRAM,
PCIe bytes) have no NVML equivalent and are not emitted.
"""

from __future__ import annotations

from gpuwatchd.core.families import Families, label_text
from gpuwatchd.core.fields import GPU_FIELD_LIST, LINK_FIELD_LIST
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.core.records import GpuStatus

DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName")
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"


def dcgm_families(view: NodeView, fams: Families, hostname_label: bool = True) -> None:
    names = list(DCGM_LABELS)
    if hostname_label:
        names.append("Hostname")
    names.append("DCGM_FI_DRIVER_VERSION")
    gpu_specs = [s for s in GPU_FIELD_LIST if s.dcgm is not None]
    link_specs = [s for s in LINK_FIELD_LIST if s.dcgm is not None]
    families = {
        s.name: fams.get(s.dcgm.name, "gauge", s.dcgm.help or s.help, names)
        for s in (*gpu_specs, *link_specs)
        if s.dcgm is not None
    }
    xid = fams.get(
        "DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", names
    )
    engine = fams.get(
        GR_ENGINE_ACTIVE,
        "gauge",
        "Ratio of time the graphics engine is active (from NVML GPU utilization).",
        names,
    )
    for g in view.gpus:
        i = g.info
        values = [str(i.index), i.uuid, i.pci_bus_id, f"nvidia{i.index}", i.name]
        if hostname_label:
            values.append(view.node_name)
        values.append(i.driver)
        labels = label_text(names, values)
        xid.add_text(labels, float(view.last_xid.get(i.index, 0)))
        sample = g.sample
        if sample is None or g.status is not GpuStatus.OK:
            continue
        util = sample.fields.get("utilization_gpu")
        if util is not None:
            engine.add_text(labels, util)
        for spec in gpu_specs:
            assert spec.dcgm is not None
            value = sample.fields.get(spec.name)
            if value is not None:
                families[spec.name].add_text(labels, value * spec.dcgm.scale)
        for spec in link_specs:
            assert spec.dcgm is not None
            per_link = [ls.fields[spec.name] for ls in sample.links if spec.name in ls.fields]
            if per_link:
                families[spec.name].add_text(labels, sum(per_link) * spec.dcgm.scale)
