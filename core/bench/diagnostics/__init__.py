"""One more training step under a tool, after a run's timed steps, on the same model and batch.

profile.py       torch.profiler: GPU time by kernel and by where it was launched (`hone bench --profile`)
memory_trace.py  CUDA's allocator history: what is alive at the step's peak (`--memory-trace`)
host_profile.py  cProfile: where the host's time goes while it launches the step (`--host-profile`)
"""

__all__: list[str] = []
