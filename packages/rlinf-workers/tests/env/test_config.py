"""EnvWorkerConfig.shard: env workers split a run's envs with the seeds one worker uses."""

import numpy as np
import pytest

from rlinf.workers.env import EnvWorker, EnvWorkerConfig
from rlinf.workers.errors import ConfigError
from rlinf.workers.runtime import WorkerContext

RUN = EnvWorkerConfig("InvertedPendulum-v5", num_envs=8, pipeline_stages=4, seed=5,
                      processes=3)


def test_shards_are_equal_contiguous_and_keep_seeds_and_indices():
    shards = [RUN.shard(rank, 2) for rank in range(2)]
    # Every rank keeps the 4 stage groups, each of half a group's 2 envs.
    assert [(s.num_envs, s.pipeline_stages, s.first_env, s.seed, s.processes)
            for s in shards] == [(4, 4, 0, 5, 3), (4, 4, 4, 9, 3)]
    assert RUN.shard(0, 1) is RUN
    two_groups = EnvWorkerConfig("InvertedPendulum-v5", num_envs=8, pipeline_stages=2,
                                 processes=3)
    assert two_groups.shard(3, 4).processes == 2  # at most one process per env of the share


def test_shards_step_the_envs_one_worker_steps():
    whole = EnvWorker(WorkerContext(role="env", rank=0, world_size=1),
                      config=EnvWorkerConfig("InvertedPendulum-v5", num_envs=4, seed=5,
                                             pipeline_stages=2))
    halves = [EnvWorker(WorkerContext(role="env", rank=r, world_size=2),
                        config=whole.config.shard(r, 2)) for r in range(2)]
    try:
        whole.reset(seed=40)
        for rank, half in enumerate(halves):
            half.reset(seed=40 + 2 * rank)  # EnvRole.reset_seed's offset of the rank
        # whole: stage groups [0, 1], [2, 3]; half r: envs 2r, 2r + 1 in groups of one
        for rank, half in enumerate(halves):
            joined = np.concatenate([np.asarray(group) for group in half._obs])
            np.testing.assert_array_equal(joined, np.asarray(whole._obs[rank]))
            assert [i.tolist() for i in half._indices] == [[2 * rank], [2 * rank + 1]]
    finally:
        for worker in (whole, *halves):
            worker.shutdown()


@pytest.mark.parametrize(("config", "ranks", "message"), [
    (RUN, 3, "3 divides a stage group's 2 envs"),
    (RUN, 4, "4 divides a stage group's 2 envs"),
    (EnvWorkerConfig("InvertedPendulum-v5", num_envs=8, pipeline_stages=2,
                     same_start_group_size=8), 2, "same-start blocks"),
])
def test_uneven_splits_are_refused(config, ranks, message):
    with pytest.raises(ConfigError, match=message):
        config.shard(0, ranks)
    with pytest.raises(ConfigError, match="outside"):
        RUN.shard(2, 2)
