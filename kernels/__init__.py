"""hone.kernels: Triton kernels, each with a plain-torch reference beside it. Imports only torch and triton."""
