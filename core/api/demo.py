"""The bundled demos, scored before and after training: the text task (`demo_config`, `run_demo`) and the vision
task (`vision_demo_config`, `run_vision_demo`, `CHANCE`: a guess's score). Light to import; torch loads when a
demo runs."""

from __future__ import annotations

from hone.core.demo.text import demo_config, run_demo
from hone.core.demo.vision import CHANCE, run_vision_demo, vision_demo_config

__all__ = ["CHANCE", "demo_config", "run_demo", "run_vision_demo", "vision_demo_config"]
