"""The trainer tests' Ray cluster; the tiny model, prompt files and `fast` overrides come from tests/conftest.py."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray cluster of 2 CPUs for the tests of one module (the Ray backend's tests)."""
    import ray

    from glassrl.workers.ray_cluster import connect

    connect(None, num_cpus=2, object_store_memory=100 * 2**20, log_to_driver=False)
    yield
    ray.shutdown()
