"""Benchmarks: speed and memory of Hone's speed paths next to plain transformers + peft, in one process.

`hone bench SCENARIO`, text scenarios:
    scenarios.py          what can be benchmarked: model shape, layers, batch size (text and vision scenarios)
    batch.py              the one packed token batch every run trains on
    weights.py            the same random-init model for every run
    transformers_peft.py  the reference run: transformers + peft as a careful user runs it
    variants.py           Hone's runs, each a set of SpeedConfig settings over "every path off"
    hone_runner.py        a Hone run: the trainer's own setup and step
    measure.py            one run: tokens/s, peak memory, MFU, first-step loss, host syncs, out-of-memory capture
    report.py             ratios and parity against the baseline, the table, the environment, the JSON file
    run.py                the whole text benchmark, run after run
    attention.py          attention alone: dense-mask SDPA against Hone's packed backends, per layer (`--micro`)
    peer_unsloth.py       Unsloth's tokens/s on the same batch, in a child process (`--peer`)
    diagnostics/          one more step under a tool: torch.profiler (`--profile`), the allocator's history
                          (`--memory-trace`), cProfile (`--host-profile`)
`hone bench vision-...`:
    vision.py             Hone's Trainer against transformers + peft with padded batches, on a vision-language model
`hone bench dpo-8b`, `hone bench grpo-...`:
    preference.py         Hone's DPO against TRL's DPOTrainer with peft
    sampling.py           GRPO's sampling: Hone's static-cache sampler against transformers' generate
    grpo_steps.py         GRPO's whole step: Hone's Trainer against TRL's GRPOTrainer without vLLM
    trl_setup.py          the TRL trainer arguments and LoRA every comparison with TRL shares
Run with `python -m`:
    attention_step.py     full LoRA steps: transformers' SDPA + full logits against Hone's attention + chunked loss
    moe_backends.py       one MoE training step per experts backend (used by the MoE GPU smoke test)
    meta/                 a step counted on the meta device (no GPU): FLOPs, bytes and live memory of every
                          operation (anatomy.py), and Hone's MoE step planned from them (step_plan.py)

Importing this package imports nothing: the Unsloth child process must import unsloth before transformers.
"""

__all__: list[str] = []
