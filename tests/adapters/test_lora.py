"""LoRA merged lazily (`adapters.lora.merge_lora`, the `lora` op, `convert --lora`), judged by PEFT.

PEFT's own `merge_and_unload` on a tiny random transformers model is the reference: our merged tensors equal
its tensors within float32's rounding of the r-term sums B @ A (`float32_merge_bound`: torch's matmul and our
fixed-order kernel sum in different orders), and the merged model's logits agree to float32 tolerance. Cases:
rsLoRA with rank/alpha patterns, an embedding target and modules_to_save on Llama; fan_in_fan_out on GPT-2's
Conv1D; two adapters stacked. Where llama-cpp-python is installed, `convert --lora --quant Q4_K_M` in one pass
must equal `llama_model_quantize` of an f32 GGUF of the same merge, tensor for tensor.
"""
import ctypes
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import lazyweights as lw
from lazyweights.adapters.lora import merge_lora
from lazyweights.core.errors import LoraError, ShapeError
from lazyweights.graph import ops
from lazyweights.graph.lora import lora_update
from lazyweights.graph.opcodes import Op

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def _llama(path, hidden=64, ffn=96, layers=2, vocab=128, dtype=None, seed=0):
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                                   num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(path, safe_serialization=True)
    return path


def _lora(base_dir, out, seed=1, **kw):
    """A PEFT adapter with random non-zero A and B (init_lora_weights=False), saved as PEFT saves it."""
    torch.manual_seed(seed)
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    model = peft.get_peft_model(base, peft.LoraConfig(init_lora_weights=False, **kw))
    with torch.no_grad():
        for module in model.modules():  # "train" the modules_to_save copies, so they differ from the base
            if isinstance(module, peft.utils.ModulesToSaveWrapper):
                module.modules_to_save["default"].weight.add_(torch.randn_like(module.original_module.weight))
    model.save_pretrained(out)
    return out


def _peft_merged(base_dir, lora_dirs):
    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    for d in lora_dirs:
        model = peft.PeftModel.from_pretrained(model, d).merge_and_unload()
    return model


def _ours(base_dir, lora_dirs):
    merged = merge_lora(dict(lw.load_weights([str(base_dir)]).items()), [str(d) for d in lora_dirs])
    return merged, lw.plan({k: _wd(v, k) for k, v in merged.items()}).materialize()


def _wd(value, name):
    return value if isinstance(value, lw.WeightData) else value.data()


def _factors(node):
    """Each adapter's (scale, transposed, B, A) of a `lora` node, as float64 arrays."""
    def value(n):
        return lw.plan({"x": lw.WeightData.wrap(n, "x", None)}).materialize()["x"].astype(np.float64)

    return [(scale, t, value(node.srcs[1 + 2 * i]), value(node.srcs[2 + 2 * i]))
            for i, (scale, t) in enumerate(node.arg)]


def float32_merge_bound(node, ref):
    """How far two float32 merges of `node` may be apart when each sums B @ A in its own order: each r-term dot
    product is within r * 2**-24 of |B| @ |A| of the exact one (Higham's bound, with the scale's and the add's
    roundings: r + 2), so two merges are within twice that, plus a unit in the last place of each result's
    final rounding (PEFT rounds once per adapter, we once in all)."""
    u = 2.0 ** -24
    bound = np.zeros(ref.shape)
    for scale, transposed, b, a in _factors(node):
        mag = abs(scale) * (np.abs(b) @ np.abs(a))
        bound += 2 * (a.shape[0] + 2) * u * (mag.T if transposed else mag)
    return bound + (len(node.arg) + 1) * np.spacing(np.abs(ref.astype(np.float32))).astype(np.float64)


def _compare(ref_model, ours, base_dir, merged):
    """Ours against PEFT's merge: untouched and replaced tensors bit for bit; merged ones within the float32
    bound above, since PEFT's torch matmul and our kernel sum B @ A in different orders."""
    ref = {k: v.detach().float().numpy() for k, v in ref_model.state_dict().items()}
    base = {k: v.data().to_numpy() for k, v in lw.load_weights([str(base_dir)]).items()}
    assert set(ours) == set(ref)
    changed = 0
    for name, arr in ours.items():
        node = _wd(merged[name], name).node
        if node.op is Op.LORA:
            diff = np.abs(arr.astype(np.float64) - ref[name].astype(np.float64))
            bound = float32_merge_bound(node, ref[name])
            assert (diff <= bound).all(), f"{name}: {diff.max()} > bound {bound[diff > bound][:3]}"
        else:
            assert arr.astype(np.float32).tobytes() == ref[name].tobytes(), name
        changed += not np.array_equal(arr, base[name])
    return changed


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    base = _llama(d / "base")
    a = _lora(base, d / "a", r=4, lora_alpha=8, use_rslora=True,
              target_modules=["q_proj", "v_proj", "down_proj", "embed_tokens"], modules_to_save=["lm_head"],
              rank_pattern={"down_proj": 2}, alpha_pattern={"v_proj": 3})
    b = _lora(base, d / "b", seed=2, r=3, lora_alpha=5, target_modules=["q_proj", "k_proj", "o_proj"])
    return d, base, a, b


def test_merge_equals_peft_merge_and_unload_and_logits(llama):
    d, base, a, _ = llama
    ref = _peft_merged(base, [a])
    merged, ours = _ours(base, [a])
    # q, v (2 layers), down (2 layers, r=2 by rank_pattern), the embedding, lm_head (modules_to_save)
    assert _compare(ref, ours, base, merged) == 8
    assert merged["model.layers.0.self_attn.q_proj.weight"].node.op is Op.LORA
    # the merged model's logits: equal to float32's rounding (the weights are within float32_merge_bound)
    model = transformers.AutoModelForCausalLM.from_pretrained(base)
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in ours.items()})
    ids = torch.tensor([[1, 5, 9, 77, 3, 100]])
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    base_model = transformers.AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():  # the LoRA moves the logits far more than the tolerance: the check can fail
        assert (base_model(ids).logits - want).abs().max() > 1e-2


def test_two_adapters_stack_into_one_node_each(llama):
    d, base, a, b = llama
    ref = _peft_merged(base, [a, b])
    merged, ours = _ours(base, [a, b])
    _compare(ref, ours, base, merged)
    q = merged["model.layers.1.self_attn.q_proj.weight"].node
    assert q.op is Op.LORA and len(q.arg) == 2 and q.srcs[0].op is Op.SOURCE  # rounded once
    again = merge_lora(merge_lora(dict(lw.load_weights([str(base)]).items()), str(a)), str(b))
    assert again["model.layers.1.self_attn.q_proj.weight"].node == q  # a list or two calls: the same node


def test_fan_in_fan_out_conv1d(tmp_path):
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=96, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(3)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "base", safe_serialization=True)
    lora = _lora(tmp_path / "base", tmp_path / "lora", r=4, lora_alpha=16, fan_in_fan_out=True,
                 target_modules=["c_attn", "c_fc"])
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    ref = peft.PeftModel.from_pretrained(ref, lora).merge_and_unload()
    merged = merge_lora(dict(lw.load_weights([str(tmp_path / "base")]).items()), str(lora))
    node = merged["transformer.h.0.attn.c_attn.weight"].node
    assert node.op is Op.LORA and node.arg == ((4.0, True),)
    ours = lw.plan({k: _wd(v, k) for k, v in merged.items()}).materialize()
    want = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    before = lw.load_weights([str(tmp_path / "base")])
    for name in ("transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_fc.weight"):
        diff = np.abs(ours[name].astype(np.float64) - want[name])
        assert (diff <= float32_merge_bound(merged[name].node, want[name])).all(), name
        assert np.abs(ours[name] - before[name].data().to_numpy()).max() > 1e-3, name  # the update is there


def test_blocks_bounded_and_equal_to_whole(llama):
    """Many row blocks (a tiny budget) give the same bytes as the reference executor's whole-tensor value."""
    from lazyweights.compiler.steps import compile_steps
    from lazyweights.run.reference import evaluate

    rng = np.random.default_rng(0)
    w = ops.const(rng.standard_normal((512, 96)).astype(ml_dtypes.bfloat16))
    b1, a1 = (ops.const(rng.standard_normal(s).astype(np.float32)) for s in ((512, 8), (8, 96)))
    b2, a2 = (ops.const(rng.standard_normal(s).astype(ml_dtypes.bfloat16)) for s in ((96, 4), (4, 512)))
    node = lora_update(lora_update(w, b1, a1, 0.25), b2, a2, 2.0, transposed=True)
    wd = lw.WeightData.wrap(node, "w", None)
    p = lw.plan({"w": wd})
    steps = compile_steps(p, budget=16 * 1024)
    assert len(steps[0].blocks) >= 8
    got = p.materialize(budget="16KB")["w"]
    whole = evaluate([node])[0]
    assert got.dtype == ml_dtypes.bfloat16 and got.tobytes() == whole.tobytes()
    # independent: float64 arithmetic, rounded once to bf16, within one bf16 step of ours
    f = lambda n: np.asarray(n.arg.array, np.float64)  # noqa: E731
    exact = f(w) + 0.25 * (f(b1) @ f(a1)) + 2.0 * (f(b2) @ f(a2)).T
    np.testing.assert_allclose(got.astype(np.float64), exact, rtol=2 ** -7)


def test_lora_op_shapes_are_checked_when_built():
    w = ops.const(np.ones((4, 6), np.float32))
    with pytest.raises(ShapeError, match=r"B float32\[4, 3\].*A float32\[3, 5\].*W float32\[4, 6\]"):
        lora_update(w, ops.const(np.ones((4, 3), np.float32)), ops.const(np.ones((3, 5), np.float32)), 1.0)


def test_adapter_for_another_base_is_refused_by_name(llama, tmp_path):
    d, base, a, _ = llama
    state = dict(lw.load_weights([str(base)]).items())
    other = _llama(tmp_path / "wide", hidden=128, ffn=96)   # same names, other shapes
    wrong = _lora(other, tmp_path / "wide_lora", r=2, lora_alpha=4, target_modules=["q_proj"])
    with pytest.raises(LoraError, match=r"q_proj.*\[128, 128\].*\[64, 64\]") as e:
        merge_lora(state, str(wrong))
    assert "model.layers.0.self_attn.q_proj" in str(e.value)
    cfg = transformers.GPT2Config(n_embd=64, n_layer=1, n_head=2, vocab_size=96, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2", safe_serialization=True)
    gpt2 = _lora(tmp_path / "gpt2", tmp_path / "gpt2_lora", r=2, target_modules=["c_attn"], fan_in_fan_out=True)
    with pytest.raises(LoraError, match="none of the adapter's .* modules is in the base"):
        merge_lora(state, str(gpt2))
    with pytest.raises(LoraError, match="no adapter_config.json"):
        merge_lora(state, str(tmp_path))


def test_bad_config_and_targets_are_named(llama, tmp_path):
    import json
    import shutil

    d, base, a, _ = llama
    state = dict(lw.load_weights([str(base)]).items())
    for change, pattern in (({"use_dora": True}, "use_dora"), ({"peft_type": "IA3"}, "IA3"),
                            ({"target_modules": ["q_proj", "c_attn"]}, r"\['c_attn'\] match no module"),
                            ({"r": 5}, "rank 4, adapter_config.json says r=5")):
        bad = tmp_path / f"bad{len(list(tmp_path.iterdir()))}"
        shutil.copytree(a, bad)
        cfg = json.loads((bad / "adapter_config.json").read_text())
        cfg.update(change)
        (bad / "adapter_config.json").write_text(json.dumps(cfg))
        with pytest.raises(LoraError, match=pattern):
            merge_lora(state, str(bad))


def test_command_line_lora_plan_and_convert(llama, tmp_path, capsys):
    from gguf import GGUFReader

    from lazyweights.tools.cli import main

    d, base, a, b = llama
    (tmp_path / "same.py").write_text("def adapt(state_dict, **kw):\n    return dict(state_dict)\n")
    assert main(["plan", f"{tmp_path / 'same.py'}:adapt", str(base), "--lora", str(a), "--lora", str(b)]) == 0
    assert "lora[4, 1.66667]" in capsys.readouterr().out  # q_proj: a (rsLoRA 8/sqrt(4)) then b (5/3)
    out = tmp_path / "m.gguf"
    assert main(["convert", "lazyweights.adapters:convert_hf_to_gguf", str(base), "--no-tokenizer", "--no-progress",
                 "--lora", str(a), "--lora", str(b), "-o", str(out)]) == 0
    ref = _peft_merged(base, [a, b]).state_dict()
    got = {t.name: np.asarray(t.data) for t in GGUFReader(str(out)).tensors}
    # llama.cpp's layout: v is not RoPE-permuted, so it is the merged HF tensor as is
    v = "model.layers.1.self_attn.v_proj.weight"
    node = merge_lora(dict(lw.load_weights([str(base)]).items()), [str(a), str(b)])[v].node
    diff = np.abs(got["blk.1.attn_v.weight"].astype(np.float64) - ref[v].numpy())
    assert (diff <= float32_merge_bound(node, ref[v].numpy())).all()
    assert main(["convert", "lazyweights.adapters:convert_hf_to_gguf", str(base), "--no-tokenizer", "--no-progress",
                 "--lora", str(tmp_path), "-o", str(tmp_path / "x.gguf")]) == 1
    assert "adapter_config.json" in capsys.readouterr().err and not (tmp_path / "x.gguf").exists()


# --- llama.cpp as the judge -------------------------------------------------------------------------------------
def _llama_quantize(src, dst, preset):
    llama_cpp = pytest.importorskip("llama_cpp")
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = 1
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{preset}")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize failed with {rc}"


def test_one_pass_lora_q4_k_m_equals_merge_then_llama_quantize(tmp_path, child_env):
    """`convert --lora --quant Q4_K_M` in one pass equals llama.cpp's `llama_model_quantize` of an f32 GGUF of the
    same merge, byte for byte; that f32 merge is PEFT's `merge_and_unload` within float32's rounding of the
    r-term sums (float32_merge_bound). Bytes against PEFT's own merge are not asked for: where torch's matmul
    rounds one element to the other side of a Q4_K step, one byte of a block differs (seen on AVX-512)."""
    pytest.importorskip("llama_cpp")
    from gguf import GGUFReader

    base = _llama(tmp_path / "base", hidden=256, ffn=512, vocab=320)
    lora = _lora(base, tmp_path / "lora", r=8, lora_alpha=16, use_rslora=True,
                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    cli = [sys.executable, "-m", "lazyweights", "convert", "lazyweights.adapters:convert_hf_to_gguf",
           "--no-tokenizer", "--no-progress"]
    for args, out in (([str(base), "--lora", str(lora)], "merged.gguf"),
                      ([str(base), "--lora", str(lora), "--quant", "Q4_K_M"], "ours.gguf")):
        subprocess.run(cli + args + ["-o", str(tmp_path / out)], check=True, env=child_env, capture_output=True)
    _llama_quantize(tmp_path / "merged.gguf", tmp_path / "ref.gguf", "Q4_K_M")
    ref = {t.name: t for t in GGUFReader(str(tmp_path / "ref.gguf")).tensors}
    ours = {t.name: t for t in GGUFReader(str(tmp_path / "ours.gguf")).tensors}
    assert set(ours) == set(ref)
    for name in ref:
        assert ours[name].tensor_type == ref[name].tensor_type, name
        assert np.asarray(ours[name].data).tobytes() == np.asarray(ref[name].data).tobytes(), name
    # the merge both files hold, against PEFT's (merged.gguf is this merge in llama.cpp's layout)
    merged, values = _ours(base, [lora])
    assert _compare(_peft_merged(base, [lora]), values, base, merged) == 14


def test_checkpoint_folder_is_the_base_not_the_adapter(llama):
    """convert_hf_to_gguf reads config.json and tokenizer.json from the checkpoint's folder: with an adapter
    merged, the first tensors (lm_head from modules_to_save, the embedding's base_layer) come from the adapter's
    folder, but the folder is still the base's."""
    import os

    from lazyweights.convert.to_gguf import _source_folder

    d, base, a, _ = llama
    merged = merge_lora(dict(lw.load_weights([str(base)]).items()), str(a))
    first = next(iter(merged))
    assert first == "lm_head.weight" and merged[first].node.op is Op.SOURCE  # the adapter's copy
    assert _source_folder(merged) == os.path.abspath(base)


def _lora_plan():
    rng = np.random.default_rng(5)
    w = ops.const(rng.standard_normal((384, 256)).astype(ml_dtypes.bfloat16))
    b, a = (ops.const(rng.standard_normal(s).astype(np.float32)) for s in ((384, 8), (8, 256)))
    node = lora_update(w, b, a, 0.5)
    return lw.plan({"w": lw.WeightData.wrap(node, "w", None),
                    "w16": lw.WeightData.wrap(ops.cast(node, "float16"), "w16", None)})


@pytest.mark.parametrize("device", ["fake", "cuda"])
def test_gpu_executor_computes_the_update_on_the_host(device):
    """The GPU executor's host part runs the `lora` op (GPU_SPLIT: host); a cast above it runs on the device.
    The fake device (tests/run/fake_gpu.py) runs everywhere; a real one where cupy finds a CUDA device."""
    import os

    from lazyweights.run.gpu import materialize_gpu

    plan = _lora_plan()
    want = plan.materialize(scheduler="sync")
    if device == "fake":
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "run"))
        from fake_gpu import NumpyDevice

        got = materialize_gpu(plan, "gpu:0", backend=NumpyDevice(), block_bytes=4096)
        arrays = {k: np.asarray(v) for k, v in got.items()}
    else:
        cupy = pytest.importorskip("cupy")
        try:
            if cupy.cuda.runtime.getDeviceCount() < 1:
                pytest.skip("no CUDA device")
        except Exception:
            pytest.skip("no CUDA device")
        got = plan.materialize(device="gpu:0")
        arrays = {k: cupy.asnumpy(v) for k, v in got.items()}
    for name, ref in want.items():
        assert np.ascontiguousarray(arrays[name]).tobytes() == ref.tobytes(), name


@pytest.mark.parametrize("transposed", [False, True])
def test_slices_sink_through_the_update(transposed):
    """A tensor-parallel rank's slice of a merged weight reads only its rows of W and B (or columns of A):
    `sink_slices` moves it below the `lora` node, and the bytes are the same as slicing the whole value."""
    from lazyweights.graph.node import toposort
    from lazyweights.graph.rewrites import sink_slices
    from lazyweights.run.reference import evaluate

    rng = np.random.default_rng(9)
    w = ops.const(rng.standard_normal((96, 64)).astype(ml_dtypes.bfloat16))
    shape_b, shape_a = ((64, 4), (4, 96)) if transposed else ((96, 4), (4, 64))
    b, a = ops.const(rng.standard_normal(shape_b).astype(np.float32)), ops.const(
        rng.standard_normal(shape_a).astype(np.float32))
    node = lora_update(w, b, a, 0.75, transposed)
    whole = evaluate([node])[0]
    for box in (((24, 48, 1), (0, 64, 1)), ((0, 96, 1), (16, 40, 1)), ((3, 90, 3), (1, 63, 2))):
        sunk = sink_slices(ops.slice_(node, box))
        assert sunk.op is Op.LORA and sunk.srcs[0].op is Op.SLICE  # W: only the box is read
        assert sum(n.op is Op.SLICE for n in toposort([sunk])) >= 2   # and B's rows or A's columns
        want = whole[tuple(slice(*r) for r in box)]
        assert evaluate([sunk])[0].tobytes() == np.ascontiguousarray(want).tobytes(), box


def test_bf16_base_rounds_once(tmp_path):
    """A bf16 base: the result is bf16, the float32 sum rounded once (torch's float32 arithmetic rounded to
    bf16 is the reference, bit for bit); PEFT's merge, which rounds the update to bf16 and then the sum, is
    within one bf16 step of it."""
    base = _llama(tmp_path / "base", dtype=torch.bfloat16)
    lora = _lora(base, tmp_path / "lora", r=4, lora_alpha=6, target_modules=["q_proj", "down_proj"])
    merged, ours = _ours(base, [lora])
    name = "model.layers.1.mlp.down_proj.weight"
    assert ours[name].dtype == ml_dtypes.bfloat16
    from safetensors.torch import load_file

    w = load_file(str(base / "model.safetensors"))[name].float()
    ad = load_file(str(lora / "adapter_model.safetensors"))
    b = ad[f"base_model.model.{name[:-7]}.lora_B.weight"].float()
    a = ad[f"base_model.model.{name[:-7]}.lora_A.weight"].float()
    want = (w + (b @ a) * 1.5).to(torch.bfloat16)
    assert ours[name].tobytes() == want.view(torch.int16).numpy().tobytes()
    peft_w = _peft_merged(base, [lora]).state_dict()[name]
    step = np.abs(want.float().numpy()) * 2.0 ** -7
    assert (np.abs(peft_w.float().numpy() - want.float().numpy()) <= step + 1e-30).all()
    assert not np.array_equal(ours[name], w.to(torch.bfloat16).view(torch.int16).numpy().view(ml_dtypes.bfloat16))
