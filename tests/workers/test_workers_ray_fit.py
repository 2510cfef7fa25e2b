"""A local Ray cluster too small for the ranks: default ranks share its CPUs; else one line at once."""

from __future__ import annotations

import pytest

from glassrl.errors import GlassrlError
from glassrl.workers.ray_cluster import RoleSpec, _bundle, fit_local, rank_env


def _spec(role: str, world_size: int, resources: dict[str, float] | None = None) -> RoleSpec:
    return RoleSpec(role, world_size, build=print, **({"resources": resources} if resources else {}))


def test_default_ranks_share_the_cores_of_a_small_machine():
    """The README's one-liner (GRPO, ray.actor.world_size=2 and a reference rank) on 2 cores."""
    specs = [_spec("actor", 2), _spec("reference", 1)]
    fitted = fit_local(specs, {"CPU": 2.0, "memory": 1e9})
    assert [s.resources for s in fitted] == [{"CPU": 0.6666}] * 2
    assert [(s.role, s.world_size, s.build) for s in fitted] == [(s.role, s.world_size, s.build) for s in specs]
    # colocated bundles: rank 0 holds an actor and the reference, rank 1 an actor; together ≤ 2 cores
    bundles = [_bundle([s.resources for s in fitted if s.world_size > r]) for r in range(2)]
    assert sum(b["CPU"] for b in bundles) <= 2.0


def test_enough_cores_or_a_joined_cluster_place_as_asked():
    specs = [_spec("actor", 2), _spec("reference", 1)]
    assert fit_local(specs, {"CPU": 4.0}) == specs


def test_ranks_set_by_the_user_keep_their_resources_and_defaults_share_what_is_left():
    specs = [_spec("actor", 1, {"CPU": 1.0, "GPU": 1.0}), _spec("reference", 2)]
    fitted = fit_local(specs, {"CPU": 2.0, "GPU": 1.0})
    assert [s.resources for s in fitted] == [{"CPU": 1.0, "GPU": 1.0}, {"CPU": 0.5}]


@pytest.mark.parametrize(
    ("specs", "total"),
    [
        ([_spec("actor", 2, {"CPU": 2.0})], {"CPU": 2.0}),  # set by the user: not shrunk
        ([_spec("actor", 1, {"CPU": 1.0, "GPU": 1.0})], {"CPU": 2.0}),  # a GPU the machine lacks
        ([_spec("actor", 1, {"CPU": 2.0}), _spec("reference", 1)], {"CPU": 2.0}),  # nothing left to share
    ],
)
def test_what_cannot_fit_is_one_line_naming_the_keys(specs, total):
    with pytest.raises(
        GlassrlError, match=r"^ray: the local Ray cluster started for this run has .* ray\.actor\.resources"
    ):
        fit_local(specs, total)


def test_ranks_run_without_progress_bars_or_cpp_warnings(monkeypatch):
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    assert rank_env() == {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "INFO")  # asked for: kept
    assert rank_env()["TORCH_CPP_LOG_LEVEL"] == "INFO"
