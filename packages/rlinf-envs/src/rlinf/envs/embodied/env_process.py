"""The child side of `rlinf.envs.embodied.processes`: ``python -m`` this module with the
file descriptor of its end of a socket pair; it builds its shard of envs and answers the
pool's requests (step with auto-reset, reset, render, attribute) until ``close`` or EOF.
Every reply carries the index of the env it answers (-1: the start).

Kept apart from the pool's module so that running it does not import it twice (the package
imports the pool).
"""

from __future__ import annotations

import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["serve"]


def serve(conn: Connection) -> None:
    """A worker process: build the shard, then answer requests until ``close`` or EOF."""
    try:
        _, _, (builder, indices) = conn.recv()
        envs = dict(zip(indices, builder(indices), strict=True))
        first = envs[indices[0]]
        conn.send((-1, "ok", (first.observation_space, first.action_space)))
    except BaseException:
        conn.send((-1, "error", traceback.format_exc()))
        return
    while True:
        try:
            op, index, argument = conn.recv()
        except (EOFError, OSError):
            break  # the parent is gone: nothing to answer
        try:
            if op == "close":
                for env in envs.values():
                    env.close()
                conn.send((index, "ok", None))
                return
            env = envs[index]
            if op == "step":
                obs, reward, terminated, truncated, info = env.step(argument)
                restart = env.reset(seed=None)[0] if terminated or truncated else None
                conn.send((index, "ok", (obs, reward, terminated, truncated, info, restart)))
            elif op == "reset":
                conn.send((index, "ok", env.reset(seed=argument)))
            elif op == "render":
                conn.send((index, "ok", env.render()))
            elif op == "getattr":
                conn.send((index, "ok", _attribute(env, argument)))
            else:
                conn.send((index, "error", f"unknown request {op!r}"))
        except BaseException:
            conn.send((index, "error", traceback.format_exc()))


def _attribute(env: Any, name: str) -> Any:
    getter = getattr(env, "get_wrapper_attr", None)
    return getter(name) if getter is not None else getattr(env, name)


if __name__ == "__main__":
    # Ctrl-C reaches the whole process group: the pool's owner decides, and its closing
    # pipe (EOF) ends this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(Connection(int(sys.argv[1])))
