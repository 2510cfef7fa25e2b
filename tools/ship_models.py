"""Ship the embedded models' weights with the package: copy each built model from
``$GLASSRL_HOME/models/<version>`` (built with ``glassrl init-model``, ``--agent``, ``--agent
research``, ``--agent reasoning-gym``, seed 0) into ``src/glassrl/builtin/weights/<version>/``, its
``sft_data.jsonl`` gzipped (deterministic: no name, no time in the header), and pin every file's sha256 in
``src/glassrl/builtin/shipped.py`` (its ``SHIPPED = {...}`` line rewritten).

    GLASSRL_HOME=/tmp/models glassrl init-model && ... && GLASSRL_HOME=/tmp/models python tools/ship_models.py
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

from glassrl.builtin.reasoning_gym_model import RG_VERSION
from glassrl.models.default_model import AGENT_VERSION, MARKER, RESEARCH_VERSION, VERSION, default_model_dir

ROOT = Path(__file__).resolve().parent.parent
WEIGHTS = ROOT / "src" / "glassrl" / "builtin" / "weights"
SHIPPED_PY = ROOT / "src" / "glassrl" / "builtin" / "shipped.py"
FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "metrics.jsonl",
    MARKER,
)


def ship(version: str) -> dict[str, str]:
    source, out = default_model_dir(version), WEIGHTS / version
    info = json.loads((source / MARKER).read_text(encoding="utf-8"))
    if info["seed"] != 0:
        sys.exit(f"{source}: built from seed {info['seed']}; the shipped weights are seed 0's")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for name in FILES:
        shutil.copyfile(source / name, out / name)
    (out / "sft_data.jsonl.gz").write_bytes(gzip.compress((source / "sft_data.jsonl").read_bytes(), 9, mtime=0))
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())}


def main(versions: list[str]) -> None:
    pins = {v: ship(v) for v in versions}
    text = SHIPPED_PY.read_text(encoding="utf-8")
    line = "SHIPPED: dict[str, dict[str, str]] = " + json.dumps(pins, indent=4) + "\n"
    text, n = re.subn(
        r"SHIPPED: dict\[str, dict\[str, str\]\] = \{.*?\n\}\n|SHIPPED: dict\[str, dict\[str, str\]\] = \{\}\n",
        line,
        text,
        flags=re.S,
    )
    if n != 1:
        sys.exit(f"{SHIPPED_PY}: no SHIPPED line to rewrite")
    SHIPPED_PY.write_text(text, encoding="utf-8")
    size = sum(p.stat().st_size for v in versions for p in (WEIGHTS / v).iterdir())
    print(f"shipped {', '.join(versions)}: {size / 1e6:.1f} MB in {WEIGHTS}")


if __name__ == "__main__":
    main(sys.argv[1:] or [VERSION, AGENT_VERSION, RESEARCH_VERSION, RG_VERSION])
