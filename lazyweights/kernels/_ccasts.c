/*
 * lazyweights.kernels._ccasts: the cast kernels and the GGUF dequantizers, compiled when lazyweights is installed.
 *
 * Why C, built at install: these kernels are most of a conversion's work, and they must start at once. A C
 * extension loads in about a millisecond (the numba build lazyweights had before cost a fresh process about
 * 0.85 s, more than serving a 2.2 GB checkpoint takes), vectorizes with per-CPU clones, and can guard its
 * reads against SIGBUS. setup.py requires it; `casts.py` uses numpy's own casts only when
 * LAZYWEIGHTS_CAST_KERNELS=numpy switches these off.
 *
 * The contract: every result, NaN payloads included, equals numpy/ml_dtypes `astype`. `casts.py` checks each
 * kernel against astype on first use, and tests/kernels/test_casts.py checks every 16-bit and 8-bit source
 * pattern and about three million float32 patterns against it.
 *
 * Every kernel has the signature:
 *     kernel(src, out, rows, cols, first, stride, *extra)
 * converting `rows` rows of `cols` elements, row r of the 1-D contiguous buffer `src` starting at element
 * ``first + r * stride`` (stride may be negative or larger than cols), densely into the 1-D contiguous
 * buffer `out`. `rows` may instead be an int64 row index: a 1-D array `index`
 * (a gather: output row i is source row index[i], starting at element ``first + index[i] * stride``), or
 * a (2, n) array of pairs (output row pairs[1][k] is source row pairs[0][k]). That is how a row
 * permutation (RoPE's q/k rows) is cast in one pass, straight from the memory map, with no gathered copy
 * in between (`casts.gather_cast_into`). The pairs let the caller visit the source rows in ascending
 * order: measured on 64 MB of bf16 -> f16 with RoPE's stride-2 rows, reading rows in permuted order cost
 * 20% more than a plain cast (the hardware prefetchers lose the stream at each 4 KB row; software
 * prefetching the next rows won back half of it), while reading them in order and writing them to their
 * permuted places cost nothing measurable. Every index range is checked against the buffers first (ValueError; IndexError for a negative or out-of-range row
 * index), never a stray read or write. The GIL is released while converting. A source page that
 * cannot be read (a memory-mapped file truncated mid-read) raises OSError(EFAULT) instead of killing the
 * process with SIGBUS (the guard below).
 *
 * Arithmetic is on float32 bit patterns held in uint32_t; helpers are branch-free selects so the compiler
 * vectorizes the loops. The two float operations (the subnormal tricks) need IEEE single precision with
 * round-to-nearest and no flush-to-zero: never build this file with -ffast-math.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_guard_api.h"
#if defined(__unix__) || defined(__APPLE__)
#include <setjmp.h>
#include <signal.h>
#define LW_GUARD 1
#endif

/* On x86-64 GCC, build each loop for AVX-512 (x86-64-v4) and AVX2 as well as the baseline (SSE2) and pick
 * at load time: a wheel built here must run on any x86-64, and on the development machine (AMD EPYC with
 * AVX-512) bf16 -> f16 ran at 4 GB/s unvectorized, 14.6 GB/s with SSE2 lanes and 34 GB/s with the v4
 * clone, the speed of LLVM's host-tuned code for the same loops. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) && __GNUC__ >= 11
#define LW_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define LW_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define LW_CLONES
#endif

static inline uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* float16 bits -> float32 bits; exact. `quiet_bit` (0 or 0x400000) is ORed into NaNs. */
static inline uint32_t widen_f16(uint32_t h, uint32_t quiet_bit) {
    uint32_t m = h & 0x3FFu, e = h & 0x7C00u;
    uint32_t normal = ((h & 0x7FFFu) << 13) + (112u << 23);
    /* m * 2**-24 is exact and a normal float32, so the FPU does the renormalization. */
    uint32_t subnormal = bits_of((float)(int32_t)m * 0x1p-24f);
    uint32_t special = 0x7F800000u | (m << 13) | (m != 0 ? quiet_bit : 0u);
    uint32_t r = e == 0 ? subnormal : normal;
    r = e == 0x7C00u ? special : r;
    return r | ((h & 0x8000u) << 16);
}

/* float32 bits -> bits of a narrower IEEE-like format (float16, fp8), round-to-nearest-even. Every format
 * parameter is a compile-time constant at each call site (runtime parameters in the loop cost up to 3x).
 * Magnitude codes above `max_code` become `ovf_code`. A NaN becomes
 * `nan_base | (payload >> (23 - mant_bits)) & nan_payload_mask`, then `| nan_zero_fix` if that is still
 * `nan_base` (how numpy keeps a float16 NaN from turning into infinity). */
static inline uint32_t narrow(uint32_t x, uint32_t mant_bits, uint32_t bias, uint32_t max_code,
                              uint32_t ovf_code, uint32_t sign_shift, uint32_t nan_base,
                              uint32_t nan_payload_mask, uint32_t nan_zero_fix) {
    uint32_t a = x & 0x7FFFFFFFu;
    uint32_t shift = 23u - mant_bits;
    uint32_t lsb = (a >> shift) & 1u;
    uint32_t t = a - ((127u - bias) << 23);
    t = t + ((1u << (shift - 1u)) - 1u);
    uint32_t normal = (t + lsb) >> shift;
    /* Below the smallest normal, adding a "magic" power of two whose ulp is the target's subnormal step
     * makes the FPU's own round-to-nearest-even round the subnormal (the classic float_to_half trick).
     * Immune to FTZ/DAZ: the sum is a normal number, and inputs DAZ would zero round to zero anyway. It
     * relies on the default round-to-nearest mode, which nothing in a numpy process changes. */
    uint32_t magic = ((127u - bias) + shift + 1u) << 23;
    uint32_t subnormal = bits_of(float_of(a) + float_of(magic)) - magic;
    uint32_t r = a >= ((128u - bias) << 23) ? normal : subnormal;
    r = r > max_code ? ovf_code : r;
    uint32_t nan = nan_base | ((a >> shift) & nan_payload_mask);
    nan = nan | (nan == nan_base ? nan_zero_fix : 0u);
    r = a > 0x7F800000u ? nan : r;
    uint32_t sign_bit = 1u << (31u - sign_shift);
    return r | ((x >> sign_shift) & sign_bit);
}

/* float32 bits -> bfloat16 bits, round-to-nearest-even, NaN -> ml_dtypes' canonical 0x7fc0 | sign. */
static inline uint32_t narrow_bf16(uint32_t x) {
    uint32_t r = ((x + 0x7FFFu) + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = ((x >> 16) & 0x8000u) | 0x7FC0u;
    return (x & 0x7FFFFFFFu) > 0x7F800000u ? nan : r;
}

#define NARROW_F16(x, nb, nm, nf) narrow((x), 10u, 15u, 0x7BFFu, 0x7C00u, 16u, (nb), (nm), (nf))
/* float8_e4m3fn has no infinity: overflow (and inf) become NaN 0x7f, never saturate to 448. */
#define NARROW_E4M3(x) narrow((x), 3u, 7u, 0x7Eu, 0x7Fu, 24u, 0x7Fu, 0u, 0u)
/* float8_e5m2 overflows to inf 0x7c; ml_dtypes' NaN is 0x7e. */
#define NARROW_E5M2(x) narrow((x), 2u, 15u, 0x7Bu, 0x7Cu, 24u, 0x7Eu, 0u, 0u)

/* float16 bits -> bfloat16 bits directly (35% faster than via float32; see k_f16_to_bf16). */
static inline uint32_t f16_to_bf16(uint32_t h) {
    uint32_t a = h & 0x7FFFu;
    uint32_t biased = a + (112u << 10);
    uint32_t normal = ((biased + 3u) + ((biased >> 3) & 1u)) >> 3;
    uint32_t subnormal = narrow_bf16(bits_of((float)(int32_t)a * 0x1p-24f)); /* a < 0x400: exact */
    uint32_t v = a < 0x400u ? subnormal : normal;
    v = a == 0x7C00u ? 0x7F80u : v;
    v = a > 0x7C00u ? 0x7FC0u : v; /* ml_dtypes' canonical NaN */
    return v | (h & 0x8000u);
}

/* Extra arguments some kernels take (the NaN modes numpy's build decides, a lookup table), and the row
 * indexes of a gather (`index`: source row of step r, NULL: row r; `out_index`: output row of step r,
 * NULL: row r). Never NULL for the cast loops. */
typedef struct {
    uint32_t nan_base, nan_mask, nan_fix;
    const void *table;
    const int64_t *index, *out_index;
} Extra;

typedef void (*LoopFn)(const void *src, void *out, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t first,
                       Py_ssize_t stride, const Extra *extra);

/* One loop per kernel: rows of a strided source into a dense output. `EXPR` maps `v` (the source
 * element widened to uint32_t) to the output element. */
#define DEFINE_LOOP(NAME, IN_T, OUT_T, EXPR)                                                          \
    LW_CLONES static void NAME(const void *src_, void *out_, Py_ssize_t rows, Py_ssize_t cols,        \
                               Py_ssize_t first, Py_ssize_t stride, const Extra *extra) {             \
        const IN_T *src = (const IN_T *)src_;                                                         \
        OUT_T *out = (OUT_T *)out_;                                                                   \
        /* hoisted: a uint8 `out` may alias anything */                                              \
        const int64_t *index = extra->index, *out_index = extra->out_index;                          \
        for (Py_ssize_t r = 0; r < rows; r++) {                                                       \
            const Py_ssize_t row = index != NULL ? (Py_ssize_t)index[r] : r;                          \
            const Py_ssize_t out_row = out_index != NULL ? (Py_ssize_t)out_index[r] : r;              \
            const IN_T *restrict s = src + first + row * stride;                                      \
            OUT_T *restrict o = out + out_row * cols;                                                 \
            for (Py_ssize_t c = 0; c < cols; c++) {                                                   \
                uint32_t v = s[c];                                                                    \
                o[c] = (OUT_T)(EXPR);                                                                 \
            }                                                                                         \
        }                                                                                             \
    }

DEFINE_LOOP(loop_bf16_to_f32, uint16_t, uint32_t, v << 16)
DEFINE_LOOP(loop_f16_to_f32_keep, uint16_t, uint32_t, widen_f16(v, 0u))
DEFINE_LOOP(loop_f16_to_f32_quiet, uint16_t, uint32_t, widen_f16(v, 0x400000u))
DEFINE_LOOP(loop_f32_to_bf16, uint32_t, uint16_t, narrow_bf16(v))
DEFINE_LOOP(loop_f16_to_bf16, uint16_t, uint16_t, f16_to_bf16(v))
DEFINE_LOOP(loop_f32_to_f16, uint32_t, uint16_t,
            NARROW_F16(v, extra->nan_base, extra->nan_mask, extra->nan_fix))
DEFINE_LOOP(loop_bf16_to_f16, uint16_t, uint16_t, NARROW_F16(v << 16, 0x7E00u, 0u, 0u))
DEFINE_LOOP(loop_f32_to_e4m3, uint32_t, uint8_t, NARROW_E4M3(v))
DEFINE_LOOP(loop_f32_to_e5m2, uint32_t, uint8_t, NARROW_E5M2(v))
DEFINE_LOOP(loop_bf16_to_e4m3, uint16_t, uint8_t, NARROW_E4M3(v << 16))
DEFINE_LOOP(loop_bf16_to_e5m2, uint16_t, uint8_t, NARROW_E5M2(v << 16))
DEFINE_LOOP(loop_f16_to_e4m3, uint16_t, uint8_t, NARROW_E4M3(widen_f16(v, 0u)))
DEFINE_LOOP(loop_f16_to_e5m2, uint16_t, uint8_t, NARROW_E5M2(widen_f16(v, 0u)))
DEFINE_LOOP(loop_lut_u8, uint8_t, uint8_t, ((const uint8_t *)extra->table)[v])
DEFINE_LOOP(loop_lut_u16, uint8_t, uint16_t, ((const uint16_t *)extra->table)[v])
DEFINE_LOOP(loop_lut_u32, uint8_t, uint32_t, ((const uint32_t *)extra->table)[v])
DEFINE_LOOP(loop_lut_u64, uint8_t, uint64_t, ((const uint64_t *)extra->table)[v])

/* bfloat16 -> float16 with the F16C conversion instruction, where the CPU has it (with AVX2).
 *
 * Why: on an AVX2 machine without AVX-512 (the development VM since it moved hosts) the portable loop
 * above runs at about 10 GB/s read+write on one core: some 25 vector operations per 8 elements make it
 * compute-bound, well under the 17-30 GB/s a copy gets, and bf16 -> f16 is nearly every byte of a
 * serving conversion. vcvtps2ph does the float32 -> float16 rounding in one instruction: IEEE
 * round-to-nearest-even with the rounding mode in the instruction, subnormal results kept (MXCSR's
 * flush-to-zero does not apply to it; a float32 subnormal input rounds to a signed zero either way).
 * Only NaNs differ from ml_dtypes (the instruction quiets them and keeps payload bits), so NaN lanes are
 * replaced by ml_dtypes' canonical 0x7e00 | sign, as the portable loop computes them. The first-use
 * self-check in casts.py compares every one of the 65536 inputs against ml_dtypes. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define LW_F16C 1
__attribute__((target("avx2,f16c"))) static inline __m128i bf16x8_to_f16(__m128i h) {
    const __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    const __m128i r = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i is_nan = _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7FFF)), _mm_set1_epi16(0x7F80));
    const __m128i nan = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16((short)0x8000)), _mm_set1_epi16(0x7E00));
    return _mm_blendv_epi8(r, nan, is_nan);
}

/* A row loop (index, out_index and stride as in DEFINE_LOOP) around CONVERT, a vector conversion of WIDTH
 * elements in a VEC, two vectors a step; the columns past the last whole step take the portable narrowing. */
#define DEFINE_BF16_TO_F16_VECTOR_LOOP(NAME, TARGET, VEC, WIDTH, LOAD, STORE, CONVERT)                            \
    __attribute__((target(TARGET))) static void NAME(const void *src_, void *out_, Py_ssize_t rows,            \
                                                     Py_ssize_t cols, Py_ssize_t first, Py_ssize_t stride,    \
                                                     const Extra *extra) {                                    \
        const uint16_t *src = (const uint16_t *)src_;                                                        \
        uint16_t *out = (uint16_t *)out_;                                                                    \
        const int64_t *index = extra->index, *out_index = extra->out_index;                                  \
        for (Py_ssize_t r = 0; r < rows; r++) {                                                              \
            const Py_ssize_t row = index != NULL ? (Py_ssize_t)index[r] : r;                                 \
            const Py_ssize_t out_row = out_index != NULL ? (Py_ssize_t)out_index[r] : r;                     \
            const uint16_t *s = src + first + row * stride;                                                  \
            uint16_t *o = out + out_row * cols;                                                              \
            Py_ssize_t c = 0;                                                                                \
            for (; c + 2 * (WIDTH) <= cols; c += 2 * (WIDTH)) {                                              \
                const VEC a = LOAD((const VEC *)(s + c));                                                    \
                const VEC b = LOAD((const VEC *)(s + c + (WIDTH)));                                          \
                STORE((VEC *)(o + c), CONVERT(a));                                                           \
                STORE((VEC *)(o + c + (WIDTH)), CONVERT(b));                                                 \
            }                                                                                                \
            for (; c < cols; c++) {                                                                          \
                const uint32_t v = s[c];                                                                     \
                o[c] = (uint16_t)NARROW_F16(v << 16, 0x7E00u, 0u, 0u);                                       \
            }                                                                                                \
        }                                                                                                    \
    }

DEFINE_BF16_TO_F16_VECTOR_LOOP(loop_bf16_to_f16_f16c, "avx2,f16c", __m128i, 8, _mm_loadu_si128, _mm_storeu_si128,
                               bf16x8_to_f16)

/* The same with AVX-512 (F, BW and VL), where the CPU has it: 16 elements per conversion instruction and the
 * NaN lanes chosen by a mask register, a third of the F16C loop's instructions per element. Why: on the
 * AVX-512 VMs (Intel Xeon) the F16C loop cast at 13.3 GB/s read+write into warm memory against memcpy's
 * 17.8 GB/s, and bf16 -> f16 is nearly every byte of W1 (benchmarks/RESULTS.md, issue 35). Same rounding,
 * same NaN rule, checked the same way. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m256i bf16x16_to_f16(__m256i h) {
    const __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    const __m256i r = _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 is_nan =
        _mm256_cmpgt_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)), _mm256_set1_epi16(0x7F80));
    const __m256i nan =
        _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16((short)0x8000)), _mm256_set1_epi16(0x7E00));
    return _mm256_mask_blend_epi16(is_nan, r, nan);
}

DEFINE_BF16_TO_F16_VECTOR_LOOP(loop_bf16_to_f16_avx512, "avx512f,avx512bw,avx512vl", __m256i, 16, _mm256_loadu_si256,
                               _mm256_storeu_si256, bf16x16_to_f16)
#endif

/* The bf16 -> f16 loop for this CPU: AVX-512's where it has AVX-512 F, BW and VL; F16C's where it has AVX2
 * and F16C; the portable one elsewhere. LAZYWEIGHTS_CAST_LOOPS=portable or =f16c caps the choice (tests run
 * each loop the CPU has). */
static LoopFn bf16_to_f16_loop = loop_bf16_to_f16;
static const char *bf16_to_f16_name = "portable";

static void pick_loops(void) {
#ifdef LW_F16C
    const char *forced = getenv("LAZYWEIGHTS_CAST_LOOPS");
    const int portable = forced != NULL && strcmp(forced, "portable") == 0;
    const int f16c_only = forced != NULL && strcmp(forced, "f16c") == 0;
    __builtin_cpu_init();
    if (portable || !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))) {
        return;
    }
    bf16_to_f16_loop = loop_bf16_to_f16_f16c;
    bf16_to_f16_name = "f16c";
    if (!f16c_only && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl")) {
        bf16_to_f16_loop = loop_bf16_to_f16_avx512;
        bf16_to_f16_name = "avx512";
    }
#endif
}

/* ---------------------------------------------------------------------------------------------------
 * The SIGBUS guard.
 *
 * Why: sources are memory maps. The executor checks a file's size and identity before each block, but a
 * file truncated after that check (`cp` over a checkpoint being loaded) turns the next read of a page past
 * the new end into SIGBUS, and SIGBUS kills the process. Every kernel call runs under a per-thread guard
 * instead: the handler jumps back out of the loop, and the call raises OSError(EFAULT), the error the
 * kernel itself gives a read() or write() over such a page, which the executor turns into
 * SourceChangedError naming the tensor and the file. The output block is then partly written; the
 * executor discards the whole result.
 *
 * A SIGBUS anywhere else is none of our business, and gets what it would have got without this module:
 * the handler we displaced runs (faulthandler prints its traceback), then the default action ends the
 * process. The handler is (re)installed before each kernel call, while holding the GIL, because
 * faulthandler.enable() (pytest does it) may have replaced it since the last call.
 */
#ifdef LW_GUARD
static _Thread_local sigjmp_buf *volatile guard_jump = NULL;
static struct sigaction displaced;

static void on_sigbus(int sig, siginfo_t *info, void *context) {
    sigjmp_buf *jump = guard_jump;
    if (jump != NULL) {
        guard_jump = NULL;
        siglongjmp(*jump, 1); /* restores the signal mask saved by sigsetjmp(.., 1): SIGBUS unblocked */
    }
    /* Not inside a kernel. The default action first, so that whatever happens next ends the process (a
     * displaced handler that returns, or re-installs us, cannot loop), then the displaced handler. Returning
     * re-runs the faulting access, which now meets the default action. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    if (displaced.sa_flags & SA_SIGINFO) {
        if (displaced.sa_sigaction != NULL)
            displaced.sa_sigaction(sig, info, context);
    } else if (displaced.sa_handler != SIG_DFL && displaced.sa_handler != SIG_IGN) {
        displaced.sa_handler(sig);
    }
}

/* Install on_sigbus unless it is the current handler. Called with the GIL held. */
static int ensure_guard_handler(void) {
    struct sigaction current, mine;
    if (sigaction(SIGBUS, NULL, &current) != 0)
        return -1;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus)
        return 0;
    memset(&mine, 0, sizeof mine);
    mine.sa_sigaction = on_sigbus;
    mine.sa_flags = SA_SIGINFO;
    sigemptyset(&mine.sa_mask);
    displaced = current;
    return sigaction(SIGBUS, &mine, NULL);
}

/* Run one loop under the guard: 0 when it finished, -1 when a read raised SIGBUS. */
static int run_guarded(LoopFn loop, const void *src, void *out, Py_ssize_t rows, Py_ssize_t cols,
                       Py_ssize_t first, Py_ssize_t stride, const Extra *extra) {
    sigjmp_buf jump;
    if (sigsetjmp(jump, 1) != 0)
        return -1; /* guard_jump was cleared by the handler */
    guard_jump = &jump;
    loop(src, out, rows, cols, first, stride, extra);
    guard_jump = NULL;
    return 0;
}

/* The same for any call (the quantizers of `_cquant`, through the capsule below). */
static int run_guarded_call(void (*call)(void *), void *context) {
    sigjmp_buf jump;
    if (sigsetjmp(jump, 1) != 0)
        return -1;
    guard_jump = &jump;
    call(context);
    guard_jump = NULL;
    return 0;
}
#else
static int ensure_guard_handler(void) { return 0; }
static int run_guarded(LoopFn loop, const void *src, void *out, Py_ssize_t rows, Py_ssize_t cols,
                       Py_ssize_t first, Py_ssize_t stride, const Extra *extra) {
    loop(src, out, rows, cols, first, stride, extra);
    return 0;
}
static int run_guarded_call(void (*call)(void *), void *context) {
    call(context);
    return 0;
}
#endif

/* The guard for the package's other extensions (`_cquant`, `_clora`), as the capsule `_guard_api`
 * (see _guard_api.h). */
static const GuardApi guard_api = {1, ensure_guard_handler, run_guarded_call};

/* ---------------------------------------------------------------------------------------------------
 * The Python side: argument checking shared by every kernel. */

static int get_index(PyObject *obj, const char *what, Py_ssize_t *value) {
    *value = PyNumber_AsSsize_t(obj, PyExc_OverflowError);
    if (*value == -1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "_ccasts: %s must be an integer that fits in a Py_ssize_t", what);
        return -1;
    }
    return 0;
}

static int get_u32(PyObject *obj, const char *what, uint32_t *value) {
    unsigned long v = PyLong_AsUnsignedLong(obj);
    if (PyErr_Occurred() || v > 0xFFFFFFFFul) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "_ccasts: %s must be an integer in [0, 2**32)", what);
        return -1;
    }
    *value = (uint32_t)v;
    return 0;
}

/* args[0] as a readable buffer and args[1] as a writable one; -1 (both released) on failure. */
static int get_buffers(PyObject *const *args, Py_buffer *src, Py_buffer *out) {
    if (PyObject_GetBuffer(args[0], src, PyBUF_SIMPLE) < 0)
        return -1;
    if (PyObject_GetBuffer(args[1], out, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(src);
        return -1;
    }
    return 0;
}

/* Run a checked loop (when there is anything to do) with the GIL released and under the SIGBUS guard, then
 * release both buffers. A source page that could not be read becomes OSError(EFAULT). */
static PyObject *run_released(LoopFn loop, Py_buffer *src, Py_buffer *out, int any, Py_ssize_t rows,
                              Py_ssize_t cols, Py_ssize_t first, Py_ssize_t stride, const Extra *extra) {
    int faulted = 0, failed = 0;
    if (any) {
        if (ensure_guard_handler() != 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            failed = 1;
        } else {
            Py_BEGIN_ALLOW_THREADS
            faulted = run_guarded(loop, src->buf, out->buf, rows, cols, first, stride, extra);
            Py_END_ALLOW_THREADS
        }
    }
    PyBuffer_Release(src);
    PyBuffer_Release(out);
    if (failed)
        return NULL;
    if (faulted) {
        lw_raise_sigbus("the source");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* `obj` as the `rows` argument: a count (0 returned), or a C-contiguous int64 array of row numbers, 1-D
 * (1 returned) or (2, n) pairs (2 returned); then `index` is acquired (release it) and `rows` is n. -1
 * with an exception set on failure. A numpy integer scalar offers a 0-d buffer and counts as a count. */
static int get_rows(PyObject *obj, Py_buffer *index, Py_ssize_t *rows) {
    if (!PyLong_Check(obj) && PyObject_CheckBuffer(obj)) {
        if (PyObject_GetBuffer(obj, index, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
            return -1;
        if (index->ndim == 1 || (index->ndim == 2 && index->shape[0] == 2)) {
            const char *f = index->format ? index->format : "B";
            if (*f == '@' || *f == '=' || *f == '<')
                f++;
            if (index->itemsize != 8 || !((f[0] == 'l' || f[0] == 'q') && f[1] == '\0')) {
                PyErr_Format(PyExc_TypeError, "_ccasts: a row index must be an int64 array, 1-D or (2, n) "
                             "(got format '%s', %zd-byte items)", index->format ? index->format : "B",
                             index->itemsize);
                PyBuffer_Release(index);
                return -1;
            }
            *rows = index->shape[index->ndim - 1];
            return index->ndim;
        }
        PyBuffer_Release(index);
    }
    return get_index(obj, "rows", rows) ? -1 : 0;
}

/* The row numbers k >= 0 whose row of `cols` elements, starting at element ``first + k * stride``, lies
 * inside a source of `n_src` elements: lo..hi inclusive (lo > hi when there is none). Needs
 * 0 <= first <= n_src and 0 <= cols <= n_src; nothing here can overflow. */
static void row_bounds(Py_ssize_t n_src, Py_ssize_t cols, Py_ssize_t first, Py_ssize_t stride,
                       Py_ssize_t *lo, Py_ssize_t *hi) {
    const Py_ssize_t last_start = n_src - cols; /* a row fits iff 0 <= its start <= last_start */
    *lo = 0;
    *hi = -1;
    if (stride > 0) {
        if (first <= last_start)
            *hi = (last_start - first) / stride;
    } else if (stride == 0) {
        if (first <= last_start)
            *hi = PY_SSIZE_T_MAX;
    } else {
        const Py_ssize_t step = -stride; /* starts decrease: too high first, then inside, then below 0 */
        *lo = first > last_start ? (first - last_start - 1) / step + 1 : 0;
        *hi = first / step;
    }
}

/* The first entry of `ix[0..n)` outside lo..hi, or -1. */
static Py_ssize_t first_outside(const int64_t *ix, Py_ssize_t n, Py_ssize_t lo, Py_ssize_t hi) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (ix[i] < (int64_t)lo || ix[i] > (int64_t)hi)
            return i;
    return -1;
}

/* Run `loop` after checking that every element it will read lies inside `src` and every element it will
 * write inside `out`, and that both are aligned for their element types. `rows` (args[2]) is a count or
 * an int64 row index (see the top of this file); every index entry is checked, with the GIL held. */
static PyObject *run_loop(const char *name, LoopFn loop, Py_ssize_t in_size, Py_ssize_t out_size,
                          PyObject *const *args, Py_ssize_t nargs, const Extra *extra_in) {
    Py_buffer src, out, index;
    Py_ssize_t rows, cols, first, stride;
    Extra extra = {0, 0, 0, NULL, NULL, NULL};
    if (extra_in != NULL)
        extra = *extra_in;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "%s() takes src, out, rows, cols, first, stride", name);
        return NULL;
    }
    if (get_index(args[3], "cols", &cols) || get_index(args[4], "first", &first) ||
        get_index(args[5], "stride", &stride))
        return NULL;
    const int gather = get_rows(args[2], &index, &rows); /* 0: a count; 1: an index; 2: pairs */
    if (gather < 0)
        return NULL;
    if (get_buffers(args, &src, &out) < 0) {
        if (gather)
            PyBuffer_Release(&index);
        return NULL;
    }
    const char *problem = NULL;
    const int64_t *src_ix = gather ? (const int64_t *)index.buf : NULL;
    const int64_t *out_ix = gather == 2 ? src_ix + rows : NULL;
    Py_ssize_t n_src = src.len / in_size, n_out = out.len / out_size;
    if (rows < 0 || cols < 0)
        problem = "rows and cols must not be negative";
    else if (((uintptr_t)src.buf % (uintptr_t)in_size) || ((uintptr_t)out.buf % (uintptr_t)out_size))
        problem = "a buffer is not aligned to its element size";
    else if (rows > 0 && cols > 0) {
        /* Every product is bounded by a division first, so nothing below can overflow. */
        Py_ssize_t step = stride < 0 ? -stride : stride;
        if (out_ix == NULL && rows > n_out / cols)
            problem = "the output buffer is too small";
        else if (gather) {
            Py_ssize_t lo = 0, hi = -1, bad;
            if (first >= 0 && first <= n_src && cols <= n_src)
                row_bounds(n_src, cols, first, stride, &lo, &hi);
            const char *what = "row index";
            const int64_t *ix = src_ix;
            bad = first_outside(src_ix, rows, lo, hi);
            if (bad < 0 && out_ix != NULL) {
                what = "output row index";
                ix = out_ix;
                lo = 0;
                hi = n_out / cols - 1;
                bad = first_outside(out_ix, rows, lo, hi);
            }
            if (bad >= 0) {
                PyErr_Format(PyExc_IndexError,
                             "%s: %s %lld (at position %zd of %zd) is %s: the %s holds rows %zd..%zd "
                             "(source %zd elements, output %zd elements, cols=%zd first=%zd stride=%zd)", name,
                             what, (long long)ix[bad], bad, rows, ix[bad] < 0 ? "negative" : "out of range",
                             ix == src_ix ? "source" : "output", lo, hi, n_src, n_out, cols, first, stride);
                PyBuffer_Release(&src);
                PyBuffer_Release(&out);
                PyBuffer_Release(&index);
                return NULL;
            }
        } else if (first < 0 || first > n_src || step > n_src || (step && rows - 1 > n_src / step))
            problem = "first or stride lies outside the source buffer";
        else {
            Py_ssize_t last = first + (rows - 1) * stride; /* start of the last row; |.| <= 2 * n_src */
            Py_ssize_t lo = first < last ? first : last, hi = (first > last ? first : last);
            if (lo < 0 || hi > n_src - cols)
                problem = "a row lies outside the source buffer";
        }
    }
    if (problem) {
        PyErr_Format(PyExc_ValueError,
                     "%s: %s (source %zd elements, output %zd elements, rows=%zd cols=%zd first=%zd "
                     "stride=%zd)", name, problem, n_src, n_out, rows, cols, first, stride);
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        if (gather)
            PyBuffer_Release(&index);
        return NULL;
    }
    extra.index = src_ix;
    extra.out_index = out_ix;
    PyObject *result = run_released(loop, &src, &out, rows > 0 && cols > 0, rows, cols, first, stride, &extra);
    if (gather)
        PyBuffer_Release(&index);
    return result;
}

/* Kernels without extra arguments. */
#define SIMPLE_KERNEL(PYNAME, LOOP, IN_SIZE, OUT_SIZE)                                                 \
    static PyObject *PYNAME(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {               \
        (void)self;                                                                                   \
        return run_loop(#PYNAME, LOOP, IN_SIZE, OUT_SIZE, args, nargs, NULL);                         \
    }

SIMPLE_KERNEL(k_bf16_to_f32, loop_bf16_to_f32, 2, 4)
SIMPLE_KERNEL(k_f32_to_bf16, loop_f32_to_bf16, 4, 2)
SIMPLE_KERNEL(k_f16_to_bf16, loop_f16_to_bf16, 2, 2)
SIMPLE_KERNEL(k_f32_to_e4m3, loop_f32_to_e4m3, 4, 1)
SIMPLE_KERNEL(k_f32_to_e5m2, loop_f32_to_e5m2, 4, 1)
SIMPLE_KERNEL(k_bf16_to_e4m3, loop_bf16_to_e4m3, 2, 1)
SIMPLE_KERNEL(k_bf16_to_e5m2, loop_bf16_to_e5m2, 2, 1)
SIMPLE_KERNEL(k_f16_to_e4m3, loop_f16_to_e4m3, 2, 1)
SIMPLE_KERNEL(k_f16_to_e5m2, loop_f16_to_e5m2, 2, 1)

/* k_bf16_to_f16(src, out, rows, cols, first, stride): the loop pick_loops chose for this CPU. */
static PyObject *k_bf16_to_f16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return run_loop("k_bf16_to_f16", bf16_to_f16_loop, 2, 2, args, nargs, NULL);
}

/* The bf16 -> f16 loop in use: "avx512", "f16c" or "portable" (for tests and benchmarks). */
static PyObject *bf16_to_f16_variant(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyUnicode_FromString(bf16_to_f16_name);
}

/* k_f16_to_f32(src, out, rows, cols, first, stride, quiet_nans) */
static PyObject *k_f16_to_f32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "k_f16_to_f32() takes src, out, rows, cols, first, stride, quiet_nans");
        return NULL;
    }
    int quiet = PyObject_IsTrue(args[6]);
    if (quiet < 0)
        return NULL;
    return run_loop("k_f16_to_f32", quiet ? loop_f16_to_f32_quiet : loop_f16_to_f32_keep, 2, 4, args, 6, NULL);
}

/* k_f32_to_f16(src, out, rows, cols, first, stride, nan_base, nan_mask, nan_fix) */
static PyObject *k_f32_to_f16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    Extra extra = {0, 0, 0, NULL, NULL, NULL};
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "k_f32_to_f16() takes src, out, rows, cols, first, stride, nan_base, nan_mask, nan_fix");
        return NULL;
    }
    if (get_u32(args[6], "nan_base", &extra.nan_base) || get_u32(args[7], "nan_mask", &extra.nan_mask) ||
        get_u32(args[8], "nan_fix", &extra.nan_fix))
        return NULL;
    return run_loop("k_f32_to_f16", loop_f32_to_f16, 4, 2, args, 6, &extra);
}

/* k_lut(src, out, rows, cols, first, stride, table): one-byte codes through a 256-entry table whose
 * entries (1, 2, 4 or 8 bytes) are the output elements. */
static PyObject *k_lut(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "k_lut() takes src, out, rows, cols, first, stride, table");
        return NULL;
    }
    Py_buffer table;
    if (PyObject_GetBuffer(args[6], &table, PyBUF_SIMPLE) < 0)
        return NULL;
    Extra extra = {0, 0, 0, table.buf, NULL, NULL};
    Py_ssize_t width = table.len / 256;
    LoopFn loop = NULL;
    if (table.len % 256 == 0 && (uintptr_t)table.buf % (uintptr_t)(width ? width : 1) == 0) {
        loop = width == 1 ? loop_lut_u8 : width == 2 ? loop_lut_u16 : width == 4 ? loop_lut_u32
             : width == 8 ? loop_lut_u64 : NULL;
    }
    PyObject *result;
    if (loop == NULL) {
        PyErr_Format(PyExc_ValueError, "k_lut: the table must be 256 aligned entries of 1, 2, 4 or 8 bytes "
                     "(got %zd bytes)", table.len);
        result = NULL;
    } else {
        result = run_loop("k_lut", loop, 1, width, args, 6, &extra);
    }
    PyBuffer_Release(&table);
    return result;
}

/* ---------------------------------------------------------------------------------------------------
 * GGUF block dequantizers, every block type: ggml's dequantize_row_* (ggml-quants.c), compiled ahead of time
 * (registered by quant/c_kernels.py).
 * Same float32 operations in the same order as ggml (the sub-block scale first, `d * sc`, then
 * `dl * q - ml`; setup.py builds with -ffp-contract=off, so nothing is fused), hence the same bits as
 * gguf-py's dequantizers: tests/kernels/test_quant_kernels.py checks every type against gguf-py. Each loop converts `rows` whole blocks of 1-D `src` bytes into `out` floats. */

static inline float f16_to_f32(const uint8_t *p) {
    return float_of(widen_f16((uint32_t)p[0] | ((uint32_t)p[1] << 8), 0u));
}

/* The super-block loops with sub-block scales (Q2_K, Q3_K, Q6_K, IQ2_*, IQ3_*) run in two passes: pass 1
 * decodes a super-block into int8 quants and one float scale per run of 16 or 32 values; pass 2 multiplies
 * (and offsets) them in fixed-length runs. The float operations are ggml's, in ggml's order (`d * sc` first,
 * then `dl * q - ml`); only integer decoding moved. The one-pass form, ggml's own loops, was not vectorized by
 * GCC and ran at 0.12-0.5x the speed of the numba build lazyweights then had, on AVX2. The 32-value block types stay one pass, each loop split in two runs of 16. */
#define LW_BYTES_01 0x0101010101010101ull

static inline uint64_t signed_grid8(uint64_t grid, uint64_t sign_mask) {
    return (grid ^ sign_mask) + (sign_mask & LW_BYTES_01);
}

/* 0xff in byte j where bit j of `bits` is set (the mask ksigns64 holds for 7-bit sign codes). */
static inline uint64_t byte_mask_of_bits(uint8_t bits) {
    uint64_t m = ((uint64_t)bits * LW_BYTES_01) & 0x8040201008040201ull;  /* byte j keeps only bit j */
    m = ((m + 0x7f7f7f7f7f7f7f7full) | m) & 0x8080808080808080ull;         /* 0x80 where that bit was set */
    return (m >> 7) * 0xff;
}

/* Pass 2 of the two-pass loops, over one super-block's 256 values in runs of GROUP with a scale dl per run:
 * y = dl * q, or y = dl * q - ml (the K-quants' order). Fixed run lengths are what GCC vectorizes. */
#define LW_SCALE_RUNS(GROUP)                                                                             \
    static inline void scale_runs_##GROUP(float *restrict y, const int8_t *restrict q, const float *dl) {\
        for (int g = 0; g < 256 / (GROUP); g++)                                                          \
            for (int j = 0; j < (GROUP); j++)                                                            \
                y[g * (GROUP) + j] = dl[g] * (float)q[g * (GROUP) + j];                                  \
    }
LW_SCALE_RUNS(16)
LW_SCALE_RUNS(32)

static inline void scale_sub_runs_16(float *restrict y, const int8_t *restrict q, const float *dl, const float *ml) {
    for (int g = 0; g < 16; g++)
        for (int j = 0; j < 16; j++)
            y[g * 16 + j] = dl[g] * (float)q[g * 16 + j] - ml[g];
}

static LW_CLONES void dq_q4_0(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                               const Extra *e) {
    const uint8_t *restrict s = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t b = 0; b < n; b++, s += 18, y += 32) {
        const float d = f16_to_f32(s);
        /* two loops of 16, not one with two stores: that is the form GCC vectorizes */
        for (int j = 0; j < 16; j++)
            y[j] = (float)((int)(s[2 + j] & 0x0F) - 8) * d;
        for (int j = 0; j < 16; j++)
            y[j + 16] = (float)((int)(s[2 + j] >> 4) - 8) * d;
    }
}

static LW_CLONES void dq_q4_1(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                               const Extra *e) {
    const uint8_t *restrict s = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t b = 0; b < n; b++, s += 20, y += 32) {
        const float d = f16_to_f32(s), m = f16_to_f32(s + 2);
        for (int j = 0; j < 16; j++)
            y[j] = (float)(s[4 + j] & 0x0F) * d + m;
        for (int j = 0; j < 16; j++)
            y[j + 16] = (float)(s[4 + j] >> 4) * d + m;
    }
}

static LW_CLONES void dq_q5_0(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                               const Extra *e) {
    const uint8_t *restrict s = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t b = 0; b < n; b++, s += 22, y += 32) {
        const float d = f16_to_f32(s);
        const uint32_t qh = (uint32_t)s[2] | ((uint32_t)s[3] << 8) | ((uint32_t)s[4] << 16) | ((uint32_t)s[5] << 24);
        for (int j = 0; j < 16; j++) {
            const uint8_t xh0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10);
            const uint8_t xh1 = (uint8_t)((qh >> (j + 12)) & 0x10);
            y[j] = (float)((int32_t)((s[6 + j] & 0x0F) | xh0) - 16) * d;
            y[j + 16] = (float)((int32_t)((s[6 + j] >> 4) | xh1) - 16) * d;
        }
    }
}

static LW_CLONES void dq_q5_1(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                               const Extra *e) {
    const uint8_t *restrict s = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t b = 0; b < n; b++, s += 24, y += 32) {
        const float d = f16_to_f32(s), m = f16_to_f32(s + 2);
        const uint32_t qh = (uint32_t)s[4] | ((uint32_t)s[5] << 8) | ((uint32_t)s[6] << 16) | ((uint32_t)s[7] << 24);
        for (int j = 0; j < 16; j++) {
            const uint8_t xh0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10);
            const uint8_t xh1 = (uint8_t)((qh >> (j + 12)) & 0x10);
            y[j] = (float)((s[8 + j] & 0x0F) | xh0) * d + m;
            y[j + 16] = (float)((s[8 + j] >> 4) | xh1) * d + m;
        }
    }
}

static LW_CLONES void dq_q8_0(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                               const Extra *e) {
    const uint8_t *restrict s = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t b = 0; b < n; b++, s += 34, y += 32) {
        const float d = f16_to_f32(s);
        for (int j = 0; j < 32; j++)
            y[j] = (float)(int8_t)s[2 + j] * d;
    }
}

static LW_CLONES void dq_q2_k(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                               const Extra *e) {
    const uint8_t *restrict s = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t b = 0; b < n; b++, s += 84, y += 256) {
        const uint8_t *sc = s, *q = s + 16;
        const float d = f16_to_f32(s + 80), mn = f16_to_f32(s + 82);
        int8_t v[256];
        float dl[16], ml[16];
        for (int g = 0; g < 16; g++) {
            dl[g] = d * (float)(sc[g] & 0xF);
            ml[g] = mn * (float)(sc[g] >> 4);
        }
        for (int k = 0; k < 256; k += 128, q += 32)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++)
                    v[k + 32 * j + l] = (int8_t)((q[l] >> (2 * j)) & 3);
        scale_sub_runs_16(y, v, dl, ml);  /* ggml: dl * q - ml */
    }
}

static LW_CLONES void dq_q3_k(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                               const Extra *e) {
    const uint8_t *restrict s = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    const uint32_t kmask1 = 0x03030303u, kmask2 = 0x0f0f0f0fu;
    for (Py_ssize_t b = 0; b < n; b++, s += 110, y += 256) {
        const uint8_t *hm = s, *q = s + 32;
        const float d_all = f16_to_f32(s + 108);
        uint32_t aux[4];
        memcpy(aux, s + 96, 12);
        const uint32_t tmp = aux[2];
        aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
        aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
        aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
        aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
        const int8_t *scales = (const int8_t *)aux;
        int8_t v[256];
        float dl[16];
        for (int g = 0; g < 16; g++)
            dl[g] = d_all * (float)(scales[g] - 32);
        for (int k = 0; k < 256; k += 128, q += 32)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++)
                    v[k + 32 * j + l] = (int8_t)(((q[l] >> (2 * j)) & 3) - ((hm[l] >> (4 * (k / 128) + j)) & 1 ? 0 : 4));
        scale_runs_16(y, v, dl);  /* ggml: dl * (q - (hm ? 0 : 4)) */
    }
}

static inline void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

static LW_CLONES void dq_q4_k(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                               const Extra *e) {
    const uint8_t *restrict s = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t b = 0; b < n; b++, s += 144) {
        const float d = f16_to_f32(s), mn = f16_to_f32(s + 2);
        const uint8_t *scales = s + 4, *q = s + 16;
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < 256; j += 64) {
            scale_min_k4(is + 0, scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = mn * (float)m;
            scale_min_k4(is + 1, scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = mn * (float)m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
            q += 32;
            is += 2;
        }
    }
}

static LW_CLONES void dq_q5_k(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                               const Extra *e) {
    const uint8_t *restrict s = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t b = 0; b < n; b++, s += 176) {
        const float d = f16_to_f32(s), mn = f16_to_f32(s + 2);
        const uint8_t *scales = s + 4, *qh = s + 16, *ql = s + 48;
        int is = 0;
        uint8_t sc, m, u1 = 1, u2 = 2;
        for (int j = 0; j < 256; j += 64) {
            scale_min_k4(is + 0, scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = mn * (float)m;
            scale_min_k4(is + 1, scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = mn * (float)m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
            is += 2;
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

static LW_CLONES void dq_q6_k(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                               const Extra *e) {
    const uint8_t *restrict s = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t b = 0; b < n; b++, s += 210, y += 256) {
        const float d = f16_to_f32(s + 208);
        const uint8_t *ql = s, *qh = s + 128;
        const int8_t *sc = (const int8_t *)(s + 192);
        int8_t v[256];
        float dl[16];
        for (int g = 0; g < 16; g++)
            dl[g] = d * (float)sc[g];
        for (int k = 0; k < 256; k += 128, ql += 64, qh += 32)
            for (int l = 0; l < 32; l++) {
                v[k + l + 0] = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                v[k + l + 32] = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                v[k + l + 64] = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                v[k + l + 96] = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            }
        scale_runs_16(y, v, dl);  /* ggml: d * sc * q, as (d * sc) * q */
    }
}

/* The grid and ternary types, MXFP4 and Q8_K: ggml's own dequantize_row_* functions and the tables they
 * read, copied verbatim into _ggml_dequant_grids.h (where they come from, and why, is said there). These
 * loops only adapt them to LoopFn, a bounded number of blocks per call because ggml indexes with `int`. */
static inline float lw_half_bits_to_float(uint16_t h) { return float_of(widen_f16((uint32_t)h, 0u)); }

#include "_ggml_dequant_grids.h"

#define GGML_ROW_LOOP(LOOP, FN, BLOCK, VALUES)                                                           \
    static LW_CLONES __attribute__((flatten)) void LOOP(const void *s_, void *o_, Py_ssize_t n,        \
                                                        Py_ssize_t c, Py_ssize_t f,                     \
                               Py_ssize_t st, const Extra *e) {                                          \
        const BLOCK *x = s_; float *y = o_; (void)c; (void)f; (void)st; (void)e;                        \
        for (int64_t done = 0; done < (int64_t)n; done += LW_GGML_CHUNK_BLOCKS) {                      \
            const int64_t blocks = (int64_t)n - done < LW_GGML_CHUNK_BLOCKS ? (int64_t)n - done          \
                                                                           : LW_GGML_CHUNK_BLOCKS;      \
            FN(x + done, y + done * (VALUES), blocks * (VALUES));                                        \
        }                                                                                                \
    }

GGML_ROW_LOOP(dq_tq1_0, dequantize_row_tq1_0, block_tq1_0, 256)
GGML_ROW_LOOP(dq_tq2_0, dequantize_row_tq2_0, block_tq2_0, 256)
GGML_ROW_LOOP(dq_iq1_s, dequantize_row_iq1_s, block_iq1_s, 256)
GGML_ROW_LOOP(dq_iq1_m, dequantize_row_iq1_m, block_iq1_m, 256)
GGML_ROW_LOOP(dq_q8_K, dequantize_row_q8_K, block_q8_K, 256)

/* MXFP4, IQ4_NL and IQ4_XS: 4-bit codes through a 16-entry table; ggml's loops, each split in two runs of 16. */
static LW_CLONES void dq_mxfp4(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                                const Extra *e) {
    const block_mxfp4 *restrict x = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t b = 0; b < n; b++, y += QK_MXFP4) {
        const float d = GGML_E8M0_TO_FP32_HALF(x[b].e);
        for (int j = 0; j < QK_MXFP4 / 2; ++j)
            y[j] = kvalues_mxfp4[x[b].qs[j] & 0x0F] * d;
        for (int j = 0; j < QK_MXFP4 / 2; ++j)
            y[j + QK_MXFP4 / 2] = kvalues_mxfp4[x[b].qs[j] >> 4] * d;
    }
}

static LW_CLONES void dq_iq4_nl(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                                 const Extra *e) {
    const block_iq4_nl *restrict x = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t b = 0; b < n; b++, y += QK4_NL) {
        const float d = GGML_FP16_TO_FP32(x[b].d);
        for (int j = 0; j < QK4_NL / 2; ++j)
            y[j] = d * kvalues_iq4nl[x[b].qs[j] & 0xf];
        for (int j = 0; j < QK4_NL / 2; ++j)
            y[j + QK4_NL / 2] = d * kvalues_iq4nl[x[b].qs[j] >> 4];
    }
}

static LW_CLONES void dq_iq4_xs(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                                 const Extra *e) {
    const block_iq4_xs *restrict x = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t i = 0; i < n; i++) {
        const float d = GGML_FP16_TO_FP32(x[i].d);
        const uint8_t *qs = x[i].qs;
        for (int ib = 0; ib < QK_K / 32; ++ib, qs += 16, y += 32) {
            const int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((x[i].scales_h >> 2 * ib) & 3) << 4);
            const float dl = d * (ls - 32);
            for (int j = 0; j < 16; ++j)
                y[j] = dl * kvalues_iq4nl[qs[j] & 0xf];
            for (int j = 0; j < 16; ++j)
                y[j + 16] = dl * kvalues_iq4nl[qs[j] >> 4];
        }
    }
}

/* IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S in two passes. ggml's loops compute, for each value,
 * `db * grid[j] * (sign ? -1.f : 1.f)` with the sign looked up bit by bit; GCC vectorizes none of it (they ran
 * at 1 GB/s, 0.12x LLVM's build of the same loops). Here pass 1 writes each group of 8 signed grid values as one
 * 64-bit store (the grid bytes with the signs applied bytewise), and pass 2 is `y = db * (float)q` over runs
 * of 16 or 32, which GCC vectorizes. Same bits as ggml for every non-NaN scale: db * (float)(-g) is exactly
 * -(db * g), which is what multiplying by -1.f gives (with a NaN scale only the NaN's sign may differ).
 *
 * Applying signs bytewise: for a sign mask s (0xff in the negated bytes), (g ^ s) + (s & 0x01..01) is the two's
 * complement -g in each negated byte, with no carry from byte to byte as long as every grid byte is in
 * 1..127; PyInit__ccasts checks that of every table these read. */

static LW_CLONES void dq_iq2_xxs(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                                  const Extra *e) {
    const block_iq2_xxs *restrict x = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t i = 0; i < n; i++, y += QK_K) {
        uint64_t q[QK_K / 8];
        float db[QK_K / 32];
        const float d = GGML_FP16_TO_FP32(x[i].d);
        for (int ib32 = 0; ib32 < QK_K / 32; ++ib32) {
            uint32_t aux32[2];
            memcpy(aux32, x[i].qs + 4 * ib32, 2 * sizeof(uint32_t));
            const uint8_t *aux8 = (const uint8_t *)aux32;
            db[ib32] = d * (0.5f + (aux32[1] >> 28)) * 0.25f;
            for (int l = 0; l < 4; ++l)
                q[4 * ib32 + l] = signed_grid8(iq2xxs_grid[aux8[l]], ksigns64[(aux32[1] >> 7 * l) & 127]);
        }
        scale_runs_32(y, (const int8_t *)q, db);
    }
}

static LW_CLONES void dq_iq2_xs(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                                 const Extra *e) {
    const block_iq2_xs *restrict x = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t i = 0; i < n; i++, y += QK_K) {
        uint64_t q[QK_K / 8];
        float db[QK_K / 16];
        const float d = GGML_FP16_TO_FP32(x[i].d);
        for (int ib32 = 0; ib32 < QK_K / 32; ++ib32) {
            db[2 * ib32 + 0] = d * (0.5f + (x[i].scales[ib32] & 0xf)) * 0.25f;
            db[2 * ib32 + 1] = d * (0.5f + (x[i].scales[ib32] >> 4)) * 0.25f;
            for (int l = 0; l < 4; ++l) {
                const uint16_t code = x[i].qs[4 * ib32 + l];
                q[4 * ib32 + l] = signed_grid8(iq2xs_grid[code & 511], ksigns64[code >> 9]);
            }
        }
        scale_runs_16(y, (const int8_t *)q, db);
    }
}

static LW_CLONES void dq_iq2_s(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                                const Extra *e) {
    const block_iq2_s *restrict x = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t i = 0; i < n; i++, y += QK_K) {
        uint64_t q[QK_K / 8];
        float db[QK_K / 16];
        const float d = GGML_FP16_TO_FP32(x[i].d);
        const uint8_t *qs = x[i].qs, *qh = x[i].qh, *signs = qs + QK_K / 8;
        for (int ib32 = 0; ib32 < QK_K / 32; ++ib32) {
            db[2 * ib32 + 0] = d * (0.5f + (x[i].scales[ib32] & 0xf)) * 0.25f;
            db[2 * ib32 + 1] = d * (0.5f + (x[i].scales[ib32] >> 4)) * 0.25f;
            for (int l = 0; l < 4; ++l)
                q[4 * ib32 + l] = signed_grid8(iq2s_grid[qs[l] | (qh[ib32] << (8 - 2 * l) & 0x300)],
                                               byte_mask_of_bits(signs[l]));
            qs += 4;
            signs += 4;
        }
        scale_runs_16(y, (const int8_t *)q, db);
    }
}

static LW_CLONES void dq_iq3_xxs(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                                  const Extra *e) {
    const block_iq3_xxs *restrict x = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t i = 0; i < n; i++, y += QK_K) {
        uint64_t q[QK_K / 8];
        float db[QK_K / 32];
        const float d = GGML_FP16_TO_FP32(x[i].d);
        const uint8_t *qs = x[i].qs, *scales_and_signs = qs + QK_K / 4;
        for (int ib32 = 0; ib32 < QK_K / 32; ++ib32) {
            uint32_t aux32;
            memcpy(&aux32, scales_and_signs + 4 * ib32, sizeof(uint32_t));
            db[ib32] = d * (0.5f + (aux32 >> 28)) * 0.5f;
            for (int l = 0; l < 4; ++l) {
                const uint64_t grid = iq3xxs_grid[qs[2 * l + 0]] | ((uint64_t)iq3xxs_grid[qs[2 * l + 1]] << 32);
                q[4 * ib32 + l] = signed_grid8(grid, ksigns64[(aux32 >> 7 * l) & 127]);
            }
            qs += 8;
        }
        scale_runs_32(y, (const int8_t *)q, db);
    }
}

static LW_CLONES void dq_iq3_s(const void *s_, void *o_, Py_ssize_t n, Py_ssize_t c, Py_ssize_t f, Py_ssize_t st,
                                const Extra *e) {
    const block_iq3_s *restrict x = s_; float *restrict y = o_; (void)c; (void)f; (void)st; (void)e;
    for (Py_ssize_t i = 0; i < n; i++, y += QK_K) {
        uint64_t q[QK_K / 8];
        float db[QK_K / 32];
        const float d = GGML_FP16_TO_FP32(x[i].d);
        const uint8_t *qs = x[i].qs, *qh = x[i].qh, *signs = x[i].signs;
        for (int ib32 = 0; ib32 < QK_K / 32; ib32 += 2) {
            db[ib32 + 0] = d * (1 + 2 * (x[i].scales[ib32 / 2] & 0xf));
            db[ib32 + 1] = d * (1 + 2 * (x[i].scales[ib32 / 2] >> 4));
            for (int half = 0; half < 2; ++half) {
                for (int l = 0; l < 4; ++l) {
                    const uint64_t grid = iq3s_grid[qs[2 * l + 0] | ((qh[half] << (8 - 2 * l)) & 256)]
                                          | ((uint64_t)iq3s_grid[qs[2 * l + 1] | ((qh[half] << (7 - 2 * l)) & 256)] << 32);
                    q[4 * (ib32 + half) + l] = signed_grid8(grid, byte_mask_of_bits(signs[l]));
                }
                qs += 8;
                signs += 4;
            }
            qh += 2;
        }
        scale_runs_32(y, (const int8_t *)q, db);
    }
}

/* Every byte of every grid the two-pass loops read is in 1..127 (see signed_grid8); 0 if so. */
static int grids_fit_signed_bytes(void) {
    const struct { const void *table; size_t bytes; } grids[] = {
        {iq2xxs_grid, sizeof iq2xxs_grid}, {iq2xs_grid, sizeof iq2xs_grid}, {iq2s_grid, sizeof iq2s_grid},
        {iq3xxs_grid, sizeof iq3xxs_grid}, {iq3s_grid, sizeof iq3s_grid},
    };
    for (size_t t = 0; t < sizeof grids / sizeof grids[0]; t++)
        for (size_t b = 0; b < grids[t].bytes; b++) {
            const uint8_t v = ((const uint8_t *)grids[t].table)[b];
            if (v == 0 || v > 127)
                return -1;
        }
    return 0;
}

/* dequantize(src, out): whole blocks of 1-D uint8 `src` into 1-D float32 `out` (checked, GIL released,
 * SIGBUS-guarded like the casts). `src_align`: the alignment the loop reads the source with (1: bytewise). */
static PyObject *run_dequant(const char *name, LoopFn loop, Py_ssize_t block_bytes, Py_ssize_t block_values,
                             Py_ssize_t src_align, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer src, out;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes src, out", name);
        return NULL;
    }
    if (get_buffers(args, &src, &out) < 0)
        return NULL;
    const Py_ssize_t blocks = src.len / block_bytes;
    const char *problem = NULL;
    if (src.len % block_bytes)
        problem = "the source is not a whole number of blocks";
    else if ((uintptr_t)src.buf % (uintptr_t)src_align)
        problem = src_align == 4 ? "the source is not aligned to 4 bytes" : "the source is not aligned to 2 bytes";
    else if ((uintptr_t)out.buf % sizeof(float))
        problem = "the output is not aligned to float32";
    else if (out.len / (Py_ssize_t)sizeof(float) != blocks * block_values || out.len % (Py_ssize_t)sizeof(float))
        problem = "the output does not hold exactly the blocks' values";
    if (problem) {
        PyErr_Format(PyExc_ValueError, "%s: %s (source %zd bytes, output %zd bytes, blocks of %zd bytes -> %zd "
                     "values)", name, problem, src.len, out.len, block_bytes, block_values);
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        return NULL;
    }
    return run_released(loop, &src, &out, blocks > 0, blocks, 0, 0, 0, NULL);
}

#define DEQUANT_KERNEL_ALIGNED(PYNAME, LOOP, BLOCK_BYTES, BLOCK_VALUES, ALIGN)                         \
    static PyObject *PYNAME(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {               \
        (void)self;                                                                                   \
        return run_dequant(#PYNAME, LOOP, BLOCK_BYTES, BLOCK_VALUES, ALIGN, args, nargs);             \
    }
#define DEQUANT_KERNEL(PYNAME, LOOP, BLOCK_BYTES, BLOCK_VALUES) DEQUANT_KERNEL_ALIGNED(PYNAME, LOOP, BLOCK_BYTES, BLOCK_VALUES, 1)

DEQUANT_KERNEL(dq_Q4_0, dq_q4_0, 18, 32)
DEQUANT_KERNEL(dq_Q4_1, dq_q4_1, 20, 32)
DEQUANT_KERNEL(dq_Q5_0, dq_q5_0, 22, 32)
DEQUANT_KERNEL(dq_Q5_1, dq_q5_1, 24, 32)
DEQUANT_KERNEL(dq_Q8_0, dq_q8_0, 34, 32)
DEQUANT_KERNEL(dq_Q2_K, dq_q2_k, 84, 256)
DEQUANT_KERNEL(dq_Q3_K, dq_q3_k, 110, 256)
DEQUANT_KERNEL(dq_Q4_K, dq_q4_k, 144, 256)
DEQUANT_KERNEL(dq_Q5_K, dq_q5_k, 176, 256)
DEQUANT_KERNEL(dq_Q6_K, dq_q6_k, 210, 256)
DEQUANT_KERNEL(dq_MXFP4, dq_mxfp4, 17, 32)
DEQUANT_KERNEL_ALIGNED(dq_TQ1_0, dq_tq1_0, 54, 256, 2)
DEQUANT_KERNEL_ALIGNED(dq_TQ2_0, dq_tq2_0, 66, 256, 2)
DEQUANT_KERNEL_ALIGNED(dq_IQ2_XXS, dq_iq2_xxs, 66, 256, 2)
DEQUANT_KERNEL_ALIGNED(dq_IQ2_XS, dq_iq2_xs, 74, 256, 2)
DEQUANT_KERNEL_ALIGNED(dq_IQ2_S, dq_iq2_s, 82, 256, 2)
DEQUANT_KERNEL_ALIGNED(dq_IQ3_XXS, dq_iq3_xxs, 98, 256, 2)
DEQUANT_KERNEL_ALIGNED(dq_IQ3_S, dq_iq3_s, 110, 256, 2)
DEQUANT_KERNEL_ALIGNED(dq_IQ1_S, dq_iq1_s, 50, 256, 2)
DEQUANT_KERNEL_ALIGNED(dq_IQ1_M, dq_iq1_m, 56, 256, 2)
DEQUANT_KERNEL_ALIGNED(dq_IQ4_NL, dq_iq4_nl, 18, 32, 2)
DEQUANT_KERNEL_ALIGNED(dq_IQ4_XS, dq_iq4_xs, 136, 256, 2)
DEQUANT_KERNEL_ALIGNED(dq_Q8_K, dq_q8_K, 292, 256, 4)

#define METHOD(NAME, DOC) {#NAME, (PyCFunction)(void (*)(void))NAME, METH_FASTCALL, DOC}

static PyMethodDef methods[] = {
    METHOD(k_bf16_to_f32, "bfloat16 bits -> float32 bits (a shift; payloads kept)."),
    METHOD(k_f16_to_f32, "float16 bits -> float32 bits; quiet_nans ORs the quiet bit into NaNs."),
    METHOD(k_f32_to_bf16, "float32 bits -> bfloat16 bits (RNE, ml_dtypes' canonical NaN)."),
    METHOD(k_f16_to_bf16, "float16 bits -> bfloat16 bits (RNE, ml_dtypes' canonical NaN)."),
    METHOD(k_f32_to_f16, "float32 bits -> float16 bits (RNE; NaN handling as numpy's build does it)."),
    METHOD(k_bf16_to_f16, "bfloat16 bits -> float16 bits (RNE, ml_dtypes' canonical NaN)."),
    {"bf16_to_f16_variant", bf16_to_f16_variant, METH_NOARGS, "The bf16 -> f16 loop in use: avx512, f16c or portable."},
    METHOD(k_f32_to_e4m3, "float32 bits -> float8_e4m3fn bits."),
    METHOD(k_f32_to_e5m2, "float32 bits -> float8_e5m2 bits."),
    METHOD(k_bf16_to_e4m3, "bfloat16 bits -> float8_e4m3fn bits."),
    METHOD(k_bf16_to_e5m2, "bfloat16 bits -> float8_e5m2 bits."),
    METHOD(k_f16_to_e4m3, "float16 bits -> float8_e4m3fn bits."),
    METHOD(k_f16_to_e5m2, "float16 bits -> float8_e5m2 bits."),
    METHOD(k_lut, "one-byte codes -> table entries."),
    METHOD(dq_Q4_0, "Q4_0 blocks -> float32 (ggml's dequantize_row_q4_0)."),
    METHOD(dq_Q4_1, "Q4_1 blocks -> float32."),
    METHOD(dq_Q5_0, "Q5_0 blocks -> float32."),
    METHOD(dq_Q5_1, "Q5_1 blocks -> float32."),
    METHOD(dq_Q8_0, "Q8_0 blocks -> float32."),
    METHOD(dq_Q2_K, "Q2_K super-blocks -> float32."),
    METHOD(dq_Q3_K, "Q3_K super-blocks -> float32."),
    METHOD(dq_Q4_K, "Q4_K super-blocks -> float32."),
    METHOD(dq_Q5_K, "Q5_K super-blocks -> float32."),
    METHOD(dq_Q6_K, "Q6_K super-blocks -> float32."),
    METHOD(dq_MXFP4, "MXFP4 blocks -> float32 (ggml's dequantize_row_mxfp4)."),
    METHOD(dq_TQ1_0, "TQ1_0 super-blocks -> float32 (source 2-byte aligned)."),
    METHOD(dq_TQ2_0, "TQ2_0 super-blocks -> float32 (source 2-byte aligned)."),
    METHOD(dq_IQ2_XXS, "IQ2_XXS super-blocks -> float32 (source 2-byte aligned)."),
    METHOD(dq_IQ2_XS, "IQ2_XS super-blocks -> float32 (source 2-byte aligned)."),
    METHOD(dq_IQ2_S, "IQ2_S super-blocks -> float32 (source 2-byte aligned)."),
    METHOD(dq_IQ3_XXS, "IQ3_XXS super-blocks -> float32 (source 2-byte aligned)."),
    METHOD(dq_IQ3_S, "IQ3_S super-blocks -> float32 (source 2-byte aligned)."),
    METHOD(dq_IQ1_S, "IQ1_S super-blocks -> float32 (source 2-byte aligned)."),
    METHOD(dq_IQ1_M, "IQ1_M super-blocks -> float32 (source 2-byte aligned)."),
    METHOD(dq_IQ4_NL, "IQ4_NL blocks -> float32 (source 2-byte aligned)."),
    METHOD(dq_IQ4_XS, "IQ4_XS super-blocks -> float32 (source 2-byte aligned)."),
    METHOD(dq_Q8_K, "Q8_K super-blocks -> float32 (source 4-byte aligned)."),
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ccasts",
    "Ahead-of-time compiled cast kernels, bit-identical to numpy/ml_dtypes astype (see _ccasts.c).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ccasts(void) {
    pick_loops();
    if (grids_fit_signed_bytes() != 0) {
        PyErr_SetString(PyExc_ImportError, "_ccasts: an IQ2/IQ3 grid byte is outside 1..127, which the two-pass "
                        "dequantizers assume (see signed_grid8)");
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *capsule = PyCapsule_New((void *)&guard_api, "lazyweights.kernels._ccasts._guard_api", NULL);
    if (capsule == NULL || PyModule_AddObject(m, "_guard_api", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
