"""CudaModule.bind(..., guard=...) and GuardedRun against a fake driver, without a GPU.

The fake stands in for libcuda with host memory: reserved ranges are host buffers, only the
ranges passed to cuMemMap count as mapped, and a fake kernel that touches anything else makes the
next cuCtxSynchronize return CUDA_ERROR_ILLEGAL_ADDRESS (700), as the GPU's MMU would. That checks
the host-side logic (placement, launch parameters, copies in and back, the error a fault becomes,
freeing); tests/test_bounds_gpu.py checks the real faults on a GPU.
"""

import ctypes
from types import SimpleNamespace

import pytest
import torch

from forge_pack.evaluate import launch
from forge_pack.evaluate.launch import CudaModule, Driver, GuardedRun, GuardSetupError, LaunchError, Plan, PlannedLaunch

GRAN = 64 * 1024  # a small granularity keeps the host buffers small; the logic does not depend on it


class FakeCuda:
    """Just enough of libcuda for the guarded path, over host memory."""

    def __init__(self, vmm_supported: int = 1):
        self.vmm_supported = vmm_supported
        self.reserved: dict[int, ctypes.Array] = {}
        self.mapped: list[tuple[int, int]] = []
        self.calls: list[tuple] = []
        self.fault = 0
        self.launched: list[tuple[str, list[int]]] = []

    # -- memory
    def accessible(self, addr: int, n: int) -> bool:
        return any(s <= addr and addr + n <= e for s, e in self.mapped)

    def touch(self, addr: int, n: int) -> bool:
        if n and not self.accessible(addr, n):
            self.fault = 700
            return False
        return True

    def cuMemGetAllocationGranularity(self, g, prop, option):
        assert prop._obj.type == launch.MEM_ALLOCATION_TYPE_PINNED and prop._obj.location.type == 1
        g._obj.value = GRAN
        return 0

    def cuMemAddressReserve(self, base, size, align, addr, flags):
        buf = ctypes.create_string_buffer(size + GRAN)  # host memory has no 2 MiB alignment: align by hand
        start = -(-ctypes.addressof(buf) // GRAN) * GRAN
        self.reserved[start] = buf
        base._obj.value = start
        self.calls.append(("reserve", start, size))
        return 0

    def cuMemAddressFree(self, base, size):
        self.calls.append(("free", base, size))
        self.reserved.pop(base)
        return 0

    def cuMemCreate(self, handle, size, prop, flags):
        assert size % GRAN == 0
        handle._obj.value = 99
        return 0

    def cuMemRelease(self, handle):
        self.calls.append(("release", handle))
        return 0

    def cuMemMap(self, ptr, size, offset, handle, flags):
        assert ptr % GRAN == 0 and size % GRAN == 0 and handle.value == 99
        self.mapped.append((ptr, ptr + size))
        self.calls.append(("map", ptr, size))
        return 0

    def cuMemUnmap(self, ptr, size):
        self.mapped.remove((ptr, ptr + size))
        self.calls.append(("unmap", ptr, size))
        return 0

    def cuMemSetAccess(self, ptr, size, desc, count):
        assert desc._obj.flags == launch.MEM_ACCESS_FLAGS_PROT_READWRITE and count == 1
        return 0

    def cuMemsetD8(self, ptr, value, n):
        if self.touch(ptr, n):
            ctypes.memset(ptr, value, n)
        return 0

    cuMemsetD8_v2 = cuMemsetD8

    def cuMemcpyDtoDAsync_v2(self, dst, src, n, stream):
        ctypes.memmove(dst, src, n)
        return self.fault

    def cuCtxSynchronize(self):
        return self.fault

    # -- everything else the launcher calls
    def cuDeviceGetAttribute(self, v, attr, dev):
        v._obj.value = self.vmm_supported if attr == launch.DEV_VMM_SUPPORTED else 0
        return 0

    def cuFuncGetAttribute(self, v, attr, f):
        v._obj.value = 1024 if attr == launch.FUNC_MAX_THREADS else 0
        return 0

    def cuGetErrorName(self, code, out):
        out._obj.value = b"CUDA_ERROR_ILLEGAL_ADDRESS" if code == 700 else b"CUDA_ERROR_INVALID_VALUE"
        return 0

    def cuGetErrorString(self, code, out):
        out._obj.value = b"an illegal memory access was encountered" if code == 700 else b"invalid argument"
        return 0

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        args = [ctypes.c_uint64.from_address(params[i]).value for i in range(f.nargs)]
        self.launched.append((f.name, args))
        if self.fault:
            return self.fault  # a poisoned context refuses further launches
        f.body(self, *args)
        return 0


def _floats(addr: int, n: int):
    return (ctypes.c_float * n).from_address(addr)


def double(gpu, x, out, n):  # out = 2 x, every access inside the tensors
    if gpu.touch(x, 4 * n) and gpu.touch(out, 4 * n):
        src, dst = _floats(x, n), _floats(out, n)
        for i in range(n):
            dst[i] = 2 * src[i]


def read_past_end(gpu, x, out, n):
    double(gpu, x, out, n)
    gpu.touch(x + 4 * n, 4)


def read_before_start(gpu, x, out, n):
    double(gpu, x, out, n)
    gpu.touch(x - 4, 4)


def scribble(gpu, x, out, n):  # writes its input
    double(gpu, x, out, n)
    _floats(x, n)[n - 1] = 42.0


KERNELS = {k.__name__: SimpleNamespace(name=k.__name__, nargs=3, body=k)
           for k in (double, read_past_end, read_before_start, scribble)}


@pytest.fixture
def fake(monkeypatch):
    gpu = FakeCuda()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return gpu


class _Fn:
    """A library function the way ctypes exposes one: callable, with settable argtypes/restype."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)


def _module(gpu: FakeCuda) -> CudaModule:
    driver = object.__new__(Driver)  # no libcuda here: the fake takes its place
    driver.lib = SimpleNamespace(**{name: _Fn(getattr(gpu, name)) for name in dir(gpu) if name.startswith("cu")})
    driver._guard_problem, driver._granularity, driver.vmm = None, 0, {}
    module = object.__new__(CudaModule)
    module.driver, module.funcs, module._smem_set = driver, dict(KERNELS), {}
    return module


def _plan(kernel: str, n: int) -> Plan:
    args = (("ptr", "x"), ("ptr", "out"), ("i64", n))
    return Plan((PlannedLaunch(kernel, args, (1, 1, 1), (32, 1, 1), 0),), ())


@pytest.mark.parametrize("guard", ["end", "start"])
def test_guarded_run_launches_on_copies_flush_against_the_unmapped_edge(fake, guard):
    module = _module(fake)
    n = 1000  # 4000 bytes: a multiple of 16, so flush means flush
    x = torch.arange(n, dtype=torch.float32)
    out = torch.full((n,), -1.0)
    run = module.bind(_plan("double", n), {"x": x, "out": out}, guard=guard)
    assert isinstance(run, GuardedRun) and module.supports_guard
    run()
    _, (px, pout, pn) = fake.launched[-1]
    bx, bout = run.buffers["x"][0], run.buffers["out"][0]
    assert (px, pout, pn) == (bx.ptr, bout.ptr, n)
    assert px != x.data_ptr() and pout != out.data_ptr()
    for b in (bx, bout):
        if guard == "end":
            assert b.ptr + 4 * n == b.start + GRAN and not fake.accessible(b.ptr + 4 * n, 1)
        else:
            assert b.ptr == b.start and not fake.accessible(b.ptr - 1, 1)
    assert torch.equal(out, 2 * torch.arange(n, dtype=torch.float32))  # copied back
    run.close()


@pytest.mark.parametrize("kernel,guard", [("read_past_end", "end"), ("read_before_start", "start")])
def test_an_access_outside_a_tensor_raises_a_sticky_launch_error_naming_the_guard(fake, kernel, guard):
    module = _module(fake)
    run = module.bind(_plan(kernel, 1000), {"x": torch.ones(1000), "out": torch.empty(1000)}, guard=guard)
    with pytest.raises(LaunchError) as info:
        run()
    e = info.value
    assert e.sticky and e.guard == guard and e.code == 700
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in str(e) and "x: 4000 B, 0 B from the unmapped range" in str(e)


def test_the_same_kernels_unguarded_see_the_callers_tensors(fake):
    module = _module(fake)
    x, out = torch.ones(1000), torch.empty(1000)
    fake.mapped.append((x.data_ptr(), x.data_ptr() + 4000))
    fake.mapped.append((out.data_ptr(), out.data_ptr() + 4000))
    run = module.bind(_plan("double", 1000), {"x": x, "out": out})
    assert not isinstance(run, GuardedRun)
    run()
    assert fake.launched[-1][1][:2] == [x.data_ptr(), out.data_ptr()] and torch.equal(out, 2 * x)


def test_a_write_into_an_input_reaches_the_callers_tensor(fake):
    module = _module(fake)
    x = torch.zeros(1000)
    with module.bind(_plan("scribble", 1000), {"x": x, "out": torch.empty(1000)}, guard="end") as run:
        run()
    assert float(x[-1]) == 42.0 and float(x[:-1].abs().sum()) == 0.0  # the verifier's mutation check sees it


def test_each_call_copies_the_callers_current_contents_in(fake):
    module = _module(fake)
    x, out = torch.ones(1000), torch.empty(1000)
    with module.bind(_plan("double", 1000), {"x": x, "out": out}, guard="end") as run:
        run()
        x.fill_(3.0)  # changed between calls, as the verifier refills out and rotates inputs
        run()
    assert torch.equal(out, torch.full((1000,), 6.0))


def test_a_strided_tensor_copies_its_whole_span_and_keeps_its_alignment_modulo_16(fake):
    module = _module(fake)
    base = torch.arange(64 * 33, dtype=torch.float32)
    x = base.view(64, 33)[:, :32]  # rows of 32 in a pitch of 33: span 63*33+32 elements
    assert launch.span_bytes(x) == (63 * 33 + 32) * 4
    view = base[1:1001]  # 4 bytes past an aligned start
    with module.bind(_plan("double", 1000), {"x": view, "out": torch.empty(1000)}, guard="end") as run:
        b = run.buffers["x"][0]
        assert b.ptr % 16 == view.data_ptr() % 16 == 4
        assert 0 <= b.slack < 16 and b.ptr + b.nbytes + b.slack == b.start + b.mapped


def test_close_unmaps_and_frees_every_buffer_and_refuses_later_calls(fake):
    module = _module(fake)
    run = module.bind(_plan("double", 1000), {"x": torch.ones(1000), "out": torch.empty(1000)}, guard="start")
    run()
    reserved = [c for c in fake.calls if c[0] == "reserve"]
    run.close()
    assert sorted(c[1] for c in fake.calls if c[0] == "free") == sorted(c[1] for c in reserved)
    assert len([c for c in fake.calls if c[0] == "unmap"]) == len(reserved)  # the probe's one byte included
    assert fake.mapped == []
    with pytest.raises(RuntimeError, match="closed"):
        run()


def test_no_virtual_memory_support_is_a_setup_error_not_a_kernel_verdict(fake):
    fake.vmm_supported = 0
    module = _module(fake)
    assert module.supports_guard is False
    assert "attribute 102 is 0" in module.driver.guard_problem()
    with pytest.raises(GuardSetupError):
        module.bind(_plan("double", 1000), {"x": torch.ones(1000), "out": torch.empty(1000)}, guard="end")
    assert not issubclass(GuardSetupError, LaunchError)  # the runner must never read it as out_of_bounds


def test_absent_optional_tensors_stay_null_and_get_no_buffer(fake):
    module = _module(fake)
    p = Plan((PlannedLaunch("double", (("ptr", "x"), ("ptr", "weight"), ("i64", 0)), (1, 1, 1), (32, 1, 1), 0),), ())
    with module.bind(p, {"x": torch.ones(4), "weight": None}, guard="end") as run:
        assert set(run.buffers) == {"x"}
        run()
    assert fake.launched[-1][1][1] == 0


def test_an_unknown_guard_side_is_refused(fake):
    with pytest.raises(ValueError):
        _module(fake).bind(_plan("double", 4), {"x": torch.ones(4), "out": torch.empty(4)}, guard="middle")
