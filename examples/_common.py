"""Shared helpers for the examples: small checkpoint writers, an independent reader, `check`, the verdict.

Every example writes a small checkpoint with its model family's real tensor names and proportions (scaled
down), runs a lazy adapter over it, and compares each result with an *independent* eager computation:
source tensors are read with `safetensors.safe_open` (or, for the dtypes safetensors' numpy loader cannot
hand out, straight from the file with numpy), never with lazyweights.

    check(name, got, want)   compare dtype, shape and bytes; record any mismatch; returns True if equal
    check_keys(got, want)    compare two sets of tensor names
    verdict(title)           print one line (OK / MISMATCH) and return the exit status (0 / 1)

Run examples as scripts (`python examples/NAME.py`); this module is found because the script's directory
is on `sys.path`.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager

import ml_dtypes
import numpy as np

# So `python examples/NAME.py` from a source checkout imports this checkout's lazyweights.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

bf16 = np.dtype(ml_dtypes.bfloat16)
f8e4m3 = np.dtype(ml_dtypes.float8_e4m3fn)
e8m0 = np.dtype(ml_dtypes.float8_e8m0fnu)

# --- recording results ------------------------------------------------------------------------------
MISMATCHES: list[str] = []
CHECKED: list[str] = []


def reset() -> None:
    """Forget every recorded result (for running an example's checks more than once in a process)."""
    MISMATCHES.clear()
    CHECKED.clear()


def check(name: str, got, want) -> bool:
    """Compare dtype, shape and bytes of `got` with `want` (numpy arrays or array-likes).

    A mismatch is printed and recorded (the verdict then fails); returns whether they are equal.
    Floats compare by bit pattern, so -0.0 != 0.0 and NaN payloads count.
    """
    got, want = np.asarray(got), np.asarray(want)
    CHECKED.append(name)
    problems = []
    if got.dtype != want.dtype:
        problems.append(f"dtype {got.dtype} != {want.dtype}")
    if got.shape != want.shape:
        problems.append(f"shape {list(got.shape)} != {list(want.shape)}")
    if not problems:
        g = np.array(got, order="C", copy=None)  # (ascontiguousarray would turn 0-d into 1-d)
        w = np.array(want, order="C", copy=None)
        if g.tobytes() != w.tobytes():
            itemsize = g.dtype.itemsize
            if itemsize in (1, 2, 4, 8) and g.size:
                u = np.dtype(f"u{itemsize}")
                diff = g.view(u) != w.view(u)
                first = np.unravel_index(int(np.argmax(diff)), g.shape)
                problems.append(f"{int(diff.sum())} of {g.size} elements differ (first at {list(map(int, first))}: "
                                f"got {g[first]!r}, want {w[first]!r})")
            else:
                problems.append("bytes differ")
    if problems:
        MISMATCHES.append(f"{name}: " + "; ".join(problems))
        print(f"  MISMATCH {name}: " + "; ".join(problems))
        return False
    return True


def check_true(name: str, condition: bool, detail: str = "") -> bool:
    """Record a boolean check (e.g. "these two outputs share memory")."""
    CHECKED.append(name)
    if not condition:
        MISMATCHES.append(f"{name}: {detail or 'failed'}")
        print(f"  MISMATCH {name}: {detail or 'failed'}")
        return False
    return True


def check_keys(got, want, what: str = "tensor names") -> bool:
    got, want = set(got), set(want)
    if got == want:
        CHECKED.append(what)
        return True
    return check_true(what, False, f"missing {sorted(want - got)}, unexpected {sorted(got - want)}")


def verdict(title: str) -> int:
    """Print the one-line verdict and return the exit status: 0 if every check passed, else 1."""
    if MISMATCHES:
        print(f"MISMATCH: {title}: {len(MISMATCHES)} of {len(CHECKED)} checks failed: {MISMATCHES[0]}")
        return 1
    if not CHECKED:
        print(f"MISMATCH: {title}: nothing was checked")
        return 1
    print(f"OK: {title}: all {len(CHECKED)} checks matched the independent eager numpy computation")
    return 0


def run(main) -> None:
    """`sys.exit(main())`, turning an unexpected exception into a failing verdict (exit status 2)."""
    try:
        status = main()
    except Exception:  # noqa: BLE001 - an example must fail loudly, never silently
        import traceback

        traceback.print_exc()
        print("MISMATCH: the example raised an exception (above)")
        status = 2
    sys.exit(status)


def print_plan(p, title: str = "plan") -> None:
    print(f"--- {title} ---")
    print(p)  # Plan.__str__ is Plan.explain()


@contextmanager
def workdir(prefix: str):
    """A temporary directory, removed afterwards (set LAZYWEIGHTS_EXAMPLES_KEEP=1 to keep it)."""
    d = tempfile.mkdtemp(prefix=f"lazyweights-{prefix}-")
    try:
        yield d
    finally:
        if not os.environ.get("LAZYWEIGHTS_EXAMPLES_KEEP"):
            shutil.rmtree(d, ignore_errors=True)


# --- writing and reading checkpoints ---------------------------------------------------------------------
def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def normal(r: np.random.Generator, shape, dtype, scale: float = 0.02) -> np.ndarray:
    return (r.standard_normal(shape, dtype=np.float32) * scale).astype(dtype)


def write_safetensors(path: str, tensors: dict[str, np.ndarray], config: dict | None = None) -> str:
    """One `model.safetensors` file (as Hugging Face writes it, `format: pt`), plus `config.json` beside it."""
    from safetensors.numpy import save_file

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    save_file({k: np.array(v, order="C", copy=None) for k, v in tensors.items()}, path, metadata={"format": "pt"})
    if config is not None:
        with open(os.path.join(os.path.dirname(path), "config.json"), "w") as f:
            json.dump(config, f, indent=2)
    return path


# safetensors' numpy loader has no fp8 types (it looks them up on numpy); read those bytes directly.
_RAW_DTYPES = {"F8_E4M3": f8e4m3, "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "F8_E8M0": e8m0}


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file, read with `safetensors.safe_open` (numpy), independently of
    lazyweights. FP8 tensors, which safetensors' numpy loader cannot return, are read from the file's
    bytes at the offsets its JSON header gives."""
    from safetensors import safe_open

    out: dict[str, np.ndarray] = {}
    raw: list[str] = []
    with safe_open(path, "numpy") as f:
        for k in f.keys():
            if f.get_slice(k).get_dtype() in _RAW_DTYPES:
                raw.append(k)
            else:
                out[k] = f.get_tensor(k)
    if raw:
        with open(path, "rb") as fh:
            n = int(np.frombuffer(fh.read(8), "<u8")[0])
            header = json.loads(fh.read(n))
            data = fh.read()
        for k in raw:
            info = header[k]
            start, stop = info["data_offsets"]
            out[k] = np.frombuffer(data[start:stop], _RAW_DTYPES[info["dtype"]]).reshape(info["shape"]).copy()
    return out


def read_saved(path_or_dir: str) -> dict[str, np.ndarray]:
    """Every tensor a `Plan.save` wrote (one file, or a directory of shards), read with safetensors."""
    if os.path.isfile(path_or_dir):
        return read_safetensors(path_or_dir)
    out = {}
    for fname in sorted(os.listdir(path_or_dir)):
        if fname.endswith(".safetensors"):
            out.update(read_safetensors(os.path.join(path_or_dir, fname)))
    return out


# --- model families (scaled-down shapes; the real proportions are noted) ---------------------------------
# Llama 3 8B: hidden 4096, intermediate 14336 (3.5x), 32 heads, 8 KV heads, head_dim 128, vocab 128256.
LLAMA = dict(hidden_size=256, intermediate_size=896, num_attention_heads=8, num_key_value_heads=2,
             head_dim=32, vocab_size=512, num_hidden_layers=2, model_type="llama",
             architectures=["LlamaForCausalLM"], rms_norm_eps=1e-5, tie_word_embeddings=False)


def llama_tensors(cfg: dict = LLAMA, dtype=np.float16, seed: int = 0, fp8_kv_scales: bool = False,
                  lm_head: bool = True) -> dict[str, np.ndarray]:
    """Hugging Face Llama names: `model.embed_tokens.weight`, `model.layers.N.self_attn.q_proj.weight`, ..."""
    r = rng(seed)
    H, I, A, K, V, hd = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                          "num_key_value_heads", "vocab_size", "head_dim"))
    t = {"model.embed_tokens.weight": normal(r, (V, H), dtype)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = (1 + normal(r, (H,), np.float32)).astype(dtype)
        t[p + "self_attn.q_proj.weight"] = normal(r, (A * hd, H), dtype)
        t[p + "self_attn.k_proj.weight"] = normal(r, (K * hd, H), dtype)
        t[p + "self_attn.v_proj.weight"] = normal(r, (K * hd, H), dtype)
        t[p + "self_attn.o_proj.weight"] = normal(r, (H, A * hd), dtype)
        if fp8_kv_scales:  # FP8 checkpoints (e.g. from llm-compressor) ship scalar KV-cache scales
            t[p + "self_attn.k_scale"] = np.asarray(r.random() * 0.1, np.float32)
            t[p + "self_attn.v_scale"] = np.asarray(r.random() * 0.1, np.float32)
        t[p + "post_attention_layernorm.weight"] = (1 + normal(r, (H,), np.float32)).astype(dtype)
        t[p + "mlp.gate_proj.weight"] = normal(r, (I, H), dtype)
        t[p + "mlp.up_proj.weight"] = normal(r, (I, H), dtype)
        t[p + "mlp.down_proj.weight"] = normal(r, (H, I), dtype)
    t["model.norm.weight"] = (1 + normal(r, (H,), np.float32)).astype(dtype)
    if lm_head:
        t["lm_head.weight"] = normal(r, (V, H), dtype)
    return t
