"""Run-config overrides the trainer-level GPU tests compare: every speed path off (`PLAIN`: transformers' attention,
the plain loss, no checkpointing, no kernels, tables on the GPU, eager experts) against the paths a GPU run takes
(`FAST`: packed varlen attention and offloaded checkpoints named, the rest as `auto` picks)."""

PLAIN = [
    "speed.attention=hf",
    "speed.loss=plain",
    'speed.checkpoint="off"',
    "speed.kernels=false",
    "speed.host_embeddings=false",
    "speed.host_lm_head=false",
    "speed.moe_backend=eager",
]
FAST = ['speed.checkpoint="offload"', "speed.attention=varlen"]
