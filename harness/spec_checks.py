"""How a RunSpec's fields are checked (harness/spec.py): whole numbers in range, finite numbers, a choice
among the known ones, each failure a SpecError naming the field; and the one place a stored spec's
strategy may be a name this process's table does not know (``reading_stored``). Standard library only.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any

from harness.recompute import PARTS as RECOMPUTE
from harness.variants import VARIANTS


class SpecError(ValueError):
    """A spec field is invalid. The message names the field."""


def require_int(spec: Any, name: str, *, minimum: int) -> None:
    value = getattr(spec, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{name}: {value!r} is not an integer")
    if value < minimum:
        raise SpecError(f"{name}: {value} must be >= {minimum}")


def require_number(spec: Any, name: str, *, positive: bool) -> None:
    value = getattr(spec, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{name}: {value!r} is not a number")
    if not math.isfinite(value):
        raise SpecError(f"{name}: {value!r} is not a finite number")
    if value < 0 or (positive and value == 0):
        raise SpecError(f"{name}: {value} must be {'> 0' if positive else '>= 0'}")


# Registries are process state; stored data is not (docs/ARCHITECTURE.md): while a stored file is read,
# a strategy or instrument the tables do not know (a plugin's, its package absent here) stays a name.
_STORED = contextvars.ContextVar("llmbench_reading_stored", default=False)


@contextlib.contextmanager
def reading_stored() -> Iterator[None]:
    """Within: a spec's strategy and instruments need not be in this process's tables (a stored
    result's, whose plugin may be absent here)."""
    token = _STORED.set(True)
    try:
        yield
    finally:
        _STORED.reset(token)


def stored_now() -> bool:
    """Whether a stored result is being read (within ``reading_stored``)."""
    return _STORED.get()


def require_choice(spec: Any, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(spec, name)
    if name == "strategy" and _STORED.get() and isinstance(value, str) and value:
        return
    if value not in choices:
        raise SpecError(f"{name}: unknown value {value!r}; choose one of {', '.join(choices)}")


def parse_variant(variant: Any) -> dict[str, int | None]:
    """The parts of a variant name, e.g. {"ac": None, "bucket": 100}; {} for "base". A
    SpecError names an unknown or repeated part, or hooks that exclude each other."""
    if not isinstance(variant, str) or not variant:
        raise SpecError(f"variant: {variant!r} must be 'base' or parts joined by '+'")
    if variant == "base":
        return {}
    parts: dict[str, int | None] = {}
    for part in variant.split("+"):
        name, number = part.rstrip("0123456789"), part[len(part.rstrip("0123456789")):]
        numbered = name in VARIANTS and VARIANTS[name].numbered
        if name not in VARIANTS or numbered != bool(number) or (number and int(number) < 1):
            known = ", ".join(v.spelling for v in VARIANTS.values())
            raise SpecError(f"variant: unknown part {part!r} in {variant!r}; known: {known}")
        if name in parts:
            raise SpecError(f"variant: {name!r} appears twice in {variant!r}")
        parts[name] = int(number) if number else None
    recompute = [name for name in RECOMPUTE if name in parts]
    if len(recompute) > 1:
        raise SpecError(f"variant: {variant!r}: {' and '.join(recompute)} are recompute policies; choose one")
    if "powersgd" in parts and "bf16-reduce" in parts:
        raise SpecError(f"variant: {variant!r}: powersgd and bf16-reduce are both DDP "
                        f"communication hooks; choose one")
    return parts


def check_model(spec: Any) -> None:
    """A RunSpec's model: its shape, its architecture's rules and its LoRA settings (a SpecError naming the
    field otherwise); lora_targets given as a list becomes a tuple."""
    if spec.comm_max_bytes < spec.comm_min_bytes:
        raise SpecError(f"comm_max_bytes: {spec.comm_max_bytes} is below "
                        f"comm_min_bytes={spec.comm_min_bytes}")
    if spec.benchmark == "collectives" and spec.world_size < 2:
        raise SpecError("world_size: the collectives probe needs at least 2 ranks (nothing moves on one)")
    if not isinstance(spec.tie_embeddings, bool):
        raise SpecError(f"tie_embeddings: {spec.tie_embeddings!r} is not true or false")
    if spec.n_kv_head and spec.n_head % spec.n_kv_head:
        raise SpecError(f"n_kv_head: {spec.n_kv_head} does not divide n_head={spec.n_head}")
    if spec.arch == "gpt" and (spec.n_kv_head not in (0, spec.n_head) or spec.ffn_hidden
                               or not spec.tie_embeddings):
        raise SpecError("arch: 'gpt' is the nanoGPT shape (full multi-head attention, 4 x n_embd MLP, "
                        "tied head); n_kv_head, ffn_hidden and tie_embeddings are for the other archs")
    if spec.arch != "gpt" and not spec.ffn_hidden:
        raise SpecError(f"ffn_hidden: required for arch {spec.arch!r} (its MLP width)")
    if (isinstance(spec.lora_dropout, bool) or not isinstance(spec.lora_dropout, (int, float))
            or not 0 <= spec.lora_dropout < 1):
        raise SpecError(f"lora_dropout: {spec.lora_dropout!r} is not a number in [0, 1)")
    if isinstance(spec.lora_targets, list):
        object.__setattr__(spec, "lora_targets", tuple(spec.lora_targets))
    if not isinstance(spec.lora_targets, tuple) or not all(
            isinstance(t, str) and t for t in spec.lora_targets):
        raise SpecError(f"lora_targets: {spec.lora_targets!r} must be a list of module names")
