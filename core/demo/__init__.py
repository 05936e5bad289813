"""The bundled demos, scored before and after fine-tuning (`hone demo`, `hone demo --vision`).

before_after.py              what they share: the base config, score phases, train then score again
files.py                     writing a demo's data files only when they changed, never half a file
text.py / text_data.py       SmolLM2-135M-Instruct taught to answer with one exact line of JSON
preference.py / _data.py     the same task as pairs (exact line chosen, a wrong form rejected): dpo, simpo, orpo, kto
grpo.py / grpo_data.py       GRPO: add two numbers, reply with one line of JSON, scored by rewards (no reference)
vision.py / vision_data.py   a small vision-language model taught the color and shape in a picture
vision_model.py              that model: SmolLM2 with a random-init vision encoder and projector
"""

__all__: list[str] = []
