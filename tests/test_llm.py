"""The LLM proposer against a real OpenAI-protocol HTTP server on 127.0.0.1 with scripted replies."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from fake_llm import FakeLLM, free_port_url
from forge_pack.core.candidate import Candidate
from forge_pack.core.errors import ForgeError
from forge_pack.core.hotspot import Hotspot
from forge_pack.llm.client import Budget, LLMClient, LLMConfig, redact, register_secret, run_summary_text, summary_from_store
from forge_pack.llm.check import parse_reply, static_check
from forge_pack.llm.options import build_llm_proposer, llm_config
from forge_pack.llm.proposer import LLMProposer
from forge_pack.search.propose import NodeView, ProposeRequest
from forge_pack.core.signature import Signature, TensorSpec
from forge_pack.store.run_store import Store
from forge_pack.core.verdict import Baseline, Evaluation, Timing, Verdict

pytestmark = pytest.mark.llm

KEY = "sk-forge-test-SECRET-0123456789abcdef"
REPLIES = Path(__file__).parent / "llm_replies"
MODEL = "fake-model"


def reply(name: str) -> dict:
    return {"reply": (REPLIES / f"{name}.md").read_text()}


def softmax_hotspot(rows: int = 64, cols: int = 128) -> Hotspot:
    x = TensorSpec("float32", (rows, cols), (cols, 1))
    sig = Signature("softmax", (("x", x),), (("dim", 1),), x)
    return Hotspot(sig, ("F.softmax",), 1, 50.0, 50.0, 0.5, device="cpu")


def make_proposer(url: str, store=None, **overrides) -> LLMProposer:
    cfg = dict(model=MODEL, base_url=url, timeout_s=3.0, backoff_s=0.01, max_tokens=2000)
    cfg.update(overrides)
    config = LLMConfig(**cfg)
    return LLMProposer(config, client=LLMClient(config, KEY), store=store)


def candidate_from(name: str, origin: str = "template") -> Candidate:
    parsed = parse_reply((REPLIES / f"{name}.md").read_text(), "cpu")
    return Candidate("softmax", "cpu", parsed.source, parsed.spec, family="ref", origin=origin)


def ok_node(node_id: int, cand: Candidate) -> NodeView:
    ev = Evaluation(Verdict(True, "ok"), Timing(40.0, 1.0, 30, 39.0, "monotonic"), speedup_vs_eager=1.25,
                    speedup_vs_compile=0.9, bandwidth_fraction=0.31)
    return NodeView(node_id, cand, ev, 1)


def failed_node(node_id: int, cand: Candidate, reason: str = "compile_error") -> NodeView:
    ev = Evaluation(Verdict(False, reason, "kernel.cpp:11:5: error: expected ';' before 'for'"),
                    compile_log="kernel.cpp: In function 'void llm_softmax(...)':\n"
                                "kernel.cpp:11:5: error: expected ';'")
    return NodeView(node_id, cand, ev, 1)


def request(parent=None, hs=None, **kw) -> ProposeRequest:
    baseline = Baseline(Timing(50.0, 2.0, 30, 48.0, "monotonic"), Timing(45.0, 2.0, 30, 44.0, "monotonic"),
                        floor_us=2.0, copy_bandwidth_gbs=20.0)
    return ProposeRequest(hs or softmax_hotspot(), "cpu", parent, baseline, **kw)


def llm_rows(store: Store) -> list[dict]:
    return [dict(r) for r in store.query("SELECT * FROM llm_calls ORDER BY id")]


def assert_key_absent(run_dir: Path) -> None:
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f"the API key leaked into {f}"


# ---------------------------------------------------------------- the moves, one by one


def test_llm_new_family_then_rewrite_are_recorded_with_tokens_latency_and_cost(tmp_path):
    with FakeLLM([reply("good_cpu"), reply("fixed_cpu")]) as srv, Store(tmp_path) as store:
        p = make_proposer(srv.url, store)
        hs = softmax_hotspot()
        (first,) = p.propose(request(None, hs))
        assert first.kind == "llm" and first.label == "llm new family"
        assert first.candidate.origin == "llm" and first.candidate.family == "llm"
        assert "llm_softmax" in first.candidate.source
        (second,) = p.propose(request(ok_node(7, first.candidate), hs))
        assert second.label == "llm rewrite #1" and second.candidate.content_hash != first.candidate.content_hash
        rows = llm_rows(store)
        assert [(r["purpose"], r["outcome"]) for r in rows] == [("new_family", "ok"), ("rewrite", "ok")]
        assert rows[1]["node_id"] == 7 and rows[1]["hotspot_id"] == hs.id
        assert rows[1]["cand_hash"] == second.candidate.content_hash
        for r in rows:
            assert r["prompt_tokens"] > 0 and r["completion_tokens"] > 0 and r["latency_s"] > 0
            assert r["cost_usd"] > 0  # an unknown model is priced by the conservative default
            assert "softmax(x: f32[64,128], dim=1)" in r["prompt"] and "```cpp" in r["reply"]
        # the rewrite prompt carries the parent's source, timing and bandwidth fraction
        user = srv.chat_requests[1]["body"]["messages"][1]["content"]
        assert "1.25x vs eager" in user and "31% of the copy bandwidth" in user and "llm_softmax" in user
        assert srv.chat_requests[0]["headers"]["authorization"] == f"Bearer {KEY}"
        assert p.summary()["outcomes"] == {"ok": 2}


def test_llm_repair_move_gets_the_verdict_and_compile_log_and_is_bounded(tmp_path):
    with FakeLLM([reply("fixed_cpu")]) as srv, Store(tmp_path) as store:
        p = make_proposer(srv.url, store, new_family=False, repair_attempts=1)
        broken = candidate_from("broken_cpu")
        (move,) = p.propose(request(failed_node(3, broken)))
        assert move.kind == "repair" and move.candidate.origin == "repair"
        user = srv.chat_requests[0]["body"]["messages"][1]["content"]
        assert "compile_error" in user and "expected ';'" in user and "float s = 0.f\n" in user
        # one repair per failed node; the repair itself failing is at the chain's limit (1)
        assert p.propose(request(failed_node(3, broken))) == []
        assert p.propose(request(failed_node(9, move.candidate, "mismatch"))) == []
        assert len(srv.chat_requests) == 1
        assert [r["outcome"] for r in llm_rows(store)] == ["ok"]


def test_llm_broken_kernel_is_repaired_through_the_search(tmp_path):
    """new family (broken, compile error) -> repair (fixed, compiles) inside the real MCTS."""
    from forge_pack.search.mcts import SearchConfig, search

    def respond(body):
        user = body["messages"][-1]["content"]
        if "The kernel that failed" in user:
            return reply("fixed_cpu")
        if "Write a new kernel" in user:
            return reply("broken_cpu")
        return {"reply": "no more ideas"}

    evaluated = []

    def evaluate(cand: Candidate) -> Evaluation:  # compile with g++: the broken kernel must fail for real
        from forge_pack.evaluate.compile import compile_candidate

        build = compile_candidate(cand, cache_dir=tmp_path / "cache")
        evaluated.append((cand.origin, build.ok))
        if not build.ok:
            return Evaluation(Verdict(False, "compile_error", build.log[:2000]), compile_log=build.log)
        return Evaluation(Verdict(True, "ok"), Timing(40.0, 1.0, 30), speedup_vs_eager=1.25)

    with FakeLLM(responder=respond) as srv, Store(tmp_path / "run") as store:
        p = make_proposer(srv.url, store)
        result = search([p], evaluate, SearchConfig(budget=4, seed=0), hotspot=softmax_hotspot(), backend="cpu")
        assert ("llm", False) in evaluated and ("repair", True) in evaluated
        assert result.best is not None and result.best.candidate.origin == "repair"
        outcomes = [(r["purpose"], r["outcome"]) for r in llm_rows(store)]
        assert ("new_family", "ok") in outcomes and ("repair", "ok") in outcomes
        assert result.evaluations <= 4


def test_llm_garbage_reply_gets_one_fix_turn_then_is_a_failed_move(tmp_path):
    with FakeLLM([reply("garbage"), reply("garbage")]) as srv, Store(tmp_path) as store:
        p = make_proposer(srv.url, store)
        assert p.propose(request(None)) == []
        rows = llm_rows(store)
        assert [(r["purpose"], r["outcome"]) for r in rows] == [("new_family", "unparseable"),
                                                               ("fix_reply", "unparseable")]
        fix = srv.chat_requests[1]["body"]["messages"]
        assert fix[-2]["role"] == "assistant" and "oops" in fix[-2]["content"]
        assert "rejected before compiling" in fix[-1]["content"]


def test_llm_garbage_then_good_reply_is_a_move():
    with FakeLLM([reply("garbage"), reply("good_cpu")]) as srv:
        p = make_proposer(srv.url)
        (move,) = p.propose(request(None))
        assert "llm_softmax" in move.candidate.source
        assert p.summary()["outcomes"] == {"ok": 1, "unparseable": 1}


def test_llm_refusal_is_recorded_without_a_fix_turn(tmp_path):
    with FakeLLM([reply("refusal")]) as srv, Store(tmp_path) as store:
        assert make_proposer(srv.url, store).propose(request(None)) == []
        assert [r["outcome"] for r in llm_rows(store)] == ["refused"]
        assert len(srv.chat_requests) == 1


def test_llm_static_check_failure_is_recorded_and_explained(tmp_path):
    with FakeLLM([reply("streams_cpu"), reply("streams_cpu")]) as srv, Store(tmp_path) as store:
        assert make_proposer(srv.url, store).propose(request(None)) == []
        rows = llm_rows(store)
        assert [r["outcome"] for r in rows] == ["static_check", "static_check"]
        assert "thread" in rows[0]["error"] and "malloc" in rows[0]["error"]


def test_llm_duplicate_kernel_is_not_a_move(tmp_path):
    existing = candidate_from("good_cpu")
    with FakeLLM([reply("good_cpu")]) as srv, Store(tmp_path) as store:
        p = make_proposer(srv.url, store)
        dup = Candidate("softmax", "cpu", existing.source, existing.spec, family="llm", origin="llm")
        assert p.propose(request(None, tried_hashes=frozenset({dup.content_hash}))) == []
        assert [r["outcome"] for r in llm_rows(store)] == ["duplicate"]


# ---------------------------------------------------------------- robustness


def test_llm_429_then_success_is_retried_with_backoff(tmp_path):
    script = [{"status": 429, "body": {"error": {"message": "rate limited"}}}, reply("good_cpu")]
    with FakeLLM(script) as srv, Store(tmp_path) as store:
        (move,) = make_proposer(srv.url, store).propose(request(None))
        assert len(srv.chat_requests) == 2
        assert [r["outcome"] for r in llm_rows(store)] == ["ok"]


def test_llm_server_errors_exhaust_retries_and_are_recorded(tmp_path):
    with FakeLLM([{"status": 500}, {"status": 503}, {"status": 502}]) as srv, Store(tmp_path) as store:
        assert make_proposer(srv.url, store, max_retries=2).propose(request(None)) == []
        assert len(srv.chat_requests) == 3
        (row,) = llm_rows(store)
        assert row["outcome"] == "http_error" and "502" in row["error"]


def test_llm_reply_that_never_comes_times_out_and_is_recorded(tmp_path):
    with FakeLLM([{"hang": 20}]) as srv, Store(tmp_path) as store:
        t = time.monotonic()
        assert make_proposer(srv.url, store, timeout_s=0.5).propose(request(None)) == []
        assert time.monotonic() - t < 5
        (row,) = llm_rows(store)
        assert row["outcome"] == "timeout" and row["latency_s"] >= 0.4


def test_llm_unreachable_endpoint_stops_llm_moves_after_three_calls(tmp_path):
    with Store(tmp_path) as store:
        p = make_proposer(free_port_url(), store, new_family=False, max_retries=0)
        broken = candidate_from("broken_cpu")
        for node in range(1, 6):
            assert p.propose(request(failed_node(node, broken))) == []
        assert [r["outcome"] for r in llm_rows(store)] == ["connection"] * 3
        assert "no answer" in p.disabled_reason
        assert "LLM moves stopped" in p.format_summary()


def test_llm_budget_stops_llm_moves_not_the_search(tmp_path):
    with FakeLLM(responder=lambda body: reply("good_cpu")) as srv, Store(tmp_path) as store:
        p = make_proposer(srv.url, store, budget_usd=0.1, price_in_usd_per_mtok=10.0, price_out_usd_per_mtok=10.0)
        good = candidate_from("good_cpu")
        moves = [p.propose(request(ok_node(n, good))) for n in range(1, 40)]
        made = sum(1 for m in moves if m)
        assert 1 <= made < 39
        rows = llm_rows(store)
        assert rows[-1]["outcome"] == "budget" and "budget" in p.disabled_reason
        assert sum(r["cost_usd"] for r in rows) <= 0.1
        assert len(srv.chat_requests) == made  # no request once the budget said no


def test_llm_concurrency_limit_holds():
    with FakeLLM(responder=lambda body: {"hang": 0.3}) as srv:
        client = LLMClient(LLMConfig(MODEL, base_url=srv.url, max_concurrency=2, timeout_s=5), KEY)
        threads = [threading.Thread(target=client.chat, args=([{"role": "user", "content": "hi"}],))
                   for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(srv.chat_requests) == 6 and srv.max_active == 2


def test_llm_key_never_reaches_the_run_dir_even_when_a_server_echoes_it(tmp_path):
    echo = {"status": 401, "body": {"error": {"message": f"Incorrect API key provided: {KEY}"}}}
    script = [{"reply": f"your key is {KEY}, no code today"}, echo]
    with FakeLLM(script, default=reply("good_cpu")) as srv, Store(tmp_path) as store:
        p = make_proposer(srv.url, store, new_family=False)
        broken = candidate_from("broken_cpu")
        for node in range(1, 4):
            p.propose(request(failed_node(node, broken)))
        rows = llm_rows(store)
        assert any(r["outcome"] == "auth" for r in rows)
        assert "[REDACTED]" in json.dumps(rows)
        assert p.disabled_reason and KEY not in p.disabled_reason
    assert_key_absent(tmp_path)
    assert KEY not in json.dumps(p.config.to_json())


def test_redact_removes_keys_and_auth_headers():
    register_secret("my-very-own-key-123")
    text = redact("headers {'Authorization': 'Bearer abc.def'} key my-very-own-key-123 sk-proj-AAAAAAAAAAAA "
                  "api_key=zzz")
    for secret in ("abc.def", "my-very-own-key-123", "AAAAAAAAAAAA", "zzz"):
        assert secret not in text


def test_budget_reserves_worst_case_before_calls():
    b = Budget(usd=1.0, tokens=None, price=(100.0, 100.0))  # $1 buys 10k tokens
    first = b.reserve(2000, 2000)  # $0.40 at worst
    assert isinstance(first, tuple) and isinstance(b.reserve(2000, 2000), tuple)
    assert isinstance(b.reserve(2000, 2000), str)  # a third in flight could pass $1
    b.settle(first, 100, 100)  # the first call cost only $0.02
    assert b.spent_usd == pytest.approx(0.02)
    assert isinstance(b.reserve(2000, 2000), tuple)


def test_pricing_table_prefix_default_and_override():
    assert LLMConfig("gpt-4o-mini-2024-07-18").price()[:2] == (0.15, 0.60)
    assert LLMConfig("gpt-4o").price()[2] == "table"
    assert LLMConfig("qwen2.5-coder:32b").price()[2] == "default"
    assert LLMConfig("qwen", price_in_usd_per_mtok=0, price_out_usd_per_mtok=0).price() == (0.0, 0.0, "config")


# ---------------------------------------------------------------- parsing and static checks

CUDA_GOOD = '''```cuda
#include <cuda_bf16.h>
extern "C" __global__ void __launch_bounds__(256) llm_softmax(const float* __restrict__ x, float* __restrict__ out,
                                                             long long rows, long long cols) {
  long long r = blockIdx.x; if (r >= rows) return;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[r * cols + c] = x[r * cols + c];
}
```
```json
{"kernels": [{"name": "llm_softmax", "args": ["x", "out", "rows", "cols"], "grid": ["rows"], "block": [256]}]}
```'''


def test_parse_reply_strips_thinking_and_takes_the_longest_source():
    text = "<think>maybe ```cuda\nbad\n``` no</think>Here.\n```cuda\n// helper\n```\n" + CUDA_GOOD
    parsed = parse_reply(text, "cuda")
    assert "llm_softmax" in parsed.source and parsed.spec.kernels[0].name == "llm_softmax"


def test_parse_reply_takes_a_spec_embedded_in_the_source():
    src = CUDA_GOOD.split("```json")[0].replace("```cuda\n", "").rstrip("`\n")
    spec = CUDA_GOOD.split("```json\n")[1].split("```")[0]
    parsed = parse_reply(f"```cuda\n{src}\n/* forge-pack-spec\n{spec}*/\n```", "cuda")
    assert parsed.spec.kernels[0].name == "llm_softmax"


def test_static_check_cuda_accepts_a_clean_kernel_and_names_each_broken_rule():
    hs = softmax_hotspot()
    ok = parse_reply(CUDA_GOOD, "cuda")
    assert static_check(ok.source, ok.spec, hs.signature, "cuda") == []
    cases = {
        "#include <torch/extension.h>\n": "torch",
        "void h() { cudaStream_t s; cudaStreamCreate(&s); }\n": "cudaStream",
        "__global__ void child() {}\n__global__ void parent() { child<<<1, 1>>>(); }\n": "<<<",
        "void h() { float* p; cudaMalloc(&p, 4); }\n": "cudaMalloc",
        "__device__ float* g() { return (float*)malloc(4); }\n": "malloc",
        "int main() { return 0; }\n": "main",
        "void h() { at::Tensor t; }\n": "at::",
    }
    for extra, needle in cases.items():
        problems = static_check(extra + ok.source, ok.spec, hs.signature, "cuda")
        assert problems and needle in " ".join(problems), (extra, problems)
    renamed = ok.source.replace("llm_softmax(", "other_name(")
    assert "defines no" in " ".join(static_check(renamed, ok.spec, hs.signature, "cuda"))
    # words that merely contain the forbidden names are fine
    fine = ok.source.replace("long long r = blockIdx.x;", "long long r = blockIdx.x; int new_val = 0, freed = 1;")
    assert static_check(fine, ok.spec, hs.signature, "cuda") == []


# ---------------------------------------------------------------- options, forge.toml, the endpoint at start


def test_llm_options_precedence_toml_env_flags(tmp_path, monkeypatch):
    monkeypatch.delenv("FORGE_LLM_BASE_URL", raising=False)
    toml = tmp_path / "forge.toml"
    toml.write_text('[llm]\nmodel = "from-toml"\nbase_url = "http://toml:1/v1"\nbudget_usd = 2.5\n')
    c = llm_config(None, toml=toml)
    assert (c.model, c.base_url, c.budget_usd) == ("from-toml", "http://toml:1/v1", 2.5)
    monkeypatch.setenv("FORGE_LLM_BASE_URL", "http://env:2/v1/")
    c = llm_config("from-flag", budget_usd=1.0, budget_tokens=500, toml=toml)
    assert (c.model, c.base_url, c.budget_usd, c.budget_tokens) == ("from-flag", "http://env:2/v1", 1.0, 500)
    assert llm_config(None, toml={}) is None
    with pytest.raises(ForgeError, match="API key"):
        llm_config("m", toml={"llm": {"api_key": "x"}})
    with pytest.raises(ForgeError, match="unknown keys"):
        llm_config("m", toml={"llm": {"modle": "x"}})


def test_openai_endpoint_without_a_key_is_a_user_error(monkeypatch):
    for var in ("FORGE_LLM_BASE_URL", "FORGE_LLM_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ForgeError, match="no API key"):
        build_llm_proposer("gpt-4o-mini", toml={})


def test_endpoint_down_gives_a_proposer_that_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_LLM_BASE_URL", free_port_url())
    said = []
    with Store(tmp_path) as store:
        p = build_llm_proposer(MODEL, toml={}, store=store, echo=said.append)
        assert p is not None and not p.enabled
        assert p.propose(request(None)) == []
        assert "does not answer" in said[0] and "templates only" in said[0]
    text = run_summary_text(tmp_path)
    assert "LLM moves stopped" in text and "does not answer" in text


def test_probe_says_when_the_model_is_not_served(monkeypatch):
    with FakeLLM(models=("other-model",)) as srv:
        monkeypatch.setenv("FORGE_LLM_BASE_URL", srv.url)
        said = []
        p = build_llm_proposer(MODEL, toml={}, echo=said.append)
        assert not p.enabled and "not served" in p.disabled_reason and "other-model" in p.disabled_reason


def test_summary_from_store_counts_llm_kernels(tmp_path):
    with FakeLLM([reply("good_cpu")]) as srv, Store(tmp_path) as store:
        p = make_proposer(srv.url, store)
        (move,) = p.propose(request(None))
        hs = softmax_hotspot()
        node = store.add_node(hs.id, None, 0, move.label, move.kind, move.candidate.to_json())
        ev = Evaluation(Verdict(True, "ok"), Timing(20.0, 1.0, 30), speedup_vs_eager=2.5)
        store.record_evaluation(node, hs.id, ev.to_json(), 0.9)
        s = summary_from_store(store.conn)
        assert s["calls"] == 1 and s["kernels_evaluated"] == 1 and s["kernels_passed"] == 1
        assert s["best_speedup_vs_eager"] == 2.5
    text = run_summary_text(tmp_path)
    assert "1 calls (ok 1)" in text and "1/1 LLM kernels passed" in text and "2.50x" in text


# ---------------------------------------------------------------- doctor


def test_doctor_checks_the_llm_endpoint(monkeypatch):
    from typer.testing import CliRunner

    from forge_pack.cli.main import app

    monkeypatch.setenv("FORGE_LLM_API_KEY", KEY)
    with FakeLLM() as srv:
        monkeypatch.setenv("FORGE_LLM_BASE_URL", srv.url)
        res = CliRunner().invoke(app, ["doctor", "--llm", MODEL, "--json"])
        doc = json.loads(res.stdout)
        endpoint = next(c for c in doc["checks"] if c["name"] == "llm endpoint")
        assert endpoint["status"] == "ok" and "serves fake-model" in endpoint["detail"]
        assert KEY not in res.stdout
    monkeypatch.setenv("FORGE_LLM_BASE_URL", free_port_url())
    res = CliRunner().invoke(app, ["doctor", "--llm", MODEL])
    assert res.exit_code == 1 and "does not answer" in res.stdout


# ---------------------------------------------------------------- prompts and docs stay consistent

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("backend", ["cuda", "cpu"])
@pytest.mark.parametrize("purpose", ["new_family", "rewrite", "repair"])
def test_prompts_render_every_purpose_for_both_backends(purpose, backend):
    from forge_pack.llm import prompts as llm_prompts

    cand = candidate_from("broken_cpu")
    cand = Candidate("softmax", backend, cand.source, cand.spec, family="ref")
    parent = {"new_family": None, "rewrite": ok_node(2, cand), "repair": failed_node(2, cand)}[purpose]
    gpu = {"gpu": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "copy_bandwidth_gbs": 4250.0}
    req = ProposeRequest(softmax_hotspot(), backend, parent, request().baseline, gpu=gpu if backend == "cuda" else {})
    system, user = (m["content"] for m in llm_prompts.render(purpose, req))
    assert "```" + ("cuda" if backend == "cuda" else "cpp") in system and '"kernels"' in system
    assert "softmax(x: f32[64,128], dim=1)" in user and "torch.nn.functional.softmax(x, dim=1)" in user
    assert "`rows` = 64" in user and "PyTorch eager: median 50.00" in user
    if backend == "cuda":
        assert "sm_90" in system and "NVIDIA H200" in user
        assert "132 SMs" in user or purpose != "rewrite"
    else:
        assert "logical cores" in user and "forge_bf16_to_float" in system
    if parent is not None:
        assert "float s = 0.f" in user
    if purpose == "repair":
        assert "compile_error" in user and "expected ';'" in user


def test_docs_forge_toml_example_is_accepted():
    import re
    import tomllib

    from forge_pack.llm.options import read_toml_llm

    text = (ROOT / "docs" / "llm.md").read_text()
    block = re.search(r"```toml\n(.*?)```", text, re.S).group(1)
    table = read_toml_llm(tomllib.loads(block))
    assert table["model"] and llm_config(None, toml={"llm": table}) is not None


def test_prompt_candidate_format_matches_the_evaluators_docs():
    docs = ROOT / "docs" / "candidate-format.md"
    if not docs.is_file():
        pytest.skip("docs/candidate-format.md is not written yet")
    prompt = ROOT / "templates" / "prompts" / "candidate_format.md"
    assert prompt.read_text().strip() == docs.read_text().strip(), \
        "the LLM prompt's copy of the candidate format is stale: cp docs/candidate-format.md " \
        "templates/prompts/candidate_format.md"


def test_a_resumed_run_counts_what_earlier_sessions_spent(tmp_path):
    with FakeLLM(responder=lambda body: reply("good_cpu")) as srv:
        with Store(tmp_path) as store:
            p = make_proposer(srv.url, store, budget_usd=1.0)
            p.propose(request(None))
            spent = p.budget.spent_usd
            assert spent > 0
        with Store(tmp_path) as store:  # --resume: a new process, a new proposer, the same run store
            again = make_proposer(srv.url, store, budget_usd=1.0)
            assert again.budget.spent_usd == pytest.approx(spent)
            # the hotspot had its new-family move: the next move on a working node is a rewrite
            (move,) = again.propose(request(ok_node(5, candidate_from("broken_cpu"))))
            assert move.label == "llm rewrite #1"


# ---------------------------------------------------------------- replies, errors and URLs found in review


def _with_spec(spec: str) -> dict:
    """good_cpu's kernel with another launch spec block."""
    good = (REPLIES / "good_cpu.md").read_text()
    source = good.split("```cpp")[1].split("```")[0]
    return {"reply": f"```cpp{source}```\n```json\n{spec}\n```"}


def test_llm_content_sent_as_a_list_of_text_parts_is_a_move(tmp_path):
    good = (REPLIES / "good_cpu.md").read_text()
    half = len(good) // 2
    with FakeLLM([{"parts": [good[:half], good[half:]]}]) as srv, Store(tmp_path) as store:
        (move,) = make_proposer(srv.url, store).propose(request(None))
        assert "llm_softmax" in move.candidate.source
        (row,) = llm_rows(store)
        assert row["outcome"] == "ok" and row["reply"] == good and row["cost_usd"] > 0


@pytest.mark.parametrize("spec", ['"requires": 1', '"workspaces": 2', '"requires": "cols > 0"'])
def test_llm_spec_with_a_wrongly_typed_field_is_unparseable_and_keeps_the_calls_cost(tmp_path, spec):
    kernels = '{"kernels": [{"name": "llm_softmax", "args": ["x", "out", "rows", "cols"]}], ' + spec + '}'
    with FakeLLM([_with_spec(kernels), reply("good_cpu")]) as srv, Store(tmp_path) as store:
        (move,) = make_proposer(srv.url, store).propose(request(None))  # the fix turn gives the kernel
        first, fixed = llm_rows(store)
        assert (first["outcome"], fixed["outcome"]) == ("unparseable", "ok")
        assert "must be a list" in first["error"]
        assert first["prompt_tokens"] > 0 and first["cost_usd"] > 0 and "llm_softmax" in first["reply"]


def test_parse_reply_turns_a_spec_nobody_foresaw_into_a_reply_error():
    from forge_pack.llm.check import ReplyError

    for spec in ('{"kernels": [{"name": "llm_softmax", "args": ["x"]}], "requires": 1}',
                 "[" * 100000 + "]" * 100000,
                 '{"kernels": [{"name": "k", "args": ["x"], "grid": ["' + "-" * 100000 + '1"]}]}'):
        with pytest.raises(ReplyError) as info:
            parse_reply(_with_spec(spec)["reply"], "cpu")
        assert info.value.outcome == "unparseable"
    with pytest.raises(ReplyError):
        parse_reply([{"type": "text", "text": "x"}], "cpu")  # type: ignore[arg-type]


def test_llm_failure_after_the_reply_came_still_records_its_tokens_cost_prompt_and_reply(tmp_path, monkeypatch):
    import forge_pack.llm.proposer as llm_proposer

    def broken_check(*args, **kwargs):
        raise RuntimeError("a bug in a check")

    monkeypatch.setattr(llm_proposer, "static_check", broken_check)
    with FakeLLM([reply("good_cpu")]) as srv, Store(tmp_path) as store:
        p = make_proposer(srv.url, store)
        assert p.propose(request(None)) == []
        (row,) = llm_rows(store)
        assert row["outcome"] == "error" and "a bug in a check" in row["error"]
        assert row["prompt_tokens"] > 0 and row["completion_tokens"] > 0 and row["cost_usd"] > 0
        assert "llm_softmax" in row["reply"] and "softmax" in row["prompt"]
        assert p.summary()["cost_usd"] == pytest.approx(p.budget.spent_usd) and p.budget.spent_usd > 0


def test_llm_insufficient_quota_is_not_retried_and_stops_llm_moves(tmp_path):
    quota = {"status": 429, "body": {"error": {"message": "You exceeded your current quota.",
                                               "type": "insufficient_quota", "code": "insufficient_quota"}}}
    with FakeLLM(default=quota) as srv, Store(tmp_path) as store:
        p = make_proposer(srv.url, store, new_family=False, max_retries=3)
        good = candidate_from("good_cpu")
        for n in range(1, 6):
            assert p.propose(request(ok_node(n, good))) == []
        assert len(srv.chat_requests) == 1  # no retry, and no further move asks
        assert "quota" in p.disabled_reason
        assert "LLM moves stopped" in p.format_summary() and "quota" in p.format_summary()
    assert "quota" in run_summary_text(tmp_path)


def test_llm_model_the_server_does_not_know_stops_llm_moves(tmp_path):
    with FakeLLM(models=("other-model",)) as srv, Store(tmp_path) as store:  # answers 404 "model ... does not exist"
        p = make_proposer(srv.url, store, new_family=False)
        good = candidate_from("good_cpu")
        for n in range(1, 6):
            assert p.propose(request(ok_node(n, good))) == []
        assert len(srv.chat_requests) == 1
        assert "HTTP 404" in p.disabled_reason and MODEL in p.disabled_reason
        assert [r["outcome"] for r in llm_rows(store)] == ["http_error"]


def test_llm_http_errors_every_move_count_toward_the_unreachable_limit(tmp_path):
    bad = {"status": 400, "body": {"error": {"message": "this server rejects every prompt"}}}
    with FakeLLM(default=bad) as srv, Store(tmp_path) as store:
        p = make_proposer(srv.url, store, new_family=False)
        good = candidate_from("good_cpu")
        for n in range(1, 8):
            p.propose(request(ok_node(n, good)))
        assert len(srv.chat_requests) == 3
        assert "3 calls in a row" in p.disabled_reason and "rejects every prompt" in p.disabled_reason


def test_llm_timeout_is_a_deadline_for_the_whole_call_not_for_each_read(tmp_path):
    with FakeLLM([{"trickle": 6.0, "reply": (REPLIES / "good_cpu.md").read_text()}]) as srv, \
            Store(tmp_path) as store:
        t = time.monotonic()
        assert make_proposer(srv.url, store, timeout_s=0.6, max_retries=0).propose(request(None)) == []
        assert time.monotonic() - t < 3.0  # the server would have kept the call alive for 6 s
        (row,) = llm_rows(store)
        assert row["outcome"] == "timeout"


def test_llm_a_slow_trickle_within_the_timeout_is_still_a_reply(tmp_path):
    with FakeLLM([{"trickle": 0.3, "reply": (REPLIES / "good_cpu.md").read_text()}]) as srv:
        (move,) = make_proposer(srv.url, timeout_s=5.0).propose(request(None))
        assert "llm_softmax" in move.candidate.source


def test_llm_credentials_in_the_base_url_are_never_printed_or_stored(tmp_path, monkeypatch):
    port_url = free_port_url()
    url = port_url.replace("http://", "http://alice:URLPASS-1234@") + "?api-key=QUERYKEY-5678&x=1"
    with Store(tmp_path) as store:
        p = make_proposer(url, store, new_family=False, max_retries=0)
        broken = candidate_from("broken_cpu")
        for node in range(1, 5):
            p.propose(request(failed_node(node, broken)))
        assert p.disabled_reason  # three connection failures, each naming the URL
        texts = [json.dumps(p.config.to_json()), json.dumps(p.summary()), p.format_summary(), p.disabled_reason]
    said = []
    monkeypatch.setenv("FORGE_LLM_BASE_URL", url)
    build_llm_proposer(MODEL, toml={"llm": {"probe": False}}, echo=said.append)
    texts += said
    for text in texts:
        assert "URLPASS" not in text and "QUERYKEY" not in text and "alice" not in text, text
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert b"URLPASS" not in f.read_bytes() and b"QUERYKEY" not in f.read_bytes(), f
    assert "127.0.0.1" in said[0]  # the rest of the URL is still shown


def test_redact_removes_credentials_from_urls():
    text = redact("cannot reach https://bob:hunter2@llm.example.com/v1?key=abc123&model=m and "
                  "http://TOKEN42@proxy:8000/v1/chat?access_token=tok99#frag")
    for secret in ("bob", "hunter2", "abc123", "TOKEN42", "tok99"):
        assert secret not in text
    assert "llm.example.com/v1" in text and "model=m" in text


class _ExplodingClient:
    def chat(self, messages, max_tokens=None):
        raise RuntimeError("the client fell over")


def test_llm_budget_reservation_is_released_when_the_client_raises_anything(tmp_path):
    config = LLMConfig(MODEL, base_url="http://127.0.0.1:9/v1", budget_usd=1.0, price_in_usd_per_mtok=10.0,
                       price_out_usd_per_mtok=10.0, new_family=False)
    p = LLMProposer(config, client=_ExplodingClient())
    good = candidate_from("good_cpu")
    for n in range(1, 40):
        p.propose(request(ok_node(n, good)))
    assert p.budget._reserved_usd == pytest.approx(0.0) and p.budget._reserved_tokens == 0
    assert p.enabled  # a reservation leak would have "spent" the budget without a single reply


def test_llm_usage_with_non_numeric_counts_is_estimated_and_charged(tmp_path):
    usage = {"prompt_tokens": "n/a", "completion_tokens": None, "total_tokens": "lots"}
    script = [{"reply": (REPLIES / "good_cpu.md").read_text(), "usage": usage},
              {"reply": (REPLIES / "fixed_cpu.md").read_text(), "usage": {"prompt_tokens": "120",
                                                                          "completion_tokens": 80.0}}]
    with FakeLLM(script) as srv, Store(tmp_path) as store:
        p = make_proposer(srv.url, store, budget_usd=1.0, price_in_usd_per_mtok=10.0, price_out_usd_per_mtok=10.0)
        (first,) = p.propose(request(None))
        (second,) = p.propose(request(ok_node(3, first.candidate)))
        estimated, numeric = llm_rows(store)
        assert estimated["outcome"] == "ok" and estimated["prompt_tokens"] > 0 and estimated["cost_usd"] > 0
        assert (numeric["prompt_tokens"], numeric["completion_tokens"]) == (120, 80)
        assert p.budget._reserved_usd == pytest.approx(0.0)


def test_llm_retry_after_that_is_not_a_number_falls_back_to_backoff(tmp_path):
    script = [{"status": 429, "headers": {"Retry-After": "nan"}}, reply("good_cpu")]
    with FakeLLM(script) as srv, Store(tmp_path) as store:
        (move,) = make_proposer(srv.url, store).propose(request(None))
        assert [r["outcome"] for r in llm_rows(store)] == ["ok"]


def test_prompt_states_the_tolerance_this_call_is_verified_with():
    from forge_pack.llm import prompts as llm_prompts

    user = llm_prompts.render("new_family", request(None))[1]["content"]
    assert "atol = 1e-08, rtol = 0.0001 (output float32)" in user  # softmax's override, not fp32's generic atol
    assert "2x eager PyTorch's own error" in user


def test_prompt_tolerances_read_without_torch_match_the_evaluators_table():
    from forge_pack.llm import prompts as llm_prompts

    tolerance = pytest.importorskip("forge_pack.evaluate.tolerance")
    tables, slack = llm_prompts._tolerance_tables()
    assert slack == tolerance.EAGER_SLACK
    assert len(tables) == len(tolerance.TABLE) + len(tolerance.OP_TABLE)
    for (op, dtype), (atol, rtol) in tables.items():
        tol = tolerance.tolerance(op or None, dtype)
        assert (tol.atol, tol.rtol) == (atol, rtol), (op, dtype)
