"""A model's own tokenizer, built from GGUF metadata exactly as llama.cpp's ``llama-vocab.cpp`` does.

``gguf_tokenizer`` holds :class:`~samplechain.tokenizer.gguf_tokenizer.GGUFTokenizer` (the vocabulary's ids,
attributes and special tokens; text <-> ids) and ``token_bytes_table``; ``bpe`` the byte-level BPE of ``gpt2``
vocabularies, ``pretokenize`` their pre-tokenizers, ``unicode`` llama.cpp's Unicode classes those run with, and
``spm`` the SentencePiece of ``llama`` vocabularies; ``symbol_merge`` the merge loop BPE and SentencePiece share.
"""
