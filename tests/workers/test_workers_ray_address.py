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


@pytest.mark.parametrize("given", [None, "disabled"])
def test_a_local_cluster_chooses_token_auth_without_ray_s_warning(monkeypatch, given):
    """Ray warns at every new local cluster whose RAY_AUTH_MODE is unset ("Token authentication is enabled
    for this Ray cluster…", issue 44); glassrl sets the mode Ray would pick, token, before ray.init, so the
    warning goes and the cluster stays authenticated; a mode the user set is kept."""
    ray = pytest.importorskip("ray")
    from ray._private.authentication import authentication_token_setup as auth

    seen = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.append(auth.os.environ.get("RAY_AUTH_MODE")))
    if given is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", given)
    warned = []
    monkeypatch.setattr(auth, "_warn_token_auth_enabled", lambda: warned.append(True))
    connect(None, num_cpus=1)
    assert seen == [given or "token"]
    assert auth.enable_token_auth_by_default() is (seen[0] == "token") and not warned  # what ray.init then decides
