"""What trains: every parameter (pretrain), LoRA adapters on a frozen base (lora), or LoRA on a
base whose linear layers are quantised to 4-bit NF4 (qlora).

peft and bitsandbytes are imported only for the workloads that use them. LoRA follows the peft
docs: ``LoraConfig`` with the spec's rank, alpha, dropout and target modules, ``get_peft_model``
on the transformers model, so only adapter parameters require gradients and only they enter the
optimizer (``make_optimizer`` takes parameters that require grad).

QLoRA quantises in memory what ``from_pretrained(quantization_config=BitsAndBytesConfig(...))``
would quantise while loading (there is no checkpoint to load): transformers'
``replace_with_bnb_linear`` swaps every ``nn.Linear`` but the LM head for ``bnb.nn.Linear4bit``,
and each keeps the random weight it had, as a ``Params4bit`` quantised when moved to the device
(transformers' own ``Bnb4bitQuantize`` does the same). NF4, double quantisation, compute in the
run's dtype, and quant storage in the parameters' dtype (fp32 master weights here) so FSDP and
ZeRO-3 can flatten and shard the packed weights like any other tensor (the QLoRA-with-FSDP
recipe of the bitsandbytes and transformers docs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from harness.spec import RunSpec

PEFT_NOTE = "prepare_model_for_kbit_training not applied: no recompute unless the variant asks (ac)"


def apply_workload(model: nn.Module, spec: RunSpec, device: torch.device) -> dict[str, Any]:
    """Freeze, quantise and add adapters as the workload says; what was done, for the result."""
    if spec.workload == "pretrain":
        return {"workload": "pretrain", "trainable": "every parameter"}
    from peft import LoraConfig, get_peft_model

    record: dict[str, Any] = {"workload": spec.workload}
    model.lm.requires_grad_(False)
    if spec.workload == "qlora":
        record["quantization"] = quantize_nf4(model.lm, spec, device)
    config = LoraConfig(r=spec.lora_rank, lora_alpha=spec.lora_alpha, lora_dropout=spec.lora_dropout,
                        target_modules=list(spec.adapter_targets), bias="none", task_type="CAUSAL_LM")
    model.lm = get_peft_model(model.lm, config)
    trainable, total = model.lm.get_nb_trainable_parameters()
    record.update(lora={"r": spec.lora_rank, "alpha": spec.lora_alpha, "dropout": spec.lora_dropout,
                        "target_modules": list(spec.adapter_targets)},
                  peft_trainable_params=trainable, peft_all_params=total, note=PEFT_NOTE)
    return record


def quantize_nf4(lm: nn.Module, spec: RunSpec, device: torch.device) -> dict[str, Any]:
    """Every linear layer but the LM head to 4-bit NF4, in place; what was set."""
    import bitsandbytes as bnb
    from transformers import BitsAndBytesConfig
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear

    compute = torch.bfloat16 if spec.dtype == "bf16" else torch.float32
    storage = next(lm.parameters()).dtype
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=compute, bnb_4bit_quant_storage=storage)
    weights = {name: (m.weight.detach(), m.bias) for name, m in lm.named_modules()
               if type(m) is nn.Linear and name != "lm_head"}
    replace_with_bnb_linear(lm, modules_to_not_convert=["lm_head"], quantization_config=config)
    for name, module in lm.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            weight, bias = weights[name]
            packed = bnb.nn.Params4bit(weight, requires_grad=False, **module.weight.__dict__)
            module.weight = packed.to(device)  # quantised here
            if bias is not None:
                module.bias = bias
    return {"library": f"bitsandbytes {bnb.__version__}", "quant_type": "nf4", "double_quant": True,
            "compute_dtype": str(compute).removeprefix("torch."),
            "quant_storage": str(storage).removeprefix("torch."),
            "layers": f"{len(weights)} nn.Linear of the decoder (lm_head and embeddings kept)"}
