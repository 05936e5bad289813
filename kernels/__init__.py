"""hone.kernels: Triton kernels, each with a plain-torch reference beside it. Imports only torch, and triton where
it is installed (hone.kernels._triton: without it every call takes the reference)."""
