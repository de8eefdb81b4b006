"""The NVML backend as a supervised worker process, so a crash or a hang inside
libnvidia-ml never stops kernel-log paging, drains, the outbox or /metrics.

``WorkerBackend`` is a ``Backend`` and an ``XidEventSource`` to the rest of the daemon, as
``NvmlBackend`` is; behind it, ``workerchild`` runs ``NvmlBackend`` in its own process.

- A worker that dies (a heap corruption's abort, a segfault, an OOM kill) fails every
  pending poll at once with ``WorkerDown`` (a ``CallTimeout``: the poller marks those GPUs
  stale at once), every later poll until it is back, and the NVML event source.
- A worker that hangs (no heartbeat for ``hang_s``, or one poll unanswered for ``hang_s``)
  is killed (SIGKILL) and handled as a dead one: no thread is left behind in the daemon.
- It is restarted with exponential backoff (``RESTART_BACKOFF``), and re-opens NVML.
  Restarts are counted (``gpuwatchd_nvml_worker_restarts_total``, ``status``) and the
  worker's state is the source ``nvml_worker``.

The worker's cost (a second Python process with libnvidia-ml loaded) is measured in
docs/PERFORMANCE.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import (
    BackendError,
    BackendUnavailable,
    CallTimeout,
    GpuLost,
    NotSupported,
    ResetRequired,
)
from gpuwatchd.core.families import Families
from gpuwatchd.core.fields import ExtraField
from gpuwatchd.core.records import GpuInfo, GpuSample, XidEvent
from gpuwatchd.sources.gpu import workerwire as wire
from gpuwatchd.sources.gpu.backend import RoundResult, SampleResult

log = logging.getLogger(__name__)

SOURCE = "nvml_worker"
RESTART_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
OPEN_TIMEOUT_S = 120.0  # nvmlInit on a node with a wedged GPU can take a while
_ERRORS: dict[str, type[BackendError]] = {
    "GpuLost": GpuLost,
    "ResetRequired": ResetRequired,
    "NotSupported": NotSupported,
    "CallTimeout": CallTimeout,
    "BackendUnavailable": BackendUnavailable,
}


class WorkerDown(CallTimeout):
    """The NVML worker process is dead, hung or restarting: no answer for this GPU now."""


def _returns(sample: GpuSample) -> SampleResult:
    return lambda: sample


def _raises(error: BackendError) -> SampleResult:
    def result() -> GpuSample:
        raise error

    return result


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    """What the worker's ``NvmlBackend`` is built with (the config's ``poll``, ``fields``)."""

    slow_interval_s: float
    link_interval_s: float
    state_interval_s: float = 15.0
    nvlink: bool = True
    processes: bool = True
    events: bool = True
    extra_fields: tuple[ExtraField, ...] = ()
    hang_s: float = 30.0

    def backend_kwargs(self) -> dict[str, Any]:
        """``NvmlBackend``'s keyword arguments, in this process or in the worker."""
        return {
            "slow_interval_s": self.slow_interval_s,
            "link_interval_s": self.link_interval_s,
            "state_interval_s": self.state_interval_s,
            "nvlink": self.nvlink,
            "processes": self.processes,
            "extra_fields": self.extra_fields,
        }

    def open_args(self) -> dict[str, Any]:
        """The worker's ``open`` message: the backend's arguments as JSON, ``events``, and
        ``beat_s``: how long the worker may stay silent (a quarter of the hang timeout, so
        a beat or a round always comes well before the daemon would call it hung)."""
        return {
            **self.backend_kwargs(),
            "extra_fields": [dataclasses.asdict(e) for e in self.extra_fields],
            "events": self.events,
            "beat_s": self.hang_s / 4,
        }


class _Pending:
    """A request in flight: a caller waits on ``done``, or ``then`` is called with the
    answer (``sample_async``)."""

    __slots__ = ("done", "reply", "since", "then")

    def __init__(
        self, since: float, then: Callable[[dict[str, Any] | None], None] | None = None
    ) -> None:
        self.done = threading.Event()
        self.reply: dict[str, Any] | None = None
        self.since = since
        self.then = then

    def answer(self, reply: dict[str, Any] | None) -> None:
        self.reply = reply
        self.done.set()
        if self.then is not None:
            self.then(reply)


class _Child:
    """One worker process and the thread that reads what it says."""

    def __init__(
        self,
        argv: list[str],
        on_message: Callable[[_Child, dict[str, Any]], None],
        on_exit: Callable[[_Child, str], None],
    ) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin: IO[bytes] = self.proc.stdin
        self._on_message = on_message
        self._on_exit = on_exit
        self.send_lock = threading.Lock()
        self.killed_for = ""  # why the supervisor killed it, if it did
        self.reader = threading.Thread(
            target=self._read, args=(self.proc.stdout,), name="nvml-worker-read", daemon=True
        )
        self.reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: dict[str, Any]) -> bool:
        with self.send_lock:
            try:
                wire.write_frame(self.stdin, message)
            except (OSError, ValueError):
                return False
        return True

    def _read(self, out: IO[bytes]) -> None:
        why = "exited"
        try:
            while True:
                self._on_message(self, wire.read_frame(out))
        except EOFError:
            pass
        except wire.WireError as exc:
            why = f"sent a bad frame ({exc})"
            self.kill()
        except OSError as exc:
            why = f"pipe error ({exc})"
        finally:
            out.close()
        code = self.proc.wait()
        with self.send_lock, contextlib.suppress(OSError):
            self.stdin.close()
        if code < 0:
            with contextlib.suppress(ValueError):
                why = f"killed by {signal.Signals(-code).name}"
        elif why == "exited":
            why = f"exited with status {code}"
        if self.killed_for:
            why = f"{self.killed_for}, {why}"
        self._on_exit(self, why)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()


class WorkerBackend:
    """NVML in a supervised child process (see the module docstring)."""

    name = "nvml"

    def __init__(
        self,
        clock: Clock,
        settings: WorkerSettings,
        status: Callable[[str, bool, str], None] | None = None,
        argv: list[str] | None = None,
    ) -> None:
        self._clock = clock
        self.settings = settings
        self._status = status or (lambda name, up, detail: None)
        self._argv = argv or [sys.executable, "-m", "gpuwatchd.sources.gpu.workerchild"]
        self._lock = threading.Lock()
        self._child: _Child | None = None
        self._up = False
        self._pending: dict[int, _Pending] = {}
        self._decoder = wire.SampleDecoder()
        self._next_id = 0
        self._infos: list[GpuInfo] = []
        self._events: queue.SimpleQueue[list[XidEvent] | BackendError] = queue.SimpleQueue()
        self._last_beat = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._supervisor: threading.Thread | None = None
        self.restarts = 0
        self.last_exit = ""
        # the poll rounds (start_rounds): cadence, whom to tell, when each GPU last answered
        self._cadence: tuple[float, float] | None = None
        self._on_round: Callable[[RoundResult], None] | None = None
        self._gpu_seen: dict[int, float] = {}

    # -- status -------------------------------------------------------------------------
    def set_status(self, status: Callable[[str, bool, str], None]) -> None:
        self._status = status

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.pid if child is not None else None

    def health(self) -> dict[str, Any]:
        return {
            "up": self._up,
            "pid": self.pid,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
        }

    def families(self, fams: Families) -> None:
        fams.get(
            "gpuwatchd_nvml_worker_restarts_total",
            "counter",
            "Restarts of the NVML worker process after it died or hung.",
            [],
        ).add([], float(self.restarts))
        fams.get(
            "gpuwatchd_nvml_worker_up",
            "gauge",
            "Whether the NVML worker process is running and has NVML open.",
            [],
        ).add([], 1.0 if self._up else 0.0)

    # -- the wire -----------------------------------------------------------------------
    def _send(
        self, message: dict[str, Any], then: Callable[[dict[str, Any] | None], None] | None = None
    ) -> tuple[int, _Pending]:
        with self._lock:
            child = self._child
            if child is None or (not self._up and message.get("op") != "open"):
                raise WorkerDown(f"NVML worker is down ({self.last_exit or 'starting'})")
            self._next_id += 1
            rid = self._next_id
            pending = self._pending[rid] = _Pending(self._clock.monotonic(), then)
        if not child.send({**message, "id": rid}):
            with self._lock:
                self._pending.pop(rid, None)
            raise WorkerDown("NVML worker is down (its pipe is closed)")
        return rid, pending

    def _request(self, message: dict[str, Any], wait_s: float | None = None) -> dict[str, Any]:
        rid, pending = self._send(message)
        if not pending.done.wait(wait_s):
            with self._lock:
                self._pending.pop(rid, None)
            raise WorkerDown(f"NVML worker did not answer {message.get('op')} in {wait_s}s")
        return self._reply(pending.reply)

    def _reply(self, reply: dict[str, Any] | None) -> dict[str, Any]:
        """The answer, or the error it carries raised as its class (None: the worker died)."""
        if reply is None:
            raise WorkerDown(f"NVML worker is down ({self.last_exit})")
        error = reply.get("error")
        if isinstance(error, dict):
            raise self._error(error)
        return reply

    @staticmethod
    def _error(error: dict[str, Any]) -> BackendError:
        """A worker's error on the wire as its class."""
        cls = _ERRORS.get(str(error.get("type")), BackendError)
        code = error.get("code")
        return cls(str(error.get("message")), code if isinstance(code, int) else None)

    def _on_message(self, child: _Child, msg: dict[str, Any]) -> None:
        if child is not self._child:
            return
        self._last_beat = self._clock.monotonic()  # any frame shows the worker alive
        if "beat" in msg:
            return
        if "events" in msg:
            events = msg["events"]
            if isinstance(events, list):
                self._events.put([wire.event_from_wire(e) for e in events])
            return
        if "events_error" in msg:
            err = msg["events_error"]
            text = err.get("message") if isinstance(err, dict) else None
            self._events.put(BackendError(str(text or "NVML event wait failed")))
            return
        rid = msg.get("id")
        if "round" in msg:
            # decoded here, in frame order, even when nobody waits for it any more: each
            # sample is a change to the one before (WireError: a bad frame, the worker dies)
            samples = msg["round"]
            if not isinstance(samples, list):
                raise wire.WireError("round is not a list")
            decoded = [self._decoder.decode(s) for s in samples]
            if not isinstance(rid, int):
                self._round(decoded, msg.get("errors"), msg.get("stuck"))
                return
            msg["sample"] = decoded[0] if decoded else None
        with self._lock:
            pending = self._pending.pop(rid, None) if isinstance(rid, int) else None
        if pending is not None:
            pending.answer(msg)

    def _round(self, samples: list[GpuSample], errors: Any, stuck: Any) -> None:
        """One poll round from the worker, handed to the poller (on this reader thread)."""
        if not isinstance(errors, dict) or not isinstance(stuck, list):
            raise wire.WireError("round errors or stuck of the wrong shape")
        now = self._clock.monotonic()
        results: RoundResult = {}
        for sample in samples:
            results[sample.gpu] = _returns(sample)
            self._gpu_seen[sample.gpu] = now
        for key, error in list(errors.items())[: wire.SampleDecoder.MAX_GPUS]:
            index = int(key) if isinstance(key, str) and key.isdigit() else None
            if index is None or not isinstance(error, dict):
                raise wire.WireError(f"round error for GPU {key!r} of the wrong shape")
            results[index] = _raises(self._error(error))
            self._gpu_seen[index] = now
        timeout = self._cadence[1] if self._cadence is not None else 0.0
        for index in stuck[: wire.SampleDecoder.MAX_GPUS]:
            if not isinstance(index, int):
                raise wire.WireError("round stuck is not a list of GPU indices")
            results[index] = _raises(CallTimeout(f"poll has not returned after {timeout:g}s"))
        on_round = self._on_round
        if on_round is not None:
            on_round(results)

    def _on_exit(self, child: _Child, why: str) -> None:
        with self._lock:
            if child is not self._child:
                return
            self._child = None
            was_up = self._up
            self._up = False
            self.last_exit = f"pid {child.pid} {why}"
            failed = list(self._pending.values())
            self._pending.clear()
        for pending in failed:
            pending.answer(None)  # WorkerDown
        if self._stop.is_set():
            return
        down = f"NVML worker is down ({self.last_exit})"
        on_round = self._on_round
        if on_round is not None:  # every GPU stale at once
            on_round({info.index: _raises(WorkerDown(down)) for info in self._infos})
        self._events.put(WorkerDown(down))  # its own: each is raised in its own thread
        log.error("NVML worker %s; GPUs are stale until it is back", self.last_exit)
        if was_up:
            self._status(SOURCE, False, self.last_exit)
        self._wake.set()

    # -- lifecycle ------------------------------------------------------------------------
    def _spawn(self) -> list[GpuInfo]:
        try:
            child = _Child(self._argv, self._on_message, self._on_exit)
        except OSError as exc:  # no process could be started (fork failed, no memory)
            raise WorkerDown(f"cannot start the NVML worker: {exc}") from exc
        with self._lock:
            self._child = child
        self._last_beat = self._clock.monotonic()
        try:
            reply = self._request({"op": "open", "args": self.settings.open_args()}, OPEN_TIMEOUT_S)
        except BackendError:
            child.kill()
            raise
        infos = [wire.info_from_wire(i) for i in reply.get("infos", [])]
        with self._lock:
            if self._child is not child:
                raise WorkerDown(f"NVML worker is down ({self.last_exit})")
            self._up = True
        now = self._clock.monotonic()
        self._gpu_seen = {info.index: now for info in infos}
        if self._cadence is not None:  # a restarted worker polls as the one before
            self._send_cadence()
        log.info("NVML worker pid %d has %d GPU(s)", child.pid, len(infos))
        self._status(SOURCE, True, f"pid {child.pid}, {self.restarts} restart(s)")
        return infos

    def open(self) -> list[GpuInfo]:
        if self._up:
            return list(self._infos)
        try:
            infos = self._spawn()
        except WorkerDown as exc:
            raise BackendUnavailable(f"NVML worker failed to open NVML: {exc}") from exc
        except BackendUnavailable:
            raise
        except BackendError as exc:
            raise BackendUnavailable(str(exc)) from exc
        self._infos = infos
        if self._supervisor is None:
            self._supervisor = threading.Thread(
                target=self._supervise, name="nvml-worker", daemon=True
            )
            self._supervisor.start()
        return list(infos)

    def _supervise(self) -> None:
        """Kill a hung worker; restart a dead one with backoff."""
        failures = 0
        # a death wakes this thread at once; a hang is looked for a few times per hang_s
        look = max(0.2, min(5.0, self.settings.hang_s / 4))
        while not self._stop.is_set():
            self._wake.wait(look)
            self._wake.clear()
            if self._stop.is_set():
                return
            child = self._child
            if child is not None and self._up:
                failures = 0
                self._kill_if_hung(child)
                continue
            if child is not None:
                continue  # opening
            delay = RESTART_BACKOFF[min(failures, len(RESTART_BACKOFF) - 1)]
            if self._clock.wait(self._stop, delay):
                return
            self.restarts += 1
            failures += 1
            try:
                infos = self._spawn()
            except BackendError as exc:
                self.last_exit = f"restart failed: {exc}"
                log.error("NVML worker restart %d failed: %s", self.restarts, exc)
                self._status(SOURCE, False, self.last_exit)
                continue
            if [i.uuid for i in infos] != [i.uuid for i in self._infos]:
                log.warning("NVML worker restarted with a different set of GPUs")
            log.warning("NVML worker restarted (%d restart(s))", self.restarts)

    def _kill_if_hung(self, child: _Child) -> None:
        now = self._clock.monotonic()
        hang = self.settings.hang_s
        with self._lock:
            oldest = min((p.since for p in self._pending.values()), default=now)
        if self._cadence is not None:  # a GPU missing from every round since it was due
            due = min(self._gpu_seen.values(), default=now) + self._cadence[0]
            oldest = min(oldest, due)
        why = ""
        if now - self._last_beat > hang:
            why = f"no heartbeat for {now - self._last_beat:.0f}s"
        elif now - oldest > hang:
            why = f"a poll unanswered for {now - oldest:.0f}s"
        if why:
            log.error("NVML worker pid %d is hung (%s): killing it", child.pid, why)
            child.killed_for = f"hung ({why})"
            child.kill()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._events.put([])  # ends a wait_xid_events in progress
        child = self._child
        if child is None:
            return
        with contextlib.suppress(BackendError):
            self._request({"op": "close"}, 5.0)
        try:
            child.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            child.kill()
        child.reader.join(5.0)

    # -- Backend ------------------------------------------------------------------------
    def sample(self, index: int) -> GpuSample:
        return self._sample(self._request({"op": "sample", "gpu": index}))

    @staticmethod
    def _sample(reply: dict[str, Any]) -> GpuSample:
        sample = reply.get("sample")
        if not isinstance(sample, GpuSample):
            raise BackendError("NVML worker answered a poll without a sample")
        return sample

    def sample_async(self, index: int, done: Callable[[SampleResult], None]) -> None:
        """One pipe write; ``done`` runs on the reader thread when the answer comes (no
        poll thread waits for it: two thread wake-ups less per GPU and poll)."""

        def answered(reply: dict[str, Any] | None) -> None:
            def result() -> GpuSample:
                return self._sample(self._reply(reply))

            done(result)

        try:
            self._send({"op": "sample", "gpu": index}, answered)
        except WorkerDown as exc:
            done(_raises(exc))

    def start_rounds(
        self, interval_s: float, call_timeout_s: float, done: Callable[[RoundResult], None]
    ) -> None:
        """The worker polls every GPU each ``interval_s`` and sends one frame per round;
        ``done`` gets each round on the reader thread (``RoundSampler``)."""
        self._on_round = done
        self._cadence = (interval_s, call_timeout_s)
        if self._up:
            self._send_cadence()
        # a worker that is down gets the cadence when it is back (_spawn)

    def _send_cadence(self) -> None:
        child = self._child
        if self._cadence is None or child is None:
            return
        interval, timeout = self._cadence
        child.send({"op": "rounds", "id": 0, "interval": interval, "timeout": timeout})

    def wait_xid_events(self, timeout_s: float) -> list[XidEvent]:
        if not self._up:
            self._clock.wait(self._stop, min(timeout_s, 1.0))
            raise WorkerDown(f"NVML worker is down ({self.last_exit or 'starting'})")
        try:
            got = self._events.get(timeout=timeout_s)
        except queue.Empty:
            return []
        if isinstance(got, WorkerDown) and self._up:
            return []  # news of a worker that has been replaced since
        if isinstance(got, BackendError):
            raise got
        return got
