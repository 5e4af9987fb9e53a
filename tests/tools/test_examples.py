"""Every example in examples/ runs (no arguments) and passes its own checks; the checks catch mismatches.

Each example writes a small checkpoint, prints its plan, materializes or saves it, compares the result with
an independent numpy computation and exits non-zero on any mismatch. Here each one runs as a subprocess
(as CI and users run them); then the examples' adapters are run with deliberate mistakes through their own
check functions, which must report failure.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES_DIR = os.path.join(ROOT, "examples")
EXAMPLES = sorted(f for f in os.listdir(EXAMPLES_DIR) if f.endswith(".py") and not f.startswith("_"))
# correctness_check.py ends with its own load report rather than an "OK:" verdict line.
NO_VERDICT_LINE = {"correctness_check.py"}


def example(name: str):
    """examples/<name>.py as a module, loaded from its file (no sys.path edit). It is registered in
    sys.modules under its own name, as `import name` would, so the examples' `import _common` finds the
    same `_common` the tests reset and inspect."""
    path = os.path.join(EXAMPLES_DIR, name + ".py")
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__file__", None) == path:
        return mod
    if name != "_common":
        example("_common")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def _run(script: str, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, os.path.join(EXAMPLES_DIR, script), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)


def test_examples_found():
    assert {"seed_adapters.py", "moe_experts.py", "phi3_fused_qkv.py", "gptq.py", "gpt_oss_mxfp4.py",
            "deepseek_fp8.py", "tied_embeddings.py", "llama_hf_to_gguf.py", "gemma3_gguf_to_hf.py"} <= set(EXAMPLES)


def test_readme_lists_every_example():
    with open(os.path.join(EXAMPLES_DIR, "README.md")) as f:
        readme = f.read()
    missing = [e for e in EXAMPLES if e not in readme]
    assert not missing, f"examples/README.md does not list {missing}"


@pytest.mark.parametrize("script", EXAMPLES)
def test_example_runs_and_passes(script):
    r = _run(script)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{script} exited {r.returncode}:\n{out[-4000:]}"
    # the plan text (Plan.explain): its node lines, its steps and its summary
    assert "steps:" in r.stdout and "summary:" in r.stdout and " = source " in r.stdout, out[-4000:]
    assert "MISMATCH" not in r.stdout
    if script not in NO_VERDICT_LINE:
        last = r.stdout.strip().splitlines()[-1]
        assert last.startswith("OK: "), f"{script}: last line is not an OK verdict: {last!r}"


# --- the checks themselves catch mistakes -----------------------------------------------------------------
@pytest.fixture
def C():
    _common = example("_common")
    _common.reset()
    yield _common
    _common.reset()


def test_check_compares_dtype_shape_and_bits(C):
    import ml_dtypes

    bf16 = ml_dtypes.bfloat16
    assert C.check("same", np.array([1.0, -0.0], bf16), np.array([1.0, -0.0], bf16))
    assert not C.check("sign of zero", np.array([0.0], bf16), np.array([-0.0], bf16))
    assert not C.check("dtype", np.zeros(2, np.float16), np.zeros(2, bf16))
    assert not C.check("shape", np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
    assert not C.check("0-d vs 1-d", np.float32(1.0).reshape(()), np.ones(1, np.float32))
    assert len(C.MISMATCHES) == 4 and C.verdict("t") == 1


def test_failed_check_gives_nonzero_exit_status(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(
        "import sys\n"
        "import numpy as np, _common as C\n"
        "C.check('x', np.zeros(3, np.float32), np.ones(3, np.float32))\n"
        "sys.exit(C.verdict('deliberately wrong'))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [EXAMPLES_DIR, os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1
    assert "MISMATCH: deliberately wrong" in r.stdout and "3 of 3 elements differ" in r.stdout


def test_seed_rope_check_catches_a_wrong_permutation(C, tmp_path):
    import types

    S = example("seed_adapters")

    from lazyweights import load_weights, plan

    cfg = types.SimpleNamespace(**C.LLAMA)
    path = C.write_safetensors(str(tmp_path / "model.safetensors"), C.llama_tensors(C.LLAMA, np.float16))
    state = dict(load_weights([path]).items())
    eager = plan(S.load_seed_adapter(S.SEED_ROPE)(dict(state), huggingface_config=cfg)).materialize()

    # the right permutation: lazy == the seed's eager form
    S.compare("right", plan(S.convert_rope_lazy(dict(state), cfg)).materialize(), eager)
    assert C.MISMATCHES == [] and C.verdict("right") == 0

    # a wrong one (full interleaved -> half-split instead of the partial-RoPE helper): caught, on q and k only
    def wrong(hd):
        return np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])

    C.reset()
    S.compare("wrong", plan(S.convert_rope_lazy(dict(state), cfg, rope_perm_fn=wrong)).materialize(), eager)
    bad = sorted(m.split(":")[1].strip() for m in C.MISMATCHES)
    assert bad == sorted(f"layers.{i}.{n}" for i in range(C.LLAMA["num_hidden_layers"])
                         for n in ("attention.q_proj.weight", "self_attn.k_proj.weight")), C.MISMATCHES
    assert C.verdict("wrong") == 1


def test_moe_check_catches_swapped_gate_and_up(C, tmp_path):
    M = example("moe_experts")

    from lazyweights import load_weights, plan

    cfg = dict(M.MIXTRAL, num_hidden_layers=1)
    path = C.write_safetensors(str(tmp_path / "model.safetensors"), M.mixtral_tensors(cfg))
    raw = C.read_safetensors(path)
    fused = M.fuse_experts(dict(load_weights([path]).items()), cfg["num_local_experts"], gate_first=False)
    M.verify_fused(plan(fused).materialize(), raw, cfg["num_local_experts"], "w3 first")
    assert [m.split(":")[1].strip() for m in C.MISMATCHES] == ["model.layers.0.mlp.experts.gate_up_proj"]


def test_phi3_check_catches_swapped_k_and_v(C, tmp_path):
    P = example("phi3_fused_qkv")

    from lazyweights import load_weights, plan

    cfg = dict(P.PHI3, num_hidden_layers=1)
    path = C.write_safetensors(str(tmp_path / "model.safetensors"), P.phi3_tensors(cfg))
    raw = C.read_safetensors(path)
    adapted = P.convert_phi3_state_dict(dict(load_weights([path]).items()), huggingface_config=cfg)
    P.verify(plan(adapted).materialize(), raw, cfg, "right")
    assert C.MISMATCHES == []
    # the mistake of splitting the fused rows as q, v, k (same shapes, so only the bytes can tell)
    k, v = "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight"
    adapted[k], adapted[v] = adapted[v], adapted[k]
    P.verify(plan(adapted).materialize(), raw, cfg, "k and v swapped")
    assert sorted(m.split(":")[1].strip() for m in C.MISMATCHES) == [k, v]


def test_gptq_check_catches_a_wrong_perm_idx(C, tmp_path):
    G = example("gptq")

    from lazyweights import load_weights, plan

    cfg = dict(G.LLAMA_GPTQ, num_hidden_layers=1)
    path = C.write_safetensors(str(tmp_path / "model.safetensors"), G.gptq_tensors(cfg))
    raw = C.read_safetensors(path)
    adapted = G.convert_gptq_state_dict(dict(load_weights([path]).items()),
                                        argsort=lambda g: np.argsort(-g, kind="stable"))
    G.verify(plan(adapted).materialize(), raw, "descending")
    n = len(G.LINEARS)
    unsorted = "perm_idx sorts g_idx: perm_idx is not a permutation sorting g_idx"
    assert sum(m.endswith(unsorted) for m in C.MISMATCHES) == n
    assert sum("perm_idx: " in m and "elements differ" in m for m in C.MISMATCHES) == n, C.MISMATCHES


def test_deepseek_check_catches_a_wrong_block_size(C, tmp_path):
    D = example("deepseek_fp8")

    from lazyweights import load_weights, plan

    cfg = dict(D.DEEPSEEK, num_hidden_layers=1)
    path = C.write_safetensors(str(tmp_path / "model.safetensors"), D.deepseek_tensors(cfg))
    raw = C.read_safetensors(path)
    state = dict(load_weights([path]).items())
    D.verify(plan(D.convert_fp8_state_dict(state)).materialize(), raw, "right")
    assert C.MISMATCHES == []
    # a 256x256 block assumed over the 128x128 scale grid: blocks take their neighbours' scales
    w = state["model.layers.0.self_attn.q_a_proj.weight"].data()
    s = state["model.layers.0.self_attn.q_a_proj.weight_scale_inv"].data()
    got = D.dequantize_block_fp8(w, s, block=256).to_numpy()
    want = D.reference(raw)["model.layers.0.self_attn.q_a_proj.weight"]
    assert not C.check("block 256", got, want)


def test_gguf_check_catches_a_missing_rope_permutation(C, tmp_path):
    L = example("llama_hf_to_gguf")

    from lazyweights import load_weights, plan
    from lazyweights.adapters import hf_to_gguf

    cfg = dict(L.LLAMA, num_hidden_layers=1)
    path = C.write_safetensors(str(tmp_path / "model.safetensors"), C.llama_tensors(cfg, C.bf16))
    raw = C.read_safetensors(path)
    want = L.reference_gguf(raw, cfg)
    # without llama.cpp's q/k permutation: exactly attn_q and attn_k differ
    got = plan(hf_to_gguf(dict(load_weights([path]).items()), cfg, rope_permuted=False)).materialize()
    for name in sorted(want):
        C.check(name, got[name], want[name])
    assert sorted(m.split(":")[0] for m in C.MISMATCHES) == ["blk.0.attn_k.weight", "blk.0.attn_q.weight"]
