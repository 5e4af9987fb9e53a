"""The bring-up report: records, folding, golden table text, JSON, the command-line function, the example."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from safetensors.numpy import save_file

from lazyweights import DType, QuantizationEncoding, Weight, WeightData, load_weights
from lazyweights.interop.check import check, fold_names, fold_rows, format_index_set
from lazyweights.interop.module import LayerList, Module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_LAYERS, H = 8, 4


class Linear(Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = Weight("weight", DType.bfloat16, (n_out, n_in))


class Layer(Module):
    def __init__(self):
        super().__init__()
        self.q_proj = Linear(H, H)
        self.k_proj = Linear(H, H)
        self.up_proj = Linear(H, 2 * H)


class Model(Module):
    def __init__(self):
        super().__init__()
        self.embed = Weight("embed.weight", DType.bfloat16, (16, H))
        self.layers = LayerList([Layer() for _ in range(N_LAYERS)])


def _good_state_dict():
    sd = {}
    for name, w in Model().raw_state_dict().items():
        sd[name] = WeightData.from_numpy(np.zeros(w.shape, np.float32), name).astype(DType.bfloat16)
    return sd


def _broken_state_dict():
    sd = _good_state_dict()
    for i in (0, 2, 5, 6, 7):  # lost in a non-contiguous set of layers
        del sd[f"layers.{i}.up_proj.weight"]
    for i in range(N_LAYERS):  # typo'd in every layer
        sd[f"layers.{i}.k_prj.weight"] = sd.pop(f"layers.{i}.k_proj.weight")
    sd["layers.3.q_proj.weight"] = sd["layers.3.q_proj.weight"].astype(DType.float16)  # wrong dtype
    sd["layers.4.q_proj.weight"] = sd["layers.4.q_proj.weight"][:, :2]  # wrong shape
    sd["lm_head.weight"] = WeightData.from_numpy(np.zeros((16, H), np.float32), "lm_head")  # extra
    sd["embed.weight"] = sd["embed.weight"].reshape(H, 16)
    return sd


GOLDEN_TABLE = """\
check: 25 weights expected, 9 match; 25 problems (13 missing, 9 unexpected, 1 dtype, 2 shape)
problem     name                              expected   actual     hint
missing     layers.{0..7}.k_proj.weight       bf16[4,4]  -          did you mean 'layers.{0..7}.k_prj.weight'?
missing     layers.{0,2,5..7}.up_proj.weight  bf16[8,4]  -
unexpected  layers.{0..7}.k_prj.weight        -          bf16[4,4]
unexpected  lm_head.weight                    -          f32[16,4]
dtype       layers.3.q_proj.weight            bf16       f16        .astype(DType.bfloat16)
shape       embed.weight                      [16,4]     [4,16]     transposed? .T
shape       layers.4.q_proj.weight            [4,4]      [4,2]"""


def test_report_records_hold_the_values():
    report = check(_broken_state_dict(), Model())
    assert not report.ok
    assert [m.name for m in report.missing][:3] == ["layers.0.k_proj.weight", "layers.0.up_proj.weight",
                                                    "layers.1.k_proj.weight"]
    assert len(report.missing) == 13 and len(report.unexpected) == 9
    m = report.missing[0]
    assert (m.expected.dtype, m.expected.shape, m.expected.encoding) == (DType.bfloat16, (4, 4), None)
    assert m.suggestions == ("layers.0.k_prj.weight",)
    assert [(u.name, u.actual.dtype, u.actual.shape) for u in report.unexpected][-1] == \
        ("lm_head.weight", DType.float32, (16, 4))
    assert [(d.name, d.expected, d.actual) for d in report.dtype_mismatches] == \
        [("layers.3.q_proj.weight", DType.bfloat16, DType.float16)]
    assert [(s.name, s.expected, s.actual) for s in report.shape_mismatches] == \
        [("embed.weight", (16, 4), (4, 16)), ("layers.4.q_proj.weight", (4, 4), (4, 2))]
    assert report.encoding_mismatches == [] and report.expected_count == 25
    assert report.problem_count(strict=False) == 3


def test_golden_table():
    report = check(_broken_state_dict(), Model())
    assert report.table() == GOLDEN_TABLE
    assert str(report) == GOLDEN_TABLE


def test_unfolded_table_lists_every_name():
    table = check(_broken_state_dict(), Model()).table(fold=False)
    for i in range(N_LAYERS):
        assert f"missing     layers.{i}.k_proj.weight" in table


def test_ok_report():
    report = check(_good_state_dict(), Model())
    assert report.ok and report.problem_count() == 0
    assert str(report) == "check: 25 weights expected, 25 match; OK"
    assert len(report.matched) == 25


def test_to_dict_is_json():
    d = check(_broken_state_dict(), Model()).to_dict()
    d = json.loads(json.dumps(d))
    assert d["ok"] is False
    assert d["missing"][0] == {"name": "layers.0.k_proj.weight",
                               "expected": {"dtype": "bfloat16", "shape": [4, 4], "encoding": None},
                               "suggestions": ["layers.0.k_prj.weight"]}
    assert d["dtype_mismatches"] == [{"name": "layers.3.q_proj.weight", "expected": "bfloat16", "actual": "float16"}]
    assert d["shape_mismatches"][0] == {"name": "embed.weight", "expected": [16, 4], "actual": [4, 16]}
    assert d["unexpected"][-1] == {"name": "lm_head.weight",
                                   "actual": {"dtype": "float32", "shape": [16, 4], "encoding": None}, "type": ""}


def test_encoding_and_invalid_values_in_the_report():
    expected = {"a": Weight("a", DType.uint8, (2, 18), quantization_encoding=QuantizationEncoding.Q4_0),
                "b": Weight("b", DType.float32, (2,))}
    sd = {"a": WeightData(np.zeros((2, 34), np.uint8), "a", quantization_encoding=QuantizationEncoding.Q8_0),
          "b": [1.0, 2.0], "c": "hello"}
    report = check(sd, expected)
    assert [(m.expected, m.actual) for m in report.encoding_mismatches] == \
        [(QuantizationEncoding.Q4_0, QuantizationEncoding.Q8_0)]
    assert [(v.name, v.type_name) for v in report.invalid_values] == [("b", "list")]
    assert [(u.name, u.actual, u.type_name) for u in report.unexpected] == [("c", None, "str")]
    assert check(sd, expected, override_quantization_encoding=True).encoding_mismatches == []
    rows = [" ".join(r.split()) for r in report.table().splitlines()]
    assert "encoding a Q4_0 Q8_0 override_quantization_encoding=True" in rows
    assert "not array b array list use WeightData, a numpy array or a tensor" in rows


def test_index_folding():
    assert format_index_set(range(22)) == "{0..21}"
    assert format_index_set([0, 2, 5, 6, 7]) == "{0,2,5..7}"
    assert format_index_set([3]) == "3"
    assert format_index_set([4, 5]) == "{4,5}"
    assert fold_names([f"layers.{i}.experts.{j}.w1" for i in range(4) for j in range(8)]) == \
        ["layers.{0..3}.experts.{0..7}.w1"]
    # ragged: layer 0 has experts 0..7, layer 1 only 0..3
    names = [f"layers.0.experts.{j}.w" for j in range(8)] + [f"layers.1.experts.{j}.w" for j in range(4)]
    assert sorted(fold_names(names)) == ["layers.0.experts.{0..7}.w", "layers.1.experts.{0..3}.w"]
    # a word that differs folds too, numbers and words together
    assert fold_names([f"layers.{i}.attn.{p}.weight" for i in (1, 2, 3) for p in ("q_proj", "k_proj")]) == \
        ["layers.{1..3}.attn.{q_proj,k_proj}.weight"]
    # rows with different values never fold
    rows = [("shape", "layers.0.w", "[2]", "[3]", ""), ("shape", "layers.1.w", "[2]", "[4]", "")]
    assert fold_rows(rows) == rows
    # a hint that follows the index folds with it; one that does not stays literal
    rows = [("missing", f"layers.{i}.w", "x", "-", f"did you mean 'layers.{i}.W'?") for i in range(3)]
    assert fold_rows(rows) == [("missing", "layers.{0..2}.w", "x", "-", "did you mean 'layers.{0..2}.W'?")]


def test_did_you_mean_prefers_prefix_fixes_and_same_layer():
    expected = {f"layers.{i}.mlp.weight": Weight("w", DType.float32, (1,)) for i in (1, 11)}
    sd = {"model.layers.1.mlp.weight": np.zeros(1, np.float32), "layers.11.mlp.weigth": np.zeros(1, np.float32)}
    report = check(sd, expected)
    assert {m.name: m.suggestions for m in report.missing} == {
        "layers.1.mlp.weight": ("model.layers.1.mlp.weight",),
        "layers.11.mlp.weight": ("layers.11.mlp.weigth",),
    }


def test_rename_collisions_and_unread_sources(tmp_path):
    path = str(tmp_path / "m.safetensors")
    save_file({"model.w": np.ones(2, np.float32), "w": np.zeros(2, np.float32),
               "model.k_scale": np.ones(1, np.float32)}, path)
    weights = load_weights([path])
    renames = [(k, k.replace("model.", "")) for k, _ in weights.items()]
    adapted = {}
    for old, new in renames:
        adapted[new] = weights[old].data()  # 'model.w' and 'w' both become 'w': the first is lost
    del adapted["k_scale"]
    report = check(adapted, {"w": Weight("w", DType.float32, (2,))}, renames=renames, checkpoint=weights)
    assert [(c.target, c.sources) for c in report.rename_collisions] == [("w", ("model.w", "w"))]
    assert not report.ok
    assert sorted(report.unread_sources) == ["model.k_scale", "model.w"]
    text = report.table()
    assert "collision w - 2 sources from model.w, w" in [" ".join(r.split()) for r in text.splitlines()]
    assert text.splitlines()[-1] == "not read by any output (2; dropped or overwritten): model.{k_scale,w}"


def test_check_a_torch_module():
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(3, 2)
    report = check({"weight": np.zeros((2, 3), np.float32), "bias": np.zeros(3, np.float32)}, lin)
    assert [(s.name, s.expected, s.actual) for s in report.shape_mismatches] == [("bias", (2,), (3,))]


# --- the command-line function and the example --------------------------------------------------------------
ADAPTERS = textwrap.dedent('''
    import numpy as np
    from lazyweights import DType, Weight
    from lazyweights.interop.module import Module

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.weight = Weight("weight", DType.bfloat16, (2, 3))

    def good(state_dict, **kwargs):
        return {k.replace("model.", ""): v.data().astype(DType.bfloat16) for k, v in state_dict.items()}

    def bad(state_dict, **kwargs):
        return {k: v.data() for k, v in state_dict.items()}
''')


def test_command_line_check(tmp_path, capsys):
    cli = pytest.importorskip("lazyweights.tools.cli")
    (tmp_path / "adapters.py").write_text(ADAPTERS)
    ckpt = str(tmp_path / "m.safetensors")
    save_file({"model.weight": np.ones((2, 3), np.float32)}, ckpt)
    mod = f"{tmp_path}/adapters.py:Net"
    assert cli.main(["check", f"{tmp_path}/adapters.py:good", ckpt, "--module", mod, "--keys"]) == 0
    assert capsys.readouterr().out == "weight\ncheck: 1 weights expected, 1 match; OK\n"
    assert cli.main(["check", f"{tmp_path}/adapters.py:bad", ckpt, "--module", mod, "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["missing"][0]["name"] == "weight" and d["unexpected"][0]["name"] == "model.weight"
    assert cli.main(["check", f"{tmp_path}/adapters.py:bad", ckpt, "--module", mod]) == 1
    assert capsys.readouterr().out.splitlines()[0] == \
        "check: 1 weights expected, 0 match; 2 problems (1 missing, 1 unexpected)"


def test_example_runs_and_fails_on_a_broken_adapter(tmp_path):
    script = os.path.join(ROOT, "examples", "correctness_check.py")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ok = subprocess.run([sys.executable, script, "--dir", str(tmp_path)], capture_output=True, text=True, env=env,
                        timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ("# 3. the adapted state dict (the plan's keys), and the plan itself\n"
            "embed_tokens.weight\nlayers.0.attention.k_proj.weight\n") in ok.stdout
    assert "check: 30 weights expected, 30 match; OK" in ok.stdout
    assert "30 weights loaded; 0 differ from the checkpoint" in ok.stdout
    bad = subprocess.run([sys.executable, script, "--dir", str(tmp_path), "--broken"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert bad.returncode == 1
    assert "missing     layers.2.attention.{q_proj,k_proj,v_proj,o_proj}.weight" in bad.stdout
