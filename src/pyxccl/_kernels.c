/* pyxccl._kernels: the compression kernels of compression/codecs/_sparse.py, in C (optional, as pyxccl._native:
 * built by pip when a C compiler is there; numpy runs the same steps without it, and with
 * PYXCCL_NATIVE=0). Each is one pass instead of several numpy calls; the results are the same bits
 * (tests/test_compress.py compares both paths). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

/* The scan of candidates(): acc += x (x NULL: not written) and, in order, the indices i with
 * |acc[i]| >= t (tb: t's bits) and their values into o and v (v may be NULL) while they fit (cap);
 * returns the count, which may exceed cap. For t >= 0 the magnitudes order as their bit patterns
 * with the sign cleared: an integer compare; NaN's pattern is above every finite one's. */
#define TAKE(j)                                    \
    do {                                           \
        if (count < cap) {                         \
            o[count] = (int32_t)(j);               \
            if (v) v[count] = a[j];                \
        }                                          \
        count++;                                   \
    } while (0)

#if defined(__x86_64__) && defined(__GNUC__)
/* 32 at a time with AVX2 where the CPU has it (chosen at run time: the build targets plain x86-64),
 * a bit per element that passes; few do (about k of n), so the loop over set bits rarely runs and
 * the values are taken while in cache. Returns where it stopped; the rest is scan()'s. */
__attribute__((target("avx2"))) static Py_ssize_t scan_avx2(float *a, const float *x, Py_ssize_t n, int32_t tb,
                                                            int32_t *o, float *v, Py_ssize_t cap,
                                                            Py_ssize_t *countp) {
    Py_ssize_t count = *countp, i = 0;
    const __m256i keep = _mm256_set1_epi32(0x7fffffff), below = _mm256_set1_epi32(tb - 1);
    for (; i + 32 <= n; i += 32) {
        uint32_t mask = 0;
        for (int q = 0; q < 4; q++) {
            __m256 s = _mm256_loadu_ps(a + i + 8 * q);
            if (x) {
                s = _mm256_add_ps(s, _mm256_loadu_ps(x + i + 8 * q));
                _mm256_storeu_ps(a + i + 8 * q, s);
            }
            __m256i m = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(s), keep), below);
            mask |= (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(m)) << 8 * q;
        }
        while (mask) {
            Py_ssize_t j = i + __builtin_ctz(mask);
            mask &= mask - 1;
            TAKE(j);
        }
    }
    *countp = count;
    return i;
}
#endif

static Py_ssize_t scan(float *a, const float *x, Py_ssize_t n, int32_t tb, int32_t *o, float *v,
                       Py_ssize_t cap) {
    Py_ssize_t count = 0, i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx2")) i = scan_avx2(a, x, n, tb, o, v, cap, &count);
#endif
    for (; i < n; i++) {                /* the tail (all of it without AVX2) */
        if (x) a[i] += x[i];
        int32_t bits;
        memcpy(&bits, a + i, 4);        /* the float's bits (a cast pointer would break aliasing rules) */
        if ((bits & 0x7fffffff) >= tb) TAKE(i);
    }
    return count;
}
#undef TAKE

/* candidates(acc, x, t, idx[, val]) -> count: acc += x (x None: acc as is, not written), and the
 * indices i with |acc[i]| >= t, in order, into idx (int32) and their values into val (float32, same
 * length) while they fit; the count may exceed len(idx), then idx is incomplete. One pass instead of
 * numpy's add, abs, compare, nonzero and gather (compression/codecs/_sparse.py). t < 0 counts as 0. */
static PyObject *candidates(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *acc_o, *x_o, *out_o, *val_o = Py_None;
    float t;
    if (!PyArg_ParseTuple(args, "OOfO|O", &acc_o, &x_o, &t, &out_o, &val_o)) return NULL;
    int add = x_o != Py_None, vals = val_o != Py_None;
    Py_buffer va, vx = {0}, vo, vv = {0};
    if (PyObject_GetBuffer(acc_o, &va, PyBUF_C_CONTIGUOUS | (add ? PyBUF_WRITABLE : 0)) < 0) return NULL;
    if (add && PyObject_GetBuffer(x_o, &vx, PyBUF_C_CONTIGUOUS) < 0) goto fail_a;
    if (PyObject_GetBuffer(out_o, &vo, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto fail_x;
    if (vals && PyObject_GetBuffer(val_o, &vv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto fail_o;
    if ((add && vx.len != va.len) || (vals && vv.len != vo.len)) {
        PyErr_SetString(PyExc_ValueError, add && vx.len != va.len ? "candidates: acc and x differ in size"
                                                                   : "candidates: idx and val differ in size");
        goto fail_v;
    }
    Py_ssize_t n = va.len / 4, cap = vo.len / 4, count;
    int32_t tb = 0;
    if (t > 0) memcpy(&tb, &t, 4);
    Py_BEGIN_ALLOW_THREADS
    count = scan(va.buf, add ? vx.buf : NULL, n, tb, vo.buf, vals ? vv.buf : NULL, cap);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&va);
    if (add) PyBuffer_Release(&vx);
    PyBuffer_Release(&vo);
    if (vals) PyBuffer_Release(&vv);
    return PyLong_FromSsize_t(count);
fail_v:
    if (vals) PyBuffer_Release(&vv);
fail_o:
    PyBuffer_Release(&vo);
fail_x:
    if (add) PyBuffer_Release(&vx);
fail_a:
    PyBuffer_Release(&va);
    return NULL;
}

/* scatter_add(out, idx, val): out[idx[j]] += val[j] for each j in order (float32 out and val, int32
 * idx, repeats summed); the caller checked 0 <= idx < len(out) (compression/codecs/_sparse.py: accumulate).
 * numpy's add.at is the fallback: this is its loop without the per-element dispatch. */
static PyObject *scatter_add(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *out_o, *idx_o, *val_o;
    if (!PyArg_ParseTuple(args, "OOO", &out_o, &idx_o, &val_o)) return NULL;
    Py_buffer vo, vi, vv;
    if (PyObject_GetBuffer(out_o, &vo, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return NULL;
    if (PyObject_GetBuffer(idx_o, &vi, PyBUF_C_CONTIGUOUS) < 0) { PyBuffer_Release(&vo); return NULL; }
    if (PyObject_GetBuffer(val_o, &vv, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&vo); PyBuffer_Release(&vi);
        return NULL;
    }
    if (vi.len != vv.len) {
        PyBuffer_Release(&vo); PyBuffer_Release(&vi); PyBuffer_Release(&vv);
        PyErr_SetString(PyExc_ValueError, "scatter_add: idx and val differ in size");
        return NULL;
    }
    float *o = vo.buf;
    const int32_t *ix = vi.buf;
    const float *v = vv.buf;
    Py_ssize_t m = vi.len / 4;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < m; j++) o[ix[j]] += v[j];
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&vo); PyBuffer_Release(&vi); PyBuffer_Release(&vv);
    Py_RETURN_NONE;
}

/* sum_pairs(out, wires) -> None: out = the sum, in the order of the list, of the packed pairs in wires
 * (compression/codecs/_sparse.py's pack() format for a tensor of len(out) elements: float32 values, a uint32
 * pair count per block of 2**16 elements, the uint16 low bits of each index, 2 bytes of padding if
 * odd). Block by block: the block zeroed, then each wire's pairs of that block added, in the list's
 * order: every element sums its contributions in that order (the bits of zeroing out and adding each
 * wire in turn), while the block stays in cache and out is written once, in order. */
static PyObject *sum_pairs(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *out_o, *list;
    if (!PyArg_ParseTuple(args, "OO!", &out_o, &PyList_Type, &list)) return NULL;
    Py_buffer vo;
    if (PyObject_GetBuffer(out_o, &vo, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return NULL;
    Py_ssize_t nw = PyList_GET_SIZE(list), count = vo.len / 4, nb = (count + 65535) >> 16, got = 0;
    Py_buffer *w = PyMem_Calloc(nw ? nw : 1, sizeof(Py_buffer));
    Py_ssize_t *pos = PyMem_Calloc(nw ? nw : 1, sizeof(Py_ssize_t)), *pairs = PyMem_Calloc(nw ? nw : 1,
                                                                                           sizeof(Py_ssize_t));
    const char *bad = NULL;
    if (!w || !pos || !pairs) { PyErr_NoMemory(); goto done; }
    while (got < nw) {
        Py_ssize_t r = got;
        if (PyObject_GetBuffer(PyList_GET_ITEM(list, r), &w[r], PyBUF_C_CONTIGUOUS) < 0) goto done;
        got++;
        Py_ssize_t rest = w[r].len - 4 * nb;
        pairs[r] = rest / 6;
        if (rest < 0 || rest % 6 != 2 * (pairs[r] % 2) || ((uintptr_t)w[r].buf & 3)) {
            bad = "sum_pairs: a wire is not 4-aligned block counts and whole 6-byte pairs, padded to 4";
            goto done;
        }
        const uint32_t *per = (const uint32_t *)((const char *)w[r].buf + 4 * pairs[r]);
        Py_ssize_t total = 0;
        for (Py_ssize_t b = 0; b < nb; b++) total += per[b];
        if (total != pairs[r]) { bad = "sum_pairs: a wire's block counts do not add up to its pairs"; goto done; }
    }
    float *o = vo.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < nb && !bad; b++) {
        Py_ssize_t base = b << 16, len = count - base < 65536 ? count - base : 65536;
        memset(o + base, 0, len * 4);
        for (Py_ssize_t r = 0; r < nw; r++) {
            const char *d = w[r].buf;
            Py_ssize_t m = pairs[r], c = ((const uint32_t *)(d + 4 * m))[b], j = pos[r];
            const float *val = (const float *)d;
            const uint16_t *low = (const uint16_t *)(d + 4 * m + 4 * nb);
            for (Py_ssize_t e = j + c; j < e; j++) {
                if (low[j] >= len) { bad = "sum_pairs: an index lies past the end of the tensor"; break; }
                o[base + low[j]] += val[j];
            }
            pos[r] = j;
        }
    }
    Py_END_ALLOW_THREADS
done:
    if (bad) PyErr_SetString(PyExc_ValueError, bad);
    for (Py_ssize_t r = 0; r < got; r++) PyBuffer_Release(&w[r]);
    PyMem_Free(w);
    PyMem_Free(pos);
    PyMem_Free(pairs);
    PyBuffer_Release(&vo);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"candidates", candidates, METH_VARARGS, "candidates(acc, x, t, idx[, val]) -> count: acc += x; indices (and values) of |acc| >= t"},
    {"sum_pairs", sum_pairs, METH_VARARGS, "sum_pairs(out, wires): out = the sum of the packed pairs, in order"},
    {"scatter_add", scatter_add, METH_VARARGS, "scatter_add(out, idx, val): out[idx] += val, repeats summed"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "pyxccl._kernels",
                                    "The sparsifiers' kernels (compression/codecs/_sparse.py), without the GIL.", -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
