"""Every kernel the GPU path can launch, compiled by nvcc for sm_80 and sm_90 (no GPU needed).

The units are the exact text CuPy hands NVRTC (`lazyweights/kernels/cuda_units.py`): RawKernels for the
fused dequantizers, ElementwiseKernels rendered into CuPy's template for the casts. nvcc compiles them with
the run-time options (`NVRTC_OPTIONS` plus CuPy's `--std`), and CuPy's own include paths for the
ElementwiseKernels, keeping the PTX. The PTX must define the kernel for each architecture and must hold no
fused multiply-add and no flush-to-zero instruction: either would break bit-exactness with the CPU path.

Skips: without nvcc (all), or without CuPy's headers (the ElementwiseKernel units, which include
`cupy/carray.cuh`). `.ci/run` installs both (nvcc is on every machine here; CuPy comes with the test extra).
Compiling differs from NVRTC in one way: nvcc does not define `__CUDACC_RTC__`, under which CuPy's
`carray.cuh` skips `#include <initializer_list>` (NVRTC predefines it).
"""
from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lazyweights.core.dtype import DType
from lazyweights.kernels.cuda_casts import DEVICE_CASTS, cast_kernel_parts
from lazyweights.kernels.cuda_units import (
    CUPY_PREPENDED_HEADERS,
    TranslationUnit,
    elementwise_unit,
    launchable_units,
    raw_unit,
)


def _find_nvcc() -> str | None:
    for candidate in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


NVCC = _find_nvcc()
ARCHS = ("80", "90")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found (the CUDA toolkit is not installed)")


def _cupy_include() -> Path | None:
    spec = importlib.util.find_spec("cupy")
    if spec is None or not spec.origin:
        return None
    include = Path(spec.origin).parent / "_core" / "include"
    return include if (include / "cupy" / "carray.cuh").is_file() else None


CUPY_INCLUDE = _cupy_include()


def _include_flags(unit: TranslationUnit) -> list[str]:
    """The include paths CuPy adds (`assemble_cupy_compiler_options`): its bundled CCCL first, then its own
    headers. nvcc adds the CUDA toolkit's include directory itself."""
    if not unit.needs_cupy_headers:
        return []
    cccl = CUPY_INCLUDE / "cupy" / "_cccl"
    return [f"-I{cccl / 'cub'}", f"-I{cccl / 'thrust'}", f"-I{cccl / 'libcudacxx'}", f"-I{CUPY_INCLUDE}"]


def compile_unit(unit: TranslationUnit, workdir: Path) -> dict[str, str]:
    """nvcc `unit` for every arch in ARCHS; returns {arch: PTX text}. Raises AssertionError with nvcc's
    message when it does not compile."""
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / f"{unit.name}.cu"
    source.write_text(unit.source)
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
    cmd = [NVCC, "-fatbin", *gencode, "--keep", f"--keep-dir={workdir}", *unit.options, *_include_flags(unit),
           "-o", str(workdir / f"{unit.name}.fatbin"), str(source)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"nvcc failed on {unit.name} ({unit.kind}):\n{done.stderr[-4000:]}")
    return {a: (workdir / f"{unit.name}.compute_{a}.ptx").read_text() for a in ARCHS}


def _two_step_chains() -> list[tuple]:
    """One two-step chain starting with each device pair (longer chains nest the same device functions)."""
    pairs = sorted(DEVICE_CASTS, key=lambda p: (p[0].name, p[1].name))
    chains = []
    for first in pairs:
        follow = [p for p in pairs if p[0].size_in_bytes == first[1].size_in_bytes and p[0] is first[1]]
        if follow:
            chains.append((first, follow[len(chains) % len(follow)]))
    return chains


def _all_units() -> list[TranslationUnit]:
    units = launchable_units() + [elementwise_unit(chain) for chain in _two_step_chains()]
    if CUPY_INCLUDE is None:
        units = [u for u in units if not u.needs_cupy_headers]
    return units


UNIT_IDS = [f"{u.kind}-{u.name}-{'i32' if '1, 1, 1>' in u.source else 'i64'}" if u.kind == "elementwise"
            else f"{u.kind}-{u.name}" for u in _all_units()]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Compile every unit once, in parallel (nvcc is single-threaded); {id: PTX dict or the error}."""
    root = tmp_path_factory.mktemp("nvcc")
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        futures = {pool.submit(compile_unit, unit, root / uid): uid for uid, unit in zip(UNIT_IDS, _all_units())}
        for future, uid in futures.items():
            try:
                results[uid] = future.result()
            except AssertionError as e:
                results[uid] = e
    return results


# PTX instructions that would make a GPU value differ from the CPU's: fused multiply-adds, and any float
# op that flushes subnormals to zero.
_FORBIDDEN = re.compile(r"^\s*(?:@%p\d+\s+)?(fma\.\S+|\S+\.ftz\.\S*)", re.MULTILINE)


def forbidden_instructions(ptx: str) -> list[str]:
    return sorted(set(_FORBIDDEN.findall(ptx)))


@pytest.mark.parametrize("uid", UNIT_IDS)
def test_unit_compiles_for_sm80_and_sm90(compiled, uid):
    result = compiled[uid]
    if isinstance(result, Exception):
        raise result
    unit = dict(zip(UNIT_IDS, _all_units()))[uid]
    for arch, ptx in result.items():
        assert f".target sm_{arch}" in ptx
        assert re.search(rf"\.visible \.entry {unit.name}\(", ptx), f"{unit.name} missing from the sm_{arch} PTX"
        assert forbidden_instructions(ptx) == [], f"{unit.name} sm_{arch}"
        if unit.kind == "raw":
            # The dequantizers do float math, each op spelled with an explicit rounding mode.
            assert "mul.rn.f32" in ptx


def test_every_launchable_unit_is_compiled():
    """The GPU path launches nothing outside `launchable_units()` (plus nested cast chains)."""
    from lazyweights.kernels.cuda_dequant import DEVICE_DEQUANT

    names = {u.name for u in launchable_units()}
    for enc in DEVICE_DEQUANT:
        assert f"lw_dequant_{enc.name.lower()}" in names
        assert f"lw_dequant_{enc.name.lower()}_bf16" in names
    for a, b in DEVICE_CASTS:
        assert f"lw_cast_{a.short}_{b.short}" in names


def test_the_checks_can_fail(tmp_path):
    """A unit that does not compile is reported with nvcc's message, and a multiply-add compiled without
    lazyweights' `--fmad=false` shows up as a forbidden fused instruction."""
    broken = TranslationUnit("raw", "lw_broken", 'extern "C" __global__ void lw_broken(float* x) { x[0] = ; }',
                             raw_unit("Q8_0").options, False)
    with pytest.raises(AssertionError, match="nvcc failed on lw_broken"):
        compile_unit(broken, tmp_path / "broken")
    madd = 'extern "C" __global__ void lw_madd(float* x) { x[0] = x[1] * x[2] + x[3]; }'
    contracted = compile_unit(TranslationUnit("raw", "lw_madd", madd, ("--std=c++17",), False), tmp_path / "fma")
    assert any(i.startswith("fma.") for i in forbidden_instructions(contracted["90"]))
    kept = compile_unit(TranslationUnit("raw", "lw_madd", madd, raw_unit("Q8_0").options, False), tmp_path / "nofma")
    assert forbidden_instructions(kept["90"]) == []


@pytest.mark.skipif(CUPY_INCLUDE is None, reason="CuPy is not installed")
@pytest.mark.parametrize("index_32_bits", [True, False])
@pytest.mark.parametrize("chain", [((DType.bfloat16, DType.float32),),
                                   ((DType.float32, DType.float8_e5m2),),
                                   ((DType.float8_e4m3fn, DType.float32), (DType.float32, DType.float16))],
                         ids=["bf16-f32", "f32-e5m2", "e4m3-f32-f16"])
def test_elementwise_unit_is_what_cupy_renders(chain, index_32_bits):
    """Our rendering equals CuPy's own (`cupy._core._kernel._get_elementwise_kernel_code`, a private helper:
    the test skips, naming the version, if a CuPy release drops it)."""
    import cupy
    import numpy as np

    try:
        from cupy._core import _carray
        from cupy._core import _kernel as k
        render, arg_info, type_map = k._get_elementwise_kernel_code, k._ArgInfo, k._TypeMap
    except (ImportError, AttributeError) as e:
        pytest.skip(f"CuPy {cupy.__version__} has no private elementwise renderer ({e})")
    in_params, out_params, operation, name, preamble = cast_kernel_parts(chain)
    params = (k._get_param_info(in_params, True) + k._get_param_info(out_params, False)
              + k._get_param_info("CIndexer _ind", False))
    ndarray_kind, indexer_kind = 1, 2  # cupy/_core/_kernel.pxd: ARG_KIND_NDARRAY = 1, ARG_KIND_INDEXER
    infos = (arg_info(ndarray_kind, cupy.ndarray, np.dtype(in_params.split()[0]).type, 1, True, index_32_bits),
             arg_info(ndarray_kind, cupy.ndarray, np.dtype(out_params.split()[0]).type, 1, True, index_32_bits),
             arg_info(indexer_kind, _carray.Indexer, None, 1, True, index_32_bits))
    theirs = "".join(f"#include <{h}>\n" for h in CUPY_PREPENDED_HEADERS) + render(
        infos, type_map(()), params, operation, name, preamble)
    assert elementwise_unit(chain, index_32_bits).source == theirs
