"""A process that owns an ActionsSink, for the outage/restart tests.

    python tests/actions_driver.py CONFIG

Reads JSON lines on stdin: {"deliver": [{"rule", "state", "gpu", "seq"}, ...]},
{"wait_idle": seconds}, {"exit": true}; answers each with one JSON line on stdout.
The test may SIGKILL it at any time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from actions_support import sink_for, transition

from gpuwatchd.configfile.loader import load_config
from gpuwatchd.core.alerts import AlertState
from gpuwatchd.core.clock import SystemClock


def main() -> int:
    config = load_config(sys.argv[1], must_exist=True, environ={})
    clock = SystemClock()
    sink = sink_for(config, clock, start=True)
    print(json.dumps({"ready": True, "pending": sink.pending()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if "deliver" in cmd:
            now = clock.now()
            batch = [
                transition(
                    t["rule"], AlertState(t["state"]), gpu=t["gpu"], seq=t["seq"], at=now, xid=None
                )
                for t in cmd["deliver"]
            ]
            sink.deliver(batch, now)
            print(json.dumps({"written": len(batch)}), flush=True)
        elif "wait_idle" in cmd:
            print(json.dumps({"idle": sink.wait_idle(cmd["wait_idle"])}), flush=True)
        elif cmd.get("exit"):
            break
    sink.close()
    print(json.dumps({"closed": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
