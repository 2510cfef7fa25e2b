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


def test_a_local_cluster_keeps_token_auth_without_ray_s_warning(monkeypatch):
    """Ray warns at every new local cluster whose RAY_AUTH_MODE is unset ("Token authentication is enabled
    for this Ray cluster…", issue 44); glassrl keeps Ray's default (token auth, the environment untouched)
    and drops that one record from Ray's logger; any other record of that logger passes."""
    import logging

    ray = pytest.importorskip("ray")
    from ray._private.authentication import authentication_token_setup as auth

    from glassrl.workers.ray_cluster import AUTH_LOGGER

    assert auth.logger.name == AUTH_LOGGER
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: None)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    connect(None, num_cpus=1)
    assert "RAY_AUTH_MODE" not in __import__("os").environ

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord(AUTH_LOGGER, logging.WARNING, __file__, 1, message, None, None)

    notice = "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out."
    assert auth.logger.filter(record(notice)) is False
    assert auth.logger.filter(record("Token authentication is disabled for this Ray cluster. Anyone…"))
