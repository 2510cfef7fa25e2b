"""``ray.address: null`` starts a Ray cluster of the run's own (issue 33, item 8): ``ray.init()``
without an address joins a cluster it finds on the machine (``RAY_ADDRESS``, or the last one
``ray start`` left in /tmp/ray), so a run could land on someone else's cluster."""

from __future__ import annotations

import pytest

from glassrl.workers.ray_cluster import connect


def test_no_address_starts_a_cluster_of_its_own_even_where_another_runs(monkeypatch):
    ray = pytest.importorskip("ray")
    from ray._private.services import canonicalize_bootstrap_address

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # another cluster, as ray.init() would find it
    connect(None, num_cpus=2)
    connect("127.0.0.1:6380")  # an address given is joined
    assert calls == [{"address": "local", "include_dashboard": False, "num_cpus": 2}, {"address": "127.0.0.1:6380"}]
    # What "local" means to Ray: start a new instance, whatever the environment names.
    assert canonicalize_bootstrap_address("local") is None
    assert canonicalize_bootstrap_address(None).endswith(":6379")  # without it: join that one
