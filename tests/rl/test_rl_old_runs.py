"""A run started by an earlier glassrl resumes: its config.yaml lacks the keys added since, and its
checkpoint says ``model.dtype: auto`` from before that meant float32 master weights everywhere."""

from __future__ import annotations

import pytest
import yaml

from glassrl.config import load_config, to_dict
from glassrl.errors import GlassrlError
from glassrl.rl.config import TrainConfig
from glassrl.rl.resolve import saved_in_todays_terms, with_precision, with_shared_prefix
from glassrl.run.state import RunConfig


def _old_config_yaml(path, drop=("threads", "model.shared_prefix", "ray.rollout")) -> None:
    """A grpo config.yaml as an earlier glassrl wrote it: every key of its day (critic_head included,
    which grpo ignores), none of those added since, model.dtype auto."""
    data = to_dict(load_config(TrainConfig, None, ["algo.advantage=grpo"]))
    for key in drop:
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            node = node[part]
        node.pop(leaf)
    data["model"]["dtype"] = "auto"
    path.write_text(yaml.safe_dump(data))


@pytest.mark.parametrize("beside", ["checkpoints", "metrics.jsonl", None])
def test_a_run_directorys_config_is_judged_by_value(tmp_path, beside, tiny_model_dir):
    _old_config_yaml(tmp_path / "config.yaml")
    if beside == "checkpoints":
        (tmp_path / "checkpoints").mkdir()
    elif beside == "metrics.jsonl":
        (tmp_path / "metrics.jsonl").write_text("")
    if beside is None:  # a user's file naming critic_head under grpo: the knob is reported as ignored
        with pytest.raises(GlassrlError, match="model.critic_head"):
            load_config(TrainConfig, tmp_path / "config.yaml")
    else:  # a run's own: every value at its default is not "written"
        cfg = load_config(TrainConfig, tmp_path / "config.yaml")
        assert cfg.threads == "auto" and cfg.model.shared_prefix == "auto"
        # ... which, resuming that run, means what it did then: the padded passes
        resumed, why = with_shared_prefix(with_precision(cfg), tiny_model_dir, tmp_path / "config.yaml")
        assert resumed.model.shared_prefix is False and "began before model.shared_prefix existed" in why
        assert with_shared_prefix(with_precision(cfg), tiny_model_dir)[0].model.shared_prefix is True  # a new run


@pytest.mark.parametrize(
    ("overrides", "then_means"),
    [
        ([], "float32"),  # CPU: auto meant float32 then, and means it now
        (["trainer.backend=ray", "ray.actor.resources={GPU: 1}"], "bfloat16"),  # CUDA: it meant bfloat16 weights
    ],
)
def test_old_auto_dtype_is_compared_as_what_it_meant(overrides, then_means):
    cfg = load_config(TrainConfig, None, ["model.device=cpu", *overrides])
    upgrade = saved_in_todays_terms(cfg)
    old = {"model.dtype": then_means, "seed": 0, "model.shared_prefix": False}  # before shared_prefix: padded
    assert upgrade({"model.dtype": "auto", "seed": 0}) == old
    explicit = {"model.dtype": "bfloat16", "model.shared_prefix": True}
    assert upgrade(explicit) == explicit  # explicit values stand


def test_resume_compares_the_checkpoint_in_todays_terms():
    cfg = with_precision(load_config(TrainConfig, None, ["model.device=cpu"]))
    now = to_dict(cfg)
    saved = to_dict(cfg)
    saved["model"]["dtype"] = "auto"
    saved.pop("threads")  # a key added since, at its default now
    saved["model"].pop("shared_prefix")  # added since, and resumed as it ran then: padded
    now["model"]["shared_prefix"] = False  # what with_shared_prefix makes of "auto" resuming that run
    run_config = RunConfig(now, ("steps",), to_dict(TrainConfig()), upgrade=saved_in_todays_terms(cfg))
    run_config.load_state_dict({"config": saved})
    assert run_config.changes == {}
    # without the upgrade, the old checkpoint would be refused as another run
    plain = RunConfig(now, ("steps",), to_dict(TrainConfig()))
    with pytest.raises(GlassrlError, match=r"model.dtype: 'auto' then, 'float32' now"):
        plain.load_state_dict({"config": saved})
