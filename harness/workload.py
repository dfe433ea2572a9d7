"""What trains: every parameter (pretrain), LoRA adapters on a frozen base (lora), or LoRA on a
base whose linear layers are quantised to 4-bit NF4 (qlora).

peft and bitsandbytes are imported only for the workloads that use them. LoRA follows the peft
docs: ``LoraConfig`` with the spec's rank, alpha, dropout and target modules, ``get_peft_model``
on the transformers model, so only adapter parameters require gradients and only they enter the
optimizer (``make_optimizer`` takes parameters that require grad).

QLoRA quantises in memory what ``from_pretrained(quantization_config=BitsAndBytesConfig(...))``
would quantise while loading (there is no checkpoint to load), and as that does, never holds the
fp32 model on the device: the model is built on the meta device, transformers'
``replace_with_bnb_linear`` swaps every ``nn.Linear`` but the LM head for ``bnb.nn.Linear4bit``,
and each layer's random weight is made, then quantised as a ``Params4bit`` moved to the device
(transformers' own ``Bnb4bitQuantize`` does the same), one module at a time (``build_nf4``).
NF4, double quantisation, compute in the
run's dtype, and quant storage in the parameters' dtype (fp32 master weights here) so FSDP and
ZeRO-3 can flatten and shard the packed weights like any other tensor (the QLoRA-with-FSDP
recipe of the bitsandbytes and transformers docs).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from harness.spec import RunSpec

PEFT_NOTE = "prepare_model_for_kbit_training not applied: no recompute unless the variant asks (ac)"


def apply_workload(model: nn.Module, spec: RunSpec, device: torch.device) -> dict[str, Any]:
    """Freeze and add adapters as the workload says (qlora's quantisation happened as the model
    was built: ``build_nf4``); what was done, for the result."""
    if spec.workload == "pretrain":
        return {"workload": "pretrain", "trainable": "every parameter"}
    from peft import LoraConfig, get_peft_model

    record: dict[str, Any] = {"workload": spec.workload}
    model.lm.requires_grad_(False)
    if spec.workload == "qlora":
        record["quantization"] = model.quantization
    config = LoraConfig(r=spec.lora_rank, lora_alpha=spec.lora_alpha, lora_dropout=spec.lora_dropout,
                        target_modules=list(spec.adapter_targets), bias="none", task_type="CAUSAL_LM")
    model.lm = get_peft_model(model.lm, config)
    trainable, total = model.lm.get_nb_trainable_parameters()
    record.update(lora={"r": spec.lora_rank, "alpha": spec.lora_alpha, "dropout": spec.lora_dropout,
                        "target_modules": list(spec.adapter_targets)},
                  peft_trainable_params=trainable, peft_all_params=total, note=PEFT_NOTE)
    return record


def build_nf4(lm: nn.Module, spec: RunSpec, device: torch.device) -> dict[str, Any]:
    """``lm``, built on the meta device, made real on ``device`` with every linear layer but the LM
    head in 4-bit NF4, in place; what was set.

    transformers' ``replace_with_bnb_linear`` swaps the linear layers for ``bnb.nn.Linear4bit`` (on
    meta). Then one module at a time, in module order: its tensors are made on ``device`` and set by
    transformers' own ``_init_weights`` (normal(0, initializer_range) for a linear weight, ones for a
    norm, the rotary frequencies); a 4-bit layer's fp32 weight is made the same way, as a plain
    ``nn.Linear`` never initialised by torch, and quantised as it becomes a ``Params4bit`` (its
    ``.to(device)``), after which only the packed copy is kept. So the device never holds the fp32
    model (Mistral-7B: 27 GiB on a 22 GiB A10), only the packed one plus one fp32 matrix at a time
    (tests/unit/test_workloads.py counts it)."""
    import bitsandbytes as bnb
    from transformers import BitsAndBytesConfig
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear

    compute = torch.bfloat16 if spec.dtype == "bf16" else torch.float32
    storage = next(lm.parameters()).dtype  # the fp32 master weights' dtype, which FSDP/ZeRO-3 flatten
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=compute, bnb_4bit_quant_storage=storage)
    replace_with_bnb_linear(lm, modules_to_not_convert=["lm_head"], quantization_config=config)
    made: dict[int, torch.Tensor] = {}  # meta tensor -> its real one: a tied weight stays tied
    layers = 0
    with torch.no_grad():
        for module in lm.modules():
            if isinstance(module, bnb.nn.Linear4bit):
                quantise_as_made(module, lm, device, storage)
                layers += 1
            elif make_real(module, device, made):
                lm._init_weights(module)
    return {"library": f"bitsandbytes {bnb.__version__}", "quant_type": "nf4", "double_quant": True,
            "compute_dtype": str(compute).removeprefix("torch."),
            "quant_storage": str(storage).removeprefix("torch."),
            "layers": f"{layers} nn.Linear of the decoder (lm_head and embeddings kept)",
            "built": "on the meta device, then one module at a time on the device, each linear "
                     "quantised as it is made (the fp32 model is never on the device)"}


def quantise_as_made(module: nn.Module, lm: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """A meta ``Linear4bit``'s weight made on ``device`` as transformers initialises a linear layer,
    then packed to 4 bits as it becomes a ``Params4bit`` (its ``.to(device)`` quantises); the fp32
    matrix is dropped with ``dense``."""
    import bitsandbytes as bnb

    dense = nn.utils.skip_init(nn.Linear, module.in_features, module.out_features,
                               bias=module.bias is not None, device=device, dtype=dtype)
    lm._init_weights(dense)
    settings = module.weight.__dict__  # the quant type, blocksize, storage replace_with_bnb_linear set
    module.weight = bnb.nn.Params4bit(dense.weight.detach(), requires_grad=False, **settings).to(device)
    if dense.bias is not None:
        module.bias = dense.bias


def make_real(module: nn.Module, device: torch.device, made: dict[int, torch.Tensor]) -> bool:
    """Give ``module``'s own meta parameters and buffers real (uninitialised) storage on ``device``,
    reusing one already made for the same meta tensor (tied weights); whether any was new."""
    fresh = False
    for table in (module._parameters, module._buffers):
        for name, meta in table.items():
            if meta is None or not meta.is_meta:
                continue
            if id(meta) not in made:
                real = torch.empty_like(meta, device=device)
                is_param = table is module._parameters
                made[id(meta)] = nn.Parameter(real, meta.requires_grad) if is_param else real
                fresh = True
            table[name] = made[id(meta)]
    return fresh


def dense_numel(param: torch.Tensor) -> int:
    """The elements a parameter stands for: a 4-bit weight counts as the matrix it packs."""
    state = getattr(param, "quant_state", None)
    return math.prod(state.shape) if state is not None else param.numel()
