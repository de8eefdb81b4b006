"""The wire between the daemon and its NVML worker process: framed JSON, both ways.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON (one object). The
worker is our own code, but what it sends passes through libnvidia-ml's answers, so the
daemon treats a frame as untrusted input: bounded in size, parsed as JSON only (never
pickle), checked for shape before use; a malformed frame ends the worker, which is then
restarted like a crashed one.

Records cross as plain dicts: ``GpuInfo`` by its fields, ``GpuSample`` and ``XidEvent``
by the functions below (``MappingProxyType`` and enums do not travel as such).

The protocol (daemon and worker ship together; it is internal, not a stable interface).
Requests carry an integer ``id``; answers to a request carry the same ``id``.

daemon -> worker:
    ``{"op": "open", "id", "args"}``       the backend's settings (``WorkerSettings``)
    ``{"op": "rounds", "id", "interval", "timeout"}``  poll every GPU each ``interval``
                                           seconds from now on (again: a new cadence)
    ``{"op": "sample", "id", "gpu"}``      one GPU read now (on-demand)
    ``{"op": "close", "id"}``              shut NVML down and exit
worker -> daemon:
    ``{"id", "infos": [GpuInfo...]}``      ``open`` worked
    ``{"id", "error": {"type", "message", "code"}}``  a request failed
    ``{"id", "round": [sample]}``          the answer to ``sample``
    ``{"round": [sample...], "errors": {"<gpu>": error}, "stuck": [gpu...]}``
                                           one poll round, unasked: every GPU's sample
                                           (``SampleEncoder``: a GPU's first whole, then
                                           changes), the GPUs whose read failed, and the
                                           GPUs left out because a call on them is stuck
    ``{"events": [XidEvent...]}``, ``{"events_error": error}``  NVML XID events, unasked
    ``{"beat": true}``                     after 2 s without any other frame
    ``{"id", "closed": true}``             ``close`` done
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Mapping
from types import MappingProxyType
from typing import IO, Any

from gpuwatchd.core.records import GpuInfo, GpuSample, GpuStatus, LinkSample, ProcessInfo, XidEvent

MAX_FRAME = 4 * 1024 * 1024  # a sample of 8 GPUs x 18 links is ~10 KB
_HEAD = struct.Struct(">I")


class WireError(Exception):
    """A frame that is too large, truncated or not the expected JSON shape."""


def dumps_message(message: dict[str, Any]) -> bytes:
    """A message's frame body: compact JSON as UTF-8."""
    return json.dumps(message, separators=(",", ":")).encode()


def write_frame(out: IO[bytes], message: dict[str, Any]) -> None:
    data = dumps_message(message)
    if len(data) > MAX_FRAME:
        raise WireError(f"frame of {len(data)} bytes exceeds {MAX_FRAME}")
    out.write(_HEAD.pack(len(data)) + data)
    out.flush()


def _read_exact(inp: IO[bytes], n: int) -> bytes:
    chunks = []
    while n:
        chunk = inp.read(n)
        if not chunk:
            raise EOFError("worker pipe closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(inp: IO[bytes]) -> dict[str, Any]:
    """The next message; ``EOFError`` at the end of the stream, ``WireError`` if malformed."""
    (size,) = _HEAD.unpack(_read_exact(inp, _HEAD.size))
    if size > MAX_FRAME:
        raise WireError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    try:
        message = json.loads(_read_exact(inp, size))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"frame is not JSON: {exc}") from exc
    if not isinstance(message, dict):
        raise WireError("frame is not a JSON object")
    return message


MAX_LINK_PEERS = 64  # NVLinks per GPU: 18 on Hopper and Blackwell


def info_to_wire(info: GpuInfo) -> dict[str, Any]:
    return dataclasses.asdict(info)


def info_from_wire(data: Any) -> GpuInfo:
    if not isinstance(data, dict):
        raise WireError("GPU info is not an object")
    names = {f.name for f in dataclasses.fields(GpuInfo)}
    fields = {k: v for k, v in data.items() if k in names}
    if "nvlink_peers" in fields:  # a list on the wire; a tuple of bus ids in GpuInfo
        peers = fields["nvlink_peers"]
        if (
            not isinstance(peers, list)
            or len(peers) > MAX_LINK_PEERS
            or not all(isinstance(p, str) and len(p) <= 32 for p in peers)
        ):
            raise WireError("GPU info: nvlink_peers is not a list of PCI bus ids")
        fields["nvlink_peers"] = tuple(peers)
    try:
        return GpuInfo(**fields)
    except TypeError as exc:
        raise WireError(f"GPU info: {exc}") from exc


def sample_to_wire(s: GpuSample) -> dict[str, Any]:
    return {
        "gpu": s.gpu,
        "uuid": s.uuid,
        "t": s.timestamp,
        "status": s.status.value,
        "f": dict(s.fields),
        "l": [[ls.link, dict(ls.fields)] for ls in s.links],
        "p": [[p.pid, p.used_memory_bytes] for p in s.processes],
        "d": s.duration_seconds,
        "e": s.error,
        "errors": dict(s.errors),
    }


def _floats(data: Any, what: str) -> dict[str, float]:
    """A decoded JSON object of numbers as ``{str: float}`` (JSON keys are strings)."""
    if not isinstance(data, dict):
        raise WireError(f"{what} is not an object")
    odd = [k for k, v in data.items() if type(v) is not float]  # most values are floats
    for k in odd:
        v = data[k]
        if type(v) is not int:  # bool, str, None, list, object
            raise WireError(f"{what}[{k!r}] is not a number")
        data[k] = float(v)
    return data


class SampleEncoder:
    """The worker's side of the sample wire: a GPU's first sample whole (``"full"``), then
    only what changed since the one before: the fields whose values moved (``"f"``), the
    names of fields that went away (``"fx"``), the links and the processes only when they
    moved (else ``"lk"``, ``"pk"``: keep), and the status, error and errors only when they
    are not the usual "ok", none and none. Most of a sample (18 links, the ECC and remap
    counters) is the same every second; encoding and decoding it again cost more CPU than
    the NVML calls that read the rest (145 us of JSON per sample on a busy H200, where
    NVML took 283 us)."""

    def __init__(self) -> None:
        # each GPU's last fields, links and processes, as sampled (a sample never changes)
        self._last: dict[
            int, tuple[Mapping[str, float], tuple[LinkSample, ...], tuple[ProcessInfo, ...]]
        ] = {}

    def encode(self, sample: GpuSample) -> dict[str, Any]:
        fields, links, processes = sample.fields, sample.links, sample.processes
        last = self._last.get(sample.gpu)
        self._last[sample.gpu] = (fields, links, processes)
        out: dict[str, Any] = {
            "gpu": sample.gpu,
            "uuid": sample.uuid,
            "t": sample.timestamp,
            "d": sample.duration_seconds,
        }
        # the usual values are left out: the decoder's defaults
        if sample.status is not GpuStatus.OK:
            out["status"] = sample.status.value
        if sample.error is not None:
            out["e"] = sample.error
        if sample.errors:
            out["errors"] = dict(sample.errors)
        if last is None:
            out["f"] = dict(fields)
            out["l"] = [[ls.link, dict(ls.fields)] for ls in links]
            out["p"] = [[p.pid, p.used_memory_bytes] for p in processes]
            out["full"] = True
            return out
        old_fields, old_links, old_processes = last
        get = old_fields.get
        out["f"] = {k: v for k, v in fields.items() if get(k) != v}
        if not fields.keys() >= old_fields.keys():
            out["fx"] = [k for k in old_fields if k not in fields]
        if links is old_links or links == old_links:  # the backend reuses unmoved links
            out["lk"] = True
        else:
            out["l"] = [[ls.link, dict(ls.fields)] for ls in links]
        if processes is old_processes or processes == old_processes:  # read every 15 s
            out["pk"] = True
        elif processes:
            out["p"] = [[p.pid, p.used_memory_bytes] for p in processes]
        return out


class SampleDecoder:
    """The daemon's side: applies each GPU's changes to the sample before (a delta with no
    sample before it is a ``WireError``: the worker is then restarted, and a new worker
    starts every GPU with a whole sample)."""

    MAX_GPUS = 256  # keyed by a number from the wire: bounded

    def __init__(self) -> None:
        self._last: dict[int, GpuSample] = {}

    def decode(self, data: Any) -> GpuSample:
        if not isinstance(data, dict):
            raise WireError("sample is not an object")
        gpu = data.get("gpu")
        if data.get("full"):
            sample = sample_from_wire(data)
        else:
            base = self._last.get(gpu) if isinstance(gpu, int) else None
            if base is None:
                raise WireError(f"a change to GPU {gpu!r}'s sample with no whole sample before")
            fields = dict(base.fields)
            fields.update(_floats(data.get("f", {}), "fields"))
            gone = data.get("fx", [])
            if not isinstance(gone, list):
                raise WireError("sample fx is not a list")
            for name in gone:
                fields.pop(str(name), None)
            sample = sample_from_wire(
                data,
                base.links if data.get("lk") else None,
                fields,
                base.processes if data.get("pk") else None,
            )
        if sample.gpu in self._last or len(self._last) < self.MAX_GPUS:
            self._last[sample.gpu] = sample
        return sample


def sample_from_wire(
    data: Any,
    links: tuple[LinkSample, ...] | None = None,
    fields: dict[str, float] | None = None,
    processes: tuple[ProcessInfo, ...] | None = None,
) -> GpuSample:
    """A sample from its wire form; ``links``, ``fields`` and ``processes``: already decoded
    and checked (``SampleDecoder``: the previous sample's, with this frame's changes
    applied)."""
    if not isinstance(data, dict):
        raise WireError("sample is not an object")
    try:
        if links is None:
            links = tuple(
                LinkSample(link=int(link), fields=MappingProxyType(_floats(f, "link fields")))
                for link, f in data.get("l", [])
            )
        if processes is None:
            processes = tuple(
                ProcessInfo(pid=int(pid), used_memory_bytes=None if mem is None else int(mem))
                for pid, mem in data.get("p", [])
            )
        errors = data.get("errors", {})
        if not isinstance(errors, dict):
            raise WireError("sample errors is not an object")
        return GpuSample(
            gpu=int(data["gpu"]),
            uuid=str(data["uuid"]),
            timestamp=float(data["t"]),
            status=GpuStatus(data.get("status", "ok")),
            fields=MappingProxyType(
                fields if fields is not None else _floats(data.get("f", {}), "fields")
            ),
            links=links,
            processes=processes,
            duration_seconds=float(data.get("d", 0.0)),
            error=None if data.get("e") is None else str(data["e"]),
            errors=MappingProxyType({str(k): str(v) for k, v in errors.items()}),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"sample: {exc!r}") from exc


def event_to_wire(e: XidEvent) -> dict[str, Any]:
    return {"t": e.timestamp, "xid": e.xid, "gpu": e.gpu, "uuid": e.uuid, "pci": e.pci_bus_id}


def event_from_wire(data: Any) -> XidEvent:
    if not isinstance(data, dict):
        raise WireError("event is not an object")
    try:
        gpu = data.get("gpu")
        return XidEvent(
            timestamp=float(data["t"]),
            source="nvml",
            xid=int(data["xid"]),
            gpu=None if gpu is None else int(gpu),
            uuid=None if data.get("uuid") is None else str(data["uuid"]),
            pci_bus_id=None if data.get("pci") is None else str(data["pci"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"event: {exc!r}") from exc
