"""A device-lock client process for the tests (run as a script, not collected by pytest).

Usage: python _lock_worker.py '<json plan>'  with the token in RLINF_COMM_TOKEN (hex).

Plan keys: address [host, port], owner, component, devices, log (path: one line per event,
appended atomically), counter (path), iterations, mode ("loop" | "hold").
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from rlinf.comm.wire import default_token
from rlinf.sched.context_switch import CallbackOnloadable
from rlinf.sched.device_lock import DeviceLockClient


def append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def main() -> int:
    plan = json.loads(sys.argv[1])
    owner, component, log = plan["owner"], plan["component"], plan["log"]
    client = DeviceLockClient(tuple(plan["address"]), token=default_token(), owner=owner)
    client.register(component, CallbackOnloadable(
        lambda: append(log, f"{owner} {component} onload"),
        lambda: append(log, f"{owner} {component} offload"),
    ))
    devices = plan["devices"]
    if plan["mode"] == "hold":
        client.acquire(devices, component=component, timeout=60)
        print("HOLDING", flush=True)
        time.sleep(600)  # killed by the test
        return 1
    counter = Path(plan["counter"])
    for _ in range(plan["iterations"]):
        with client.hold(devices, component=component, timeout=120):
            append(log, f"{owner} {component} enter")
            value = int(counter.read_text())  # non-atomic read-modify-write on purpose
            time.sleep(0.001)
            counter.write_text(str(value + 1))
            append(log, f"{owner} {component} exit")
    append(log, f"{owner} {component} gone")  # exiting frees its device state
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
