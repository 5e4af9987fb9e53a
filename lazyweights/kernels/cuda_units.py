"""The exact CUDA translation units CuPy builds for every kernel the GPU path can launch.

Why this exists: there is no GPU on the development machines or in CI, so the device code would otherwise
meet a CUDA compiler for the first time on a user's GPU. nvcc is on every machine here; the tests
(`tests/kernels/test_cuda_compile.py`) hand each unit below to nvcc for sm_80 and sm_90, with the NVRTC
options lazyweights passes at run time, so a kernel that does not compile, or that the compiler would
contract into fused multiply-adds, fails the suite on a CPU-only machine.

A unit is written out the way CuPy itself writes it before calling NVRTC (CuPy 13/14,
`cupy/_core/_kernel.pyx` and `cupy/_core/_compile_with_cache.pyx`):

- a `RawKernel(code, name, options)` compiles `code` as it is (no CuPy headers), with CuPy adding
  `--std=c++17` (CuPy 14; 13 used c++14) and its include paths to `options`;
- an `ElementwiseKernel` is rendered into CuPy's loop template, with its four headers (`cupy/complex.cuh`,
  `cupy/carray.cuh`, `cupy/atomics.cuh`, `cupy/math_constants.h`) prepended and each array parameter a
  `CArray<T, ndim, c_contiguous, index_32_bits>`. The GPU executor always passes flat contiguous arrays,
  so ndim is 1 and c_contiguous is 1; `index_32_bits` follows the array's size, so both variants are
  rendered (a mixed call combines template instances both variants already compile).

When CuPy is installed, the tests also check that `elementwise_unit` renders character for character what
CuPy's own renderer produces for the same kernel, so a CuPy release that changes its template shows up here.

Example:
    >>> from lazyweights.core.dtype import DType
    >>> unit = elementwise_unit(((DType.bfloat16, DType.float32),))
    >>> unit.name, unit.needs_cupy_headers
    ('lw_cast_bf16_f32', True)
    >>> print(unit.source.splitlines()[1])
    #include <cupy/carray.cuh>
    >>> raw = raw_unit("Q4_K")
    >>> raw.name, raw.needs_cupy_headers, raw.options[-1]
    ('lw_dequant_q4_k', False, '--std=c++17')
"""
from __future__ import annotations

import string
from dataclasses import dataclass

from ..core.dtype import DType
from .cuda_casts import DEVICE_CASTS, NVRTC_OPTIONS, cast_kernel_parts
from .cuda_dequant import DEVICE_DEQUANT, kernel_source

__all__ = ["TranslationUnit", "raw_unit", "elementwise_unit", "launchable_units", "dequant_chains",
           "CUPY_PREPENDED_HEADERS", "CUPY_DEFAULT_STD"]

#: The headers CuPy prepends to every ElementwiseKernel (`compile_with_cache(prepend_cupy_headers=True)`).
CUPY_PREPENDED_HEADERS = ("cupy/complex.cuh", "cupy/carray.cuh", "cupy/atomics.cuh", "cupy/math_constants.h")

#: The language standard CuPy adds to the options of every kernel that names none.
CUPY_DEFAULT_STD = "--std=c++17"

# CuPy's ElementwiseKernel template, as `_get_simple_elementwise_kernel_code` spells it (whitespace
# included: the test compares our rendering with CuPy's character for character).
_ELEMENTWISE_TEMPLATE = string.Template('''
    ${typedef_preamble}
    ${preamble}
    extern "C" __global__ void ${name}(${params}) {
      ${loop_prep};
      #pragma unroll 1
      CUPY_FOR(i, _ind.size()) {
        _ind.set(i);
        ${operation};
      }
      ${after_loop};
    }
    ''')

# numpy dtype name -> the C type CuPy's `get_typename` gives it (only the ones the cast kernels use).
_CUPY_C_TYPE = {"uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int"}


@dataclass(frozen=True)
class TranslationUnit:
    """One CUDA source file as NVRTC would receive it.

    kind: "raw" (a CuPy RawKernel) or "elementwise" (a CuPy ElementwiseKernel);
    name: the `extern "C"` kernel the unit defines;
    source: the full text handed to the compiler;
    options: the compiler options lazyweights and CuPy pass (include paths excluded: they depend on where
        CuPy and CUDA are installed);
    needs_cupy_headers: whether the source includes CuPy's own headers (`cupy/carray.cuh` and friends).
    """

    kind: str
    name: str
    source: str
    options: tuple[str, ...]
    needs_cupy_headers: bool


def _options() -> tuple[str, ...]:
    return tuple(NVRTC_OPTIONS) + (CUPY_DEFAULT_STD,)


def raw_unit(encoding, chain=()) -> TranslationUnit:
    """The RawKernel unit for dequantizing `encoding` followed by the device cast `chain`.

    Example:
        >>> from lazyweights.core.dtype import DType
        >>> u = raw_unit("Q8_0", ((DType.float32, DType.float16),))
        >>> u.name, 'extern "C" __global__ void lw_dequant_q8_0_f16' in u.source
        ('lw_dequant_q8_0_f16', True)
    """
    source, name = kernel_source(encoding, tuple(chain))
    return TranslationUnit("raw", name, source, _options(), False)


def elementwise_unit(chain, index_32_bits: bool = True) -> TranslationUnit:
    """The ElementwiseKernel unit `cast_kernel(chain)` compiles when called on flat contiguous arrays whose
    sizes give `index_32_bits` (CuPy's `CArray`/`CIndexer` template flag).

    Example:
        >>> from lazyweights.core.dtype import DType
        >>> u = elementwise_unit(((DType.float32, DType.float8_e4m3fn),), index_32_bits=False)
        >>> "CArray<unsigned int, 1, 1, 0> _raw_x" in u.source and "CIndexer<1, 0> _ind" in u.source
        True
    """
    in_param, out_param, operation, name, preamble = cast_kernel_parts(tuple(chain))
    flag = int(bool(index_32_bits))
    (in_type, in_name), (out_type, out_name) = in_param.split(), out_param.split()
    in_c, out_c = _CUPY_C_TYPE[in_type], _CUPY_C_TYPE[out_type]
    params = (f"const CArray<{in_c}, 1, 1, {flag}> _raw_{in_name}, CArray<{out_c}, 1, 1, {flag}> _raw_{out_name}, "
              f"CIndexer<1, {flag}> _ind")
    # `_get_elementwise_kernel_code`: one reference per non-raw array, then the body.
    body = "\n".join([f"const {in_c} &{in_name} = _raw_{in_name}[_ind.get()];",
                      f"{out_c} &{out_name} = _raw_{out_name}[_ind.get()];", operation])
    code = _ELEMENTWISE_TEMPLATE.substitute(typedef_preamble="", preamble=preamble, name=name, params=params,
                                            operation=body, loop_prep="", after_loop="")
    header = "".join(f"#include <{h}>\n" for h in CUPY_PREPENDED_HEADERS)
    return TranslationUnit("elementwise", name, header + code, _options(), True)


def dequant_chains() -> list[tuple]:
    """The cast chains the GPU path fuses after a device dequantize: none (float32 out), or one device cast
    from float32 (`compiler/gpu.split_chain` asks for exactly these for `dequantize(..., dtype)`)."""
    f32 = DType.float32
    return [()] + [((f32, dst),) for dst in sorted({b for a, b in DEVICE_CASTS if a is f32}, key=lambda d: d.name)]


def launchable_units() -> list[TranslationUnit]:
    """Every unit the GPU path can compile: each device dequantizer with each chain in `dequant_chains()`,
    and each device cast pair as an ElementwiseKernel in both index widths.

    Longer cast chains reuse the same device functions, nested; `tests/kernels/test_cuda_compile.py` also
    compiles one two-step chain per pair.

    Example:
        >>> units = launchable_units()
        >>> len({u.name for u in units if u.kind == "raw"}), len([u for u in units if u.kind == "elementwise"])
        (50, 40)
    """
    units = [raw_unit(enc, chain) for enc in sorted(DEVICE_DEQUANT, key=lambda e: e.name)
             for chain in dequant_chains()]
    pairs = sorted(DEVICE_CASTS, key=lambda p: (p[0].name, p[1].name))
    units += [elementwise_unit((pair,), flag) for pair in pairs for flag in (True, False)]
    return units

