"""Renders a ``NodeView`` as Prometheus metrics at scrape time.

Every scrape builds fresh families from the latest immutable view, so a scrape never
calls NVML and never waits on a GPU. ``MetricsRenderer`` caches the text per view
version: scrapes between two polls cost a lookup. ``render_openmetrics`` is the same
families in OpenMetrics 1.0 (what Prometheus asks for first), rendered by the same code
and cached the same way, so neither format is the slow path. Both scrape paths add the
daemon's own ``process_*`` metrics, read fresh at every scrape (they are not part of
``families()``, which ``simulate`` writes, so its output stays the same from run to run).

Either format can be asked for gzip-compressed (a scraper that sends
``Accept-Encoding: gzip``, as Prometheus does). The node's families are compressed once
per view version and format, and the compressor's state is kept after a sync flush: a
scrape copies that state, compresses only the fresh ``process_*`` lines and finishes the
stream, one gzip member: 48 us where compressing the whole 8-GPU body takes 1-2 ms.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from gpuwatchd import __version__
from gpuwatchd.config.sections import MetricsConfig
from gpuwatchd.core.families import (
    OPENMETRICS_EOF,
    Families,
    escape_label_value,
    label_text,
)
from gpuwatchd.core.fieldcheck import field_families
from gpuwatchd.core.fields import (
    CLOCK_EVENT_REASONS,
    GPU_FIELD_LIST,
    LINK_FIELD_LIST,
    ExtraField,
    FieldSpec,
)
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.core.records import GpuInfo, GpuStatus
from gpuwatchd.exposition.process import ProcessMetrics

GPU_LABELS = ("gpu", "uuid", "pci_bus_id", "model")
LINK_LABELS = (*GPU_LABELS, "link")

ExtraFamilies = Callable[[NodeView, Families], None]


@lru_cache(maxsize=1024)
def gpu_label_text(info: GpuInfo) -> str:
    return label_text(GPU_LABELS, (str(info.index), info.uuid, info.pci_bus_id, info.name))


def _suffix(spec: FieldSpec) -> str:
    if not spec.const_labels:
        return ""
    return "," + label_text(tuple(spec.const_labels), tuple(spec.const_labels.values()))


_GPU_SPECS = tuple((spec, _suffix(spec)) for spec in GPU_FIELD_LIST)
_LINK_SPECS = tuple((spec, _suffix(spec)) for spec in LINK_FIELD_LIST)
_REASONS = tuple((bit, f',reason="{name}"') for bit, name in CLOCK_EVENT_REASONS)
_STATUSES = tuple((st, f',status="{st.value}"') for st in GpuStatus)


def _node_families(view: NodeView, fams: Families) -> None:
    fams.get("gpuwatchd_build_info", "gauge", "gpuwatchd version (value 1).", ["version"]).add(
        [__version__], 1.0
    )
    fams.get(
        "gpuwatchd_node_info", "gauge", "The node name gpuwatchd reports as (value 1).", ["node"]
    ).add([view.node_name], 1.0)
    fams.get(
        "gpuwatchd_start_time_seconds",
        "gauge",
        "When the daemon started, in seconds since the epoch.",
        [],
    ).add([], view.started_at)
    fams.get("gpuwatchd_gpus", "gauge", "GPUs found at start-up.", []).add(
        [], float(len(view.gpus))
    )
    if view.expected_gpus is not None:
        fams.get(
            "gpuwatchd_gpus_expected", "gauge", "GPUs this node is configured to have.", []
        ).add([], float(view.expected_gpus))


def _source_families(view: NodeView, fams: Families) -> None:
    up = fams.get(
        "gpuwatchd_source_up",
        "gauge",
        "1 when the input source works (nvml, journald, kmsg, nvml_events).",
        ["source"],
    )
    last = fams.get(
        "gpuwatchd_source_last_success_timestamp_seconds",
        "gauge",
        "When the source last succeeded, in seconds since the epoch.",
        ["source"],
    )
    dur = fams.get(
        "gpuwatchd_source_duration_seconds",
        "gauge",
        "How long the source's last cycle took (nvml: the slowest GPU poll).",
        ["source"],
    )
    errs = fams.get(
        "gpuwatchd_source_errors_total", "counter", "Failed cycles of the source.", ["source"]
    )
    for name in sorted(view.sources):
        s = view.sources[name]
        up.add([name], 1.0 if s.up else 0.0)
        if s.last_success is not None:
            last.add([name], s.last_success)
        if s.last_duration is not None:
            dur.add([name], s.last_duration)
        errs.add([name], float(s.errors))


def _gpu_families(
    view: NodeView, fams: Families, per_link: bool, extra_fields: tuple[ExtraField, ...] = ()
) -> None:
    info_f = fams.get(
        "gpuwatchd_gpu_info",
        "gauge",
        "Static facts about each GPU (value 1).",
        [*GPU_LABELS, "serial", "vbios", "driver"],
    )
    up = fams.get(
        "gpuwatchd_gpu_up",
        "gauge",
        "1 when the GPU's last poll answered; 0 when lost, stale or failing.",
        GPU_LABELS,
    )
    status = fams.get(
        "gpuwatchd_gpu_status",
        "gauge",
        "The GPU's poll status as a state set (ok, lost, stale, error).",
        [*GPU_LABELS, "status"],
    )
    last = fams.get(
        "gpuwatchd_gpu_last_sample_timestamp_seconds",
        "gauge",
        "When the GPU last answered a poll, in seconds since the epoch.",
        GPU_LABELS,
    )
    polldur = fams.get(
        "gpuwatchd_gpu_poll_duration_seconds",
        "gauge",
        "Wall time of the GPU's last successful poll.",
        GPU_LABELS,
    )
    slowdown = fams.get(
        "gpuwatchd_gpu_slowdown_temperature_celsius",
        "gauge",
        "GPU temperature at which the hardware slows the clocks.",
        GPU_LABELS,
    )
    shutdown = fams.get(
        "gpuwatchd_gpu_shutdown_temperature_celsius",
        "gauge",
        "GPU temperature at which the hardware shuts down.",
        GPU_LABELS,
    )
    memmax = fams.get(
        "gpuwatchd_memory_max_temperature_celsius",
        "gauge",
        "Highest HBM temperature the GPU is specified for.",
        GPU_LABELS,
    )
    ecc = fams.get("gpuwatchd_ecc_enabled", "gauge", "1 when ECC is enabled.", GPU_LABELS)
    nlinks = fams.get(
        "gpuwatchd_nvlink_links", "gauge", "NVLink links present on the GPU.", GPU_LABELS
    )
    gpu_fams = [
        (
            spec.name,
            sfx,
            fams.get(spec.metric, spec.kind, spec.help, (*GPU_LABELS, *spec.const_labels)),
        )
        for spec, sfx in (*_GPU_SPECS, *((e.spec(), "") for e in extra_fields))
    ]
    reasons = fams.get(
        "gpuwatchd_clock_event_reason_active",
        "gauge",
        "1 when NVML reports this clocks-event (throttle) reason.",
        [*GPU_LABELS, "reason"],
    )
    link_fams = [
        (
            spec.name,
            sfx,
            fams.get(spec.metric, spec.kind, spec.help, (*LINK_LABELS, *spec.const_labels)),
        )
        for spec, sfx in _LINK_SPECS
    ]

    for g in view.gpus:
        i = g.info
        base = gpu_label_text(i)
        info_f.add_text(
            base + "," + label_text(("serial", "vbios", "driver"), (i.serial, i.vbios, i.driver)),
            1.0,
        )
        up.add_text(base, 1.0 if g.status is GpuStatus.OK else 0.0)
        for st, sfx in _STATUSES:
            status.add_text(base + sfx, 1.0 if g.status is st else 0.0)
        if g.last_success is not None:
            last.add_text(base, g.last_success)
        if i.slowdown_temperature is not None:
            slowdown.add_text(base, i.slowdown_temperature)
        if i.shutdown_temperature is not None:
            shutdown.add_text(base, i.shutdown_temperature)
        if i.memory_max_temperature is not None:
            memmax.add_text(base, i.memory_max_temperature)
        if i.ecc_enabled is not None:
            ecc.add_text(base, 1.0 if i.ecc_enabled else 0.0)
        nlinks.add_text(base, float(i.nvlink_count))
        sample = g.sample
        if sample is None or g.status is not GpuStatus.OK:
            continue  # never present old readings as current ones
        polldur.add_text(base, sample.duration_seconds)
        fields = sample.fields
        for name, sfx, fam in gpu_fams:
            value = fields.get(name)
            if value is not None:
                fam.add_text(base + sfx, value)
        mask = fields.get("clock_event_reasons")
        if mask is not None:
            bits = int(mask)
            for bit, sfx in _REASONS:
                reasons.add_text(base + sfx, 1.0 if bits & bit else 0.0)
        if per_link:
            for ls in sample.links:
                lbase = f'{base},link="{ls.link}"'
                lf = ls.fields
                for name, sfx, fam in link_fams:
                    value = lf.get(name)
                    if value is not None:
                        fam.add_text(lbase + sfx, value)


XID_OTHER_LABEL = "other"
"""The ``xid`` label of every code outside NVIDIA's XID catalog."""

_MigKey = tuple[int | None, str, int, int | None]  # gpu, xid label, GPU and compute instance


@lru_cache(maxsize=1)
def _catalog_codes() -> frozenset[int]:
    from gpuwatchd.xid.catalog import Catalog

    return frozenset(Catalog.default().codes())


def _xid_families(view: NodeView, fams: Families) -> None:
    xid = fams.get(
        "gpuwatchd_xid_errors_total",
        "counter",
        "NVIDIA XID errors seen from trusted sources, by GPU and XID code; a report the "
        "driver attributed to a MIG instance is counted in a series of its own with the "
        "labels gpu_instance and compute_instance.",
        [*GPU_LABELS, "xid"],
    )
    by_index = {g.info.index: g.info for g in view.gpus}

    def order(item: tuple[tuple[int | None, int], int]) -> tuple[int, int]:
        (gpu, code), _ = item
        return (-1 if gpu is None else gpu, code)

    # A code NVIDIA's catalog does not list (a corrupt line, a code
    # newer than the catalog) is counted under one label, so that 100,000 distinct codes
    # cannot make 100,000 series. The exact code is in the log and in /api/v1/status.
    known = _catalog_codes()

    def label_of(code: int) -> str:
        return str(code) if code in known else XID_OTHER_LABEL

    # MIG-attributed reports leave the whole-GPU series and get one per instance, so that
    # sum() over the family is still the number of reports.
    mig: dict[_MigKey, int] = {}
    mig_total: dict[tuple[int | None, str], int] = {}
    for (gpu, code, gi, ci), count in view.mig_xid_counts.items():
        label = label_of(code)
        mig[(gpu, label, gi, ci)] = mig.get((gpu, label, gi, ci), 0) + count
        mig_total[(gpu, label)] = mig_total.get((gpu, label), 0) + count
    buckets: dict[tuple[int | None, str], int] = {}
    for (gpu, code), count in sorted(view.xid_counts.items(), key=order):
        label = label_of(code)
        buckets[(gpu, label)] = buckets.get((gpu, label), 0) + count

    def base_of(gpu: int | None) -> str:
        info = by_index.get(gpu) if gpu is not None else None
        return gpu_label_text(info) if info is not None else 'gpu="",uuid="",pci_bus_id="",model=""'

    for (gpu, label), count in buckets.items():
        whole = count - mig_total.get((gpu, label), 0)
        if whole > 0:
            xid.add_text(f'{base_of(gpu)},xid="{escape_label_value(label)}"', float(whole))

    def mig_order(item: tuple[_MigKey, int]) -> tuple[int, str, int, int]:
        (gpu, label, gi, ci), _ = item
        return (-1 if gpu is None else gpu, label, gi, -1 if ci is None else ci)

    for (gpu, label, gi, ci), count in sorted(mig.items(), key=mig_order):
        instance = f'gpu_instance="{gi}",compute_instance="{"" if ci is None else ci}"'
        xid.add_text(f'{base_of(gpu)},xid="{escape_label_value(label)}",{instance}', float(count))
    decoded = fams.get(
        "gpuwatchd_xid_nvlink5_decoded_total",
        "counter",
        "NVLink5 XIDs 144-150 by the verdict of their decoded registers (NVIDIA's 144-150 "
        "decode): fatal (RESET_GPU), nonfatal (IGNORE, or follow the XID 154), undecoded.",
        [*GPU_LABELS, "xid", "verdict"],
    )

    def verdict_order(item: tuple[tuple[int | None, int, str], int]) -> tuple[int, int, str]:
        (gpu, code, verdict), _ = item
        return (-1 if gpu is None else gpu, code, verdict)

    for (gpu, code, verdict), count in sorted(view.xid_verdict_counts.items(), key=verdict_order):
        decoded.add_text(f'{base_of(gpu)},xid="{code}",verdict="{verdict}"', float(count))

    sxid = fams.get(
        "gpuwatchd_sxid_errors_total",
        "counter",
        "NVSwitch SXid lines from trusted sources, by switch and what the line says: fatal, "
        "nonfatal, unrated (no severity word), or detail (the Data and Severity lines that "
        "follow a report).",
        ["pci_bus_id", "verdict"],
    )
    for (pci, verdict), count in sorted(view.sxid_counts.items()):
        sxid.add_text(
            f'pci_bus_id="{escape_label_value(pci)}",verdict="{escape_label_value(verdict)}"',
            float(count),
        )


def build_families(
    view: NodeView,
    *,
    per_link: bool = True,
    extra: tuple[ExtraFamilies, ...] = (),
    extra_fields: tuple[ExtraField, ...] = (),
) -> Families:
    """Every family of the node; ``extra_fields`` are the config's ``fields`` section."""
    fams = Families()
    _node_families(view, fams)
    _gpu_families(view, fams, per_link, extra_fields)
    field_families(view, extra_fields, fams)  # configured fields no GPU answers
    _xid_families(view, fams)
    _source_families(view, fams)
    for add in extra:
        add(view, fams)
    return fams


GZIP_LEVEL = 6
"""zlib's default: the 8-GPU body in 11.3 KB (level 1: 12.7 KB), compressed once per poll."""
GZIP_MEM_LEVEL = 5
"""The compressor state kept per format is 160 KiB (zlib's default 8: 270 KiB, and a
larger body: the text repeats label sets within the 32 KiB window either way)."""


@dataclass(frozen=True)
class _Compressed:
    """The node's families of one view version, gzip-compressed up to a sync flush, and
    the compressor at that point (copied for each scrape's fresh tail)."""

    version: int
    head: bytes
    state: zlib._Compress


class MetricsRenderer:
    """Text exposition of the node, cached per view version (plain and gzip)."""

    def __init__(
        self,
        view: Callable[[], NodeView],
        *,
        per_link: bool = True,
        dcgm_compat: bool = False,
        hostname_label: bool = True,
        extra_families: tuple[ExtraFamilies, ...] = (),
        process: ProcessMetrics | None = None,
        extra_fields: tuple[ExtraField, ...] = (),
    ) -> None:
        self._view = view
        self.extra_fields = extra_fields
        self.process = process or ProcessMetrics()
        self.per_link = per_link
        extra: list[ExtraFamilies] = list(extra_families)
        if dcgm_compat:
            from gpuwatchd.exposition.dcgm_compat import dcgm_families

            extra.append(lambda v, f: dcgm_families(v, f, hostname_label=hostname_label))
        self.extra = tuple(extra)
        self._lock = threading.Lock()
        self._cache: dict[bool, tuple[int, bytes]] = {}  # openmetrics? -> (version, body)
        self._gzip: dict[bool, _Compressed] = {}  # openmetrics? -> compressed node body

    @classmethod
    def for_config(
        cls,
        view: Callable[[], NodeView],
        metrics: MetricsConfig,
        extra_families: tuple[ExtraFamilies, ...] = (),
        extra_fields: tuple[ExtraField, ...] = (),
    ) -> MetricsRenderer:
        """The renderer with the ``metrics:`` section's options (and the ``fields:``)."""
        return cls(
            view,
            per_link=metrics.per_link,
            dcgm_compat=metrics.dcgm_compat,
            hostname_label=metrics.hostname_label,
            extra_families=extra_families,
            extra_fields=extra_fields,
        )

    def families(self, view: NodeView | None = None) -> Families:
        return build_families(
            view or self._view(),
            per_link=self.per_link,
            extra=self.extra,
            extra_fields=self.extra_fields,
        )

    def render(self, *, gzip: bool = False) -> bytes:
        """The node's families (cached per view version), then the process metrics;
        ``gzip``: the same, gzip-compressed."""
        tail = self.process.render()
        if gzip:
            return self._compressed(False, tail)
        return self._node_body(False)[1] + tail

    def render_openmetrics(self, *, gzip: bool = False) -> bytes:
        """The same in OpenMetrics 1.0, ending in ``# EOF``."""
        process = Families()
        self.process.add(process)
        tail = process.render_openmetrics() + OPENMETRICS_EOF
        if gzip:
            return self._compressed(True, tail)
        return self._node_body(True)[1] + tail

    def _node_body(self, openmetrics: bool) -> tuple[int, bytes]:
        """(view version, the node's families rendered), from the cache when it is that
        version's."""
        view = self._view()
        with self._lock:
            cached = self._cache.get(openmetrics)
            if cached is not None and cached[0] == view.version:
                return cached
        fams = self.families(view)
        body = fams.render_openmetrics() if openmetrics else fams.render()
        with self._lock:
            self._cache[openmetrics] = (view.version, body)
        return view.version, body

    def _compressed(self, openmetrics: bool, tail: bytes) -> bytes:
        """One gzip member: the cached compressed node body, then ``tail``."""
        version, body = self._node_body(openmetrics)
        with self._lock:
            done = self._gzip.get(openmetrics)
        if done is None or done.version != version:
            state = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS, GZIP_MEM_LEVEL)
            head = state.compress(body) + state.flush(zlib.Z_SYNC_FLUSH)
            done = _Compressed(version, head, state)
            with self._lock:
                self._gzip[openmetrics] = done
        finish = done.state.copy()  # the cached state is never written to again
        return done.head + finish.compress(tail) + finish.flush()
