"""The NVML worker process: libnvidia-ml lives here, never in the daemon.

``python -m gpuwatchd.sources.gpu.workerchild`` is started by ``WorkerBackend`` with its
stdin and stdout as the wire (``workerwire``); its stderr is the daemon's, so its log lines
reach the same journal. The first message is ``open`` with the backend's settings; then:

- ``sample`` (``gpu``): answered by one thread per GPU, so one GPU's stuck call never holds
  another GPU's answer (the daemon's poller bounds each GPU in time, as before);
- XID events: one thread waits in ``nvmlEventSetWait`` and sends every batch unasked;
- a heartbeat every second from its own thread, so the daemon can tell a wedged worker
  from a slow GPU;
- ``close``: shut NVML down and exit.

If the daemon goes away (stdin closes) the worker exits. ``GPUWATCHD_NVML_MODULE`` names a
module to use instead of ``pynvml`` (a stand-in for tests and drills: the CI tests load one
that aborts or hangs, see ``tests/nvml_standins/``).
"""

from __future__ import annotations

import importlib
import logging
import os
import queue
import sys
import threading
import time
from typing import IO, Any

from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.errors import BackendError
from gpuwatchd.core.fields import ExtraField
from gpuwatchd.sources.gpu import workerwire as wire
from gpuwatchd.sources.gpu.nvml import NvmlBackend

log = logging.getLogger("gpuwatchd.nvml-worker")

MODULE_ENV = "GPUWATCHD_NVML_MODULE"
BEAT_S = 2.0
# One nvmlEventSetWait call costs driver CPU whether or not an event comes (about 1 ms a
# second at a 1 s wait on a busy H200): wait long; an event still returns at once.
EVENT_WAIT_S = 10.0


def error_to_wire(exc: BaseException) -> dict[str, Any]:
    code = exc.code if isinstance(exc, BackendError) else None
    return {"type": type(exc).__name__, "message": str(exc), "code": code}


class Worker:
    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._write = threading.Lock()
        self._stop = threading.Event()
        self.backend: NvmlBackend | None = None
        self._queues: dict[int, queue.SimpleQueue[int | None]] = {}
        self._sent_at = time.monotonic()

    def send(self, message: dict[str, Any]) -> None:
        with self._write:
            self._sent_at = time.monotonic()
            try:
                wire.write_frame(self._out, message)
            except (BrokenPipeError, OSError, ValueError):  # the daemon is gone
                self._stop.set()
                os._exit(0)

    def open(self, rid: int, args: dict[str, Any]) -> None:
        module: Any = None
        name = os.environ.get(MODULE_ENV)
        if name:
            module = importlib.import_module(name)
        kwargs = {k: v for k, v in args.items() if k != "events"}  # WorkerSettings's
        kwargs["extra_fields"] = tuple(ExtraField(**e) for e in kwargs.get("extra_fields", []))
        backend = NvmlBackend(SystemClock(), nvml=module, **kwargs)
        try:
            infos = backend.open()
        except BackendError as exc:
            self.send({"id": rid, "error": error_to_wire(exc)})
            return
        self.backend = backend
        for info in infos:
            q: queue.SimpleQueue[int | None] = queue.SimpleQueue()
            self._queues[info.index] = q
            threading.Thread(
                target=self._gpu_loop, args=(info.index, q), name=f"gpu{info.index}", daemon=True
            ).start()
        if args.get("events"):
            threading.Thread(target=self._event_loop, name="events", daemon=True).start()
        self.send({"id": rid, "infos": [wire.info_to_wire(i) for i in infos]})

    def _gpu_loop(self, index: int, q: queue.SimpleQueue[int | None]) -> None:
        assert self.backend is not None
        while (rid := q.get()) is not None:
            try:
                sample = self.backend.sample(index)
            except BackendError as exc:
                self.send({"id": rid, "error": error_to_wire(exc)})
                continue
            except Exception as exc:  # a bug: report it as this GPU's error, keep serving
                log.exception("sampling GPU %d", index)
                self.send({"id": rid, "error": error_to_wire(exc)})
                continue
            self.send({"id": rid, "sample": wire.sample_to_wire(sample)})

    def _event_loop(self) -> None:
        assert self.backend is not None
        while not self._stop.is_set():
            try:
                events = self.backend.wait_xid_events(EVENT_WAIT_S)
            except BackendError as exc:
                self.send({"events_error": error_to_wire(exc)})
                self._stop.wait(5.0)
                continue
            if events:
                self.send({"events": [wire.event_to_wire(e) for e in events]})

    def beat(self) -> None:
        """A beat after ``BEAT_S`` without any frame: every frame tells the daemon this
        process is alive, so a worker answering polls never beats."""
        wait = BEAT_S
        while not self._stop.wait(wait):
            quiet = time.monotonic() - self._sent_at
            if quiet >= BEAT_S:
                self.send({"beat": True})
                quiet = 0.0
            wait = BEAT_S - quiet

    def serve(self, inp: IO[bytes]) -> None:
        threading.Thread(target=self.beat, name="beat", daemon=True).start()
        while True:
            try:
                msg = wire.read_frame(inp)
            except (EOFError, wire.WireError):
                return
            op, rid = msg.get("op"), msg.get("id")
            if not isinstance(rid, int):
                continue
            if op == "open" and self.backend is None:
                self.open(rid, msg.get("args") or {})
            elif op == "sample" and isinstance(msg.get("gpu"), int):
                q = self._queues.get(msg["gpu"])
                if q is None:
                    err = BackendError(f"no GPU with index {msg['gpu']}")
                    self.send({"id": rid, "error": error_to_wire(err)})
                else:
                    q.put(rid)
            elif op == "close":
                self._stop.set()
                if self.backend is not None:
                    self.backend.close()
                self.send({"id": rid, "closed": True})
                return


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("GPUWATCHD_WORKER_LOG_LEVEL", "WARNING"),
        format="gpuwatchd nvml-worker: %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    out = sys.stdout.buffer
    inp = sys.stdin.buffer
    sys.stdout = sys.stderr  # nothing but frames on the wire
    Worker(out).serve(inp)
    os._exit(0)  # threads stuck in NVML must not hold the exit


if __name__ == "__main__":
    main()
