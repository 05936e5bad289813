"""Sample answers (train.sample_prompts = N) on a vision-language model: an evaluation row's prompt is answered with
its image, as peft and the model's own processor answer it with the saved adapter."""

from __future__ import annotations

import json

import torch
from vision_helpers import reply, user, write_jsonl

from hone.core import events
from hone.core.config import RunConfig
from hone.core.train.samples_file import read_samples
from hone.core.train.trainer import Trainer

MAX_NEW = 5


def test_an_evaluation_rows_image_goes_with_its_prompt(vision_model_dir, mixed_rows, tmp_path):
    from peft import PeftModel
    from PIL import Image
    from transformers import AutoConfig, AutoModelForImageTextToText

    from hone.core.models.load import load_tokenizer

    folder, rows = mixed_rows
    model_dir = vision_model_dir("qwen2_5_vl")
    held_out = [{"messages": [user("red.png", "What color is it?"), reply("red")]}, rows[0]]
    config = RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(model_dir))}",
            f"data.train=[{json.dumps(str(write_jsonl(folder / 'samples-train.jsonl', rows)))}]",
            f"data.eval={json.dumps(str(write_jsonl(folder / 'samples-eval.jsonl', held_out)))}",
            f"output.runs_dir={json.dumps(str(tmp_path))}",
            "data.max_length=128",
            "data.image_max_side=64",
            "train.batch_tokens=160",
            "train.max_steps=2",
            "train.eval_every=2",
            "train.lr=1e-4",  # a small change: the random model keeps answering in words, not end tokens
            "train.sample_prompts=2",
            f"train.sample_max_new_tokens={MAX_NEW}",
            "lora.r=4",
        ]
    )
    seen = list(Trainer(config, device="cpu").run())
    failed = [e for e in seen if isinstance(e, events.RunFailed)]
    assert not failed, failed[0].reason + "\n" + failed[0].details[-2000:]
    finished = next(e for e in seen if isinstance(e, events.RunFinished))
    (last,) = read_samples(finished.run_dir)
    assert last.step == 2 and len(last.samples) == 2
    (image_prompt, image_answer), (text_prompt, _) = last.samples
    assert "What color is it?" in image_prompt and text_prompt == "What is the capital of France?"

    # the reference: the saved adapter on the base, the row with its image through the processor the run loads
    # (transformers' Qwen-VL processor needs torchvision; without it Hone's image-and-text processor stands in)
    processor = load_tokenizer(str(model_dir), AutoConfig.from_pretrained(model_dir))
    base = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    tuned = PeftModel.from_pretrained(base, finished.adapter_dir).eval()
    image = Image.open(folder / "red.png").convert("RGB")  # 40 x 30: under image_max_side, not scaled
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What color is it?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[image], return_tensors="pt")
    answers = []
    with torch.no_grad():
        for given in (inputs, {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}):
            out = tuned.generate(**given, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0)
            answers.append(processor.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip())
    # the same ids without the pixels answer otherwise: the image took part
    assert image_answer == answers[0] != answers[1]
