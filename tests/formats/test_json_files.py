"""One reader for the JSON files beside a checkpoint (`formats.json_files`), and every caller uses it: a broken
config.json / preprocessor_config.json / tokenizer_config.json / modules.json / adapter_config.json is one
`JSONFileError` naming the file and Python's own `json` complaint (the reference below), wherever it is read;
a missing one is None (each caller then says what it needs); a URL's sibling object is read over HTTP with
the same result as the local file."""
from __future__ import annotations

import http.server
import json
import threading

import numpy as np
import pytest

import lazyweights as lw
from lazyweights.core.errors import FormatError, JSONFileError
from lazyweights.formats.json_files import beside, json_beside, read_json

BROKEN = '{"model_type": "llama",}'


def _json_error(text: str) -> str:
    """What Python's json module says about `text` (the reference the error message must carry)."""
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        return str(e)
    raise AssertionError("valid JSON")


def test_reads_beside_a_file_or_in_a_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "n": [1, 2]}))
    assert json_beside(tmp_path / "model.safetensors", "config.json") == {"model_type": "llama", "n": [1, 2]}
    assert json_beside(str(tmp_path), "config.json") == {"model_type": "llama", "n": [1, 2]}
    assert json_beside(tmp_path, "generation_config.json") is None
    assert read_json(tmp_path / "nope.json") is None
    assert beside("https://h/m/a.safetensors?x=1", "config.json") == "https://h/m/config.json"


@pytest.mark.parametrize("text, complaint", [
    (BROKEN, _json_error(BROKEN)),
    ("[1, 2]", "holds a JSON list, expected an object"),
    ("", _json_error("")),
])
def test_a_broken_file_is_one_named_error(tmp_path, text, complaint):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(JSONFileError) as e:
        read_json(path)
    assert str(path) in str(e.value) and complaint in str(e.value)
    assert e.value.path == str(path)
    assert isinstance(e.value, FormatError) and isinstance(e.value, ValueError)


def test_not_utf8_is_the_same_error(tmp_path):
    (tmp_path / "config.json").write_bytes(b'{"a": "\xff"}')
    with pytest.raises(JSONFileError, match="config.json: not a valid JSON file: 'utf-8' codec"):
        json_beside(tmp_path, "config.json")


def test_an_array_where_one_is_expected(tmp_path):
    (tmp_path / "modules.json").write_text(json.dumps([{"type": "x.Pooling", "path": "1_Pooling"}]))
    assert read_json(tmp_path / "modules.json", expect=list) == [{"type": "x.Pooling", "path": "1_Pooling"}]
    with pytest.raises(JSONFileError, match="holds a JSON list, expected an object"):
        read_json(tmp_path / "modules.json")


# --- every caller -------------------------------------------------------------------------------------------------
@pytest.fixture
def broken_checkpoint(tmp_path, write_safetensors):
    write_safetensors(tmp_path / "model.safetensors", {"w": np.zeros((2, 2), np.float32)})
    (tmp_path / "config.json").write_text(BROKEN)
    return tmp_path


def test_load_weights_names_the_broken_config(broken_checkpoint):
    with pytest.raises(JSONFileError) as e:
        lw.load_weights([str(broken_checkpoint / "model.safetensors")])
    assert str(broken_checkpoint / "config.json") in str(e.value) and _json_error(BROKEN) in str(e.value)


def test_load_hf_config_names_the_broken_config_and_the_missing_one(broken_checkpoint, tmp_path_factory):
    from lazyweights.formats.config import load_hf_config

    with pytest.raises(JSONFileError, match="config.json: not a valid JSON file"):
        load_hf_config(broken_checkpoint)
    empty = tmp_path_factory.mktemp("empty")
    with pytest.raises(FormatError, match="no such file") as e:
        load_hf_config(empty)
    assert not isinstance(e.value, JSONFileError)


def test_converters_name_the_broken_config(tmp_path, write_safetensors):
    from lazyweights.convert.mmproj import convert_hf_to_mmproj
    from lazyweights.convert.to_gguf import convert_hf_to_gguf

    write_safetensors(tmp_path / "model.safetensors", {"w": np.zeros((2, 2), np.float32)})
    weights = lw.load_weights([str(tmp_path / "model.safetensors")])  # no config.json yet
    (tmp_path / "config.json").write_text(BROKEN)  # then a broken one, read by the converters themselves
    sd = dict(weights.items())
    with pytest.raises(JSONFileError, match="config.json: not a valid JSON file"):
        convert_hf_to_gguf(sd)
    with pytest.raises(JSONFileError, match="config.json: not a valid JSON file"):
        convert_hf_to_mmproj(sd)


def test_registry_and_lora_read_through_it(broken_checkpoint, tmp_path_factory):
    from lazyweights.adapters.lora import read_lora_config
    from lazyweights.adapters.registry import architecture_from_config

    assert architecture_from_config(broken_checkpoint / "model.safetensors") is None  # nothing to guess from
    good = tmp_path_factory.mktemp("good")
    (good / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert architecture_from_config([str(good / "model.safetensors")]) == "LlamaForCausalLM"
    lora = tmp_path_factory.mktemp("lora")
    (lora / "adapter_config.json").write_text(BROKEN)
    with pytest.raises(JSONFileError, match="adapter_config.json: not a valid JSON file"):
        read_lora_config(str(lora))


def test_mmproj_processor_and_tokenizer_configs(tmp_path):
    from lazyweights.adapters.vision_archs import VISION_ARCHS
    from lazyweights.convert.mmproj import _preprocessor_config, _token_ids

    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5], "media_proc_cfg": {"a": 1}}))
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": {"image_std": [0.25]}}))
    pre = _preprocessor_config(str(tmp_path))
    assert (pre["image_mean"], pre["image_std"], pre["a"]) == ([0.5], [0.25], 1)
    assert _preprocessor_config(None) is None
    rec = next(r for r in VISION_ARCHS.values() if r.token_rows)
    (tmp_path / "tokenizer_config.json").write_text(BROKEN)
    with pytest.raises(JSONFileError, match="tokenizer_config.json: not a valid JSON file"):
        _token_ids(rec, str(tmp_path))


# --- over HTTP ----------------------------------------------------------------------------------------------------
class _Files(http.server.BaseHTTPRequestHandler):
    """HEAD and ranged GET over a dict of name -> bytes (404 for the rest), as an object store answers."""

    files: dict[str, bytes] = {}

    def log_message(self, *a):
        pass

    def _send(self, status, body=b"", extra=()):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"v1"')
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        return body

    def do_HEAD(self):
        body = self.files.get(self.path.split("?", 1)[0].lstrip("/"))
        if body is None:
            self._send(404)
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", '"v1"')
            self.end_headers()

    def do_GET(self):
        body = self.files.get(self.path.split("?", 1)[0].lstrip("/"))
        if body is None:
            self._send(404)
            return
        start, end = (int(x) for x in self.headers["Range"].split("=")[1].split("-"))
        end = min(end, len(body) - 1)  # a range past the end is cut at the end, as RFC 9110 says
        part = body[start:end + 1]
        self.wfile.write(self._send(206, part, [("Content-Range", f"bytes {start}-{end}/{len(body)}")]))


@pytest.fixture
def served():
    files: dict[str, bytes] = {}
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_Files,), {"files": files}))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield files, f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


def test_a_urls_sibling_reads_as_the_local_file(served, tmp_path):
    files, base = served
    doc = {"model_type": "qwen2", "rope_parameters": {"rope_theta": 1e6}, "é": "ü"}
    files["m/config.json"] = json.dumps(doc, ensure_ascii=False).encode()
    files["m/bad.json"] = BROKEN.encode()
    (tmp_path / "config.json").write_bytes(files["m/config.json"])
    assert json_beside(f"{base}/m/model.safetensors", "config.json") == doc == json_beside(tmp_path, "config.json")
    assert json_beside(f"{base}/m/model.safetensors", "generation_config.json") is None
    with pytest.raises(JSONFileError) as e:
        read_json(f"{base}/m/bad.json")
    assert f"{base}/m/bad.json" in str(e.value) and _json_error(BROKEN) in str(e.value)


def test_the_command_line_names_a_broken_hf_config(tmp_path, write_safetensors, capsys):
    from lazyweights.tools.cli import main

    write_safetensors(tmp_path / "model.safetensors", {"w": np.zeros((2, 2), np.float32)})
    (tmp_path / "cfg.json").write_text(BROKEN)
    rc = main(["convert", "Gemma3ForConditionalGeneration", str(tmp_path), "-o", str(tmp_path / "x.gguf"),
               "--mmproj", str(tmp_path / "mm.gguf"), "--hf-config", str(tmp_path / "cfg.json"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc != 0 and "cfg.json: not a valid JSON file" in err and _json_error(BROKEN) in err
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "mm.gguf").exists()
