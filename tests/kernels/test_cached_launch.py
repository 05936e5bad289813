"""CachedLaunch: the first call of a specialization goes through Triton, later ones launch the compiled kernel
directly with every argument of its signature in order. A stand-in kernel records what each path receives (the
real launch is covered by the GPU tests of every kernel, which all go through it on CUDA)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hone.kernels import _runtime


def _body(x_ptr, out_ptr, n, scale, BLOCK: int = 64, EVEN: bool = False):
    pass


class _Compiled:
    """What Triton returns from a launch: a compiled kernel with its launcher."""

    def __init__(self, log):
        self.log = log
        self.function = object()
        self.packed_metadata = ("meta",)

    def launch_metadata(self, grid, stream, *args):
        return ("launch-metadata", grid, stream)

    def run(self, *launch):
        self.log.append(("direct", launch))


class _Kernel:
    """A `@triton.jit` kernel's interface: `fn` and `kernel[grid](*args, **kwargs)`, which compiles once per
    specialization and launches."""

    fn = staticmethod(_body)

    def __init__(self):
        self.log = []
        self.compiled = {}

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("triton", grid, args, kwargs))
            return _Compiled(self.log)

        return run


class _Driver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 1234


@pytest.fixture
def cached(monkeypatch):
    monkeypatch.setattr(_runtime, "_driver", lambda: _Driver())
    kernel = _Kernel()
    return kernel, _runtime.CachedLaunch(kernel)


def test_second_call_launches_the_compiled_kernel_with_the_full_signature(cached):
    kernel, launch = cached
    x, out = torch.zeros(64), torch.zeros(64)
    launch[(4,)](x, out, 64, 0.5, BLOCK=32, num_warps=4)
    launch[(8, 2)](x, out, 64, 0.25, BLOCK=32, num_warps=4)

    assert [entry[0] for entry in kernel.log] == ["triton", "direct"]
    _, args = kernel.log[1]
    grid, stream, meta = args[:3], args[3], args[6]
    assert grid == (8, 2, 1) and stream == 1234 and meta == ("launch-metadata", (8, 2, 1), 1234)
    # every parameter of the signature after the hooks, in order: positional ones, then BLOCK as passed and
    # EVEN's default (num_warps is a launch option, not a parameter)
    assert args[9:] == (x, out, 64, 0.25, 32, False)


@pytest.mark.parametrize(
    "change", ["alignment", "int one", "int multiple of 16", "int64", "dtype", "constexpr", "option"]
)
def test_a_different_specialization_goes_through_triton_again(cached, change):
    kernel, launch = cached
    x, out = torch.zeros(64), torch.zeros(64)
    args, kwargs = [x, out, 64, 0.5], {"BLOCK": 32, "num_warps": 4}
    launch[(1,)](*args, **kwargs)
    if change == "alignment":
        args[0] = x[1:]
    elif change == "int one":
        args[2] = 1
    elif change == "int multiple of 16":
        args[2] = 63
    elif change == "int64":
        args[2] = 2**33
    elif change == "dtype":
        args[1] = out.double()
    elif change == "constexpr":
        kwargs["BLOCK"] = 64
    else:
        kwargs["num_warps"] = 8
    launch[(1,)](*args, **kwargs)
    assert [entry[0] for entry in kernel.log] == ["triton", "triton"]
    launch[(1,)](*args, **kwargs)
    assert [entry[0] for entry in kernel.log] == ["triton", "triton", "direct"]


def test_arguments_it_cannot_key_and_callable_grids_go_through_triton(cached):
    kernel, launch = cached
    x, out = torch.zeros(4), torch.zeros(4)
    for _ in range(2):
        launch[(1,)](x, out, "not a number", 0.5)
        launch[lambda meta: (1,)](x, out, 4, 0.5)
    assert [entry[0] for entry in kernel.log] == ["triton"] * 4


def test_a_missing_parameter_without_default_keeps_triton_path(cached):
    kernel, launch = cached
    x = torch.zeros(4)
    for _ in range(2):
        launch[(1,)](x, x, 4)  # `scale` missing: Triton would report it; we never launch directly
    assert [entry[0] for entry in kernel.log] == ["triton", "triton"]


def test_launcher_hands_out_the_cached_form_only_on_cuda(monkeypatch):
    kernel = _Kernel()
    monkeypatch.setattr(_runtime, "CACHED_LAUNCH", True)
    assert isinstance(_runtime.launcher(kernel, torch.device("cuda")), _runtime.CachedLaunch)
    monkeypatch.setattr(_runtime, "CACHED_LAUNCH", False)
    assert _runtime.launcher(kernel, torch.device("cuda")) is kernel


def test_grid_helpers_agree_with_tritons():
    import triton

    for n in range(1, 3000):
        assert _runtime.next_power_of_2(n) == triton.next_power_of_2(n)
        for b in (1, 3, 16, 128):
            assert _runtime.cdiv(n, b) == triton.cdiv(n, b)
    assert _runtime.cdiv(0, 16) == 0
