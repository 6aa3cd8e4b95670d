"""static_check's rejections, each asserted as the whole Verdict (ok, reason, exact detail).

The messages are read by whoever wrote the kernel (often an LLM) and decide whether a candidate is
compiled at all, so a changed flag, reason or line number must turn a test red.
"""

import pytest

from forge_pack.core.candidate import Candidate, parse_spec
from forge_pack.targets.sigparse import parse_signature
from forge_pack.evaluate.static_check import Param, check, check_source, kernel_params
from forge_pack.core.verdict import Verdict

SIG = parse_signature("softmax", "x: bf16[64,1000], dim=-1, dtype=float32")
F32 = parse_signature("softmax", "x: f32[64,1000], dim=-1")
HDR = 'extern "C" __global__ void '
SPEC2 = '{"kernels": [{"name": "k", "args": ["x", "out"]}]}'


def cuda(src: str, spec: str = SPEC2, op: str = "softmax") -> Candidate:
    return Candidate(op, "cuda", src, parse_spec(spec))


def cpu(src: str, spec: str = SPEC2, op: str = "softmax") -> Candidate:
    return Candidate(op, "cpu", src, parse_spec(spec))


def rejected(reason: str, detail: str) -> Verdict:
    return Verdict(False, reason, detail)


def test_an_unknown_backend_is_rejected():
    c = Candidate("softmax", "rocm", "", parse_spec(SPEC2))
    assert check(c, SIG) == rejected("static_check", "unknown backend 'rocm'")


def test_a_candidate_for_another_op_is_rejected():
    c = cuda(HDR + "k(const __nv_bfloat16* x, float* out) {}", op="log_softmax")
    assert check(c, SIG) == rejected("static_check", "candidate is for op 'log_softmax', target is 'softmax'")


def test_a_signature_forge_pack_does_not_target_is_inapplicable():
    sig = parse_signature("softmax", "x: f32[64,1000], dim=0")
    assert check(cuda(HDR + "k(const float* x, float* out) {}"), sig) == rejected(
        "inapplicable", "forge-pack does not target this signature: softmax over a dimension other than the last")


def test_a_false_requires_rule_is_inapplicable_with_the_rule_and_the_signature():
    spec = '{"kernels": [{"name": "k", "args": ["x", "out"]}], "requires": ["cols % 1024 == 0"]}'
    v = check(cuda(HDR + "k(const __nv_bfloat16* x, float* out) {}", spec), SIG)
    assert v == rejected("inapplicable", f"requires `cols % 1024 == 0` is false for {SIG.pretty()}")


def test_a_launch_spec_error_names_the_message_and_its_hint():
    spec = '{"kernels": [{"name": "k", "args": ["out"], "grid": ["rows / 3"]}]}'
    assert check(cuda(HDR + "k(float* out) {}", spec), SIG) == rejected(
        "static_check", "launch spec: kernels[0].grid evaluates to 21.333333333333332, not an integer "
                        "(use // for integer division)")


def test_a_cuda_include_outside_the_allowed_headers_lists_them():
    v = check(cuda('#include <cstdio>\n' + HDR + "k(const __nv_bfloat16* x, float* out) {}"), SIG)
    assert v == rejected("static_check", "#include <cstdio> is not allowed: CUDA candidates may include only "
                                         "cuda_bf16.h, cuda_fp16.h, cuda_fp8.h (no torch headers, no host code)")


def test_a_cpu_include_of_threads_is_rejected_but_cmath_is_not():
    src = '#include <cmath>\n#include <thread>\nextern "C" void k(const float* x, float* out) {}'
    assert check(cpu(src), F32) == rejected(
        "static_check", "#include <thread> is not allowed in a CPU candidate (no threads, files, torch or CUDA)")
    assert check(cpu('#include <cmath>\nextern "C" void k(const float* x, float* out) {}'), F32) is None


def test_a_cpu_candidate_is_held_to_the_cpu_rules_and_names_the_line():
    src = 'extern "C" void k(const float* x, float* out) {\n  int t;\n  pthread_create(&t, 0, 0, 0);\n}'
    assert check(cpu(src), F32) == rejected(
        "static_check", "line 3: `pthread_create` starts its own threads (work that outlives the call escapes "
                        "the checks): use OpenMP")


def test_line_numbers_count_the_lines_of_block_comments():
    src = ('/* a comment\n   over three\n   lines */\n' + HDR + "k(const __nv_bfloat16* x, float* out) {\n"
           "  cudaMalloc(0, 4);\n}")
    assert check(cuda(src), SIG) == rejected(
        "static_check", "line 5: `cudaMalloc` calls the CUDA runtime (streams, allocation, launches): the tool "
                        "writes all host code")


def test_forbidden_calls_inside_comments_are_ignored():
    src = ("// cudaMalloc here would be host work\n/* so would\n   cudaStreamCreate( */\n" + HDR
           + "k(const __nv_bfloat16* x, float* out) {}")
    assert check_source(cuda(src)) is None
    assert check(cuda(src), SIG) is None


def test_no_kernel_receiving_out_is_rejected():
    v = check(cuda(HDR + "k(const __nv_bfloat16* x) {}", '{"kernels": [{"name": "k", "args": ["x"]}]}'), SIG)
    assert v == rejected("static_check", "no kernel receives `out`: pass \"out\" in some kernel's args")


def test_an_oversized_block_is_a_launch_error_with_the_thread_count():
    spec = '{"kernels": [{"name": "k", "args": ["x", "out"], "block": [2048]}]}'
    v = check(cuda(HDR + "k(const __nv_bfloat16* x, float* out) {}", spec), SIG)
    assert v == rejected("launch_error", "kernel k: block (2048, 1, 1) has 2048 threads (at most 1024, z at most 64)")


def test_arity_mismatch_lists_the_arguments_passed():
    spec = '{"kernels": [{"name": "k", "args": ["x", "out", "rows", "cols"]}]}'
    v = check(cuda(HDR + "k(const __nv_bfloat16* x, float* out, long long rows) {}", spec), SIG)
    assert v == rejected("static_check", "kernels[0] k declares 3 parameters but the launch spec passes 4 "
                                         "arguments (x, out, rows, cols)")


def test_a_kernel_the_parser_cannot_read_does_not_hide_the_next_kernels_mismatch():
    src = (HDR + "a(const __nv_bfloat16* x, float* out, void (*cb)(int)) {}\n"
           + HDR + "b(const __nv_bfloat16* x, float* out, long long rows) {}")
    spec = '{"kernels": [{"name": "a", "args": ["x", "out", "rows"]}, {"name": "b", "args": ["x", "out"]}]}'
    assert check(cuda(src, spec), SIG) == rejected(
        "static_check", "kernels[1] b declares 3 parameters but the launch spec passes 2 arguments (x, out)")


@pytest.mark.parametrize("params,args,detail", [
    ("const __nv_bfloat16* x, float out", '"x", "out"',
     "kernels[0] k: argument 'out' is a tensor pointer but parameter `float out` is not a pointer"),
    ("const float* x, float* out", '"x", "out"',
     "kernels[0] k: tensor `x` is bfloat16 but parameter `const float* x` points to float"),
    ("const __nv_bfloat16* x, __half* out", '"x", "out"',
     "kernels[0] k: tensor `out` is float32 but parameter `__half* out` points to __half"),
    ("const __nv_bfloat16* x, float* out, long long* rows", '"x", "out", "rows"',
     "kernels[0] k: argument 'rows' is a i64 value but parameter `long long* rows` is a pointer"),
    ("const __nv_bfloat16* x, float* out, double eps", '"x", "out", "f32:1.0"',
     "kernels[0] k: parameter `double eps` is double: scalars are passed as float (f32) or integers"),
    ("const __nv_bfloat16* x, float* out, int rows", '"x", "out", "rows"',
     "kernels[0] k: argument 'rows' is passed as 64-bit int (long long) but parameter `int rows` is 32-bit int: "
     "write \"i32:rows\" in the spec or change the parameter type"),
    ("const __nv_bfloat16* x, float* out, long long cols", '"x", "out", "i32:cols"',
     "kernels[0] k: argument 'i32:cols' is passed as 32-bit int but parameter `long long cols` is 64-bit int "
     "(long long): write \"i64:cols\" in the spec or change the parameter type"),
    ("const __nv_bfloat16* x, float* out, int scale", '"x", "out", "f32:2.5"',
     "kernels[0] k: argument 'f32:2.5' is passed as float but parameter `int scale` is 32-bit int: "
     "write \"i32:2.5\" in the spec or change the parameter type"),
])
def test_argument_and_parameter_disagreements_name_the_fix(params, args, detail):
    spec = '{"kernels": [{"name": "k", "args": [%s]}]}' % args
    assert check(cuda(HDR + f"k({params}) {{}}", spec), SIG) == rejected("static_check", detail)


def test_a_struct_parameter_is_not_type_checked():
    spec = '{"kernels": [{"name": "k", "args": ["x", "out", "rows"]}]}'
    assert check(cuda(HDR + "k(const __nv_bfloat16* x, float* out, struct Shape rows) {}", spec), SIG) is None


def test_an_input_bound_to_a_writable_pointer_is_aliasing_with_the_fix():
    v = check(cuda(HDR + "k(__nv_bfloat16* x, float* out) {}"), SIG)
    assert v == rejected("aliasing", "kernels[0] k: input `x` is bound to the writable parameter "
                                     "`__nv_bfloat16* x`: the kernel may write into its input (output aliases "
                                     "an input); declare inputs `const T*` and write only to `out` or workspaces")


def test_parameter_qualifiers_and_spellings_are_parsed():
    src = (HDR + "k(const float* __restrict__ a, const float * __restrict b, float* restrict c, "
           "volatile int* d, __grid_constant__ const long long e, const float& f, float g[], "
           "std::int64_t h, double i, unsigned j, struct Pair k, float const* l, int m = 3)")
    got = [(p.name, p.kind, p.base, p.const) for p in kernel_params(src, "k")]
    assert got == [("a", "ptr", "float", True), ("b", "ptr", "float", True), ("c", "ptr", "float", False),
                   ("d", "ptr", "int", False), ("e", "i64", "long long", True), ("f", "f32", "float", True),
                   ("g", "ptr", "float", False), ("h", "i64", "int64_t", False), ("i", "f64", "double", False),
                   ("j", "i32", "unsigned", False), ("k", "other", "Pair", False), ("l", "ptr", "float", True),
                   ("m", "i32", "int", False)]


def test_comments_inside_a_parameter_list_leave_the_types_intact():
    src = (HDR + "k(const float* x, /* the result,\n  one row per block */ float* out, // rows\n long long rows)")
    assert [(p.name, p.kind, p.base) for p in kernel_params(src, "k")] == [
        ("x", "ptr", "float"), ("out", "ptr", "float"), ("rows", "i64", "long long")]


@pytest.mark.parametrize("decl,expected", [
    ("k()", []),
    ("k(void)", []),
    ("k(const float* x, ...)", None),
    ("k(const float* x, void (*f)(int))", None),
    ("k(float*)", None),  # an unnamed parameter cannot be matched to an argument
    ("k(const float* x, float* 2out)", None),
])
def test_parameter_lists_the_parser_reads_or_declines(decl, expected):
    assert kernel_params(HDR + decl + " {}", "k") == expected


def test_template_arguments_with_commas_stay_in_one_parameter():
    ps = kernel_params(HDR + "k(const Vec<float, 4>* x, float* out, int n)", "k")
    assert [(p.name, p.kind) for p in ps] == [("x", "ptr"), ("out", "ptr"), ("n", "i32")]
    ps = kernel_params(HDR + "k(float (&a)[4], float* out)", "k")
    assert ps is None


def test_an_unterminated_parameter_list_does_not_raise():
    assert kernel_params(HDR + "k(const float* x, float* out", "k") == [
        Param("const float* x", "x", "ptr", "float", True), Param("float* ou", "ou", "ptr", "float", False)]


def test_an_i64_argument_for_an_int_parameter_names_the_i32_spelling():
    spec = '{"kernels": [{"name": "k", "args": ["x", "out", "i64:cols"]}]}'
    v = check(cuda(HDR + "k(const __nv_bfloat16* x, float* out, int cols) {}", spec), SIG)
    assert v == rejected("static_check", "kernels[0] k: argument 'i64:cols' is passed as 64-bit int (long long) but "
                                         "parameter `int cols` is 32-bit int: write \"i32:cols\" in the spec or "
                                         "change the parameter type")


def test_a_const_pointer_to_writable_data_is_not_a_read_only_input():
    ps = kernel_params(HDR + "k(float* const a, const float* const b, float const* c)", "k")
    assert [(p.name, p.const) for p in ps] == [("a", False), ("b", True), ("c", True)]
    v = check(cuda(HDR + "k(__nv_bfloat16* const x, float* out) {}"), SIG)
    assert v.reason == "aliasing" and v.detail.startswith(
        "kernels[0] k: input `x` is bound to the writable parameter `__nv_bfloat16* const x`")


@pytest.mark.parametrize("decl", [
    "k(const float* x, float* out, __attribute__((unused)) int n)",  # parentheses: an attribute
    "k(float* out, Args... rest)",  # a parameter pack
])
def test_parameters_with_attributes_or_packs_make_the_list_unreadable(decl):
    assert kernel_params(HDR + decl + " {}", "k") is None


def test_parentheses_and_brackets_nest_when_splitting_parameters():
    ps = kernel_params(HDR + "k(float* X, int a = (1), const Map<Pair<int, int>, float>* m, float* out) {}", "k")
    assert [(p.name, p.kind, p.base) for p in ps] == [("X", "ptr", "float"), ("a", "i32", "int"),
                                                     ("m", "ptr", "Map<Pair<int, int>, float>"),
                                                     ("out", "ptr", "float")]
