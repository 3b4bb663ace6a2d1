import pytest

from rlinf.workers.embodied import PolicyRolloutConfig, PolicyRolloutWorker
from rlinf.workers.env import EnvWorker, EnvWorkerConfig
from rlinf.workers.models import PolicyConfig
from rlinf.workers.runtime import WorkerContext

CONTEXT = WorkerContext(role="test", rank=0, world_size=1)


@pytest.fixture
def make_env():
    made: list[EnvWorker] = []

    def make(name: str = "InvertedPendulum-v5", **options) -> EnvWorker:
        env = EnvWorker(CONTEXT, config=EnvWorkerConfig(env_name=name, **options))
        made.append(env)
        return env

    yield make
    for env in made:
        env.shutdown()


def make_policy(obs_dim: int, action_dim: int, *, seed: int = 0) -> PolicyRolloutWorker:
    return PolicyRolloutWorker(CONTEXT, config=PolicyRolloutConfig(
        policy=PolicyConfig(obs_shape=(obs_dim,), action_dim=action_dim), seed=seed,
        num_threads=1))
