"""An rlinf.comm Channel plugs into the env worker's protocol unchanged (payloads over shm)."""

import threading

import numpy as np
import pytest

from rlinf.comm import Channel, Endpoint, TCPStore, new_token
from rlinf.workers.env import Trajectory

from .conftest import make_policy
from .reference import run_collocated


@pytest.fixture
def endpoint(monkeypatch):
    token = new_token()
    monkeypatch.setenv("RLINF_COMM_TOKEN", token.hex())
    with TCPStore.serve(token=token, timeout=60) as store:
        ep = Endpoint("embodied-test", store=store).make_current()
        yield store, ep
        ep.close()


def test_env_worker_over_channels_matches_collocated(make_env, endpoint):
    store, ep = endpoint
    observations = Channel.create("obs", store=store, endpoint=ep)
    actions = Channel.create("actions", store=store, endpoint=ep)
    try:
        env = make_env(num_envs=4, pipeline_stages=2, seed=6)
        policy = make_policy(4, 1, seed=2)
        failure: list[BaseException] = []

        def serve() -> None:
            try:
                policy.serve(source=observations, sink=actions, num_steps=15, num_stages=2,
                             timeout=60)
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=serve)
        thread.start()
        got = env.rollout(num_steps=15, sink=observations, source=actions, timeout=60)
        thread.join(timeout=60)
        assert not failure and not thread.is_alive()
    finally:
        observations.disconnect()
        actions.disconnect()
    ref_env = make_env(num_envs=4, pipeline_stages=2, seed=6)
    ref = run_collocated(ref_env, make_policy(4, 1, seed=2), num_steps=15)
    a, b = Trajectory.concat(ref.trajectories), Trajectory.concat(got.trajectories)
    for field in ("obs", "actions", "rewards", "log_probs", "values", "next_values"):
        np.testing.assert_array_equal(getattr(b, field), getattr(a, field), err_msg=field)
