"""The NVML worker's sample wire sends each GPU's changes, and the daemon rebuilds the
same samples from them."""

from __future__ import annotations

import dataclasses
import json
from types import MappingProxyType

import pytest

from gpuwatchd.core.records import GpuSample, GpuStatus, LinkSample, ProcessInfo
from gpuwatchd.sources.gpu.workerwire import SampleDecoder, SampleEncoder, WireError


def _sample(gpu: int, t: float, fields: dict[str, float], crc: float = 0.0) -> GpuSample:
    links = tuple(
        LinkSample(link=i, fields=MappingProxyType({"nvlink_up": 1.0, "crc": crc}))
        for i in range(18)
    )
    return GpuSample(
        gpu=gpu,
        uuid=f"GPU-{gpu}",
        timestamp=t,
        fields=MappingProxyType(fields),
        links=links,
        processes=(ProcessInfo(pid=7, used_memory_bytes=1 << 20),),
        duration_seconds=0.004,
    )


def _over_the_wire(encoder: SampleEncoder, decoder: SampleDecoder, s: GpuSample) -> GpuSample:
    frame = json.loads(json.dumps(encoder.encode(s)))  # as the pipe carries it
    return decoder.decode(frame)


def test_changes_only_rebuild_every_sample_exactly() -> None:
    encoder, decoder = SampleEncoder(), SampleDecoder()
    history = [
        _sample(0, 1.0, {"temperature_gpu": 40.0, "power": 300.0, "ecc": 0.0}),
        _sample(1, 1.0, {"temperature_gpu": 50.0, "power": 310.0}),
        _sample(0, 2.0, {"temperature_gpu": 41.0, "power": 300.0, "ecc": 0.0}),
        _sample(0, 3.0, {"temperature_gpu": 41.0, "power": 299.5}),  # ecc went away
        _sample(0, 4.0, {"temperature_gpu": 41.0, "power": 299.5, "ecc": 3.0}, crc=5.0),
        _sample(1, 2.0, {"temperature_gpu": 50.0, "power": 310.0}),
    ]
    for s in history:
        got = _over_the_wire(encoder, decoder, s)
        assert got.as_dict() == s.as_dict()
        assert dict(got.fields) == dict(s.fields)
        assert got.links == s.links and got.processes == s.processes


def test_an_unchanged_sample_sends_little() -> None:
    encoder = SampleEncoder()
    first = json.dumps(encoder.encode(_sample(0, 1.0, {"temperature_gpu": 40.0, "x": 1.0})))
    again = encoder.encode(_sample(0, 2.0, {"temperature_gpu": 40.0, "x": 1.0}))
    assert again["f"] == {} and "l" not in again and again["lk"] is True
    assert len(json.dumps(again)) * 5 < len(first)


def test_a_change_without_a_whole_sample_before_it_is_a_wire_error() -> None:
    encoder = SampleEncoder()
    encoder.encode(_sample(0, 1.0, {"temperature_gpu": 40.0}))
    delta = json.loads(json.dumps(encoder.encode(_sample(0, 2.0, {"temperature_gpu": 41.0}))))
    with pytest.raises(WireError):
        SampleDecoder().decode(delta)  # a new daemon-side decoder has no base


def test_a_restarted_worker_starts_every_gpu_whole() -> None:
    decoder = SampleDecoder()
    old = SampleEncoder()
    for t in (1.0, 2.0):
        _over_the_wire(old, decoder, _sample(0, t, {"temperature_gpu": 40.0 + t, "gone": 1.0}))
    new = SampleEncoder()  # the worker process was replaced
    s = _sample(0, 3.0, {"temperature_gpu": 60.0})
    frame = new.encode(s)
    assert frame.get("full") is True
    got = _over_the_wire(SampleEncoder(), decoder, s)
    assert dict(got.fields) == {"temperature_gpu": 60.0}  # nothing carried from before
    assert got.status is GpuStatus.OK


def test_a_change_of_the_wrong_type_is_refused() -> None:
    encoder, decoder = SampleEncoder(), SampleDecoder()
    _over_the_wire(encoder, decoder, _sample(0, 1.0, {"temperature_gpu": 40.0}))
    delta = json.loads(json.dumps(encoder.encode(_sample(0, 2.0, {"temperature_gpu": 41.0}))))
    for bad in ({"f": {"temperature_gpu": "hot"}}, {"fx": "temperature_gpu"}):
        with pytest.raises(WireError):
            decoder.decode({**delta, **bad})


def test_processes_status_and_errors_cross_as_they_change() -> None:
    """Processes (read every 15 s) cross only when they changed; a status, error and
    errors other than the usual ones cross, and their going away is seen too."""
    encoder, decoder = SampleEncoder(), SampleDecoder()
    base = _sample(0, 1.0, {"temperature_gpu": 40.0})
    none = dataclasses.replace(base, timestamp=2.0, processes=())
    two = dataclasses.replace(
        base, timestamp=3.0, processes=(ProcessInfo(7, 1 << 20), ProcessInfo(9, None))
    )
    failing = dataclasses.replace(
        two,
        timestamp=4.0,
        status=GpuStatus.ERROR,
        error="reset required",
        errors=MappingProxyType({"power": "GPU 0: timeout"}),
    )
    for s in (base, none, two, two, failing, dataclasses.replace(two, timestamp=5.0)):
        got = _over_the_wire(encoder, decoder, s)
        assert got.as_dict() == s.as_dict()
        assert got.processes == s.processes and got.status is s.status
        assert got.error == s.error and dict(got.errors) == dict(s.errors)
    same = encoder.encode(dataclasses.replace(two, timestamp=6.0))
    assert same["pk"] is True and "p" not in same and "errors" not in same
