"""`hone eval RUN --task`: lm-evaluation-harness tasks scored on a run's base model and its fine-tune, through Hone's
own model loading, the scores stored in the run folder and written as JSON.

A tiny random-init model is trained two CPU steps; two local tasks in lm-eval's YAML format read JSONL files in a
temporary folder: a multiple-choice task (accuracy) and a generation task (exact match). The references come from the
models themselves, without lm-eval: each choice's log-likelihood summed over its tokens by a plain forward pass, and
transformers' greedy `generate`. The task data is built from those references so that the base's scores are known
in advance (half of the multiple-choice answers are the base's favourite, two of three generation targets are the
base's own greedy answers); the fine-tune is checked against its own references. With --chat-template the reference
prompts are rendered by the tokenizer's own `apply_chat_template`: a system message, the task's solved example as a
user and an assistant turn, the question.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("lm_eval", reason='lm-evaluation-harness is not installed (pip install "hone-studio[eval]")')

from hone.core import events
from hone.core.cli import main
from tests.core.conftest import make_tiny_config, write_rows

QUESTIONS = [
    ("The sky is", ["blue", "green", "loud"]),
    ("Two plus two is", ["three", "four", "five", "six"]),
    ("Water is", ["dry", "wet", "square"]),
    ("Fire is", ["cold", "hot", "blue"]),
    ("A cat says", ["meow", "moo", "quack"]),
    ("Snow is", ["white", "black", "warm", "late"]),
]
SAYS = ["Say hi", "Say no", "Say up"]  # one token each after "Say": the batch's prompts are as long, so none is padded
MAX_NEW_TOKENS = 5
SYSTEM = "Answer in one word."
SHOT = ("Say yes", "yes")  # the chat task's one solved example (its fewshot_config, taken first_n)


def _mc_yaml(data, cache) -> str:
    return (
        "task: hone_mc\ndataset_path: json\ndataset_kwargs:\n"
        f"  data_files:\n    test: {data}\n  cache_dir: {cache}\n"
        'test_split: test\noutput_type: multiple_choice\ndoc_to_text: "Q: {{question}}\\nA:"\n'
        'doc_to_choice: "{{choices}}"\ndoc_to_target: answer\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\nmetadata:\n  version: 1.0\n"
    )


def _gen_yaml(data, cache) -> str:
    return (
        "task: hone_gen\ndataset_path: json\ndataset_kwargs:\n"
        f"  data_files:\n    test: {data}\n  cache_dir: {cache}\n"
        'test_split: test\noutput_type: generate_until\ndoc_to_text: "Q: {{question}}\\nA:"\n'
        'doc_to_target: "{{answer}}"\n'
        f'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: {MAX_NEW_TOKENS}\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 2.0\n"
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir, chat_files):
    """A finished two-step CPU run of the tiny model; its LoRA learned fast enough to change the model's answers."""
    from hone.core.train.trainer import Trainer

    root = tmp_path_factory.mktemp("lm-eval-run")
    config = make_tiny_config(
        tiny_model_dir("tiny-dense"), chat_files, root, "output.name=r", "train.max_steps=2", "train.lr=2e-2"
    )
    seen = list(Trainer(config, device="cpu").run())
    assert isinstance(seen[-1], events.RunFinished), seen[-1]
    return root / "r"


@pytest.fixture(scope="module")
def references(run_dir, tiny_model_dir):
    """(tokenizer, {"base": model, "tuned": model}): the base from its folder by transformers, the fine-tune with the
    run's adapter by peft, float32 on the CPU, as plain as they come."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tiny_model_dir("tiny-dense")
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "adapter")
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tuned = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), str(run_dir / "adapter")
    ).eval()
    return tokenizer, {"base": base, "tuned": tuned}


def _chat_yaml(data, cache) -> str:
    """hone_gen's generation, with one solved example lm-eval takes in order (not at random) when asked for a shot."""
    return _gen_yaml(data, cache).replace("task: hone_gen", "task: hone_chat") + (
        f'fewshot_config:\n  sampler: first_n\n  samples:\n    - {{question: "{SHOT[0]}", answer: "{SHOT[1]}"}}\n'
    )


def _question(question: str) -> str:
    return f"Q: {question}\nA:"


def _chat_prompt(tokenizer, question: str) -> str:
    """The prompt lm-eval should build with --chat-template --system-instruction SYSTEM --num-fewshot 1, rendered by
    transformers from the conversation written out here."""
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": _question(SHOT[0])},
        {"role": "assistant", "content": SHOT[1]},
        {"role": "user", "content": _question(question)},
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _loglikelihood(model, tokenizer, context: str, continuation: str) -> float:
    """log p(continuation | context): the continuation's tokens' log-probabilities summed, one forward pass."""
    import torch

    ctx = tokenizer(context)["input_ids"]
    ids = tokenizer(context + continuation)["input_ids"]
    assert ids[: len(ctx)] == ctx  # the context's tokens are the same with the continuation after them
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
    return sum(float(logp[t - 1, ids[t]]) for t in range(len(ctx), len(ids)))


def _choice_scores(model, tokenizer) -> list[list[float]]:
    return [[_loglikelihood(model, tokenizer, f"Q: {q}\nA:", f" {c}") for c in choices] for q, choices in QUESTIONS]


def _greedy(model, tokenizer, prompt: str) -> str:
    """transformers' greedy answer, cut at the first end-of-text token and the first newline (the task's `until`)."""
    import torch

    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_NEW_TOKENS,
            do_sample=False,
            pad_token_id=tokenizer.eos_token_id,
        )
    new = out[0, ids.shape[1] :].tolist()
    if tokenizer.eos_token_id in new:
        new = new[: new.index(tokenizer.eos_token_id)]
    return tokenizer.decode(new, skip_special_tokens=True).split("\n")[0]


@pytest.fixture(scope="module")
def tasks(references, tmp_path_factory):
    """(task folder, multiple-choice answers, generation targets). Even rows' answer is the base's most likely
    choice, odd rows' its least likely: the base's accuracy is 1/2 by construction. The first two generation targets
    are the base's greedy answers, the third one it cannot give: its exact match is 2/3."""
    tokenizer, models = references
    folder = tmp_path_factory.mktemp("tasks")
    base_scores = _choice_scores(models["base"], tokenizer)
    answers = []
    for i, scores in enumerate(base_scores):
        pick = max if i % 2 == 0 else min
        answers.append(scores.index(pick(scores)))
    assert all(len(set(s)) == len(s) for s in base_scores)  # no ties: argmax and argmin are one choice each
    targets = [_greedy(models["base"], tokenizer, _question(q)) for q in SAYS[:2]] + ["no model says this"]
    lengths = {len(tokenizer(f"Q: {q}\nA:")["input_ids"]) for q in SAYS}
    assert len(lengths) == 1, lengths  # one batch of equal prompts: lm-eval pads none, as greedy `generate` here
    mc = write_rows(
        folder / "mc.jsonl",
        [{"question": q, "choices": c, "answer": a} for (q, c), a in zip(QUESTIONS, answers, strict=True)],
    )
    gen = write_rows(folder / "gen.jsonl", [{"question": q, "answer": t} for q, t in zip(SAYS, targets, strict=True)])
    cache = folder / "datasets-cache"
    (folder / "mc.yaml").write_text(_mc_yaml(mc, cache), encoding="utf-8")
    (folder / "gen.yaml").write_text(_gen_yaml(gen, cache), encoding="utf-8")
    return folder, answers, targets


@pytest.fixture(scope="module")
def scored(run_dir, tasks, tmp_path_factory):
    """`hone eval RUN --task hone_mc,hone_gen --task-dir FOLDER --json OUT` run once: the JSON it wrote."""
    folder, _, _ = tasks
    out = tmp_path_factory.mktemp("json") / "tasks.json"
    argv = ["eval", str(run_dir), "--task", "hone_mc,hone_gen", "--task-dir", str(folder), "--json", str(out)]
    assert main(argv) == 0
    return json.loads(out.read_text(encoding="utf-8"))


def _entry(document, model: str, task: str) -> dict:
    found = [e for e in document["entries"] if e["model"] == model and e["task"] == task]
    assert len(found) == 1, found
    return found[0]


def _mean_stderr(values: list[float]) -> float:
    """The standard error of a mean, from the sample standard deviation (n - 1)."""
    n = len(values)
    mean = sum(values) / n
    return (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5 / n**0.5


def test_multiple_choice_accuracy_is_the_models_own_log_likelihoods(scored, references, tasks):
    tokenizer, models = references
    _, answers, _ = tasks
    lengths = [[len(c) for c in choices] for _, choices in QUESTIONS]
    scores = {model: _choice_scores(models[model], tokenizer) for model in ("base", "tuned")}
    assert scores["tuned"] != scores["base"]  # the adapter changes the log-likelihoods
    accuracy = {}
    for model, rows in scores.items():
        hits = [float(s.index(max(s)) == a) for s, a in zip(rows, answers, strict=True)]
        # lm-eval's acc_norm: each log-likelihood over its choice's length in characters
        normed = [[v / n for v, n in zip(s, ns, strict=True)] for s, ns in zip(rows, lengths, strict=True)]
        hits_norm = [float(s.index(max(s)) == a) for s, a in zip(normed, answers, strict=True)]
        entry = _entry(scored, model, "hone_mc")
        assert entry["metrics"]["acc,none"] == pytest.approx(sum(hits) / len(hits), abs=1e-12)
        assert entry["metrics"]["acc_norm,none"] == pytest.approx(sum(hits_norm) / len(hits_norm), abs=1e-12)
        assert entry["stderr"]["acc,none"] == pytest.approx(_mean_stderr(hits), rel=1e-9)
        assert entry["samples"] == len(QUESTIONS) and entry["num_fewshot"] == 0 and entry["limit"] is None
        accuracy[model] = sum(hits) / len(hits)
    assert accuracy["base"] == 0.5  # as the data was built: the adapter was off for the base


def test_generation_exact_match_is_the_models_own_greedy_answers(scored, references, tasks):
    tokenizer, models = references
    _, _, targets = tasks
    answers = {model: [_greedy(models[model], tokenizer, _question(q)) for q in SAYS] for model in ("base", "tuned")}
    assert answers["tuned"][:2] != answers["base"][:2]  # the fine-tune answers otherwise: its score tells them apart
    for model, given in answers.items():
        expected = sum(a == t for a, t in zip(given, targets, strict=True)) / len(SAYS)
        entry = _entry(scored, model, "hone_gen")
        assert entry["metrics"]["exact_match,none"] == pytest.approx(expected, abs=1e-12)
        assert entry["task_version"] == "2.0" and entry["samples"] == len(SAYS)
    assert _entry(scored, "base", "hone_gen")["metrics"]["exact_match,none"] == pytest.approx(2 / 3)


def test_scores_are_stored_in_the_run_folder_and_read_back(scored, run_dir):
    import hashlib

    import lm_eval

    from hone.core.api import read_task_scores

    stored = read_task_scores(run_dir)
    assert stored.damage == "" and stored.path == run_dir / "lm_eval_scores.json"
    assert [e.as_dict() for e in stored.entries] == scored["entries"]
    raw = json.loads(stored.path.read_text(encoding="utf-8"))
    assert raw["hone_lm_eval_scores"] == 1
    sha = hashlib.sha256((run_dir / "adapter" / "adapter_model.safetensors").read_bytes()).hexdigest()
    for entry in scored["entries"]:
        assert entry["lm_eval"] == lm_eval.__version__
        if entry["model"] == "tuned":
            assert entry["weights"] == f"adapter:{sha}"
    assert {e["weights"] for e in scored["entries"] if e["model"] == "base"} == {f"base:{_base_name(run_dir)}"}
    assert scored["lm_eval"] == lm_eval.__version__ and scored["tasks"] == ["hone_mc", "hone_gen"]
    assert scored["run"] == str(run_dir.resolve()) and scored["limit"] is None


def _base_name(run_dir) -> str:
    from hone.core.config import RunConfig

    return RunConfig.load(run_dir / "config.toml").model.name_or_path


def test_a_task_file_with_limit_and_shots_is_stored_beside_the_earlier_scores(scored, run_dir, tasks, capsys):
    folder, _, _ = tasks
    argv = ["eval", str(run_dir), "--task", str(folder / "mc.yaml"), "--limit", "3"]  # the YAML file's path
    assert main([*argv, "--num-fewshot", "2", "--batch-size", "2"]) == 0
    shown = capsys.readouterr().out
    from hone.core.api import read_task_scores

    entries = read_task_scores(run_dir).entries
    limited = [e for e in entries if e.limit == 3]
    assert sorted(e.model for e in limited) == ["base", "tuned"]
    assert all(e.task == "hone_mc" and e.samples == 3 and e.num_fewshot == 2 for e in limited)
    assert len(entries) == len(scored["entries"]) + 2  # the scores of every row are kept
    for e in limited:  # the table shows each model's accuracy and the change
        assert "hone_mc" in shown and f"{e.metrics['acc,none']:.4f}" in shown
    assert "acc,none" in shown and "at most 3 rows per task" in shown


def test_nltk_data_that_is_not_here_is_named_with_its_download_command(run_dir, tasks, monkeypatch):
    """IFEval's checks split sentences with nltk, whose data lm-eval downloads when it can; offline it is missing
    until scoring asks for it."""
    import lm_eval
    import nltk

    from hone.core.api import ChatModels, score_tasks, select_tasks
    from hone.core.config import RunConfig
    from hone.core.errors import HoneError

    def nltk_without_its_data(**_):
        nltk.data.find("tokenizers/hone_no_such_resource")  # raises nltk's own LookupError

    monkeypatch.setattr(lm_eval, "simple_evaluate", nltk_without_its_data)
    folder, _, _ = tasks
    selection = select_tasks(["hone_gen"], folder)
    models = ChatModels.for_run(run_dir, device="cpu")
    with pytest.raises(HoneError) as caught:
        score_tasks(run_dir, RunConfig.load(run_dir / "config.toml"), models, selection)
    assert "needs nltk's hone_no_such_resource data" in caught.value.message
    assert "python -m nltk.downloader hone_no_such_resource" in caught.value.advice


@pytest.fixture(scope="module")
def chat_task(references, tmp_path_factory):
    """(task folder, generation targets) of hone_chat: its first two targets are the base's greedy answers to the chat
    prompts, the third one it cannot give, so its exact match through the template is 2/3."""
    tokenizer, models = references
    folder = tmp_path_factory.mktemp("chat-task")
    prompts = [_chat_prompt(tokenizer, q) for q in SAYS]
    assert len({len(tokenizer(p)["input_ids"]) for p in prompts}) == 1  # one batch of equal prompts: none padded
    targets = [_greedy(models["base"], tokenizer, p) for p in prompts[:2]] + ["no model says this"]
    rows = write_rows(folder / "chat.jsonl", [{"question": q, "answer": t} for q, t in zip(SAYS, targets, strict=True)])
    (folder / "chat.yaml").write_text(_chat_yaml(rows, folder / "datasets-cache"), encoding="utf-8")
    return folder, targets


def test_chat_template_renders_lm_evals_prompts_with_the_tokenizers_template(
    run_dir, references, chat_task, tmp_path, monkeypatch, capsys
):
    from hone.core.inference.harness.model import HoneLM

    tokenizer, models = references
    folder, targets = chat_task
    given: list[str] = []  # every generation request's context, as lm-eval built it
    generate_until = HoneLM.generate_until

    def recording(self, requests, disable_tqdm=False):
        given.extend(request.args[0] for request in requests)
        return generate_until(self, requests, disable_tqdm)

    monkeypatch.setattr(HoneLM, "generate_until", recording)
    out = tmp_path / "chat.json"
    argv = ["eval", str(run_dir), "--task", "hone_chat", "--task-dir", str(folder), "--num-fewshot", "1"]
    assert main([*argv, "--chat-template", "--system-instruction", SYSTEM, "--json", str(out)]) == 0
    prompts = [_chat_prompt(tokenizer, q) for q in SAYS]
    assert sorted(given) == sorted(prompts * 2)  # the base's and the fine-tune's: the system turn, the shot as turns
    document = json.loads(out.read_text(encoding="utf-8"))
    answers = {model: [_greedy(models[model], tokenizer, p) for p in prompts] for model in ("base", "tuned")}
    assert answers["base"] != [_greedy(models["base"], tokenizer, _question(q)) for q in SAYS]  # not raw text's
    for model, said in answers.items():
        expected = sum(a == t for a, t in zip(said, targets, strict=True)) / len(SAYS)
        entry = _entry(document, model, "hone_chat")
        assert entry["metrics"]["exact_match,none"] == pytest.approx(expected, abs=1e-12)
        assert entry["chat_template"] is True and entry["system_instruction"] == SYSTEM and entry["num_fewshot"] == 1
    assert _entry(document, "base", "hone_chat")["metrics"]["exact_match,none"] == pytest.approx(2 / 3)
    assert document["chat_template"] is True and document["system_instruction"] == SYSTEM
    shown = capsys.readouterr().out
    assert "through the chat template" in shown and f"system instruction: {SYSTEM}" in shown
