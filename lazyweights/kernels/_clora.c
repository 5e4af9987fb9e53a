/*
 * lazyweights.kernels._clora: the LoRA update's arithmetic, ``acc += scale * (coef @ basis)``, with one fixed
 * order of float32 operations per output element, compiled when lazyweights is installed.
 *
 * Why not numpy's BLAS: OpenBLAS picks its kernel by the matrix shape (on AVX-512 a separate small-matrix kernel
 * as well), and its kernels round an element's sum differently. A `lora` block of 64 rows and one of 61 gave the
 * same element different float32 values, so one plan gave different bytes under different budgets, executors
 * and thread counts (one bf16 ulp; enough to move a Q4_K byte). Here every element of the update is
 *
 *     d = 0;  d = fma(coef[i,0], basis[0,j], d);  d = fma(coef[i,1], basis[1,j], d);  ...  (k = 0 .. r-1)
 *     acc[i,j] = acc[i,j] + (scale == 1 ? d : d * scale)          (the multiply and the add rounded apart)
 *
 * whatever the block, the thread or the CPU. fmaf is exactly specified (the product and the sum rounded once,
 * IEEE 754's fusedMultiplyAdd), so the AVX-512 and AVX2+FMA clones (vfmadd lane by lane) and the baseline clone
 * (the C library's fmaf) give the same bits; -ffp-contract=off (setup.py) keeps the compiler from fusing anything
 * else. Never build this file with -ffast-math.
 *
 * Why this order: it is the order of a BLAS micro-kernel for a small inner dimension (accumulators start at
 * zero, one fused multiply-add per k, k ascending), so the update equals torch's float32 `B @ A` (PEFT's
 * `get_delta_weight`) bit for bit wherever torch's kernel sums that way: every element of the tests' merges on
 * the AVX-512 development machine. The tests still judge against PEFT only within float32's rounding bound,
 * since another torch build may sum otherwise. tests/kernels/test_lora_kernel.py holds the order against the C
 * library's fmaf, element by element.
 *
 * Speed: on x86-64 with AVX-512 or AVX2+FMA the bulk runs in register tiles (`TILE_KERNEL`), about 25 GFMA/s
 * on one core of the AVX2 development machine for r = 16; the update, its scale and its add in cache take what
 * numpy's BLAS product, scale and add took (`benchmarks/bench_lora.py --op-only`). Edges, and other CPUs, run in
 * `span`, which the compiler vectorizes.
 *
 * Reads are guarded with _ccasts' SIGBUS guard (the capsule `_guard_api`, as _cquant uses it): a memory-mapped
 * factor truncated mid-read raises OSError(EFAULT) instead of killing the process.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_guard_api.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) && __GNUC__ >= 11
#define LW_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define LW_CLONES __attribute__((target_clones("avx2,fma", "default")))
#else
#define LW_CLONES
#endif
/* The register tiles (AVX-512 and AVX2+FMA intrinsics, picked at run time) on x86-64 GCC and clang. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define LW_X86_TILES 1
#else
#define LW_X86_TILES 0
#endif

/* Widest register tile's columns (AVX-512: 4 vectors of 16): `packed` holds r rows of it. */
#define MAX_TILE_COLS 64

typedef struct {
    float *acc;
    const float *coef, *basis;
    Py_ssize_t rows, cols, r;
    float scale;
    float *packed;  /* r * MAX_TILE_COLS floats, allocated with the GIL held so that a SIGBUS cannot leak it */
} Job;

/* Columns per chunk of `span`: d and one chunk of each basis row stay in L1 (4 KiB each). */
#define CHUNK 1024

/* Rows [i0, i1) by columns [j0, j1) of the update, added to acc: d = sum_k coef[i, k] * basis[k, j] by fused
 * multiply-adds, k in order, then acc += d (times scale). Any shape; the compiler vectorizes the j loops (the
 * x86-64-v3/v4 clones with vfmadd; plain AVX2 has no FMA and would call fmaf per element). It does the edges
 * the register tiles below leave, and all the work where there are none. */
static LW_CLONES void span(const Job *job, Py_ssize_t i0, Py_ssize_t i1, Py_ssize_t j0, Py_ssize_t j1) {
    float d[CHUNK] __attribute__((aligned(64)));
    const Py_ssize_t cols = job->cols, r = job->r;
    for (Py_ssize_t i = i0; i < i1; i++) {
        const float *restrict c = job->coef + i * r;
        for (Py_ssize_t jc = j0; jc < j1; jc += CHUNK) {
            const Py_ssize_t n = j1 - jc < CHUNK ? j1 - jc : CHUNK;
            for (Py_ssize_t j = 0; j < n; j++)
                d[j] = 0.0f;
            for (Py_ssize_t k = 0; k < r; k++) {
                const float ck = c[k];
                const float *restrict bk = job->basis + k * cols + jc;
                for (Py_ssize_t j = 0; j < n; j++)
                    d[j] = fmaf(ck, bk[j], d[j]);
            }
            float *restrict o = job->acc + i * cols + jc;
            if (job->scale == 1.0f) {
                for (Py_ssize_t j = 0; j < n; j++)
                    o[j] = o[j] + d[j];
            } else {
                const float s = job->scale;
                for (Py_ssize_t j = 0; j < n; j++)
                    o[j] = o[j] + d[j] * s;
            }
        }
    }
}

#if LW_X86_TILES
/* Register tiles: ROWS rows by 4 vectors of columns held in registers across every k, so each load of a basis
 * vector serves ROWS rows and the loop is bound by the fused multiply-adds, not by L1 (the `span` loop loads
 * and stores d at every k). ROWS x 4 accumulators fit the register file: 16 of AVX-512's 32, 12 of AVX2's 16
 * (4 x 4 there spilled to the stack, 20% slower). The columns of a tile are first copied out of basis into
 * `packed` ([r][4 * WIDTH], contiguous), once for all the rows: basis rows are `cols` floats apart, and with
 * cols a power of two the r rows of a tile fall into one L1 set and evict each other (packing: 16 -> 21 GFMA/s
 * at cols = 4096). The operations per element are `span`'s, in its order. */
#define TILE_KERNEL(NAME, TARGET, ROWS, VEC, WIDTH, ZERO, LOAD, STORE, SET1, FMADD, ADD, MUL)                          \
    __attribute__((target(TARGET))) static void NAME(const Job *job, Py_ssize_t rows, Py_ssize_t cols,                 \
                                                     float *packed) {                                                  \
        const Py_ssize_t stride = job->cols, r = job->r;                                                               \
        const VEC s = SET1(job->scale);                                                                                \
        for (Py_ssize_t j0 = 0; j0 < cols; j0 += 4 * WIDTH) {                                                          \
            for (Py_ssize_t k = 0; k < r; k++)                                                                         \
                memcpy(packed + k * 4 * WIDTH, job->basis + k * stride + j0, 4 * WIDTH * sizeof(float));               \
            for (Py_ssize_t i = 0; i < rows; i += ROWS) {                                                              \
                VEC d[ROWS][4];                                                                                        \
                for (int a = 0; a < ROWS; a++)                                                                         \
                    for (int v = 0; v < 4; v++)                                                                        \
                        d[a][v] = ZERO();                                                                              \
                const float *c = job->coef + i * r;                                                                    \
                for (Py_ssize_t k = 0; k < r; k++) {                                                                   \
                    const float *bk = packed + k * 4 * WIDTH;                                                          \
                    const VEC b0 = LOAD(bk), b1 = LOAD(bk + WIDTH), b2 = LOAD(bk + 2 * WIDTH),                         \
                              b3 = LOAD(bk + 3 * WIDTH);                                                               \
                    for (int a = 0; a < ROWS; a++) {                                                                   \
                        const VEC ca = SET1(c[a * r + k]);                                                             \
                        d[a][0] = FMADD(ca, b0, d[a][0]);                                                              \
                        d[a][1] = FMADD(ca, b1, d[a][1]);                                                              \
                        d[a][2] = FMADD(ca, b2, d[a][2]);                                                              \
                        d[a][3] = FMADD(ca, b3, d[a][3]);                                                              \
                    }                                                                                                  \
                }                                                                                                      \
                for (int a = 0; a < ROWS; a++) {                                                                       \
                    float *o = job->acc + (i + a) * stride + j0;                                                       \
                    for (int v = 0; v < 4; v++) {                                                                      \
                        const VEC u = job->scale == 1.0f ? d[a][v] : MUL(d[a][v], s);                                  \
                        STORE(o + v * WIDTH, ADD(LOAD(o + v * WIDTH), u));                                             \
                    }                                                                                                  \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
    }

TILE_KERNEL(tiles_avx512, "avx512f", 4, __m512, 16, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps,
            _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_mul_ps)
TILE_KERNEL(tiles_avx2, "avx2,fma", 3, __m256, 8, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps,
            _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_mul_ps)
#endif

/* acc += scale * (coef @ basis): register tiles where the CPU has them, `span` for the rest. */
static void accumulate(const Job *job) {
    Py_ssize_t rows = 0, cols = 0;
#if LW_X86_TILES
    Py_ssize_t tile_cols = 0, tile_rows = 0;
    void (*tiles)(const Job *, Py_ssize_t, Py_ssize_t, float *) = NULL;
    if (__builtin_cpu_supports("avx512f")) {
        tiles = tiles_avx512;
        tile_rows = 4;
        tile_cols = 64;
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        tiles = tiles_avx2;
        tile_rows = 3;
        tile_cols = 32;
    }
    if (tiles != NULL) {
        rows = job->rows - job->rows % tile_rows;
        cols = job->cols - job->cols % tile_cols;
        if (rows > 0 && cols > 0)
            tiles(job, rows, cols, job->packed);
        else
            rows = cols = 0;
    }
#endif
    if (cols < job->cols)
        span(job, 0, rows, cols, job->cols);
    span(job, rows, job->rows, 0, job->cols);
}

static void run_job(void *context) { accumulate((const Job *)context); }

static const GuardApi *guard = NULL;

/* Whether a * b float32 values have a byte count that fits in Py_ssize_t (a, b >= 0). */
static int fits(Py_ssize_t a, Py_ssize_t b) { return a == 0 || b <= PY_SSIZE_T_MAX / 4 / a; }

/* `obj` as a C-contiguous float32 buffer of exactly `count` values; -1 with an exception set otherwise. */
static int get_f32(PyObject *obj, const char *what, Py_buffer *view, int writable, Py_ssize_t count) {
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Format(PyExc_ValueError, "lora_accumulate: %s must be a %sC-contiguous float32 buffer (got %.100s)",
                     what, writable ? "writable, " : "", Py_TYPE(obj)->tp_name);
        return -1;
    }
    const char *fmt = view->format ? view->format : "B";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@')
        fmt++;
    if (fmt[0] != 'f' || fmt[1] != '\0' || view->itemsize != 4) {
        PyErr_Format(PyExc_TypeError, "lora_accumulate: %s must be float32, got buffer format '%s'", what,
                     view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    if (view->len != count * 4) {
        PyErr_Format(PyExc_ValueError, "lora_accumulate: %s holds %zd float32 values, the shapes need %zd", what,
                     view->len / 4, count);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *lora_accumulate(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "lora_accumulate(acc, coef, basis, rows, cols, r, scale) takes 7 arguments");
        return NULL;
    }
    Py_ssize_t rows = PyLong_AsSsize_t(args[3]), cols = PyLong_AsSsize_t(args[4]), r = PyLong_AsSsize_t(args[5]);
    double scale = PyFloat_AsDouble(args[6]);
    if (PyErr_Occurred())
        return NULL;
    if (rows < 0 || cols < 0 || r < 1 || !fits(rows, cols) || !fits(rows, r) || !fits(r, cols) ||
        !fits(r, MAX_TILE_COLS)) {
        PyErr_Format(PyExc_ValueError, "lora_accumulate: need rows, cols >= 0 and r >= 1 (and sizes that fit), got "
                     "rows=%zd cols=%zd r=%zd", rows, cols, r);
        return NULL;
    }
    Py_buffer acc, coef, basis;
    if (get_f32(args[0], "acc", &acc, 1, rows * cols) < 0)
        return NULL;
    if (get_f32(args[1], "coef", &coef, 0, rows * r) < 0) {
        PyBuffer_Release(&acc);
        return NULL;
    }
    if (get_f32(args[2], "basis", &basis, 0, r * cols) < 0) {
        PyBuffer_Release(&acc);
        PyBuffer_Release(&coef);
        return NULL;
    }
    Job job = {acc.buf, coef.buf, basis.buf, rows, cols, r, (float)scale, NULL};
    int failed = 0;
    if (rows > 0 && cols > 0) {
        job.packed = PyMem_RawMalloc((size_t)r * MAX_TILE_COLS * sizeof(float));
        failed = job.packed == NULL ? (PyErr_NoMemory(), 1) : lw_run_released(guard, run_job, &job, "a LoRA factor");
    }
    PyMem_RawFree(job.packed);
    PyBuffer_Release(&acc);
    PyBuffer_Release(&coef);
    PyBuffer_Release(&basis);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"lora_accumulate", (PyCFunction)(void (*)(void))lora_accumulate, METH_FASTCALL,
     "lora_accumulate(acc, coef, basis, rows, cols, r, scale)\n--\n\n"
     "acc[rows, cols] += scale * (coef[rows, r] @ basis[r, cols]), float32, C-contiguous, each element's products "
     "summed by fused multiply-adds in the order k = 0 .. r-1 (see _clora.c). Releases the GIL."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_clora",
    "The LoRA update in one fixed order of float32 operations per element (see _clora.c).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__clora(void) {
    guard = lw_import_guard();
    return PyModule_Create(&module);
}
