"""Load the four roles from a local Hugging Face checkpoint directory.

- actor and reference: :func:`load_causal_lm` (``AutoModelForCausalLM``);
- critic and reward model: :func:`load_scalar_model`, a model giving one scalar
  per position, read with :func:`scalar_outputs` as ``(B, L)`` where ``L`` is the
  full sequence length (prompt + response).

Two scalar heads (the registry ``SCALAR_HEADS``):

- ``"token-classification"``: ``AutoModelForTokenClassification`` with
  ``num_labels=1`` — the backbone plus a ``score`` Linear(H, 1);
- ``"value-head"``: :class:`~glassrl.models.value_head.CausalLMWithValueHead`,
  the whole causal LM plus a ``v_head`` Linear(H, 1).

The critic is initialised from the actor with ``load_scalar_model(actor_path)``
(plain causal-LM checkpoint: backbone copied, head fresh) or from the reward
model with ``load_scalar_model(rm_path)`` (backbone and head copied). A
checkpoint that already carries a scalar head must be loaded with the same
``head``; a mismatch is an error rather than a silently dropped head.

Seeding: a fresh head is drawn from torch's global RNG (normal, std =
``config.initializer_range``, bias 0 — the Hugging Face ``_init_weights`` rule,
used for both heads), so ``torch.manual_seed(s)`` before loading makes it
reproducible.

No model is ever downloaded. A model is a local directory holding a ``config.json``,
or the id of a model already in the local Hugging Face cache (``Qwen/Qwen2.5-0.5B-Instruct``:
:func:`resolve_model_path`, with HF_HUB_OFFLINE semantics); every loader here takes both.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from glassrl.errors import GlassrlError
from glassrl.models.logprobs import position_ids_from_mask
from glassrl.models.value_head import VALUE_HEAD_MARKER, CausalLMWithValueHead

logger = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> ``cuda`` when a GPU is visible, else ``cpu``; otherwise ``torch.device(name)``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise GlassrlError(f"device: {name!r} is not a device; use 'auto', 'cpu', 'cuda' or 'cuda:N'") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise GlassrlError(f"device: {name!r} asked for, but no CUDA device is visible; use 'auto' or 'cpu'")
    return device


def resolve_dtype(name: str, device: torch.device | str) -> torch.dtype:
    """``"auto"`` -> float32 on CPU, bfloat16 on CUDA; else one of ``DTYPES``."""
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if name not in DTYPES:
        raise GlassrlError(f"dtype: unknown {name!r}; valid: {', '.join(['auto', *DTYPES])}")
    return DTYPES[name]


def resolve_model_path(name: str | Path, key: str | None = None) -> Path:
    """The directory to load the model ``name`` from: ``name`` itself when it is a directory,
    else the snapshot of the Hugging Face hub id ``name`` in the local cache (HF_HUB_CACHE, else
    HF_HOME/hub: ``models--org--name/snapshots/<refs/main>``). Nothing is downloaded: an id the
    cache lacks is a GlassrlError saying so. ``key`` names the config key in the message."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    from huggingface_hub.utils import validate_repo_id

    path = Path(name)
    if path.is_dir():
        return path
    where = f"{key} = {str(name)!r}" if key else repr(str(name))
    try:
        validate_repo_id(str(name))
    except HFValidationError:
        raise GlassrlError(f"{where}: no such directory") from None
    try:
        return Path(snapshot_download(str(name), local_files_only=True))
    except LocalEntryNotFoundError:
        raise GlassrlError(
            f"{where}: neither a directory nor a model in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); glassrl downloads nothing at run time: fetch it once "
            f"(`hf download {name}`) or give a checkpoint directory"
        ) from None


def _checkpoint_dir(path: str | Path) -> Path:
    path = resolve_model_path(path)
    if not (path / "config.json").is_file():
        raise GlassrlError(f"{path}: not a Hugging Face checkpoint directory (no config.json)")
    return path


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """``AutoTokenizer`` from a local directory, its special tokens checked against the model's
    embedding there (:func:`fit_special_tokens`); ``pad_token`` falls back to ``eos_token``.

    Padding side is left to callers (prompts are left-padded, responses right-padded).
    """
    path = resolve_model_path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as err:
        raise GlassrlError(f"{path}: cannot load a tokenizer: {err}") from None
    rows = embedding_rows(path)
    note = fit_special_tokens(tokenizer, rows, str(path))
    if note is not None:
        logger.warning("%s", note)
    return tokenizer


def embedding_rows(path: Path) -> int | None:
    """Rows of the input embedding of the model at ``path`` (its config's vocab_size); None
    when ``path`` holds a tokenizer without a model."""
    if not (path / "config.json").is_file():
        return None
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        return None  # not a config transformers reads: the model's loader says why
    return getattr(config.get_text_config(), "vocab_size", None)


def fit_special_tokens(tokenizer, rows: int | None, where: str) -> str | None:
    """Make the pad token one the model can embed; returns a line saying which was chosen (None
    when the tokenizer's own was kept). A tokenizer without a pad token (Llama's) pads with its EOS.

    A tokenizer without a pad token, or whose pad id is not below ``rows`` (Qwen2's tokenizer
    without one gets ``<|endoftext|>`` added, id = its vocabulary size: an IndexError in
    generate), pads with its EOS. GlassrlError (one line) when the EOS, or another special token
    the prompts or the chat template use, lies outside the embedding: no safe choice exists.
    ``rows`` None (no model beside the tokenizer): only a missing pad is filled in."""

    def fits(token_id: int | None) -> bool:
        return token_id is not None and (rows is None or 0 <= token_id < rows)

    size = f"the model's embedding has {rows} rows" if rows is not None else ""
    eos = tokenizer.eos_token
    if not fits(tokenizer.eos_token_id):
        if eos is None:
            raise GlassrlError(f"{where}: tokenizer has neither a usable pad_token nor an eos_token")
        raise GlassrlError(
            f"{where}: eos_token {eos!r} has id {tokenizer.eos_token_id}, but {size}: the model can never "
            "end a response; give a tokenizer whose special tokens are in the model's vocabulary"
        )
    note, pad = None, tokenizer.pad_token
    if pad is None or not fits(tokenizer.pad_token_id):
        if pad is not None:
            note = (
                f"{where}: pad_token {pad!r} has id {tokenizer.pad_token_id}, but {size}; "
                f"padding with eos_token {eos!r} (id {tokenizer.eos_token_id}) instead"
            )
        else:  # a Llama tokenizer has none (issue 44: this pad was chosen without a word)
            note = (
                f"{where}: the tokenizer has no pad_token; padding with eos_token {eos!r} "
                f"(id {tokenizer.eos_token_id}), masked out of every number"
            )
        tokenizer.pad_token = eos
    dropped = {pad} - {tokenizer.pad_token}  # no longer used: the token it stood for needs no row
    outside = [
        (token, token_id)
        for token, token_id in zip(tokenizer.all_special_tokens, tokenizer.all_special_ids)
        if token not in dropped and not fits(token_id)
    ]
    unused = [(token, token_id) for token, token_id in outside if not _reachable(tokenizer, token)]
    if len(unused) < len(outside):
        token, token_id = next(pair for pair in outside if pair not in unused)
        raise GlassrlError(
            f"{where}: special token {token!r} has id {token_id}, but {size}, and {_reachable(tokenizer, token)}; "
            "give a tokenizer whose special tokens are in the model's vocabulary"
        )
    if unused:
        # transformers 5 adds <|endoftext|> to a Qwen2 tokenizer as its unk token, id = its vocabulary size
        names = ", ".join(f"{_role(tokenizer, token)} {token!r} (id {token_id})" for token, token_id in unused)
        unused_note = (
            f"{where}: {names} lies beyond the model's {rows} embedding rows, but no input reaches it (data text "
            "is read as text, the chat template does not write it, the tokenizer's model never emits it): left unused"
        )
        note = unused_note if note is None else f"{note}; {unused_note}"
        dropped |= {token for token, _ in unused}
    beyond = [t for i, t in tokenizer.added_tokens_decoder.items() if rows is not None and i >= rows]
    if rows is not None and len(tokenizer) - rows > sum(t.content in dropped for t in beyond):
        raise GlassrlError(
            f"{where}: the tokenizer has {len(tokenizer)} tokens, but {size}: text holding the ones "
            "beyond cannot be embedded; give the model's own tokenizer"
        )
    return note


def _reachable(tokenizer, token: str) -> str | None:
    """How an input can hold the special ``token`` (for the error), or None when none can: it is the
    EOS, pad or BOS glassrl writes, the chat template writes it, the post-processor adds it, or the
    tokenizer's model emits it for text it cannot read (its unknown token). Data text never becomes a
    special token (glassrl.data.formatting), and the model cannot sample an id beyond its rows."""
    if token in (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token):
        return "glassrl writes it (eos, pad or bos)"
    if token in str(getattr(tokenizer, "chat_template", None) or ""):
        return "the chat template writes it"
    if tokenizer.convert_tokens_to_ids(token) in tokenizer("", add_special_tokens=True)["input_ids"]:
        return "the tokenizer adds it to every text"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(backend.model, "unk_token", None) == token:
        return "the tokenizer may emit it for text its vocabulary lacks" if backend else "the tokenizer may emit it"
    return None


def _role(tokenizer, token: str) -> str:
    """``unk_token``, ``eos_token``, … or ``special token``: what ``token`` stands for in the tokenizer."""
    return next((name for name, value in tokenizer.special_tokens_map.items() if value == token), "special token")


def pad_id(tokenizer) -> int:
    """The id that pads prompts (left) and responses (right): the tokenizer's pad token, else its EOS
    (which :func:`load_tokenizer` makes the pad token of a tokenizer that has none). Padding is masked
    out everywhere, so its value never enters a number."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def load_causal_lm(path: str | Path, *, dtype: str = "auto", device: str = "auto") -> PreTrainedModel:
    """Actor or reference model (``AutoModelForCausalLM``), in eval mode; trainers call ``.train()``."""
    path = _checkpoint_dir(path)
    dev = resolve_device(device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype, dev), local_files_only=True)
    return model.to(dev).eval()


def _load_token_classification(path: Path, dtype: torch.dtype, device: torch.device) -> nn.Module:
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if _is_token_classification(config) and config.num_labels != 1:
        raise GlassrlError(
            f"{path}: token-classification checkpoint has {config.num_labels} labels; a scalar model needs 1"
        )
    config.num_labels = 1
    # Dropout on the score head would make values noisy in training; verl sets
    # classifier_dropout = 0 for its critic (verl, workers/fsdp_workers.py, critic init).
    config.classifier_dropout = 0.0
    fresh = not _is_token_classification(config)
    with quiet_load_report() if fresh else contextlib.nullcontext():  # the head is new on purpose
        model = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=dtype, local_files_only=True)
    return model.to(device)


@contextlib.contextmanager
def quiet_load_report() -> Iterator[None]:
    """transformers' warnings off while a model loads: its LOAD REPORT calls a fresh scalar head's
    weights MISSING ("Consider training on your downstream task"), which is what glassrl does; the
    caller says so in its own line (:func:`has_scalar_head`)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)


def has_scalar_head(path: str | Path) -> bool:
    """Whether the checkpoint at ``path`` carries a scalar head (else :func:`load_scalar_model` draws a fresh one)."""
    return _checkpoint_head(_checkpoint_dir(path)) is not None


SCALAR_HEADS: dict[str, Callable[[Path, torch.dtype, torch.device], nn.Module]] = {
    "token-classification": _load_token_classification,
    "value-head": CausalLMWithValueHead.from_pretrained,
}


def _is_token_classification(config) -> bool:
    return any(arch.endswith("ForTokenClassification") for arch in (config.architectures or []))


def _checkpoint_head(path: Path) -> str | None:
    """The scalar head a checkpoint already carries, or None for a plain (causal-LM) checkpoint."""
    if (path / VALUE_HEAD_MARKER).is_file():
        return "value-head"
    if _is_token_classification(AutoConfig.from_pretrained(path, local_files_only=True)):
        return "token-classification"
    return None


def load_scalar_model(
    path: str | Path, *, head: str = "token-classification", dtype: str = "auto", device: str = "auto"
) -> nn.Module:
    """Critic or reward model giving one scalar per position; read it with :func:`scalar_outputs`.

    ``path`` is a causal-LM checkpoint (fresh head, seeded by torch's RNG) or a
    scalar checkpoint saved with the same ``head`` (head loaded). Eval mode.
    """
    if head not in SCALAR_HEADS:
        raise GlassrlError(f"head: unknown {head!r}; valid: {', '.join(SCALAR_HEADS)}")
    path = _checkpoint_dir(path)
    found = _checkpoint_head(path)
    if found is not None and found != head:
        raise GlassrlError(f"{path}: holds a {found!r} scalar model; load it with head={found!r}, not {head!r}")
    dev = resolve_device(device)
    return SCALAR_HEADS[head](path, resolve_dtype(dtype, dev), dev).eval()


def scalar_outputs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-position scalars ``(B, L)`` from either head type, in float32.

    ``position_ids`` default to ``(attention_mask.cumsum(-1) - 1).clamp(min=0)``
    so that left-padded rows get the same positions as unpadded ones. ``attention_mask``
    None with ``position_ids``: packed sequences (glassrl.models.packing); 4D: a layout's own mask,
    passed as it is (glassrl.models.shared_prefix).
    """
    if position_ids is None:
        position_ids = position_ids_from_mask(attention_mask)
    if attention_mask is not None and attention_mask.ndim == 2:
        attention_mask = attention_mask.long()
    if isinstance(model, CausalLMWithValueHead):
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)  # (B, L)
    else:
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).logits  # (B, L, 1)
        out = logits.squeeze(-1)  # (B, L)
    return out.float()
