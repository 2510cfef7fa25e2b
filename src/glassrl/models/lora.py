"""LoRA adapters on the actor and the critic (Hu et al. 2021, "LoRA", eq. 3: W₀ + BA·α/r), with ``peft``.

Only the adapters (and a critic's scalar head) train; the base weights stay frozen
and are shared: the reference policy is the same model with its adapters disabled
(``with model.disable_adapter():``, glassrl.workers.lora), so no second copy of
the model is loaded. B starts at zero (Hu et al. 2021, §4.1), so π_θ = π_ref at step 0.

On disk a LoRA policy or critic is a ``peft`` adapter directory (``adapter_config.json``,
``adapter_model.safetensors``; a value-head critic adds its head files, see
glassrl.models.value_head) whose config names its base checkpoint by absolute path.
:func:`export_merged` folds the adapters into the base weights (``merge_and_unload``)
and writes a plain Hugging Face model that ``from_pretrained`` loads without peft.

``peft`` is an optional extra (``pip install glassrl[lora]``), imported here only.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from glassrl.config import option
from glassrl.errors import GlassrlError
from glassrl.models.value_head import VALUE_HEAD_MARKER, VALUE_HEAD_WEIGHTS, CausalLMWithValueHead

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# The scalar head of Hugging Face's *ForTokenClassification decoders (Llama, Qwen2, ...):
# a token-classification critic trains it in full beside the adapters (a fresh head must learn).
TOKEN_CLASSIFICATION_HEAD = "score"


@dataclass(frozen=True)
class LoraSettings:
    """The adapter of one role (peft.LoraConfig's fields of the same meaning)."""

    r: int = 8  # rank of B (d×r) and A (r×k)
    alpha: float = 16.0  # scale α: the update is BA·α/r
    dropout: float = 0.0  # dropout on the adapter's input
    # modules that get an adapter: names, or "all-linear" (every Linear but the output layer)
    target_modules: str | tuple[str, ...] = "all-linear"


@dataclass
class LoraConfig:
    """LoRA adapters (Hu et al. 2021, eq. 3: W₀ + BA·α/r) with peft (glassrl.models.lora); only they train."""

    r: int = option(8, help="rank of the adapters B (d×r) and A (r×k)")
    alpha: float = option(16.0, help="scale α: the update is BA·α/r")
    dropout: float = option(0.0, help="dropout on the adapters' input, in [0, 1)")
    target_modules: str | list[str] = option(
        "all-linear", help="modules that get an adapter: names, or all-linear (every Linear but the output layer)"
    )

    def settings(self) -> LoraSettings:
        """The adapters these keys describe (``model.lora`` of glassrl train, ``lora`` of glassrl dpo)."""
        targets = self.target_modules if isinstance(self.target_modules, str) else tuple(self.target_modules)
        return LoraSettings(r=self.r, alpha=self.alpha, dropout=self.dropout, target_modules=targets)


def _peft():
    try:
        import peft
    except ImportError:
        raise GlassrlError("LoRA needs the peft package: pip install 'glassrl[lora]'") from None
    return peft


@contextlib.contextmanager
def _peft_quietly() -> Iterator[None]:
    """peft builds a model by reading transformers' deprecated ``is_gradient_checkpointing`` (a
    FutureWarning on every adapter made or loaded, peft's to change, not the user's to read)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def _config(settings: LoraSettings, task_type: str | None, exclude: tuple[str, ...] = ()):
    peft = _peft()
    if settings.r < 1 or settings.alpha <= 0 or not 0 <= settings.dropout < 1:
        raise GlassrlError(
            f"lora: r = {settings.r}, alpha = {settings.alpha}, dropout = {settings.dropout}: "
            "need r ≥ 1, alpha > 0, 0 ≤ dropout < 1"
        )
    targets = settings.target_modules
    config = peft.LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets if isinstance(targets, str) else list(targets),
        exclude_modules=list(exclude) or None,
        modules_to_save=list(exclude) or None,
        task_type=task_type,
    )
    return config


def _with_base(peft_model, base_path: str | Path):
    """``peft_model`` whose adapter config names its base by absolute path, so that the adapter is
    loaded back (resume, export) from any directory. Set after get_peft_model, which replaces the
    config's value with the model's own ``name_or_path`` (a relative path when loaded from one)."""
    peft_model.peft_config["default"].base_model_name_or_path = str(Path(base_path).resolve())
    return peft_model


def apply_lora(model: nn.Module, settings: LoraSettings, base_path: str | Path) -> nn.Module:
    """``model`` with adapters; only the adapters (and a scalar head) keep requires_grad.

    - a causal LM (actor): a peft model of task CAUSAL_LM;
    - a :class:`CausalLMWithValueHead` critic: adapters on its backbone, ``v_head`` trained in full;
    - a token-classification critic: adapters on the backbone, its ``score`` head trained in full.

    ``base_path`` is the checkpoint the base weights were loaded from (written into the adapter's config).
    """
    peft = _peft()
    try:
        with _peft_quietly():
            if isinstance(model, CausalLMWithValueHead):
                model.backbone = _with_base(peft.get_peft_model(model.backbone, _config(settings, None)), base_path)
                return model
            if type(model).__name__.endswith("ForTokenClassification"):
                config = _config(settings, "TOKEN_CLS", (TOKEN_CLASSIFICATION_HEAD,))
                return _with_base(peft.get_peft_model(model, config), base_path)
            return _with_base(peft.get_peft_model(model, _config(settings, "CAUSAL_LM")), base_path)
    except ValueError as err:  # peft: a target module that the model does not have
        raise GlassrlError(f"lora.target_modules = {settings.target_modules!r}: {err}") from None


def adapter_weights(model: nn.Module) -> dict[str, tuple[torch.Tensor, float]]:
    """The adapters of the peft model ``model`` as peft's save writes them (``get_peft_model_state_dict``:
    ``base_model.model.<module>.lora_A.weight``, …), each with its module's scale α/r (the factor an
    engine that folds the scale into B multiplies it by: vLLM's ``LoRALayerWeights.optimize``)."""
    peft = _peft()
    modules = dict(model.named_modules())
    out = {}
    for name, tensor in peft.get_peft_model_state_dict(model).items():
        module = modules.get(name.rsplit(".lora_", 1)[0])
        scaling = getattr(module, "scaling", {}).get(model.active_adapter, 1.0) if module is not None else 1.0
        out[name] = (tensor, float(scaling))
    return out


def adapter_config(path: str | Path) -> dict:
    """The adapter config of a saved LoRA model, or GlassrlError naming the directory."""
    file = Path(path) / ADAPTER_CONFIG
    if not file.is_file():
        raise GlassrlError(f"{path}: not a LoRA adapter directory (no {ADAPTER_CONFIG})")
    return json.loads(file.read_text(encoding="utf-8"))


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def base_path(path: str | Path) -> Path:
    """The base checkpoint an adapter directory was trained on (must still be there)."""
    base = adapter_config(path).get("base_model_name_or_path")
    if not base or not (Path(base) / "config.json").is_file():
        raise GlassrlError(f"{path}/{ADAPTER_CONFIG}: base_model_name_or_path = {base!r} is not a checkpoint directory")
    return Path(base)


def load_adapters(model: nn.Module, path: str | Path) -> nn.Module:
    """Load the adapters (and a value head) saved in ``path`` into the LoRA model ``model``, in place."""
    peft = _peft()
    path = Path(path)
    target = model.backbone if isinstance(model, CausalLMWithValueHead) else model
    weights = path / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise GlassrlError(f"{path}: no {ADAPTER_WEIGHTS}")
    result = peft.set_peft_model_state_dict(target, load_file(weights))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise GlassrlError(f"{path}: adapters do not fit the model: {(result.unexpected_keys or missing)[:3]}")
    if isinstance(model, CausalLMWithValueHead):
        if not (path / VALUE_HEAD_MARKER).is_file():
            raise GlassrlError(f"{path}: a value-head critic's adapters without {VALUE_HEAD_MARKER}")
        model.v_head.load_state_dict(load_file(path / VALUE_HEAD_WEIGHTS))
    return model


def load_lora_model(path: str | Path, settings: LoraSettings, load_base: Callable[[Path], nn.Module]) -> nn.Module:
    """A LoRA model saved in ``path``: its base (``load_base(base_path)``, e.g. load_causal_lm
    or load_scalar_model bound to dtype and device) with the saved adapters (and value head).
    The ``load`` of a LoRA actor or critic worker: its state_dict matches the live model's."""
    base = base_path(path)
    return load_adapters(apply_lora(load_base(base), settings, base), path)


def merge(model: nn.Module) -> nn.Module:
    """The base model with BA·α/r added to each adapted weight (peft ``merge_and_unload``)."""
    if isinstance(model, CausalLMWithValueHead):
        model.backbone = model.backbone.merge_and_unload()
        return model
    return model.merge_and_unload()


def export_merged(policy: str | Path, out: str | Path) -> Path:
    """Write the policy saved in ``policy`` (a LoRA adapter directory or a full Hugging Face
    checkpoint) as a plain Hugging Face model with its tokenizer in ``out``.

    Adapters are merged in float32 and the result stored in the base checkpoint's dtype.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    policy, out = Path(policy), Path(out)
    if out.exists() and any(out.iterdir()):
        raise GlassrlError(f"--out {out}: exists and is not empty")
    if not is_adapter_dir(policy):
        if not (policy / "config.json").is_file():
            raise GlassrlError(f"{policy}: neither a LoRA adapter ({ADAPTER_CONFIG}) nor a model (config.json)")
        shutil.copytree(policy, out, dirs_exist_ok=True)
        return out
    peft = _peft()
    base = base_path(policy)
    stored = AutoConfig.from_pretrained(base, local_files_only=True).dtype or torch.float32
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, local_files_only=True)
    with _peft_quietly():
        merged = merge(peft.PeftModel.from_pretrained(model, policy)).to(stored)
    merged.save_pretrained(out)
    tokenizer_dir = policy if (policy / "tokenizer_config.json").is_file() else base
    AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True).save_pretrained(out)
    return out
