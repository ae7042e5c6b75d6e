"""A compact description of a written checkpoint's layout (for reports and
for reading what a tool wrote): its quantization_config, layer 0's tensors
of expert 0, the router and q_proj, its files beside the weights, and the
top-level config.json keys that differ from the bf16 base's."""

from __future__ import annotations

import json
import re
from pathlib import Path

from safetensors import safe_open

PICK = re.compile(
    r"^model\.layers\.0\.(mlp\.experts\.0\.(gate|up|down)_proj|mlp\.gate|"
    r"self_attn\.q_proj)[.]"
)
STANDARD_FILES = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors",
    ".real-checkpoint.json",
}


def _trim(obj: object, limit: int = 6) -> object:
    if isinstance(obj, dict):
        return {k: _trim(v, limit) for k, v in obj.items()}
    if isinstance(obj, list) and len(obj) > limit:
        return [*obj[:limit], f"... {len(obj) - limit} more"]
    return obj


def tensor_layout(model_dir: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118
                if PICK.match(name) or name.startswith(
                    "model.layers.0.mlp.experts.gate_up"
                ):
                    sl = fh.get_slice(name)
                    out[name] = f"{sl.get_dtype()} {list(sl.get_shape())}"
    # Fused-expert layouts (3D tensors) do not match PICK: list layer 0's MLP.
    if not any(".experts." in k for k in out):
        for f in sorted(model_dir.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():  # noqa: SIM118
                    if name.startswith("model.layers.0.mlp.experts"):
                        sl = fh.get_slice(name)
                        out[name] = f"{sl.get_dtype()} {list(sl.get_shape())}"
    return dict(sorted(out.items()))


def config_diff(model_dir: Path, base_dir: Path) -> dict[str, object]:
    cfg = json.loads((model_dir / "config.json").read_text())
    base = json.loads((base_dir / "config.json").read_text())
    diff: dict[str, object] = {}
    for key in sorted(set(cfg) | set(base)):
        if key == "quantization_config":
            continue
        if cfg.get(key, "<absent>") != base.get(key, "<absent>"):
            diff[key] = f"{base.get(key, '<absent>')!r} -> {cfg.get(key, '<absent>')!r}"
    return diff


def summarize(model_dir: Path, base_dir: Path) -> str:
    cfg = json.loads((model_dir / "config.json").read_text())
    lines = [f"## {model_dir}"]
    qcfg = cfg.get("quantization_config")
    lines.append("quantization_config: " + json.dumps(_trim(qcfg), sort_keys=True))
    lines.append("layer 0 tensors:")
    lines += [f"  {k}: {v}" for k, v in tensor_layout(model_dir).items()]
    extra = sorted(
        p.name
        for p in model_dir.iterdir()
        if p.is_file() and p.name not in STANDARD_FILES
    )
    lines.append(f"extra files: {extra}")
    for name in extra:
        if name.endswith(".json"):
            text = json.dumps(_trim(json.loads((model_dir / name).read_text())))
            lines.append(f"  {name}: {text[:600]}")
    lines.append(
        f"config keys differing from the base: {config_diff(model_dir, base_dir)}"
    )
    return "\n".join(lines)
