"""The command line for a new user (issue 37): --help shows defaults and real examples, `archs` lists the
architecture names both ways, errors lead with the fix in command-line words, every path may be a URL,
output folders are made, a refused connection fails at once, and every check that can run before the work
does (shown by counting calls to `load_weights` / `Plan.save`, and by the absence of any output).

Commands run in-process through `cli.main` (the same code the console script runs)."""
from __future__ import annotations

import argparse
import json
import os
import shlex

import numpy as np
import pytest
from safetensors.numpy import load_file

import lazyweights as lw
from lazyweights.lazy import weights as weights_module
from lazyweights.lazy.plan import Plan
from lazyweights.tools import cli

W1 = "lazyweights.tools.demo:convert_safetensor_state_dict"


def run(capsys, *args):
    """`lazyweights ARGS` in this process: (exit status, stdout, stderr)."""
    try:
        rc = cli.main([str(a) for a in args])
    except SystemExit as e:  # argparse: --help (0) and usage errors (2)
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc, err, *fragments):
    assert rc == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lazyweights: error: "), err
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def counted(monkeypatch):
    """Calls to load_weights (a checkpoint opened) and Plan.save (tensors computed and written)."""
    calls = {"load_weights": 0, "save": 0}
    real_load, real_save = weights_module.load_weights, Plan.save

    def load(*a, **k):
        calls["load_weights"] += 1
        return real_load(*a, **k)

    def save(self, *a, **k):
        calls["save"] += 1
        return real_save(self, *a, **k)

    monkeypatch.setattr(weights_module, "load_weights", load)
    monkeypatch.setattr(Plan, "save", save)
    return calls


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tiny_llama):  # tiny_llama: tests/conftest.py
    d = tmp_path_factory.mktemp("manners") / "ckpt"
    tiny_llama(str(d))
    return d


@pytest.fixture(scope="module")
def llama_hf(tmp_path_factory, llama_checkpoint):  # llama_checkpoint: tests/conftest.py
    """A tiny checkpoint as the README's make_ckpt.py recipe makes it (the same files: config.json without
    max_position_embeddings, no tokenizer)."""
    return llama_checkpoint(tmp_path_factory.mktemp("mk") / "llama", layers=1, hidden=64, inter=128, heads=4,
                            kv_heads=2, vocab=100)


@pytest.fixture(scope="module")
def gguf_without_tokenizer(tmp_path_factory, llama_hf):
    """That checkpoint converted to GGUF with --no-tokenizer (max_position_embeddings added, as told)."""
    d = tmp_path_factory.mktemp("mkfixed")
    src = d / "llama"
    os.makedirs(src)
    for f in os.listdir(llama_hf):
        if f != "config.json":
            os.link(llama_hf / f, src / f)
    cfg = json.loads((llama_hf / "config.json").read_text())
    cfg["max_position_embeddings"] = 256
    (src / "config.json").write_text(json.dumps(cfg))
    out = d / "llama.gguf"
    assert cli.main(["convert", "LlamaForCausalLM", str(src), "-o", str(out), "--no-tokenizer",
                     "--no-progress"]) == 0
    return out


# --- --help: defaults and examples ----------------------------------------------------------------------------
def _subcommands():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return parser, sub.choices


def test_every_help_shows_its_defaults_and_examples(capsys):
    from lazyweights.compiler.steps import DEFAULT_BUDGET

    parser, choices = _subcommands()
    assert set(cli.EXAMPLES) - {""} == set(choices)  # every subcommand has examples, and only those
    for name, sub in choices.items():
        rc, text, _ = run(capsys, name, "--help")
        assert rc == 0
        head, examples = text.split("\nexamples:\n", 1)
        examples = examples.splitlines()
        assert max(len(ln) for ln in head.splitlines()) <= 100, name  # descriptions still wrapped
        assert 2 <= len([ln for ln in examples if ln.startswith(f"  lazyweights {name}")]) <= 4, (name, examples)
        for action in sub._actions:  # every option with a default says what it is
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS, []):
                assert "default" in cli._Help(name)._get_help_string(action), (name, action.dest)
    rc, text, _ = run(capsys, "convert", "--help")
    squashed = " ".join(text.split())
    assert f"(default: {DEFAULT_BUDGET >> 20} MiB)" in squashed  # the 512 MiB the scheduler really uses
    assert "--budget SIZE working memory, e.g. 1GB (default: 512 MiB)" in squashed
    assert "(default: one shard)" in squashed and "default: threads" in squashed
    rc, text, _ = run(capsys, "demo", "--help")
    assert "(default: 64MB)" in " ".join(text.split()) and "(default: 2)" in text
    rc, text, _ = run(capsys, "--help")
    assert "examples:" in text and "lazyweights archs" in text


def test_every_example_parses():
    parser, _ = _subcommands()
    for name, lines in cli.EXAMPLES.items():
        for line in lines:
            argv = shlex.split(line.split("  #")[0])
            assert argv[0] == "lazyweights" and (not name or argv[1] == name), line
            parser.parse_args(argv[1:])  # a usage error exits 2 and fails the test


def test_convert_example_runs_as_shown(capsys, ckpt, tmp_path):
    """The w1 example of `convert --help`, on a real checkpoint: a sharded folder safetensors reads back."""
    line = next(ln for ln in cli.EXAMPLES["convert"] if ln.startswith(f"lazyweights convert {W1}"))
    argv = [str(ckpt) if a == "llama-hf/" else str(tmp_path / "out") if a == "out/" else a
            for a in shlex.split(line)[1:]]
    rc, out, err = run(capsys, *argv, "--no-progress", "--max-shard-size", "300B")
    assert rc == 0, err
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    shards = {os.path.join(tmp_path / "out", f) for f in index["weight_map"].values()}
    got = {k: v for f in shards for k, v in load_file(f).items()}
    assert set(got) == set(index["weight_map"]) and len(shards) > 1


# --- archs ---------------------------------------------------------------------------------------------------
def test_archs_both_ways_against_gguf_py_and_transformers(capsys):
    from gguf.constants import MODEL_ARCH_NAMES

    rc, out, _ = run(capsys, "archs", "--json")
    assert rc == 0
    t = json.loads(out)
    llama_cpp_names = set(MODEL_ARCH_NAMES.values())
    rows = t["hf_to_gguf"]
    assert {"hf_class": "LlamaForCausalLM", "model_type": "llama", "gguf": "llama"} in rows
    assert {"hf_class": "Qwen3MoeForCausalLM", "model_type": "qwen3_moe", "gguf": "qwen3moe"} in rows
    assert not {r["gguf"] for r in rows} - llama_cpp_names  # every target is an architecture llama.cpp has
    assert not set(t["gguf_to_hf"]) - llama_cpp_names
    # every class is transformers' class for that model_type (where this transformers knows the model_type)
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto import modeling_auto

    classes: dict[str, set[str]] = {}
    for attr in dir(modeling_auto):
        table = getattr(modeling_auto, attr)
        if attr.startswith("MODEL_") and attr.endswith("_MAPPING_NAMES") and isinstance(table, dict):
            for mt, cls in table.items():
                classes.setdefault(mt, set()).update([cls] if isinstance(cls, str) else cls)
    known = set().union(*classes.values())
    remote_code = {"ExaoneForCausalLM", "InternLM3ForCausalLM"}  # trust_remote_code models: not in transformers
    assert {r["hf_class"] for r in rows} - known == remote_code, transformers.__version__
    # the same pairing as transformers' for most rows; the rest are text parts of multimodal models (their
    # *_text model_type) and configs a class accepts besides its own (MistralForCausalLM reads llama configs)
    same = [r for r in rows if r["hf_class"] in classes.get(r["model_type"], ())]
    assert len(same) >= 75, len(same)
    # GGUF -> HF: each class listed converts that architecture back (its adapter accepts the model_type)
    from lazyweights.adapters.builtin import BUILTIN

    assert t["gguf_to_hf"]["llama"][0] == {"hf_class": "LlamaForCausalLM", "model_type": "llama"}
    for arch, back in t["gguf_to_hf"].items():
        assert back, arch
        for c in back:
            assert c["model_type"] in BUILTIN[c["hf_class"]], (arch, c)
    # the text form lists every row, both ways
    rc, text, _ = run(capsys, "archs")
    body = text.split("GGUF -> Hugging Face")
    assert len(body) == 2
    for r in rows:
        assert any(ln.split()[:3] == [r["hf_class"], r["model_type"], r["gguf"]] for ln in body[0].splitlines())
    for arch in t["gguf_to_hf"]:
        assert any(ln.split()[:1] == [arch] for ln in body[1].splitlines()), arch


# --- errors lead with the fix -------------------------------------------------------------------------------------
def test_a_mistyped_architecture_leads_with_did_you_mean_before_opening_anything(capsys, counted, nginx):
    url = nginx.url("nothing-here/model.safetensors")  # never requested: the name fails first
    nginx.clear_log()
    rc, _, err = run(capsys, "convert", "LlamaForCasualLM", url, "-o", "out.gguf")
    line = one_line_error(rc, err, "`lazyweights archs`")
    assert line.startswith("lazyweights: error: Did you mean 'LlamaForCausalLM'")
    assert len(line) < 400 and "Qwen3ForCausalLM" not in line  # no list of 80 names
    assert counted == {"load_weights": 0, "save": 0} and nginx.log() == []


def test_cli_words_not_python_keywords(capsys, counted, ckpt, tmp_path):
    out = tmp_path / "x.safetensors"
    rc, _, err = run(capsys, "convert", W1, ckpt, "-o", out, "--quant", "q4_k_m")
    line = one_line_error(rc, err, "--quant Q4_K_M writes GGUF: give an output ending in .gguf or --format gguf")
    assert "quant=" not in line and "format=" not in line
    assert counted == {"load_weights": 0, "save": 0} and not out.exists()
    # the library's own message (Plan.save, reached from Python) reads in flags when the CLI prints it
    with pytest.raises(lw.UsageError) as e:
        lw.plan({"w": lw.WeightData.from_numpy(np.ones(2, np.float32), "w")}).save(str(out), quant="Q8_0")
    assert "quant='Q8_0'" in str(e.value)
    assert cli.cli_words(str(e.value)).startswith("--quant Q8_0 writes GGUF: give an output ending in .gguf or "
                                                  "--format gguf")


def test_unknown_preset_and_types_fail_before_the_checkpoint_is_opened(capsys, counted, ckpt, tmp_path):
    out = tmp_path / "x.gguf"
    rc, _, err = run(capsys, "convert", W1, ckpt, "-o", out, "--quant", "Q4_K_N")
    line = one_line_error(rc, err, "--quant Q4_K_N: unknown preset", "Q4_K_M")
    assert line.startswith("lazyweights: error: Did you mean ")
    rc, _, err = run(capsys, "convert", W1, ckpt, "-o", out, "--quant", "Q4_K_M", "--output-tensor-type", "q9_9")
    one_line_error(rc, err, "--output-tensor-type", "q9_9")
    rc, _, err = run(capsys, "convert", W1, ckpt, "-o", out, "--quant", "Q4_K_M", "--imatrix", tmp_path / "no.dat")
    one_line_error(rc, err, "--imatrix", "no.dat: no such file")
    rc, _, err = run(capsys, "quantize", tmp_path / "in.gguf", out, "Q4_K_N")
    one_line_error(rc, err, "unknown preset")
    assert counted == {"load_weights": 0, "save": 0} and not out.exists()


def test_an_output_that_cannot_be_written_fails_before_the_work(capsys, counted, ckpt, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rc, _, err = run(capsys, "convert", W1, ckpt, "-o", blocker / "sub" / "x.gguf")
    one_line_error(rc, err, f"{blocker} is a file")
    folder = tmp_path / "a-folder"
    folder.mkdir()
    rc, _, err = run(capsys, "convert", W1, ckpt, "-o", folder, "--format", "gguf")
    one_line_error(rc, err, "a folder is there", "give a file name")
    rc, _, err = run(capsys, "convert", W1, ckpt, "-o", "http://127.0.0.1:9/x.gguf")
    one_line_error(rc, err, "local paths, not URLs")
    rc, _, err = run(capsys, "convert", W1, ckpt, "-o", tmp_path / "x.gguf", "--format", "safetensors")
    one_line_error(rc, err, "with --format safetensors: the name says gguf")
    rc, _, err = run(capsys, "convert", W1, ckpt, "-o", tmp_path / "x.safetensors", "--format", "gguf")
    one_line_error(rc, err, "with --format gguf: the name says safetensors", "ending in .gguf")
    assert counted == {"load_weights": 0, "save": 0}
    assert sorted(os.listdir(tmp_path)) == ["a-file", "a-folder"] and not os.listdir(folder)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_folder_fails_before_the_work(capsys, counted, ckpt, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        rc, _, err = run(capsys, "convert", W1, ckpt, "-o", ro / "new" / "x.safetensors")
        one_line_error(rc, err, "permission denied")
    finally:
        ro.chmod(0o755)
    assert counted == {"load_weights": 0, "save": 0}


def test_output_folders_are_made_and_the_write_stays_atomic(capsys, ckpt, gguf_without_tokenizer, tmp_path):
    from gguf import GGUFReader

    reference = load_file(os.path.join(ckpt, "model.safetensors"))
    st = tmp_path / "a" / "b" / "x.safetensors"
    rc, _, err = run(capsys, "convert", "--no-progress", W1, ckpt, "-o", st)
    assert rc == 0, err
    assert os.listdir(st.parent) == ["x.safetensors"]  # no temporary left beside it
    got = load_file(str(st))
    assert np.array_equal(got["embed_tokens.weight"].view(np.uint16),
                          reference["model.embed_tokens.weight"].astype(np.float16).view(np.uint16))
    gg = tmp_path / "c" / "d" / "x.gguf"  # quantize too (convert to a new folder's GGUF: the make_ckpt test)
    rc, _, err = run(capsys, "quantize", "--no-progress", gguf_without_tokenizer, gg, "Q8_0")
    assert rc == 0, err
    assert os.listdir(gg.parent) == ["x.gguf"]
    source = GGUFReader(str(gguf_without_tokenizer))
    assert {t.name for t in GGUFReader(str(gg)).tensors} == {t.name for t in source.tensors}


# --- the work starts only once everything it needs is there ------------------------------------------------------
def test_make_ckpt_checkpoint_one_error_says_exactly_what_to_add(capsys, counted, llama_hf, tmp_path):
    """The README's make_ckpt.py checkpoint has no max_position_embeddings and no tokenizer.json: one error
    names both fixes; doing exactly what it says converts on the next try."""
    out = tmp_path / "out" / "llama.gguf"
    rc, _, err = run(capsys, "convert", "LlamaForCausalLM", llama_hf, "-o", out)
    line = one_line_error(rc, err, f'add "max_position_embeddings": N (the model\'s values) to {llama_hf}/config.json',
                          f"{llama_hf} has no tokenizer.json either", "--no-tokenizer")
    assert "tokenizer=False" not in line
    assert counted["save"] == 0 and not out.parent.exists()
    cfg = json.loads((llama_hf / "config.json").read_text())
    fixed = tmp_path / "fixed"
    os.makedirs(fixed)
    for f in os.listdir(llama_hf):
        if f != "config.json":
            os.link(llama_hf / f, fixed / f)
    (fixed / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 512}))
    rc, _, err = run(capsys, "convert", "--no-progress", "LlamaForCausalLM", fixed, "-o", out, "--no-tokenizer")
    assert rc == 0, err
    from gguf import GGUFReader

    r = GGUFReader(str(out))
    assert int(r.fields["llama.context_length"].parts[-1][0]) == 512
    assert len(r.tensors) == 1 + 9 + 2  # embeddings; one layer's 9; norm, output


def test_gguf_to_hf_without_tokenizer_fails_before_any_tensor(capsys, counted, gguf_without_tokenizer, tmp_path):
    out = tmp_path / "hf"
    counted.update(load_weights=0, save=0)
    rc, _, err = run(capsys, "convert", "LlamaForCausalLM", gguf_without_tokenizer, "-o", out)
    line = one_line_error(rc, err, "the GGUF metadata has no tokenizer", "pass --no-tokenizer")
    assert "tokenizer=False" not in line
    assert counted["save"] == 0 and not out.exists() and os.listdir(tmp_path) == []
    # with the flag it is written, config.json included, which transformers reads
    rc, _, err = run(capsys, "convert", "--no-progress", "LlamaForCausalLM", gguf_without_tokenizer, "-o", out,
                     "--no-tokenizer")
    assert rc == 0, err
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors"]
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.from_pretrained(str(out))
    assert cfg.model_type == "llama" and cfg.max_position_embeddings == 256 and cfg.hidden_size == 64


def test_gguf_to_hf_from_python_builds_the_files_before_the_tensors(monkeypatch, gguf_without_tokenizer, tmp_path):
    """The same check on the library's path (`Plan.save` of a GGUF -> HF result, `export_hf_folder`): the
    folder's files are built before any shard is written, so the missing tokenizer costs no work."""
    import lazyweights.lazy.save as save_module
    from lazyweights.adapters import convert_gguf_state_dict, export_hf_folder

    shards = []
    real = save_module.write_shards
    monkeypatch.setattr(save_module, "write_shards", lambda *a, **k: shards.append(1) or real(*a, **k))
    w = lw.load_weights([str(gguf_without_tokenizer)])
    adapted = convert_gguf_state_dict(dict(w.items()), w.config)
    with pytest.raises(lw.TokenizerConversionError, match="the GGUF metadata has no tokenizer"):
        lw.plan(adapted).save(str(tmp_path / "hf"))
    with pytest.raises(lw.TokenizerConversionError, match="the GGUF metadata has no tokenizer"):
        export_hf_folder(str(gguf_without_tokenizer), str(tmp_path / "hf2"))
    assert shards == [] and os.listdir(tmp_path) == []
    export_hf_folder(str(gguf_without_tokenizer), str(tmp_path / "hf2"), tokenizer=False)
    assert shards == [1] and sorted(os.listdir(tmp_path / "hf2")) == ["config.json", "generation_config.json",
                                                                       "model.safetensors"]


# --- URLs everywhere ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(nginx, tiny_llama):
    folder = nginx.root / "manners"
    tiny_llama(str(folder))
    return folder


def test_every_path_taking_subcommand_reads_urls(capsys, nginx, served, ckpt, tmp_path):
    url = nginx.url("manners/model.safetensors")
    rc, out, err = run(capsys, "inspect", url)
    assert rc == 0 and "10 tensors" in out, err
    rc, out, err = run(capsys, "diff", url, ckpt / "model.safetensors", "--values")
    assert rc == 0, (out, err)
    assert "summary: 0 added, 0 removed, 0 changed dtype/shape, 0 differ in values, 10 equal in values" in out
    rc, out, err = run(capsys, "plan", W1, url)
    assert rc == 0 and "plan: " in out, err
    local = tmp_path / "from-url.safetensors"
    rc, out, err = run(capsys, "convert", "--no-progress", W1, url, "-o", local)
    assert rc == 0, err
    rc, out, err = run(capsys, "diff", local, str(tmp_path / "same.safetensors"))
    assert rc == 1  # a missing second path is an error, not a diff
    # verify: the manifest beside the URL, fetched; then a manifest written for a URL with --manifest
    rc, out, err = run(capsys, "verify", served, "--write")
    assert rc == 0, err
    rc, out, err = run(capsys, "verify", url)
    assert rc == 0 and out.startswith("OK: 10 tensors checked against " + nginx.url("manners/lazyweights.verify.json"))
    os.remove(served / "lazyweights.verify.json")
    mine = tmp_path / "m" / "manifest.json"
    rc, out, err = run(capsys, "verify", url, "--write")
    one_line_error(rc, err, "give --manifest FILE")
    rc, out, err = run(capsys, "verify", url, "--write", "--manifest", mine)
    assert rc == 0 and mine.is_file(), err
    assert json.loads(mine.read_text())["tensors"] == json.loads(
        json.dumps(_local_manifest(ckpt, tmp_path)["tensors"]))
    rc, out, err = run(capsys, "verify", url, "--manifest", mine, "--json")
    assert rc == 0 and json.loads(out)["ok"] and json.loads(out)["path"] == url
    rc, out, err = run(capsys, "verify", nginx.url("manners/"))
    one_line_error(rc, err, "lazyweights.verify.json", "404")


def test_quantize_reads_a_url(capsys, nginx, gguf_without_tokenizer, tmp_path):
    from gguf import GGUFReader

    os.link(gguf_without_tokenizer, nginx.root / "manners-bf16.gguf")
    out = tmp_path / "q" / "q8.gguf"
    rc, _, err = run(capsys, "quantize", "--no-progress", nginx.url("manners-bf16.gguf"), out, "Q8_0")
    assert rc == 0, err
    local = tmp_path / "local-q8.gguf"
    assert run(capsys, "quantize", "--no-progress", gguf_without_tokenizer, local, "Q8_0")[0] == 0
    assert out.read_bytes() == local.read_bytes()  # the same file as from the local copy
    assert {t.tensor_type.name for t in GGUFReader(str(out)).tensors} >= {"Q8_0"}


def test_verify_write_to_a_named_manifest(capsys, ckpt, tmp_path):
    mine = tmp_path / "elsewhere" / "m.json"
    rc, out, err = run(capsys, "verify", ckpt, "--write", "--manifest", mine)
    assert rc == 0 and out.startswith(f"wrote {mine}: 10 tensors hashed"), err
    assert not (ckpt / "lazyweights.verify.json").exists()
    assert json.loads(mine.read_text())["tensors"] == _local_manifest(ckpt, tmp_path)["tensors"]
    rc, out, err = run(capsys, "verify", ckpt, "--manifest", mine)
    assert rc == 0 and out.startswith("OK: 10 tensors checked"), err


def test_s3_paths_with_storage_options(capsys, s3, ckpt, tmp_path):
    """inspect, diff and verify on s3:// with --storage-options (verify's manifest fetched from the bucket)."""
    s3.client.create_bucket(Bucket="manners")
    s3.client.upload_file(str(ckpt / "model.safetensors"), "manners", "tiny/model.safetensors")
    options = json.dumps(s3.options)
    url = "s3://manners/tiny/model.safetensors"
    rc, out, err = run(capsys, "inspect", url, "--storage-options", options)
    assert rc == 0 and "10 tensors" in out, err
    rc, out, err = run(capsys, "diff", url, ckpt / "model.safetensors", "--values", "--storage-options", options)
    assert rc == 0 and "10 equal in values" in out, err
    manifest = tmp_path / "m.json"
    rc, out, err = run(capsys, "verify", url, "--write", "--manifest", manifest, "--storage-options", options)
    assert rc == 0, err
    assert json.loads(manifest.read_text())["tensors"] == _local_manifest(ckpt, tmp_path)["tensors"]
    s3.client.upload_file(str(manifest), "manners", "tiny/lazyweights.verify.json")
    rc, out, err = run(capsys, "verify", url, "--storage-options", options)
    assert rc == 0 and out.startswith("OK: 10 tensors checked against s3://manners/tiny/lazyweights.verify.json"), err


def _local_manifest(ckpt, tmp_path):
    from lazyweights.tools.verify import write_manifest

    copy = tmp_path / "local-copy"
    os.makedirs(copy)
    os.link(ckpt / "model.safetensors", copy / "model.safetensors")
    with open(write_manifest(str(copy))) as f:
        return json.load(f)


def test_a_refused_connection_fails_at_once_naming_the_url(capsys, monkeypatch):
    import lazyweights.io.remote as remote

    port = _free_port()
    sleeps = []
    monkeypatch.setattr(remote.time, "sleep", lambda s: sleeps.append(s))
    url = f"http://127.0.0.1:{port}/model.safetensors"
    rc, _, err = run(capsys, "inspect", url)
    line = one_line_error(rc, err, url, "connection refused", f"nothing listens on 127.0.0.1:{port}",
                          "start the server or fix the host and port")
    assert "urllib3" not in line and "HTTPConnectionPool" not in line
    assert sleeps == []  # not retried
    with pytest.raises(lw.RemoteError) as e:  # the named error, from Python too
        lw.load_weights([url])
    assert e.value.url == url and isinstance(e.value, OSError)
    rc, _, err = run(capsys, "verify", url)
    one_line_error(rc, err, "connection refused")
    assert sleeps == []


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
