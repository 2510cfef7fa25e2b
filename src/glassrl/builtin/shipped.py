"""The embedded models' weights as the package ships them: built once (seed 0, the specs of
:mod:`glassrl.models.default_model`) and copied from the package on first use, so that every machine
starts from the same weights in seconds, instead of building them (2 to 25 minutes, and a build
differs by CPU: its SFT's float sums do).

``weights/<version>/`` holds what a build writes (config, safetensors, tokenizer, ``glassrl.json``
with the build's held-out figures), its ``sft_data.jsonl`` gzipped. Each file's sha256 is pinned
here (:data:`SHIPPED`): :func:`install` checks every byte before it copies a file, and a package
whose copy differs is refused with a line that says so. ``glassrl init-model --force`` still builds
the model on this machine and prints its figures beside the shipped ones (:func:`compare`).

The shipped weights are used when the seed is 0 and the shipped ``glassrl.json`` names the current
spec; a spec changed since (another size, another mix) builds instead, and the test over
:data:`SHIPPED` fails until the weights are built again and shipped (``tools/ship_models.py``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from glassrl.errors import GlassrlError
from glassrl.models.default_model import MARKER, AgentModelSpec, DefaultModelSpec, ResearchModelSpec, spec_json

WEIGHTS = Path(__file__).parent / "weights"
SFT_DATA = "sft_data.jsonl"
# version -> file name -> sha256; written by tools/ship_models.py (built 2026-11-28, torch 2.13.0+cpu,
# transformers 5.24.0, one thread: built in 138 s, 369 s and 1255 s on a 2-core machine; default-rg-v2,
# glassrl.builtin.reasoning_gym_model, on 2026-11-29 in 310 s under a load average of ~3: 17 MB of float32)
SHIPPED: dict[str, dict[str, str]] = {
    "default-v2": {
        "chat_template.jinja": "bb90ee0b35e76d10b5d88d0ff658beb0801e3d4bc6e0a41f26740b220f814438",
        "config.json": "23b899134a85e315e61cd1e94a6f097bfc284acd5cd240f8cfed8a0296f4f00b",
        "generation_config.json": "b3774c2596ef62cd2f3a08561715f3c8b423448d4f03f89fc62181c461218360",
        "glassrl.json": "f590110e467f657b04d5acac738dc1f80a240b3279bd51fbfd1813316e30bb94",
        "metrics.jsonl": "cc1f2d7d8c3812e597630f1c3d0a8a38b3f98a5398867a4900791a037653b635",
        "model.safetensors": "c00331ca13c9dc40de7075ad338d16e2d8d0daffafd3d47159d78fe8a88dc865",
        "sft_data.jsonl.gz": "fd7e61b01c92b2790628e8ba2a61bc11d72171873d2bd5d8cf0eccd38d92bb0d",
        "tokenizer.json": "747fc61915c051b83f4926236d3a3e06307be1097d24909723aa374db6fef195",
        "tokenizer_config.json": "8e5b22351b96f5777ebae1f3aecb72cf712917cf65325e11c5ea331cd9ff2dd1",
    },
    "default-agent-v1": {
        "chat_template.jinja": "bb90ee0b35e76d10b5d88d0ff658beb0801e3d4bc6e0a41f26740b220f814438",
        "config.json": "64e0033d82f7eec6f68a5ba2692a5f20dbb9c1ea3f63da9a1a84a21b31b217d9",
        "generation_config.json": "b3774c2596ef62cd2f3a08561715f3c8b423448d4f03f89fc62181c461218360",
        "glassrl.json": "cd68fd60817ad08eb036e9ec25caa896e3b6fd226d7b43921bcd112769671979",
        "metrics.jsonl": "c5598baa7c6b6da091c9edcc18aafccb8d88d66c325f7c3b5590db750f113203",
        "model.safetensors": "5c72ca30ac1a950ce5ed06485400cfa684988ab85a284344916de97fb842b82f",
        "sft_data.jsonl.gz": "7987c25362ea58e2a081126ee97ee2d475bdf01dabdedb173a73254a929bcef9",
        "tokenizer.json": "3a25c57133478d9c98438db3b759f0f751e183a44221dfdb0177cc5581848194",
        "tokenizer_config.json": "97657630aac8adc5658acf651cdfb38c2dc6d16f66acd79e45acb1b031bea855",
    },
    "default-research-v1": {
        "chat_template.jinja": "bb90ee0b35e76d10b5d88d0ff658beb0801e3d4bc6e0a41f26740b220f814438",
        "config.json": "b88421013ea52027678e2e05b206a876eb3631806d050e3c8bde770160794a37",
        "generation_config.json": "b3774c2596ef62cd2f3a08561715f3c8b423448d4f03f89fc62181c461218360",
        "glassrl.json": "e64702bd09019ad741441375f9f436d5d6c10acb3dbb440712d3f21d78fa1e7e",
        "metrics.jsonl": "97a716acf8a8ea73b857f56651cf2c958aa95e42b470722b49ef3e3131c20ad5",
        "model.safetensors": "063e353c854bb8cf6d707ef3813f3f2fd8db592ff4538133045dca352f34dcf7",
        "sft_data.jsonl.gz": "9153d0a4bb2cb4aee5c4390ad22863dfe1dd05c74ef15b46d8f2d2029599915f",
        "tokenizer.json": "1dd1494b512ca8e4dae298c8cc470208cf1154dbc2f0e1fe064f6400a7a64269",
        "tokenizer_config.json": "c868afc6a36db95fa56c25552bfe2bce293480cbee66b99ea7e180422d64c0e4",
    },
    "default-rg-v2": {
        "chat_template.jinja": "bb90ee0b35e76d10b5d88d0ff658beb0801e3d4bc6e0a41f26740b220f814438",
        "config.json": "d1dd46e965d39bc81c943297068f64dd2a82f489632d731c514e3eab4bb89494",
        "generation_config.json": "b3774c2596ef62cd2f3a08561715f3c8b423448d4f03f89fc62181c461218360",
        "glassrl.json": "22a96bd896c941a15ea0186c8972f0d873dc00533ddff2ae5d88fb079f1d303b",
        "metrics.jsonl": "7c66a56f26e4ea02bf70c5ebc3593a4a81311df804d873914643883d6889fa60",
        "model.safetensors": "dace077b19a3996304922aacbca19497fcc6c6e908d583a8c64ecb13f112195f",
        "sft_data.jsonl.gz": "72b4bacd84eb816b9477226ae4abe7fcc765c3a6b2ebe55a345ea247367e89ab",
        "tokenizer.json": "c08178974e945dc2cc4a90d6111bdda5b0879603430455c73d1360baba83bf8d",
        "tokenizer_config.json": "8e5b22351b96f5777ebae1f3aecb72cf712917cf65325e11c5ea331cd9ff2dd1",
    },
}


def shipped_dir(version: str, seed: int, spec: DefaultModelSpec | AgentModelSpec | ResearchModelSpec) -> Path | None:
    """The package's weights of ``version`` when they are the model asked for (seed 0, ``spec``); else None."""
    if seed != 0 or version not in SHIPPED:
        return None
    path = WEIGHTS / version
    try:
        info = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return path if info.get("seed") == 0 and info.get("spec") == spec_json(spec) else None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def install(version: str, source: Path, out: Path) -> None:
    """Copy the shipped files of ``version`` from ``source`` into the new directory ``out``, each
    checked against its pinned sha256 first; ``*.gz`` files are written unzipped."""
    out.mkdir(parents=True)
    for name, pinned in SHIPPED[version].items():
        data = (source / name).read_bytes()
        got = hashlib.sha256(data).hexdigest()
        if got != pinned:
            raise GlassrlError(
                f"{source / name}: sha256 {got[:16]}… is not the pinned {pinned[:16]}…: the package's copy of "
                f"the model {version} is damaged; reinstall glassrl, or build the model here with "
                "glassrl init-model --force"
            )
        if name.endswith(".gz"):
            (out / name.removesuffix(".gz")).write_bytes(gzip.decompress(data))
        else:
            (out / name).write_bytes(data)


def is_shipped(version: str, path: Path) -> bool:
    """Whether ``path`` holds the shipped weights of ``version`` (its safetensors' sha256 is the pinned one)."""
    pinned = SHIPPED.get(version, {}).get("model.safetensors")
    weights = path / "model.safetensors"
    return pinned is not None and weights.is_file() and sha256(weights) == pinned


def shipped_info(version: str) -> dict | None:
    """The shipped build's ``glassrl.json`` (its held-out figures), or None when none is shipped."""
    if version not in SHIPPED:
        return None
    return json.loads((WEIGHTS / version / MARKER).read_text(encoding="utf-8"))


def compare(version: str, built: dict, path: Path) -> list[str]:
    """Lines that set a build's figures (``built``: its glassrl.json) beside the shipped build's:
    whether the weights are the same bytes, then each held-out figure, shipped → here."""
    shipped = shipped_info(version)
    if shipped is None or built.get("spec") != shipped.get("spec"):
        return []
    same = is_shipped(version, path)
    lines = [
        "  the shipped weights: "
        + (
            "the same bytes as this build"
            if same
            else "other bytes than this build (the float sums of SFT differ by CPU)"
        )
    ]
    for key, figures in built.items():
        if not key.startswith(("heldout_", "train_")) or not isinstance(figures, dict):
            continue
        theirs = shipped.get(key, {})
        pairs = [
            f"{name} {theirs[name]:.3g} → {value:.3g}"
            for name, value in figures.items()
            if isinstance(value, float) and isinstance(theirs.get(name), float)
        ]
        if pairs:
            lines.append(f"  {key} (shipped → this build): " + ", ".join(pairs))
    return lines
