"""A model for the planner as a preset or a Hugging Face config.json, and what the strategy table says it
sends: the inputs of the step-time predictor (pytest_llmbench/planner/steptime.py) besides the device.
Standard library at import; transformers and torch only inside the functions that need them.
"""

from __future__ import annotations

# A config.json is data a user downloaded: read as untrusted input. Real ones are a few KiB (the
# largest, with quantisation tables, under 100 KiB); the bounds below are far past any model built.
MAX_CONFIG_BYTES = 4 * 2**20
MAX_NESTING = 32
# (keys, largest value): past these the shape is no model anyone trains, and the planner's per-layer
# arithmetic would allocate or overflow (10^9 layers: MemoryError; 10^30: OverflowError).
SHAPE_BOUNDS = (
    (("num_hidden_layers", "n_layers", "n_layer"), 4096),
    (("hidden_size", "d_model", "n_embd"), 1 << 18),
    (("num_attention_heads", "n_heads", "n_head", "num_key_value_heads"), 1 << 14),
    (("intermediate_size", "n_inner", "ffn_hidden_size"), 1 << 20),
    (("vocab_size",), 1 << 23),
    (("max_position_embeddings", "max_seq_len", "n_positions"), 1 << 27),
    (("head_dim", "multiple_of"), 1 << 14),
)
# Shape keys that are ratios (any finite number): MPT's MLP width is expansion_ratio x d_model, Llama's
# ffn_dim_multiplier scales its; 10^30 passed the integer bounds above and crashed inside torch.
RATIO_BOUNDS = (("expansion_ratio", 64.0), ("mlp_ratio", 64.0), ("ffn_dim_multiplier", 64.0))


def read_config(path: str) -> dict:
    """A Hugging Face config.json as a dict, or a ValueError naming the file and what is wrong. Read as
    data (harness/untrusted.py: a regular file, bounded, strict UTF-8 JSON with finite
    numbers), its nesting and its shape within MAX_NESTING and SHAPE_BOUNDS. ``path`` may be a model
    folder (a downloaded snapshot): its config.json is read. A multimodal config (Gemma 3, Llama 4,
    Qwen2.5-VL, Mistral 3) nests its language model under ``text_config``: that is the model the
    planner sizes (its vision tower is not counted), said by ``text_model_of``."""
    import os

    from harness.untrusted import UntrustedError, read_json

    if os.path.isdir(path) and not path.endswith(".json"):  # a model folder; a *.json folder is refused
        path = os.path.join(path, "config.json")
    try:
        data = read_json(path, MAX_CONFIG_BYTES, "a config.json")
    except UntrustedError as exc:
        raise ValueError(f"--model {path}: cannot read a config.json: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--model {path}: a config.json holds one JSON object")
    if _depth(data) > MAX_NESTING:
        raise ValueError(f"--model {path}: JSON nested deeper than {MAX_NESTING} levels; not a config.json")
    data = text_model_of(data, path)
    if not data.get("model_type") or not isinstance(data["model_type"], str):
        raise ValueError(
            f"--model {path}: no model_type: transformers cannot tell which architecture to build"
        )
    for keys, top in SHAPE_BOUNDS:
        for key in keys:
            value = data.get(key)
            if isinstance(value, bool) or (value is not None and not isinstance(value, int)):
                raise ValueError(f"--model {path}: {key} {value!r} is not an integer")
            if value is not None and not 0 < value <= top:
                raise ValueError(f"--model {path}: {key} {value} is outside 1..{top:,}, no model's shape")
    for key, top in RATIO_BOUNDS:
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value <= top):
            raise ValueError(f"--model {path}: {key} {value!r} is not a number in (0, {top:g}], "
                             f"no model's shape")
    return data


def text_model_of(data: dict, path: str) -> dict:
    """The language model of a config: ``text_config`` where a multimodal config nests one (with the
    outer config's vocabulary and tying where the inner one leaves them out), else the config."""
    inner = data.get("text_config")
    if inner is None:
        return data
    if not isinstance(inner, dict) or not isinstance(inner.get("model_type"), str):
        raise ValueError(f"--model {path}: text_config is not a config with a model_type")
    outer = {k: data[k] for k in ("vocab_size", "tie_word_embeddings") if k in data and k not in inner}
    return {**outer, **inner}


def _depth(value, level: int = 1) -> int:
    """How deep JSON containers nest in ``value`` (1: a flat object), stopping past MAX_NESTING."""
    if level > MAX_NESTING or not isinstance(value, (dict, list)):
        return level if isinstance(value, (dict, list)) else level - 1
    children = value.values() if isinstance(value, dict) else value
    return max((_depth(child, level + 1) for child in children), default=level)


def check_config(config: dict, path: str) -> None:
    """That transformers builds ``config`` (its model type known, its values accepted), else a ValueError."""
    from pytest_llmbench.planner import opcount

    try:
        cfg = opcount.hf_config(config)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a bad config
        raise ValueError(f"--model {path}: transformers cannot build this config: {exc}") from None
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if type(cfg) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        dropped = [k for k in ("auto_map", "trust_remote_code") if k in config]
        raise ValueError(
            f"--model {path}: transformers has no causal-LM class for model_type {config['model_type']!r}"
            + (f"; the config's {', '.join(dropped)} (custom code) is never run: a config is data"
               if dropped else "")
        )


def is_config_path(model: str) -> bool:
    import os

    return model.endswith(".json") or os.sep in model or os.path.isdir(model)


def spec_of_config(config: dict, name: str, **overrides):
    """The RunSpec shape closest to a Hugging Face config (what the memory planner and the strategy
    table's payloads read): llama, mistral and qwen2 as themselves; any other architecture as the
    project's GPT shape when its MLP is 4 x wide (MPT, GPT-2, ...), else as a llama shape of its width.
    The operators are counted on the config's own architecture (planner/opcount.py)."""
    from harness.spec import RunSpec

    def first(*keys, default=None):
        for key in keys:
            if config.get(key) is not None:
                return config[key]
        return default

    d = first("hidden_size", "d_model", "n_embd")
    heads = first("num_attention_heads", "n_heads", "n_head")
    layers = first("num_hidden_layers", "n_layers", "n_layer")
    vocab = first("vocab_size")
    if not all(isinstance(v, int) and v > 0 for v in (d, heads, layers, vocab)):
        raise ValueError(
            f"--model {name}: the config names no positive width, heads, layers and vocab size "
            f"(hidden_size/d_model, num_attention_heads/n_heads, num_hidden_layers/n_layers, "
            f"vocab_size)"
        )
    ffn = first("intermediate_size", "n_inner", "ffn_hidden_size")
    if ffn is None and config.get("expansion_ratio"):
        ffn = int(config["expansion_ratio"] * d)
    ffn = ffn or 4 * d
    kind = config.get("model_type")
    block = first("max_position_embeddings", "max_seq_len", "n_positions", default=2048)
    shape = dict(n_layer=layers, n_head=heads, n_embd=d, vocab_size=vocab, block_size=max(block, 1))
    if kind in ("llama", "mistral", "qwen2"):
        shape.update(
            arch=kind,
            n_kv_head=first("num_key_value_heads", default=heads),
            ffn_hidden=ffn,
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
    elif ffn == 4 * d:
        shape.update(arch="gpt", n_kv_head=0, ffn_hidden=0, tie_embeddings=True)
    else:
        shape.update(
            arch="llama",
            n_kv_head=heads,
            ffn_hidden=ffn,
            tie_embeddings=bool(config.get("tie_word_embeddings", True)),
        )
    overrides.setdefault("block_size", max(shape["block_size"], overrides.get("seq_len", 1)))
    return RunSpec(model=name, **{**shape, **overrides})


_PROFILES: dict = {}


def operator_profile(config: dict | None, spec, *, micro_batch: int, seq_len: int):
    """planner/opprofile.py's profile of the config (or, with None, the spec's own model), cached."""
    import json

    from pytest_llmbench.planner import opprofile

    key = (json.dumps(config, sort_keys=True) if config else spec.model, micro_batch, seq_len)
    if key not in _PROFILES:
        if config is not None:
            _PROFILES[key] = opprofile.profile(config, micro_batch=micro_batch, seq_len=seq_len)
        else:
            _PROFILES[key] = opprofile.profile_spec(spec.replace(micro_batch=micro_batch, seq_len=seq_len))
    return _PROFILES[key]
