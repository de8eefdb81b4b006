"""Reading a scenario file: every key checked, every mistake reported as
``PATH:LINE:COL: message`` (a ``ConfigError``), then compiled (``scenario.compile``).
docs/scenarios.md describes the format.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from gpuwatchd.config.yamlsrc import Node, Reader
from gpuwatchd.core.errors import Location
from gpuwatchd.core.fields import (
    CLOCK_EVENT_REASON_BITS,
    LINK_FIELDS,
    ExtraField,
    FieldSpec,
    gpu_fields_with,
)
from gpuwatchd.core.units import format_duration, value_with_unit
from gpuwatchd.scenario.compile import SCENARIO_DERIVED, compile_scenario
from gpuwatchd.scenario.gpumodels import DEFAULT_MODEL, KNOWN_MODELS, UNKNOWN_MODEL_REQUIRED
from gpuwatchd.scenario.series import Scenario
from gpuwatchd.scenario.spec import MAX_GPUS, MAX_XID, TRANSPORTS, Event, GpuEntry, links_of


def _hint(word: str, choices: list[str] | tuple[str, ...]) -> str:
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _model_hint(model: str) -> str:
    low = model.lower()
    for known in KNOWN_MODELS:
        if known.lower().startswith(low) or low.startswith(known.lower()):
            return f" (did you mean {known!r}?)"
    return _hint(model, list(KNOWN_MODELS))


def _normalise_bus_id(text: str) -> str | None:
    """NVML form ``00000000:3B:00.0`` from ``0000:3b:00.0``, ``3b:00.0`` and the like."""
    parts = text.strip().split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3 or "." not in parts[2]:
        return None
    dev, _, fn = parts[2].partition(".")
    try:
        dom, bus, d, f = (int(x, 16) for x in (parts[0], parts[1], dev, fn))
    except ValueError:
        return None
    if dom > 0xFFFFFFFF or bus > 0xFF or d > 0x1F or f > 7:
        return None
    return f"{dom:08X}:{bus:02X}:{d:02X}.{f}"


def _valid_uuid(text: str) -> bool:
    body = text.removeprefix("GPU-")
    if body == text:
        return False
    groups = body.split("-")
    if [len(g) for g in groups] != [8, 4, 4, 4, 12]:
        return False
    return all(c in "0123456789abcdefABCDEF" for g in groups for c in g)


_TOP_KEYS = ("name", "description", "duration", "step", "gpus", "baseline", "jitter", "timeline")


_GPUS_COUNT_KEYS = ("count", "model", "nvlink_links")


_GPU_ENTRY_KEYS = ("uuid", "pci_bus_id", "model", "nvlink_links", "serial", "vbios")


_EVENT_KEYS = (
    "at",
    "note",
    "gpu",
    "link",
    "set",
    "add",
    "ramp",
    "throttle",
    "lose",
    "recover",
    "stall",
    "kernel_log",
    "transport",
    "nvml_xid",
)


_ACTIONS = (
    "set",
    "add",
    "ramp",
    "throttle",
    "lose",
    "recover",
    "stall",
    "kernel_log",
    "nvml_xid",
)


_RAMP_KEYS = ("field", "rate", "per")


class ScenarioParser:
    def __init__(self, path: str, extra: tuple[ExtraField, ...] = ()) -> None:
        self.path = path
        self.r = Reader()
        self.extra = extra
        self.gpu_fields = gpu_fields_with(extra)
        self.all_fields: Mapping[str, FieldSpec] = {**self.gpu_fields, **LINK_FIELDS}

    # -- top level ------------------------------------------------------------------
    def scenario(self, root: Node | None) -> Scenario:
        r = self.r
        if root is None:
            r.fail(Location(self.path, 1, 1), "scenario: the file is empty")
        keys = r.mapping(root, list(_TOP_KEYS), "scenario", required=("name", "duration", "gpus"))
        if keys is None:
            r.raise_if_any()
            raise AssertionError("unreachable")
        name = ""
        if (n := keys.get("name")) is not None:
            name = r.string(n, "name") or ""
            if isinstance(n.value, str) and not name.strip():
                r.error(n.loc, "name: must not be empty")
        description = ""
        if (n := keys.get("description")) is not None:
            description = (r.string(n, "description") or "").strip()
        duration: float | None = None
        if (n := keys.get("duration")) is not None:
            duration = r.duration(n, "duration", allow_zero=False)
        step = 1.0
        if (n := keys.get("step")) is not None:
            got = r.duration(n, "step", allow_zero=False)
            if got is not None and duration is not None and got > duration:
                r.error(n.loc, f"step: {n.value!r} is longer than the duration")
            step = got if got is not None else step

        gpus: list[GpuEntry] | None = None
        if (n := keys.get("gpus")) is not None:
            gpus = self.gpus(n)
        baseline: dict[str, float] = {}
        if (n := keys.get("baseline")) is not None:
            baseline = self.field_values(n, "baseline", allow_links=False) or {}
        if gpus is not None:
            self.check_models(gpus, baseline, keys.get("baseline"), root.loc)
        jitter: dict[str, float] = {}
        if (n := keys.get("jitter")) is not None:
            jitter = self.jitter(n)
        events: list[Event] = []
        if (n := keys.get("timeline")) is not None:
            events = self.timeline(n, gpus, duration)
        r.raise_if_any()
        assert gpus is not None and duration is not None
        return compile_scenario(
            self.path,
            name,
            description,
            duration,
            step,
            gpus,
            baseline,
            jitter,
            events,
            self.gpu_fields,
        )

    # -- gpus -----------------------------------------------------------------------
    def gpus(self, node: Node) -> list[GpuEntry] | None:
        r = self.r
        if node.is_mapping():
            keys = r.mapping(node, list(_GPUS_COUNT_KEYS), "gpus", required=("count",))
            if keys is None or "count" not in keys:
                return None
            count = r.integer(keys["count"], "gpus.count", minimum=1, maximum=MAX_GPUS)
            model, model_loc = DEFAULT_MODEL, node.loc
            if (n := keys.get("model")) is not None:
                model = r.string(n, "gpus.model") or DEFAULT_MODEL
                model_loc = n.loc
            links = None
            if (n := keys.get("nvlink_links")) is not None:
                links = r.integer(n, "gpus.nvlink_links", minimum=0, maximum=64)
            if count is None:
                return None
            gpu = GpuEntry(node.loc, None, None, model, model_loc, "gpus.model", links, None, None)
            return [gpu] * count
        if node.is_sequence():
            items = r.sequence(node, "gpus") or []
            if not items:
                r.error(node.loc, "gpus: the list is empty")
                return None
            if len(items) > MAX_GPUS:
                r.error(node.loc, f"gpus: at most {MAX_GPUS} GPUs")
                return None
            out: list[GpuEntry] = []
            seen_uuid: dict[str, int] = {}
            seen_pci: dict[str, int] = {}
            for i, item in enumerate(items):
                what = f"gpus[{i}]"
                keys = r.mapping(item, list(_GPU_ENTRY_KEYS), what) or {}
                gpu = GpuEntry(
                    item.loc, None, None, DEFAULT_MODEL, item.loc, f"{what}.model", None, None, None
                )
                if (n := keys.get("uuid")) is not None and (s := r.string(n, f"{what}.uuid")):
                    if not _valid_uuid(s):
                        r.error(
                            n.loc,
                            f"{what}.uuid: {s!r} is not a GPU UUID "
                            "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                        )
                    elif s.lower() in seen_uuid:
                        r.error(n.loc, f"{what}.uuid: same as gpus[{seen_uuid[s.lower()]}]")
                    else:
                        seen_uuid[s.lower()] = i
                        gpu.uuid = s
                if (n := keys.get("pci_bus_id")) is not None and (
                    s := r.string(n, f"{what}.pci_bus_id")
                ):
                    bus = _normalise_bus_id(s)
                    if bus is None:
                        r.error(
                            n.loc,
                            f"{what}.pci_bus_id: {s!r} is not a PCI bus id (like 00000000:3B:00.0)",
                        )
                    elif bus in seen_pci:
                        r.error(n.loc, f"{what}.pci_bus_id: same as gpus[{seen_pci[bus]}]")
                    else:
                        seen_pci[bus] = i
                        gpu.pci_bus_id = bus
                if (n := keys.get("model")) is not None:
                    gpu.model = r.string(n, f"{what}.model") or DEFAULT_MODEL
                    gpu.model_loc = n.loc
                if (n := keys.get("nvlink_links")) is not None:
                    gpu.nvlink_links = r.integer(n, f"{what}.nvlink_links", minimum=0, maximum=64)
                if (n := keys.get("serial")) is not None:
                    gpu.serial = r.string(n, f"{what}.serial")
                if (n := keys.get("vbios")) is not None:
                    gpu.vbios = r.string(n, f"{what}.vbios")
                out.append(gpu)
            return out
        r.error(node.loc, "gpus: expected a mapping with 'count' or a list of GPUs")
        return None

    def check_models(
        self,
        gpus: list[GpuEntry],
        baseline: dict[str, float],
        base_node: Node | None,
        loc: Location,
    ) -> None:
        reported: set[str] = set()
        for gpu in gpus:
            if gpu.model in KNOWN_MODELS or gpu.model in reported:
                continue
            reported.add(gpu.model)
            missing = [f for f in UNKNOWN_MODEL_REQUIRED if f not in baseline]
            if missing:
                self.r.error(
                    gpu.model_loc,
                    f"{gpu.model_what}: {gpu.model!r} is not a known model"
                    f"{_model_hint(gpu.model)}; known: {', '.join(KNOWN_MODELS)}. "
                    f"For another model give `baseline` with at least {', '.join(missing)}",
                )

    # -- field values ---------------------------------------------------------------
    def field_name(self, node: Node, what: str, allow_links: bool) -> tuple[str, FieldSpec] | None:
        name = node.value
        if not isinstance(name, str):
            self.r.error(node.loc, f"{what}: a field name must be a string")
            return None
        spec = self.all_fields.get(name)
        if spec is None:
            close = _hint(name, list(self.all_fields))
            self.r.error(
                node.loc,
                f"{what}: unknown field {name!r}"
                + (
                    close
                    or " (another NVML field id needs an entry in the config's `fields` section)"
                ),
            )
            return None
        if name in SCENARIO_DERIVED:
            self.r.error(
                node.loc,
                f"{what}: {name!r} is derived ({SCENARIO_DERIVED[name]}); set those instead",
            )
            return None
        if name in LINK_FIELDS and not allow_links:
            self.r.error(node.loc, f"{what}: {name!r} is a per-link field and needs `link:`")
            return None
        return name, spec

    def value(self, node: Node, what: str, spec: FieldSpec, increment: bool) -> float | None:
        r = self.r
        raw = node.value
        if isinstance(raw, str):
            converted = value_with_unit(raw, spec)
            if isinstance(converted, str):
                r.error(node.loc, f"{what}: {converted}")
                return None
            raw = converted
        if isinstance(raw, bool) and spec.integer:
            raw_num: object = int(raw)
        else:
            raw_num = raw
        node = Node(raw_num, node.loc, node.tag)
        minimum = None if spec.name.startswith("temperature_") and not increment else 0.0
        if increment and spec.kind == "gauge":
            minimum = None
        maximum = 1.0 if spec.name.startswith("utilization_") and not increment else None
        if isinstance(raw_num, int | float) and not isinstance(raw_num, bool):
            if maximum is not None and raw_num > maximum and raw_num <= 100:
                r.error(
                    node.loc, f"{what}: ratios are 0-1 (write {raw_num / 100:g}, not {raw_num})"
                )
                return None
            if spec.integer and not float(raw_num).is_integer():
                r.error(node.loc, f"{what}: {spec.name} counts whole numbers, got {raw_num!r}")
                return None
        return r.number(node, what, minimum=minimum, maximum=maximum)

    def field_values(
        self, node: Node, what: str, allow_links: bool, increment: bool = False
    ) -> dict[str, float] | None:
        if not node.is_mapping():
            self.r.error(node.loc, f"{what}: expected a mapping of field: value")
            return None
        out: dict[str, float] = {}
        for key, val in node.items():
            got = self.field_name(key, what, allow_links)
            if got is None:
                continue
            name, spec = got
            v = self.value(val, f"{what}.{name}", spec, increment)
            if v is not None:
                out[name] = v
        return out

    def jitter(self, node: Node) -> dict[str, float]:
        if not node.is_mapping():
            self.r.error(node.loc, "jitter: expected a mapping of field: amplitude")
            return {}
        out: dict[str, float] = {}
        for key, val in node.items():
            got = self.field_name(key, "jitter", allow_links=False)
            if got is None:
                continue
            name, spec = got
            if spec.kind != "gauge" or spec.integer:
                self.r.error(
                    key.loc,
                    f"jitter: {name!r} is a {'counter' if spec.kind == 'counter' else 'count'}; "
                    "jitter applies to measured gauges (temperatures, power, clocks, ...)",
                )
                continue
            v = self.r.number(val, f"jitter.{name}", minimum=0.0)
            if v is not None:
                out[name] = v
        return out

    # -- timeline -------------------------------------------------------------------
    def timeline(
        self, node: Node, gpus: list[GpuEntry] | None, duration: float | None
    ) -> list[Event]:
        items = self.r.sequence(node, "timeline")
        if items is None:
            return []
        events = []
        for i, item in enumerate(items):
            ev = self.event(item, f"timeline[{i}]", i, gpus, duration)
            if ev is not None:
                events.append(ev)
        return events

    def gpu_selector(self, node: Node | None, what: str, count: int | None) -> tuple[int, ...]:
        r = self.r
        if node is None or node.value == "all":
            return tuple(range(count or 0))
        values = node.value if node.is_sequence() else [node]
        if node.is_sequence() and not values:
            r.error(node.loc, f"{what}: the list is empty")
            return ()
        out: list[int] = []
        for item in values:
            if isinstance(item.value, str):
                r.error(item.loc, f"{what}: expected a GPU index, a list of indexes or 'all'")
                continue
            idx = r.integer(item, what, minimum=0)
            if idx is None:
                continue
            if count is not None and idx >= count:
                r.error(
                    item.loc,
                    f"{what}: GPU {idx} is out of range (this scenario has {count} GPUs: "
                    f"0-{count - 1})",
                )
                continue
            if idx not in out:
                out.append(idx)
        return tuple(out)

    def link_selector(
        self, node: Node, what: str, gpus: tuple[int, ...], link_counts: list[int] | None
    ) -> tuple[int, ...]:
        r = self.r
        fewest = None
        if link_counts is not None and gpus:
            fewest = min(gpus, key=lambda g: link_counts[g])
        limit = None if fewest is None or link_counts is None else link_counts[fewest]
        if node.value == "all":
            if limit == 0:
                r.error(node.loc, f"{what}: GPU {fewest} has no NVLink links")
            return tuple(range(limit or 0))
        values = node.value if node.is_sequence() else [node]
        out: list[int] = []
        for item in values:
            if isinstance(item.value, str):
                r.error(item.loc, f"{what}: expected a link number, a list of them or 'all'")
                continue
            idx = r.integer(item, what, minimum=0)
            if idx is None:
                continue
            if limit is not None and idx >= limit:
                span = f"0-{limit - 1}" if limit else "none"
                r.error(
                    item.loc,
                    f"{what}: link {idx} is out of range (GPU {fewest} has {limit} NVLink "
                    f"links: {span})",
                )
                continue
            if idx not in out:
                out.append(idx)
        return tuple(out)

    def event(
        self,
        node: Node,
        what: str,
        order: int,
        gpus: list[GpuEntry] | None,
        duration: float | None,
    ) -> Event | None:
        r = self.r
        keys = r.mapping(node, list(_EVENT_KEYS), what, required=("at",))
        if keys is None or "at" not in keys:
            return None
        at_node = keys["at"]
        at = r.duration(at_node, f"{what}.at")
        if at is not None and duration is not None and at > duration:
            r.error(
                at_node.loc,
                f"{what}.at: {at_node.value!r} is after the end of the scenario "
                f"(duration {format_duration(duration)})",
            )
        count = None if gpus is None else len(gpus)
        link_counts = None if gpus is None else [links_of(g) for g in gpus]
        selected = self.gpu_selector(keys.get("gpu"), f"{what}.gpu", count)
        links = None
        if (n := keys.get("link")) is not None:
            links = self.link_selector(n, f"{what}.link", selected, link_counts)
        ev = Event(order, at or 0.0, what, selected, links, gpu_named="gpu" in keys)
        actions = [k for k in _ACTIONS if k in keys]
        if not actions and "note" not in keys:
            r.error(
                node.loc,
                f"{what}: nothing happens here: give a note or one of {', '.join(_ACTIONS)}",
            )
        per_link = links is not None
        if (n := keys.get("note")) is not None:
            ev.note = r.string(n, f"{what}.note")
        if (n := keys.get("set")) is not None:
            ev.sets = list((self.field_values(n, f"{what}.set", per_link) or {}).items())
            self.check_link_fields(n, what, per_link)
        if (n := keys.get("add")) is not None:
            ev.adds = list(
                (self.field_values(n, f"{what}.add", per_link, increment=True) or {}).items()
            )
            self.check_link_fields(n, what, per_link)
        if (n := keys.get("ramp")) is not None:
            ev.ramps = self.ramps(n, f"{what}.ramp", per_link)
        if (n := keys.get("throttle")) is not None:
            ev.throttle = self.throttle(n, f"{what}.throttle")
        if (n := keys.get("lose")) is not None and r.boolean(n, f"{what}.lose") is not None:
            ev.lose = bool(n.value)
            if not ev.lose:
                r.error(n.loc, f"{what}.lose: write `recover: true` to bring a GPU back")
        if (n := keys.get("recover")) is not None and r.boolean(n, f"{what}.recover") is not None:
            ev.recover = bool(n.value)
            if not ev.recover:
                r.error(n.loc, f"{what}.recover: only `recover: true` means something")
        if ev.lose and ev.recover:
            r.error(node.loc, f"{what}: lose and recover at once")
        if (n := keys.get("stall")) is not None:
            ev.stall = r.duration(n, f"{what}.stall", allow_zero=False)
            if (
                ev.stall is not None
                and at is not None
                and duration is not None
                and at + ev.stall > duration
            ):
                r.error(n.loc, f"{what}.stall: the stall runs past the end of the scenario")
        if (n := keys.get("kernel_log")) is not None:
            line = r.string(n, f"{what}.kernel_log")
            if line is not None and ("\n" in line.strip() or not line.strip()):
                r.error(n.loc, f"{what}.kernel_log: one non-empty line per event")
            elif line is not None:
                ev.kernel_log = line.strip()
        if (n := keys.get("transport")) is not None:
            if "kernel_log" not in keys:
                r.error(n.loc, f"{what}.transport: only applies to a kernel_log line")
            ev.transport = r.string(n, f"{what}.transport", TRANSPORTS) or "kernel"
        if (n := keys.get("nvml_xid")) is not None:
            ev.nvml_xid = r.integer(n, f"{what}.nvml_xid", minimum=1, maximum=MAX_XID)
        if per_link:
            whole = [k for k in ("throttle", "lose", "recover", "stall", "nvml_xid") if k in keys]
            if whole:
                r.error(
                    keys["link"].loc,
                    f"{what}.link: {', '.join(whole)} applies to a whole GPU; "
                    "put it in an entry without `link:`",
                )
            elif not any(k in keys for k in ("set", "add", "ramp")):
                r.error(keys["link"].loc, f"{what}.link: only set, add and ramp take a link")
        return ev

    def check_link_fields(self, node: Node, what: str, per_link: bool) -> None:
        if not per_link or not node.is_mapping():
            return
        for key, _ in node.items():
            if key.value in self.gpu_fields:
                self.r.error(
                    key.loc,
                    f"{what}: {key.value!r} is a GPU field; an entry with `link:` sets only "
                    "per-link fields",
                )

    def ramps(self, node: Node, what: str, per_link: bool) -> list[tuple[str, float]]:
        r = self.r
        items = node.value if node.is_sequence() else [node]
        out: list[tuple[str, float]] = []
        for j, item in enumerate(items):
            w = f"{what}[{j}]" if node.is_sequence() else what
            keys = r.mapping(item, list(_RAMP_KEYS), w, required=("field", "rate"))
            if keys is None or "field" not in keys or "rate" not in keys:
                continue
            got = self.field_name(keys["field"], f"{w}.field", per_link)
            rate = r.number(keys["rate"], f"{w}.rate", minimum=0.0)
            per = 1.0
            if (n := keys.get("per")) is not None:
                per = r.duration(n, f"{w}.per", allow_zero=False) or 1.0
            if got is None:
                continue
            name, spec = got
            if per_link is True and name in self.gpu_fields:
                r.error(
                    keys["field"].loc,
                    f"{w}.field: {name!r} is a GPU field; an entry with `link:` ramps only "
                    "per-link fields",
                )
                continue
            if spec.kind != "counter":
                r.error(
                    keys["field"].loc,
                    f"{w}.field: {name!r} is a gauge; only counters ramp (use `set` for gauges)",
                )
                continue
            if rate is not None:
                out.append((name, rate / per))
        return out

    def throttle(self, node: Node, what: str) -> int | None:
        r = self.r
        items = r.sequence(node, what)
        if items is None:
            return None
        mask = 0
        names = list(CLOCK_EVENT_REASON_BITS)
        ok = True
        for item in items:
            name = item.value
            if not isinstance(name, str):
                r.error(item.loc, f"{what}: expected a clock-event reason name")
                ok = False
            elif name not in CLOCK_EVENT_REASON_BITS:
                r.error(
                    item.loc,
                    f"{what}: unknown clock-event reason {name!r}{_hint(name, names)} "
                    f"(one of {', '.join(names)})",
                )
                ok = False
            else:
                mask |= CLOCK_EVENT_REASON_BITS[name]
        return mask if ok else None
