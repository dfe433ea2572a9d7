"""Model shapes by name: the project's GPT sizes and Hugging Face presets with their published
shapes. Standard library only (read by the spec, the plugin and the report)."""

from __future__ import annotations

from typing import Any

# Model shapes by name. ``block_size`` is the number of positions (learned for gpt; the
# published max_position_embeddings for the others). Hugging Face presets carry the published
# config.json values of the model named in ``source``; what does not change the shape (rope
# settings, norm epsilon, sliding window) is in harness/hf.py beside them.
GPT = dict(arch="gpt", n_kv_head=0, ffn_hidden=0, tie_embeddings=True)
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # Small enough for 2 CPU cores: ~0.8M parameters, well under a second per step.
    "tiny": dict(GPT, n_layer=4, n_head=4, n_embd=128, vocab_size=1024, block_size=512),
    # ~153M parameters: large enough that peak RSS on CPU shows parameter sharding.
    "cpu-150m": dict(GPT, n_layer=12, n_head=16, n_embd=1024, vocab_size=1024, block_size=512),
    # GPT-2 family, vocab padded to a multiple of 64 as in nanoGPT.
    "gpt2-124m": dict(GPT, n_layer=12, n_head=12, n_embd=768, vocab_size=50304, block_size=1024),
    "gpt2-350m": dict(GPT, n_layer=24, n_head=16, n_embd=1024, vocab_size=50304, block_size=1024),
    "gpt2-774m": dict(GPT, n_layer=36, n_head=20, n_embd=1280, vocab_size=50304, block_size=1024),
    "gpt2-1558m": dict(GPT, n_layer=48, n_head=25, n_embd=1600, vocab_size=50304, block_size=1024),
    # source: huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json (8.03B)
    "llama3-8b": dict(arch="llama", n_layer=32, n_head=32, n_kv_head=8, n_embd=4096, ffn_hidden=14336,
                      vocab_size=128256, block_size=8192, tie_embeddings=False),
    # source: huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json (1.24B)
    "llama3.2-1b": dict(arch="llama", n_layer=16, n_head=32, n_kv_head=8, n_embd=2048, ffn_hidden=8192,
                        vocab_size=128256, block_size=131072, tie_embeddings=True),
    # source: huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json (6.74B); full multi-head
    # attention: what the original report's "16.8M trainable parameters" (r16 on q,k,v,o) fits
    "llama2-7b": dict(arch="llama", n_layer=32, n_head=32, n_kv_head=32, n_embd=4096, ffn_hidden=11008,
                      vocab_size=32000, block_size=4096, tie_embeddings=False),
    # source: huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json (7.24B)
    "mistral-7b": dict(arch="mistral", n_layer=32, n_head=32, n_kv_head=8, n_embd=4096, ffn_hidden=14336,
                       vocab_size=32000, block_size=32768, tie_embeddings=False),
    # source: huggingface.co/mistralai/Mistral-7B-Instruct-v0.3/blob/main/config.json (7.25B): the model
    # the original QLoRA benchmark fine-tuned (v0.1 with a 32768 vocabulary, no sliding window)
    "mistral-7b-v0.3": dict(arch="mistral", n_layer=32, n_head=32, n_kv_head=8, n_embd=4096, ffn_hidden=14336,
                            vocab_size=32768, block_size=32768, tie_embeddings=False),
    # source: huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json (7.62B)
    "qwen2.5-7b": dict(arch="qwen2", n_layer=28, n_head=28, n_kv_head=4, n_embd=3584, ffn_hidden=18944,
                       vocab_size=152064, block_size=131072, tie_embeddings=False),
    # source: huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json (0.49B)
    "qwen2.5-0.5b": dict(arch="qwen2", n_layer=24, n_head=14, n_kv_head=2, n_embd=896, ffn_hidden=4864,
                         vocab_size=151936, block_size=32768, tie_embeddings=True),
    # Tiny members of each family for 2 CPU cores: 2 layers, grouped-query attention (4 query
    # heads, 2 key/value heads), SwiGLU, the family's own tying; well under a second per step.
    "tiny-llama": dict(arch="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=128, ffn_hidden=352,
                       vocab_size=1024, block_size=512, tie_embeddings=False),
    "tiny-mistral": dict(arch="mistral", n_layer=2, n_head=4, n_kv_head=2, n_embd=128, ffn_hidden=448,
                         vocab_size=1024, block_size=512, tie_embeddings=False),
    "tiny-qwen2": dict(arch="qwen2", n_layer=2, n_head=4, n_kv_head=2, n_embd=128, ffn_hidden=352,
                       vocab_size=1024, block_size=512, tie_embeddings=True),
}
