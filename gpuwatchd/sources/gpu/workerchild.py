"""The NVML worker process: libnvidia-ml lives here, never in the daemon.

``python -m gpuwatchd.sources.gpu.workerchild`` is started by ``WorkerBackend`` with its
stdin and stdout as the wire (``workerwire``); its stderr is the daemon's, so its log lines
reach the same journal. The first message is ``open`` with the backend's settings; then:

- ``rounds`` (``interval``, ``timeout``): from then on the worker owns the poll cadence.
  One round thread reads every GPU in turn each ``interval`` seconds (the GPUs take turns:
  NVML charges more CPU for two GPUs read at the same moment) and sends ONE ``round``
  frame with every GPU's sample: one wake and one frame per round, not four thread
  hand-offs per GPU. A GPU whose call is stuck past ``timeout`` is left out: the
  supervisor (the heartbeat thread) sends the round without it, names it in ``stuck``,
  and a fresh round thread carries on with the others, skipping that GPU until its call
  returns. A second ``rounds`` replaces the cadence;
- ``sample`` (``gpu``): one GPU read now, answered on its own (an on-demand read); it
  takes its turn with the round thread;
- XID events: one thread waits in ``nvmlEventSetWait`` and sends every batch unasked;
- a heartbeat from its own thread after ``beat_s`` (a quarter of the daemon's hang
  timeout, sent with ``open``) without any other frame, so the daemon can tell a wedged
  worker from a slow GPU;
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
from gpuwatchd.core.records import GpuSample
from gpuwatchd.sources.gpu import workerwire as wire
from gpuwatchd.sources.gpu.nvml import NvmlBackend

log = logging.getLogger("gpuwatchd.nvml-worker")

MODULE_ENV = "GPUWATCHD_NVML_MODULE"
BEAT_S = 2.0  # until the daemon says how often it needs to hear (``open``'s ``beat_s``)
# The GPUs take turns: NVML charges about 1.4x the CPU for two GPUs read at the same moment
# from two threads (bench/nvml_worker_gap.py, 2 x H200 under NCCL). A GPU waits at most
# this long for another's poll, then reads alongside it: one that hangs never holds up
# the others for more than this.
POLL_TURN_WAIT_S = 0.25
# One nvmlEventSetWait call costs driver CPU whether or not an event comes (about 1 ms a
# second at a 1 s wait on a busy H200): wait long; an event still returns at once.
EVENT_WAIT_S = 10.0


def error_to_wire(exc: BaseException) -> dict[str, Any]:
    code = exc.code if isinstance(exc, BackendError) else None
    return {"type": type(exc).__name__, "message": str(exc), "code": code}


class _Round:
    """One round thread's state: the GPU it is reading (and since when), the samples and
    errors read so far in this round."""

    __slots__ = ("errors", "gpu", "live", "next_at", "samples", "since")

    def __init__(self) -> None:
        self.live = True  # False once the supervisor has given up on it
        self.gpu: int | None = None
        self.since = 0.0
        self.next_at = 0.0  # when its next round starts (monotonic)
        self.samples: list[GpuSample] = []
        self.errors: dict[str, dict[str, Any]] = {}


class Worker:
    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._write = threading.Lock()
        self._stop = threading.Event()
        self.backend: NvmlBackend | None = None
        self._indices: list[int] = []
        self._requests: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._sent_at = time.monotonic()
        self._beat_s = BEAT_S
        self._beat_wake = threading.Event()  # set: beat_s or the cadence changed: look again
        self._encoder = wire.SampleEncoder()
        self._turn = threading.Lock()  # GPUs polled one after another (POLL_TURN_WAIT_S)
        # the poll rounds: cadence, the current round thread's state, GPUs stuck in a call
        self._rounds_lock = threading.Lock()
        self._interval = 0.0
        self._timeout = 0.0
        self._round: _Round | None = None
        self._stuck: set[int] = set()
        self._cadence = threading.Event()  # set: the cadence changed, start a round now
        self.rounds_sent = 0

    def send(self, message: dict[str, Any], samples: list[GpuSample] | None = None) -> None:
        """One frame; ``samples`` are encoded under the write lock, so each GPU's changes
        reach the daemon in the order they were encoded."""
        with self._write:
            self._sent_at = time.monotonic()
            if samples is not None:
                message["round"] = [self._encoder.encode(s) for s in samples]
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
        beat = args.get("beat_s")
        if isinstance(beat, (int, float)) and beat == beat:
            self._beat_s = min(60.0, max(0.1, float(beat)))
            self._beat_wake.set()
        kwargs = {k: v for k, v in args.items() if k not in ("events", "beat_s")}
        kwargs["extra_fields"] = tuple(ExtraField(**e) for e in kwargs.get("extra_fields", []))
        backend = NvmlBackend(SystemClock(), nvml=module, **kwargs)
        try:
            infos = backend.open()
        except BackendError as exc:
            self.send({"id": rid, "error": error_to_wire(exc)})
            return
        self.backend = backend
        self._indices = [info.index for info in infos]
        threading.Thread(target=self._request_loop, name="on-demand", daemon=True).start()
        if args.get("events"):
            threading.Thread(target=self._event_loop, name="events", daemon=True).start()
        self.send({"id": rid, "infos": [wire.info_to_wire(i) for i in infos]})

    def _read_gpu(self, index: int) -> GpuSample:
        """One GPU's sample, taking its turn (``POLL_TURN_WAIT_S``)."""
        assert self.backend is not None
        turn = self._turn  # replaced when a round thread is given up inside a call
        got_turn = turn.acquire(timeout=POLL_TURN_WAIT_S)
        try:
            return self.backend.sample(index)
        finally:
            if got_turn:
                turn.release()

    def _try_read(self, index: int) -> GpuSample | dict[str, Any]:
        """One GPU's sample, or its error as the wire carries it (a ``BackendError``, or a
        bug, logged: either way this GPU's error, and the worker keeps serving)."""
        try:
            return self._read_gpu(index)
        except Exception as exc:
            if not isinstance(exc, BackendError):
                log.exception("sampling GPU %d", index)
            return error_to_wire(exc)

    def _request_loop(self) -> None:
        """On-demand reads (``sample``), one at a time."""
        while (request := self._requests.get()) is not None:
            rid, index = request
            got = self._try_read(index)
            if isinstance(got, GpuSample):
                self.send({"id": rid}, [got])
            else:
                self.send({"id": rid, "error": got})

    # -- poll rounds --------------------------------------------------------------------
    def set_cadence(self, interval: float, timeout: float) -> None:
        with self._rounds_lock:
            self._interval, self._timeout = interval, timeout
            running = self._round is not None
        if running:
            self._cadence.set()
        else:
            self._start_round_thread()
        self._beat_wake.set()  # the supervisor's next look depends on the cadence

    def _start_round_thread(self) -> None:
        state = _Round()
        with self._rounds_lock:
            self._round = state
        threading.Thread(target=self._round_loop, args=(state,), name="rounds", daemon=True).start()

    def _round_loop(self, state: _Round) -> None:
        next_round = time.monotonic()
        while not self._stop.is_set():
            for index in self._indices:
                with self._rounds_lock:
                    if not state.live:
                        return
                    if index in self._stuck:
                        continue
                    state.gpu, state.since = index, time.monotonic()
                got = self._try_read(index)
                with self._rounds_lock:
                    if not self._returned(state, index):
                        return
                    if isinstance(got, GpuSample):
                        state.samples.append(got)
                    else:
                        state.errors[str(index)] = got
            with self._rounds_lock:
                if not state.live:
                    return
                samples, state.samples = state.samples, []
                errors, state.errors = state.errors, {}
                stuck = sorted(self._stuck)
                interval = self._interval
            self.send({"errors": errors, "stuck": stuck}, samples)
            self.rounds_sent += 1
            next_round += interval
            now = time.monotonic()
            if next_round < now:  # fell behind (a slow round, a suspend): don't burst
                next_round = now + interval
            state.next_at = next_round
            if self._cadence.wait(next_round - now):
                self._cadence.clear()
                next_round = time.monotonic()

    def _returned(self, state: _Round, index: int) -> bool:
        """A round's GPU call returned (under ``_rounds_lock``): False if the supervisor
        gave up on this round thread meanwhile (the GPU is then no longer stuck)."""
        state.gpu = None
        if state.live:
            return True
        self._stuck.discard(index)
        return False

    def _supervise_round(self) -> None:
        """If the round thread has been in one GPU's call past the timeout: send the round
        without that GPU (named stuck), and carry on with a fresh round thread."""
        with self._rounds_lock:
            state = self._round
            if state is None or state.gpu is None or self._timeout <= 0:
                return
            if time.monotonic() - state.since < self._timeout:
                return
            state.live = False
            self._stuck.add(state.gpu)
            self._turn = threading.Lock()  # the stuck thread keeps the old one
            log.warning("GPU %d: a call has not returned after %gs", state.gpu, self._timeout)
            samples, errors, stuck = state.samples, state.errors, sorted(self._stuck)
        self.send({"errors": errors, "stuck": stuck}, samples)
        self._start_round_thread()

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
        """A beat after ``beat_s`` (the daemon's hang timeout / 4) without any frame: every
        frame tells the daemon this process is alive, so a worker sending rounds at least
        that often never beats. The same thread is the round supervisor
        (``_supervise_round``), and it wakes only when a call could be past its timeout: a
        call's timeout after the call began, or the next round's start plus the timeout,
        but no sooner than one timeout from now. A healthy worker's supervisor so wakes at
        most once per round, and a stuck GPU is named within 2 x the timeout."""
        wait = self._beat_s
        while True:
            self._beat_wake.wait(wait)
            self._beat_wake.clear()
            if self._stop.is_set():
                return
            self._supervise_round()
            now = time.monotonic()
            quiet = now - self._sent_at
            if quiet >= self._beat_s:
                self.send({"beat": True})
                quiet = 0.0
            wait = min(self._beat_s - quiet, self._next_look(now))

    def _next_look(self, now: float) -> float:
        """Seconds until a round's call could be past its timeout (inf: no rounds)."""
        with self._rounds_lock:
            state, timeout = self._round, self._timeout
            if state is None or timeout <= 0:
                return float("inf")
            if state.gpu is not None:  # in a call now
                return max(0.05, state.since + timeout - now)
            return max(timeout, state.next_at + timeout - now)

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
            elif op == "rounds" and self.backend is not None:
                interval, timeout = msg.get("interval"), msg.get("timeout")
                if isinstance(interval, (int, float)) and isinstance(timeout, (int, float)):
                    self.set_cadence(max(0.01, float(interval)), float(timeout))
            elif op == "sample" and isinstance(msg.get("gpu"), int):
                if msg["gpu"] not in self._indices:
                    err = BackendError(f"no GPU with index {msg['gpu']}")
                    self.send({"id": rid, "error": error_to_wire(err)})
                else:
                    self._requests.put((rid, msg["gpu"]))
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
