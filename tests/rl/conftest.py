"""The trainer tests' overrides; the tiny model and prompt files come from tests/conftest.py."""

from __future__ import annotations

import pytest

from helpers import tiny_run_overrides


@pytest.fixture
def fast(tiny_model_dir, prompt_files, tmp_path):
    """Overrides that make any TrainConfig a seconds-long run of the tiny model on 8 prompts."""
    return tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "run")


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray cluster of 2 CPUs for the tests of one module (the Ray backend's tests)."""
    import ray

    from glassrl.workers.ray_cluster import connect

    connect(None, num_cpus=2, object_store_memory=100 * 2**20, log_to_driver=False)
    yield
    ray.shutdown()
