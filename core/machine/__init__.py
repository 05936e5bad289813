"""This machine, read without torch: GPU telemetry through NVML (`telemetry`) and the CUDA allocator setting Hone's
processes start with (`allocator`). Each module is stdlib-only (plus nvidia-ml-py), so the Studio reads it freely."""
