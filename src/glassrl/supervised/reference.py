"""Reference log-probs of the preference trainers: computed once, before the first step, and
cached with the run.

π_ref is frozen, so log π_ref(a_i|s_i) of every response token of the data is a constant of the
run: computing it once costs one forward pass over the data, where computing it every step would
cost one per step (TRL's ``precompute_ref_log_probs``). It is kept in memory and in
``output_dir/reference_logprobs.safetensors``: per group of sequences (``train/chosen``,
``eval/rejected``, ...) the log-probs of all their response tokens end to end (float32) and the
offsets where each sequence starts (``<group>/offsets``, int64, one more than the sequences);
the file's metadata holds a fingerprint, the sha256 of the reference's identity and every
sequence's token ids. A resumed run reads the file back when the fingerprint matches and
computes it again otherwise (its start-up line says which).

Shapes: N sequences of a group, L_n response tokens of sequence n, B a batch, T its response width.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from glassrl.data.collate import collate
from glassrl.models.logprobs import response_logprobs
from glassrl.models.precision import compute_precision
from glassrl.run.atomic import disk_errors

FILE = "reference_logprobs.safetensors"
Sequences = Sequence[tuple[list[int], list[int]]]  # (prompt_ids, response_ids)


def fingerprint(identity: dict, groups: dict[str, Sequences]) -> str:
    """sha256 of the reference's ``identity`` (its checkpoint, precision) and every group's token ids."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode())
    for name in sorted(groups):
        digest.update(name.encode())
        for prompt, response in groups[name]:
            digest.update(json.dumps([prompt, response]).encode())
    return digest.hexdigest()


@torch.no_grad()
def sequence_logprobs(
    model: torch.nn.Module, sequences: Sequences, *, batch_size: int, pad_id: int, dtype: torch.dtype
) -> list[torch.Tensor]:
    """log π(a_i|s_i) of each sequence's response tokens, (L_n,) float32 on CPU each, in ``batch_size`` chunks."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out: list[torch.Tensor] = []
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        batch = collate(chunk, pad_id)
        with compute_precision(device, dtype):
            logprobs, _ = response_logprobs(
                model,
                batch["input_ids"].to(device),
                batch["attention_mask"].to(device),
                batch["response_mask"].shape[1],
            )  # (B, T)
        out += [logprobs[b, : len(response)].float().cpu() for b, (_, response) in enumerate(chunk)]
    model.train(was_training)
    return out


class ReferenceLogprobs:
    """The cached log π_ref of each group's sequences; :meth:`batch` pads a batch of them."""

    def __init__(self, groups: dict[str, list[torch.Tensor]]) -> None:
        self.groups = groups

    def batch(self, group: str, indices: Sequence[int], width: int, device: torch.device) -> torch.Tensor:
        """log π_ref (B, T = ``width``) of sequences ``indices`` of ``group``, right-padded with 0
        (the collate layout: response token i at column i)."""
        out = torch.zeros((len(indices), width), dtype=torch.float32)
        for row, index in enumerate(indices):
            values = self.groups[group][index]
            out[row, : len(values)] = values
        return out.to(device)

    def save(self, path: Path, key: str) -> None:
        tensors = {}
        for name, rows in self.groups.items():
            lengths = torch.tensor([0] + [len(r) for r in rows], dtype=torch.int64)
            tensors[name] = torch.cat(rows) if rows else torch.zeros(0)
            tensors[f"{name}/offsets"] = lengths.cumsum(0)
        tmp = path.with_name(f".{path.name}.tmp")
        with disk_errors(str(path), path.parent):
            path.parent.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(tmp), metadata={"fingerprint": key})
            tmp.replace(path)

    @classmethod
    def load(cls, path: Path, key: str) -> ReferenceLogprobs | None:
        """The cache in ``path`` when its fingerprint is ``key``; None when absent, unreadable or stale."""
        try:
            with safe_open(str(path), framework="pt") as f:
                if (f.metadata() or {}).get("fingerprint") != key:
                    return None
            tensors = load_file(str(path))
        except (OSError, SafetensorError):
            return None
        groups = {}
        for name in [n for n in tensors if not n.endswith("/offsets")]:
            offsets = tensors[f"{name}/offsets"].tolist()
            flat = tensors[name]
            groups[name] = [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
        return cls(groups)


def cached_reference(
    out: Path,
    groups: dict[str, Sequences],
    identity: dict,
    compute: Callable[[Sequences], list[torch.Tensor]],
    resume: bool,
) -> tuple[ReferenceLogprobs, str]:
    """The reference log-probs of ``groups`` (``compute(sequences) -> [(L_n,)]`` per group), read
    from ``out``'s cache when resuming with a matching fingerprint, else computed and written there;
    with a line saying which."""
    path = Path(out) / FILE
    key = fingerprint(identity, groups)
    if resume and (cached := ReferenceLogprobs.load(path, key)) is not None:
        return cached, f"reference log-probs: read from {path}"
    reference = ReferenceLogprobs({name: compute(seqs) for name, seqs in groups.items()})
    reference.save(path, key)
    count = sum(len(seqs) for seqs in groups.values())
    why = " (the cache did not match this run's data and reference)" if resume else ""
    return reference, f"reference log-probs: computed once for {count} sequences{why}, cached in {path}"
