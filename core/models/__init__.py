"""Models: loading one from a Hugging Face id, a folder, a GGUF file or the bundled demo, and the shape table.

load.py    load_model / load_tokenizer / load_config, device and dtype choice, GGUF conversion cache
shapes.py  public model shapes and random-init models built from them (tests and benchmarks)
head.py    a causal LM split into body and LM head (what the chunked loss and host tables work on)
"""

__all__: list[str] = []
