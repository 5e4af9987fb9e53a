"""The JSON files a checkpoint keeps beside its weights (config.json, preprocessor_config.json,
tokenizer_config.json, modules.json, ...), read one way, local or remote, with one error.

`read_json(path)` is the JSON object (or array) in a local file or a URL (`http://`, `https://`, `s3://`, `gs://`),
None when there is no such file; `json_beside(path, name)` is the file `name` in the folder of `path` (a
checkpoint file, a folder, or a URL: its sibling object). A file that exists but is not UTF-8 JSON holding
the kind of value expected is a `JSONFileError` (a `FormatError`, so a `ValueError`) naming the file and the
parser's complaint; a remote store's own failure stays its `RemoteError`.

Example:
    >>> import json, os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> _ = open(os.path.join(d, "config.json"), "w").write(json.dumps({"model_type": "llama"}))
    >>> json_beside(os.path.join(d, "model.safetensors"), "config.json")
    {'model_type': 'llama'}
    >>> json_beside(d, "config.json")["model_type"], json_beside(d, "generation_config.json") is None
    ('llama', True)
    >>> _ = open(os.path.join(d, "bad.json"), "w").write("{'model_type': 1}")
    >>> try:
    ...     read_json(os.path.join(d, "bad.json"))
    ... except JSONFileError as e:
    ...     print(os.path.basename(e.path), str(e).split(": ", 1)[1])
    bad.json not a valid JSON file: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)
"""
from __future__ import annotations

import json
import os
from typing import Any

from ..core.errors import JSONFileError, RemoteError
from ..io.remote import fetch_small, is_url, options_of, url_exists


def beside(path: Any, name: str) -> str:
    """The path (or URL) of `name` in the folder of `path`: inside `path` when it is a local folder, else
    beside the file (a URL's query string dropped).

    >>> beside("s3://bucket/m/model.safetensors?v=2", "config.json"), beside("/m/model.gguf", "config.json")
    ('s3://bucket/m/config.json', '/m/config.json')
    """
    path = os.fspath(path)
    if is_url(path):
        return path.split("?", 1)[0].rsplit("/", 1)[0] + "/" + name
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    return os.path.join(folder, name)


def read_json(path: Any, *, expect: type = dict, options_from: str | None = None) -> Any:
    """The JSON object (or, with `expect=list`, array: sentence-transformers' modules.json) in the local file or
    URL `path`; None when it does not exist. A URL is read with the storage options the file `options_from`
    (default: `path` itself) was opened with. JSONFileError when the file is unreadable, not UTF-8, not JSON,
    or holds another kind of value.

    >>> read_json("/nonexistent/config.json") is None
    True
    """
    path = os.fspath(path)
    try:
        if is_url(path):
            with options_of(options_from or path):
                if not url_exists(path):
                    return None
                doc = json.loads(fetch_small(path).decode("utf-8"))
        else:
            if not os.path.isfile(path):
                return None
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
    except RemoteError:
        raise  # the store's own error (timeouts, truncated bodies, 403s) names the URL and the cause
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise JSONFileError(f"{path}: not a valid JSON file: {e}", path) from None
    if not isinstance(doc, expect):
        want = "an array" if expect is list else "an object"
        raise JSONFileError(f"{path}: holds a JSON {type(doc).__name__}, expected {want}", path)
    return doc


def json_beside(path: Any, name: str) -> dict | None:
    """The JSON object in the file `name` beside `path` (`beside`, `read_json`), None when there is none.
    See the module example."""
    return read_json(beside(path, name), options_from=os.fspath(path) if is_url(path) else None)
