"""Names registered in the store (endpoints, channels), and taking over a dead holder's.

A process that registers a name writes a record (its listening address and a stamp of
its process) under the name's store key. A process killed with SIGKILL cannot remove it,
so a restarted process asking for the same name must be able to take the record over once
its holder is gone. On the holder's own node (same kernel and pid namespace) that is
certain: its pid is free or belongs to a newer process. From elsewhere it is gone when
nothing answers at its address as that name: the connection is refused (the kernel closed
a killed process's listener), the listener there does not share our token (another run
reused the port), or it names itself otherwise. A holder that accepts but does not answer
(stopped, busy) keeps its name: a live process never loses it to a newcomer. The probe
alone cannot tell a loaded node's slow newcomer, which reused a dead holder's port, from
a stalled holder; the stamp can. The take-over is a compare-and-set on the old record, so two
newcomers cannot both win.
"""

from __future__ import annotations

import json
from typing import Any

from rlinf.comm import errors
from rlinf.comm._internal import wire
from rlinf.comm._internal.locality import process_stamp, stamped_process_gone
from rlinf.comm._internal.logs import get_logger
from rlinf.comm._internal.rpc import RpcPeer
from rlinf.comm._internal.store import Store

log = get_logger(__name__)

PROBE_TIMEOUT_S = 2.0
"""How long a probe waits for the holder of a name to answer before deeming it alive."""


def claim(store: Store, key: str, record: dict[str, Any], *, name: str, what: str,
          token: bytes, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Register `record` under `key`, taking the key over if its holder is dead.

    The record is stored with this process's stamp under ``"process"``. Raises CommError
    naming the live holder when the name is taken.
    """
    mine = json.dumps({**record, "process": process_stamp()}).encode()
    current = store.compare_set(key, None, mine)
    if current == mine:
        return
    holder = _parse(current)  # unreadable: no live holder can be behind it
    if holder is None or not holder_alive(holder, name=name, token=token, timeout=timeout):
        if store.compare_set(key, current, mine) == mine:
            log.info("name_taken_over", what=what, name=name,
                     dead_holder=holder.get("address") if holder else None)
            return
        holder = _parse(store.get(key, timeout=timeout)) or holder
    where = holder.get("address") if holder else "an unreadable record"
    raise errors.CommError(
        f"expected {what} name {name!r} to be free; a live process holds it (at {where}). "
        "Pick another name, or close the one that holds it first"
    )


def holder_alive(record: dict[str, Any], *, name: str, token: bytes,
                 timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the process that wrote `record` for `name` is still there (module docstring)."""
    if stamped_process_gone(record.get("process")):
        return False
    address = record.get("address")
    if not isinstance(address, list) or len(address) != 2:
        return False
    try:
        conn = wire.connect((str(address[0]), int(address[1])), token=token, timeout=timeout)
    except (errors.PeerDiedError, errors.AuthenticationError):
        return False
    except errors.CommError:  # accepted but silent (stopped, busy): still alive
        return True
    peer = RpcPeer(conn, name=f"holder of {name!r}").start()
    try:
        reply, _ = peer.call({"op": "whoami"}, timeout=timeout)
    except errors.CommTimeoutError:
        return True
    except errors.CommError:
        return False
    finally:
        peer.close()
    return reply.get("name") == name


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
