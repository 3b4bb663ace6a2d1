"""`sockio`: waiting on a socket that another thread closed is a closed connection."""

from __future__ import annotations

import select
import socket

import pytest

from rlinf.comm._internal.sockio import Deadline, wait_fd
from rlinf.comm.errors import PeerDiedError


def test_waiting_on_a_socket_closed_under_us_is_a_peer_died_error() -> None:
    left, right = socket.socketpair()
    right.close()
    left.close()  # what a local close from another thread leaves: descriptor -1
    with pytest.raises(PeerDiedError, match="closed locally"):
        wait_fd(left, select.POLLIN, Deadline(5.0), "recv")
