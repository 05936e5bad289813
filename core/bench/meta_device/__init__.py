"""A training step counted on the `meta` device, where tensors have shapes and no data: no GPU needed.

anatomy.py    every operation of a step with its FLOPs, bytes moved and live memory
step_plan.py  Hone's MoE step planned from that anatomy: predicted time and memory by component
              (`python -m hone.core.bench.meta_device.step_plan`)
"""

__all__: list[str] = []
