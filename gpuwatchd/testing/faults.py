"""Faults injected into a running daemon, for tests and watchdog drills.

``gpuwatchd run`` reads ``$GPUWATCHD_TEST_FAULT`` (and only then imports this module)::

    GPUWATCHD_TEST_FAULT=wedge-evaluator:N    after N rule evaluations, the next one never
                                              returns (until shutdown)

A wedged evaluation holds the pipeline lock, as a rule stuck in a pathological regex
would: the evaluator stops, then the poll workers block handing over their samples, then
the poll scheduler blocks reporting them stale. The watchdog must notice and stop
pinging systemd. Nothing else in the daemon knows about this hook.

``KmsgStorm`` is the other kind of fault this module makes: a kernel log flooded with
lines, XIDs among them, written at a steady rate into a file of /dev/kmsg records that the
daemon follows (``sources.kernel_log: kmsg``, ``sources.kmsg_path: FILE``). It never
touches the machine's real kernel log. The fault suite and ``bench/xid_storm.py`` use it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuwatchd.core.alerts import AlertTransition
from gpuwatchd.core.families import Families
from gpuwatchd.core.nodestate import NodeView

__all__ = ["DEFAULT_STORM", "ENV", "KmsgStorm", "StormXid", "WedgeStage", "stages_from_environ"]

ENV = "GPUWATCHD_TEST_FAULT"


class WedgeStage:
    """A pipeline ``Stage`` whose evaluation number ``after + 1`` blocks until ``close()``."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.evaluations = 0
        self.wedged = threading.Event()
        self._release = threading.Event()

    def observe(self, record: object) -> None:
        return None

    def evaluate(self, now: float, view: NodeView) -> list[AlertTransition]:
        self.evaluations += 1
        if self.evaluations > self.after:
            self.wedged.set()
            self._release.wait()
        return []

    def families(self, view: NodeView, fams: Families) -> None:
        return None

    def close(self) -> None:
        self._release.set()


def stages_from_environ(environ: Mapping[str, str]) -> list[WedgeStage]:
    """The fault stages ``$GPUWATCHD_TEST_FAULT`` asks for; ``ValueError`` if malformed."""
    spec = environ.get(ENV, "")
    if not spec:
        return []
    kind, _, arg = spec.partition(":")
    if kind == "wedge-evaluator" and arg.isdigit():
        return [WedgeStage(int(arg))]
    raise ValueError(f"{ENV}={spec!r}: expected wedge-evaluator:N")


# -- a kernel-log storm ------------------------------------------------------------------
HGX_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")  # scenario GPUs 0-7
_XID_TEXT = {
    79: "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    48: "pid=2011, name=python3, An uncorrectable double bit error (DBE) has been detected",
    31: "pid=4242, name=python3, channel 0x00000009, intr 00000000. MMU Fault: ENGINE GRAPHICS",
    13: "pid=4242, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)",
}
_NOISE = (
    "usb 1-1: new high-speed USB device number {n} using xhci_hcd",
    "mlx5_core 0000:0c:00.0: mlx5_fw_tracer_handle_traces:{n} FW tracer event",
    'audit: type=1400 audit({n}.123:42): apparmor="ALLOWED" operation="open"',
    "nvme nvme0: I/O {n} QID 7 timeout, completion polled",
)


@dataclass(frozen=True)
class StormXid:
    """One line in ``every`` is this XID; ``gpu`` ``None`` takes the GPUs in turn."""

    every: int
    code: int
    gpu: int | None


DEFAULT_STORM = (
    StormXid(5000, 79, 2),  # GPU 2 falls off the bus, and the driver keeps saying so
    StormXid(7000, 48, 5),  # GPU 5: double-bit ECC errors
    StormXid(3000, 31, None),  # applications fault on every GPU (MMU faults)
)


class KmsgStorm:
    """Appends /dev/kmsg records (facility 0) to ``path`` at ``rate`` lines per second for
    ``seconds``, in 10 ms batches; counts what it wrote. ``start()``/``join()`` run it on a
    thread; ``behind`` is how far (s) the writer itself fell behind its schedule."""

    def __init__(
        self,
        path: str,
        rate: int,
        seconds: float,
        xids: Sequence[StormXid] = DEFAULT_STORM,
        first_seq: int = 1,
    ) -> None:
        self.path = path
        self.rate = rate
        self.seconds = seconds
        self.xids = tuple(xids)
        self.seq = first_seq - 1
        self.lines = 0
        self.xid_lines: dict[tuple[int, int], int] = {}
        self.behind = 0.0
        self.elapsed = 0.0
        self._turn = 0
        self._thread: threading.Thread | None = None

    def _line(self) -> str:
        self.seq += 1
        n = self.seq
        for x in self.xids:
            if n % x.every == 0:
                gpu = x.gpu
                if gpu is None:
                    gpu = self._turn % len(HGX_BUSES)
                    self._turn += 1
                key = (gpu, x.code)
                self.xid_lines[key] = self.xid_lines.get(key, 0) + 1
                text = _XID_TEXT.get(x.code, "test")
                msg = f"NVRM: Xid (PCI:0000:{HGX_BUSES[gpu]}:00): {x.code}, {text}"
                return f"4,{n},{n * 20},-;{msg}\n"
        return f"6,{n},{n * 20},-;{_NOISE[n % len(_NOISE)].format(n=n)}\n"

    def run(self) -> None:
        tick = 0.01
        per_tick = max(1, round(self.rate * tick))
        start = time.monotonic()
        due = start
        with open(self.path, "a", encoding="utf-8") as fh:
            while time.monotonic() - start < self.seconds:
                fh.write("".join(self._line() for _ in range(per_tick)))
                fh.flush()
                self.lines += per_tick
                due += tick
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    self.behind = max(self.behind, -delay)
        self.elapsed = time.monotonic() - start

    def start(self) -> KmsgStorm:
        self._thread = threading.Thread(target=self.run, name="kmsg-storm", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def xid_total(self) -> int:
        return sum(self.xid_lines.values())
