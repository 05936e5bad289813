"""The bundled demos, scored before and after fine-tuning (`hone demo`, `hone demo --vision`).

text.py / text_data.py       SmolLM2-135M-Instruct taught to answer with one exact line of JSON
vision.py / vision_data.py   a small vision-language model taught the color and shape in a picture
vision_model.py              that model: SmolLM2 with a random-init vision encoder and projector
"""

__all__: list[str] = []
