"""hone.app: the Hone Studio desktop GUI (PySide6 + pyqtgraph).

Imports no torch at module import time: the window opens fast, and torch loads only when a model is chosen.
"""
