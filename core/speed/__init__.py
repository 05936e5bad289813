"""The speed paths a run switches on, each choice recorded with its reason (`paths`: before LoRA the attention and
MoE experts backends, after it activation checkpointing, fused kernels, compilation and host vocabulary tables).
Each path is a subpackage or module here with its reference, probe, undo and tests: `attention/`, `moe/`,
`checkpointing/`, `fused/`, `compile`, `host_tables`, `step_graphs` (steps recorded as CUDA graphs, `graph_choice` says
when).
"""
