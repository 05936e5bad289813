"""hone.core: the engine. Config, models, data, packing, attention, offload, MoE, trainer, export, bench, CLI.

Importing this package is cheap: it pulls in neither torch nor Qt. Heavy modules import torch themselves.
"""

__version__ = "0.1.0"
