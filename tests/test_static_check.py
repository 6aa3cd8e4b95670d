"""Checks before compiling: source rules, spec/kernel agreement, aliasing, requires."""

import pytest

from forge_pack.core.candidate import Candidate, parse_spec
from forge_pack.core.errors import ForgeError
from forge_pack.evaluate.launch import check_requires, plan
from forge_pack.search.families import reference_candidate
from forge_pack.evaluate.static_check import check, kernel_params

from eval_helpers import KERNELS, expected_reasons, load_fixture
from forge_pack.targets.sigparse import parse_signature

SIG = parse_signature("softmax", "x: bf16[64,1000], dim=-1, dtype=float32")
GN = parse_signature("group_norm", "x: f32[2,64,8,8], num_groups=8, weight: f32[64], bias: f32[64]")


def cuda(src: str, spec: str, op: str = "softmax") -> Candidate:
    return Candidate(op, "cuda", src, parse_spec(spec))


SPEC4 = '{"kernels": [{"name": "k", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [128]}]}'


def test_kernel_params_are_parsed_with_constness_and_kinds():
    src = ('extern "C" __global__ void __launch_bounds__(256) k(const __nv_bfloat16* __restrict__ x, '
           'float * out, long long rows, int cols, float eps, float const* w) {}')
    ps = kernel_params(src, "k")
    assert [(p.name, p.kind, p.const) for p in ps] == [("x", "ptr", True), ("out", "ptr", False),
                                                      ("rows", "i64", False), ("cols", "i32", False),
                                                      ("eps", "f32", False), ("w", "ptr", True)]
    assert ps[0].base == "__nv_bfloat16"
    assert kernel_params(src, "missing") is None


def test_reference_kernels_pass_static_checks():
    for op, text in [("softmax", "x: bf16[64,1000], dim=-1, dtype=float32"),
                     ("log_softmax", "x: f16[8,100], dim=1"),
                     ("group_norm", "x: bf16[2,64,8,8], num_groups=8, weight: bf16[64], bias: bf16[64]"),
                     ("adaptive_avg_pool2d", "x: f32[4,32,7,7]{channels_last}, output_size=(1,1)")]:
        sig = parse_signature(op, text)
        for backend in ("cuda", "cpu"):
            cand = reference_candidate(sig, backend)
            assert cand is not None and cand.origin == "reference"
            assert check(cand, sig) is None, (op, backend)
    assert reference_candidate(SIG, "cuda") is not None


def test_arity_mismatch_is_static_check():
    src = 'extern "C" __global__ void k(const __nv_bfloat16* x, float* out, long long rows) {}'
    v = check(cuda(src, SPEC4), SIG)
    assert v.reason == "static_check" and "declares 3 parameters" in v.detail and "passes 4" in v.detail


def test_dtype_mismatch_of_a_pointer_is_static_check():
    src = 'extern "C" __global__ void k(const float* x, float* out, long long rows, long long cols) {}'
    v = check(cuda(src, SPEC4), SIG)
    assert v.reason == "static_check" and "bfloat16" in v.detail


def test_int_width_mismatch_names_the_fix():
    v = check(load_fixture(KERNELS / "cuda_int_width.cu"), parse_signature("softmax", "x: f32[64,1000], dim=-1"))
    assert v.reason == "static_check" and '"i32:rows"' in v.detail


def test_input_bound_to_writable_parameter_is_aliasing():
    for name in ("cuda_aliasing.cu", "cpu_aliasing.cpp"):
        v = check(load_fixture(KERNELS / name), parse_signature("softmax", "x: f32[64,1000], dim=-1"))
        assert v is not None and v.reason == "aliasing" and "`x`" in v.detail, name


@pytest.mark.parametrize("name", ["cuda_side_stream.cu", "cpu_side_thread.cpp"])
def test_side_stream_and_side_thread_work_is_rejected_before_compiling(name):
    path = KERNELS / name
    v = check(load_fixture(path), parse_signature("softmax", "x: f32[64,1000], dim=-1"))
    assert v is not None and v.reason in expected_reasons(path)


@pytest.mark.parametrize("src,needle", [
    ('#include <torch/extension.h>\nextern "C" __global__ void k() {}', "not allowed"),
    ('extern "C" __global__ void k() { cudaStream_t s; }', "CUDA runtime"),
    ('int main() { return 0; }', "main"),
])
def test_forbidden_cuda_source(src, needle):
    v = check(cuda(src, SPEC4), SIG)
    assert v.reason == "static_check" and needle in v.detail


def test_missing_out_argument_is_static_check():
    src = 'extern "C" __global__ void k(const __nv_bfloat16* x, long long rows) {}'
    v = check(cuda(src, '{"kernels": [{"name": "k", "args": ["x", "rows"]}]}'), SIG)
    assert v.reason == "static_check" and "out" in v.detail


def test_requires_false_is_inapplicable_and_bad_names_are_static_check():
    spec = '{"kernels": [{"name": "k", "args": ["x", "out"]}], "requires": ["cols % 1024 == 0"]}'
    v = check(cuda('extern "C" __global__ void k(const __nv_bfloat16* x, float* out) {}', spec), SIG)
    assert v.reason == "inapplicable" and "cols % 1024 == 0" in v.detail
    spec = '{"kernels": [{"name": "k", "args": ["x", "out", "colz"]}]}'
    v = check(cuda('extern "C" __global__ void k(const __nv_bfloat16* x, float* out, long long c) {}', spec), SIG)
    assert v.reason == "static_check" and "colz" in v.detail


def test_oversized_block_is_a_launch_error_before_compiling():
    spec = '{"kernels": [{"name": "k", "args": ["x", "out"], "block": [2048]}]}'
    v = check(cuda('extern "C" __global__ void k(const __nv_bfloat16* x, float* out) {}', spec), SIG)
    assert v.reason == "launch_error" and "2048" in v.detail


def test_plan_types_arguments_and_evaluates_expressions():
    spec = parse_spec('{"kernels": [{"name": "k", "args": ["x", "weight", "bias", "out", "C", "eps", "i32:HW", '
                      '"f32:1.0/GROUP_SIZE", "CPG*HW"], "grid": ["N*G"], "block": [256], '
                      '"shared_mem": "CPG*4"}], "workspaces": [{"name": "ws", "bytes": "N*G*8", "zero": true}]}')
    p = plan(spec, GN)
    (l,) = p.launches
    assert l.args == (("ptr", "x"), ("ptr", "weight"), ("ptr", "bias"), ("ptr", "out"), ("i64", 64),
                      ("f32", 1e-5), ("i32", 64), ("f32", 1.0 / 512), ("i64", 512))
    assert l.grid == (16, 1, 1) and l.block == (256, 1, 1) and l.shared_mem == 32
    assert p.workspaces == (("ws", 128, True),)


def test_plan_errors_are_forge_errors():
    with pytest.raises(ForgeError, match="not an integer"):
        plan(parse_spec('{"kernels": [{"name": "k", "args": ["out"], "grid": ["rows / 3"]}]}'), SIG)
    with pytest.raises(ForgeError, match="32 bits"):
        plan(parse_spec('{"kernels": [{"name": "k", "args": ["i32:rows * 1000000000"]}]}'), SIG)
    with pytest.raises(ForgeError, match="shadows"):
        plan(parse_spec('{"kernels": [{"name": "k", "args": ["out"]}], "workspaces": [{"name": "x", "bytes": 4}]}'),
             SIG)
    assert check_requires(parse_spec('{"kernels": [{"name": "k", "args": ["out"]}], "requires": ["rows > 1"]}'),
                          SIG) is None


_BODY = ('extern "C" __global__ void k(const __nv_bfloat16* x, float* out, long long rows, long long cols) {\n'
         '  if (threadIdx.x == 0) out[blockIdx.x] = 0.f;\n}\n')


@pytest.mark.parametrize("prefix,named", [
    ("#ifdef __CUDACC_RTC__\n#define SKIP 1\n#endif\n", "`#ifdef` tests `__CUDACC_RTC__`"),  # NVRTC only
    ("#if defined(TORCH_EXTENSION_NAME)\n#endif\n", "`#if` tests `TORCH_EXTENSION_NAME`"),  # the package only
    ("#ifndef NDEBUG\n#endif\n", "`#ifndef` tests `NDEBUG`"),  # Python's extension builds pass -DNDEBUG
    ("#define __NVCC__ 1\n#ifdef __NVCC__\n#endif\n", "`#ifdef` tests `__NVCC__`"),  # defining it does not help
    ("#if defined(__CUDA_ARCH__) && defined(__OPTIMIZE__)\n#endif\n", "`#if` tests `__OPTIMIZE__`"),
])
def test_a_conditional_on_a_build_macro_is_static_check(prefix, named):
    """The search (NVRTC / g++) and the package (nvcc / the torch extension) compile the same source:
    a test on a macro only one of them defines could ship a kernel other than the verified one."""
    v = check(cuda(prefix + _BODY, SPEC4), SIG)
    assert (v.ok, v.reason) == (False, "static_check")
    assert named in v.detail and "the shipped kernel differ from the verified one" in v.detail


@pytest.mark.parametrize("text", ["__FILE__", "__DATE__", "__TIME__", "__COUNTER__", "__has_include(<cuda_bf16.h>)"])
def test_macros_that_differ_between_builds_are_refused_anywhere(text):
    v = check(cuda(f"#define TAG {text}\n" + _BODY, SPEC4), SIG)
    assert (v.ok, v.reason) == (False, "static_check")
    assert v.detail.startswith(f"line 1: `{text.split('(')[0]}` differs between the search's build and the package's")


@pytest.mark.parametrize("prefix", [
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n#endif\n",  # the same device architecture in both
    "#ifndef IN_T\n#define IN_T float\n#endif\n",  # the source's own macro
    "#if FAST_EXP\n#endif\n",  # a knob of its own it never defines: undefined in both builds
    "#if 0x10u > 3\n#endif\n",  # digits and suffixes are not names
    "#if defined(__AVX512F__) || defined(__AVX2__)\n#endif\n",  # same -march in both; the package checks the CPU
])
def test_conditionals_on_the_sources_own_macros_pass(prefix):
    assert check(cuda(prefix + _BODY, SPEC4), SIG) is None


def test_every_template_family_passes_the_build_parity_rule():
    from forge_pack.search import templates_proposer as tp
    from forge_pack.search.template_kit import H200
    from forge_pack.evaluate.static_check import check_source

    seen = 0
    for op, text in [("softmax", "x: f32[512,2048], dim=-1"), ("softmax", "x: f32[8,262144], dim=-1"),
                     ("group_norm", "x: bf16[1,128,256,256], num_groups=32, weight: bf16[128], bias: bf16[128]"),
                     ("layer_norm", "x: f32[64,768], normalized_shape=(768,), weight: f32[768], bias: f32[768]"),
                     ("batch_norm", "x: bf16[32,256,56,56], running_mean: bf16[256], running_var: bf16[256], "
                                    "weight: bf16[256], bias: bf16[256]"),
                     ("adaptive_avg_pool2d", "x: bf16[32,2048,7,7]{channels_last}, output_size=(1,1)")]:
        sig = parse_signature(op, text)
        for backend in ("cuda", "cpu"):
            for fam in tp.applicable_families(sig, backend):
                cand = tp._candidate(fam, sig, tp._first_valid(fam, sig, fam.defaults(sig, H200), H200))
                assert check_source(cand) is None, (backend, fam.name, check_source(cand))
                seen += 1
    assert seen >= 20


@pytest.mark.parametrize("name", ["cuda_nvrtc_only_honest.cu", "cpu_release_build_shortcut.cpp"])
def test_two_faced_fixtures_are_refused_before_compiling(name):
    """Honest where the search compiles them, not where the package does (tests/kernels/)."""
    v = check(load_fixture(KERNELS / name), parse_signature("softmax", "x: f32[512,2048], dim=-1"))
    assert expected_reasons(KERNELS / name) == {"static_check"}
    assert (v.ok, v.reason) == (False, "static_check") and "a macro a compiler or build defines" in v.detail
