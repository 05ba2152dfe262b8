/* pyxccl._native: runs a compiled segment schedule (core/onehost.py) without the GIL.
 *
 * The Python executor in core/onehost.py is the reference; this is the same
 * thing, instruction by instruction, for the dtypes and ops it knows. A
 * program is the walker's order of one rank's rounds (BEGIN, local ops,
 * PUBLISH, incoming ops), 8 int64 per instruction, compiled once per
 * schedule. run() returns after a wait has slept for a while so that Python
 * can check the deadline and the peers, and is then called again from the
 * instruction it stopped at: every instruction waits before it changes
 * anything, so running it again is safe.
 *
 * Segment layout: see transport/segment.py (offsets are passed in).
 */
#define _GNU_SOURCE          /* sched_getcpu */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <math.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define PAUSE() __asm__ __volatile__("yield")
#else
#define PAUSE() ((void)0)
#endif

#define YIELD_EVERY_NS 20000

enum { I_BEGIN = 1, I_COPY, I_POST, I_PUBLISH, I_GET, I_SYNC };
enum { B_IN, B_OUT, B_TMP, B_WIN };
enum { DONE = 0, NAPPED, MISMATCH, BOUNDS, CMA_FAILED, UNSUPPORTED };
enum { SEQ, W0, W1, ADDR, NBYTES };

typedef struct {
    char *base;                 /* the segment */
    int64_t line, hdr_at, head, area, pids_at;
    int64_t me, n;
    char *buf[3];               /* in, out, tmp of this call */
    uint64_t call[3];           /* seq, w0, w1 */
    uint32_t round;
    int parity;
    int64_t spin_ns, yields;
    int dtype, op;
    char *posted;               /* what I posted this round (NULL: nothing) */
    char *scratch;              /* single-copy reads that are reduced land here first */
    int64_t scratch_bytes;
    int64_t peer, err;          /* who failed, and errno or offset */
} Run;

static inline int ge(uint32_t a, uint32_t b) { return (uint32_t)(a - b) < 0x80000000u; }
static inline volatile uint32_t *counter(Run *r, int64_t p) { return (volatile uint32_t *)(r->base + p * r->line); }
static inline volatile uint64_t *header(Run *r, int parity, int64_t p) {
    return (volatile uint64_t *)(r->base + r->hdr_at + (parity * r->n + p) * 64);
}
static inline volatile uint32_t *my_cpu(Run *r) { return counter(r, r->me) + 1 + r->n; }
static inline char *window(Run *r, int parity, int64_t p) { return r->base + r->head + (parity * r->n + p) * r->area; }

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Until rank p has published round `target`: spin, yield, then sleep on its counter (futex) for
 * at most 2 ms. Returns 1 when reached, 0 after a sleep (the caller goes back to Python). */
static int wait_for(Run *r, int64_t p, uint32_t target) {
    volatile uint32_t *c = counter(r, p);
    if (ge(__atomic_load_n(c, __ATOMIC_ACQUIRE), target)) return 1;
    /* Where each of us runs: a peer queued on this very core cannot publish until this one yields
     * (spinning would burn the time slice it needs); on another core it is worth spinning for. */
    int cpu = sched_getcpu();
    *my_cpu(r) = (uint32_t)cpu;
    volatile uint32_t *theirs = c + 1 + r->n;
    int64_t t0 = now_ns(), next_yield = t0 + YIELD_EVERY_NS;
    for (unsigned i = 1;; i++) {
        PAUSE();
        if (ge(__atomic_load_n(c, __ATOMIC_ACQUIRE), target)) return 1;
        if ((i & 15) == 0 && *theirs == (uint32_t)cpu) {
            sched_yield();
            cpu = sched_getcpu();
            *my_cpu(r) = (uint32_t)cpu;
        }
        if ((i & 63) == 0) {
            int64_t t = now_ns();
            if (t - t0 > r->spin_ns) break;
            if (t > next_yield) {   /* the rank we wait for may be queued on this very core: let it run */
                sched_yield();
                next_yield = t + YIELD_EVERY_NS;
            }
        }
    }
    for (int64_t i = 0; i < r->yields; i++) {
        sched_yield();
        if (ge(__atomic_load_n(c, __ATOMIC_ACQUIRE), target)) return 1;
    }
    volatile uint32_t *flag = c + 1 + r->me;
    __atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);        /* my flag before their counter: no lost wake-up */
    uint32_t cur = __atomic_load_n(c, __ATOMIC_ACQUIRE);
    if (!ge(cur, target)) {
        struct timespec nap = {0, 2000000};
        syscall(SYS_futex, (void *)c, FUTEX_WAIT, cur, &nap, NULL, 0);
    }
    __atomic_store_n(flag, 0, __ATOMIC_RELAXED);
    return ge(__atomic_load_n(c, __ATOMIC_ACQUIRE), target);
}

/* dst = dst (op) src, element-wise, in the order numpy would (so every rank gets the same bits). */
/* restrict: the two never overlap (a window and a user buffer, or two user buffers), so the
 * compiler may vectorize without run-time alias checks (-O3 in setup.py). */
#define LOOP(T, EXPR) do { T *restrict d = (T *)dst; const T *restrict s = (const T *)src; \
    int64_t k = nbytes / sizeof(T); for (int64_t i = 0; i < k; i++) { T a = d[i], b = s[i]; d[i] = (EXPR); } \
    } while (0)
#define FLOAT_OPS(T) switch (op) { \
    case 0: LOOP(T, a + b); return 1; case 1: LOOP(T, a * b); return 1; \
    case 2: LOOP(T, (a != a || a <= b) ? a : b); return 1; case 3: LOOP(T, (a != a || a >= b) ? a : b); return 1; \
    default: return 0; }
#define INT_OPS(T, U) switch (op) { \
    case 0: LOOP(T, (T)((U)a + (U)b)); return 1; case 1: LOOP(T, (T)((U)a * (U)b)); return 1; \
    case 2: LOOP(T, a <= b ? a : b); return 1; case 3: LOOP(T, a >= b ? a : b); return 1; \
    case 4: LOOP(T, a & b); return 1; case 5: LOOP(T, a | b); return 1; case 6: LOOP(T, a ^ b); return 1; \
    case 7: LOOP(T, (T)(a && b)); return 1; case 8: LOOP(T, (T)(a || b)); return 1; \
    default: return 0; }

static int reduce(int dtype, int op, char *dst, const char *src, int64_t nbytes) {
    switch (dtype) {
    case 0: FLOAT_OPS(float)
    case 1: FLOAT_OPS(double)
    case 2: INT_OPS(int8_t, uint8_t)
    case 3: INT_OPS(int16_t, uint16_t)
    case 4: INT_OPS(int32_t, uint32_t)
    case 5: INT_OPS(int64_t, uint64_t)
    case 6: INT_OPS(uint8_t, uint8_t)
    case 7: INT_OPS(uint16_t, uint16_t)
    case 8: INT_OPS(uint32_t, uint32_t)
    case 9: INT_OPS(uint64_t, uint64_t)
    }
    return 0;
}

static char *address(Run *r, int64_t buf, int64_t off) {
    return (buf == B_WIN ? window(r, r->parity, r->me) : r->buf[buf]) + off;
}

static int move(Run *r, char *dst, const char *src, int64_t nbytes, int64_t red) {
    if (!red) {
        if (dst != src) memmove(dst, src, nbytes);
        return DONE;
    }
    return reduce(r->dtype, r->op, dst, src, nbytes) ? DONE : UNSUPPORTED;
}

/* Does rank p make my call? (Compared in a call's first round, before any of p's data is read.) */
static int agrees(Run *r, int64_t p) {
    volatile uint64_t *h = header(r, r->parity, p);
    return h[SEQ] == r->call[0] && h[W0] == r->call[1] && h[W1] == r->call[2];
}

/* A Get: `nbytes` at `src_off` of p's window of `parity`, or of the buffer p posted. */
static int get(Run *r, int64_t p, int parity, int64_t src_off, char *dst, int64_t nbytes, int64_t red) {
    if (p == r->me && r->posted && parity == r->parity)
        return move(r, dst, r->posted + src_off, nbytes, red);
    volatile uint64_t *h = header(r, parity, p);
    int64_t posted = (int64_t)h[NBYTES];
    if (!posted)
        return move(r, dst, window(r, parity, p) + src_off, nbytes, red);
    r->peer = p;
    if (src_off < 0 || src_off + nbytes > posted) { r->err = src_off + nbytes; return BOUNDS; }
    char *to = dst;
    if (red) {
        if (r->scratch_bytes < nbytes) {
            free(r->scratch);
            r->scratch = malloc(nbytes);
            r->scratch_bytes = r->scratch ? nbytes : 0;
            if (!r->scratch) { r->err = ENOMEM; return CMA_FAILED; }
        }
        to = r->scratch;
    }
    pid_t pid = (pid_t)((volatile uint64_t *)(r->base + r->pids_at))[2 * p];
    for (int64_t done = 0; done < nbytes;) {
        struct iovec local = {to + done, (size_t)(nbytes - done)};
        struct iovec remote = {(void *)(uintptr_t)(h[ADDR] + src_off + done), (size_t)(nbytes - done)};
        ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (got <= 0) { r->err = got < 0 ? errno : EFAULT; return CMA_FAILED; }
        done += got;
    }
    return red ? move(r, dst, to, nbytes, 1) : DONE;
}

static int step(Run *r, const int64_t *i) {
    switch (i[0]) {
    case I_BEGIN: {      /* my window of this parity is free once everyone published the round before */
        uint32_t prev = r->round;
        for (int64_t p = 0; p < r->n; p++)
            if (p != r->me && !wait_for(r, p, prev)) { r->peer = p; return NAPPED; }
        r->round = prev + 1;
        r->parity = r->round & 1;
        r->posted = NULL;
        header(r, r->parity, r->me)[NBYTES] = 0;
        return DONE;
    }
    case I_COPY:
        return move(r, address(r, i[3], i[4]), address(r, i[1], i[2]), i[5], i[6]);
    case I_POST: {
        volatile uint64_t *h = header(r, r->parity, r->me);
        r->posted = address(r, i[1], i[2]);
        h[ADDR] = (uint64_t)(uintptr_t)r->posted;
        h[NBYTES] = (uint64_t)i[3];
        return DONE;
    }
    case I_PUBLISH: {
        volatile uint64_t *h = header(r, r->parity, r->me);
        h[SEQ] = r->call[0]; h[W0] = r->call[1]; h[W1] = r->call[2];
        volatile uint32_t *c = counter(r, r->me);
        *my_cpu(r) = (uint32_t)sched_getcpu();
        __atomic_store_n(c, r->round, __ATOMIC_RELEASE);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);    /* my counter before their flags (and counters) */
        for (int64_t w = 0; w < r->n; w++)
            if (c[1 + w]) { syscall(SYS_futex, (void *)c, FUTEX_WAKE, (int)r->n, NULL, NULL, 0); break; }
        if (i[1] == 0)      /* a call's first round: the peers already in it make my call? */
            for (int64_t p = 0; p < r->n; p++)
                if (p != r->me && ge(*counter(r, p), r->round) && !agrees(r, p)) { r->peer = p; return MISMATCH; }
        return DONE;
    }
    case I_GET:
    case I_SYNC: {
        int64_t p = i[1];
        if (i[0] == I_GET && i[7])      /* the round before: read before publishing, no wait */
            return get(r, p, r->parity ^ 1, i[2], address(r, i[3], i[4]), i[5], i[6]);
        if (p != r->me) {
            if (!wait_for(r, p, r->round)) { r->peer = p; return NAPPED; }
            if (i[0] == I_SYNC ? i[2] == 0 : i[8] == 0) {
                if (!agrees(r, p)) { r->peer = p; return MISMATCH; }
            }
        }
        return i[0] == I_SYNC ? DONE : get(r, p, r->parity, i[2], address(r, i[3], i[4]), i[5], i[6]);
    }
    }
    return UNSUPPORTED;
}

/* run(program, pc, segment, round, call, buffers, settings) -> the new round when done (the common
 * case, kept cheap), else (status, pc, round, peer, err)
 *   program:  C-contiguous int64, 9 values per instruction (opcode + 8 arguments)
 *   segment:  (base, line, hdr_at, head, area, pids_at, me, n): where things are in it
 *   round:    the segment's round counter (returned advanced)
 *   call:     (seq, w0, w1), the call's fingerprint
 *   buffers:  (in, out, tmp), contiguous arrays or None
 *   settings: (spin_ns, yields, dtype code, op code)   */
static PyObject *run(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer prog, views[3];
    PyObject *objs[3];
    Py_ssize_t pc;
    unsigned long long base, s0, s1, s2;
    long long line, hdr_at, head, area, pids_at, me, n, spin, yields;
    unsigned long rnd;
    int dtype, op;
    if (!PyArg_ParseTuple(args, "y*n(KLLLLLLL)k(KKK)(OOO)(LLii)", &prog, &pc, &base, &line, &hdr_at, &head, &area,
                          &pids_at, &me, &n, &rnd, &s0, &s1, &s2, &objs[0], &objs[1], &objs[2], &spin, &yields,
                          &dtype, &op))
        return NULL;
    Run run_, *r = &run_;
    memset(r, 0, sizeof *r);
    int got = 0;
    for (; got < 3; got++) {
        if (objs[got] == Py_None) continue;
        if (PyObject_GetBuffer(objs[got], &views[got], PyBUF_ANY_CONTIGUOUS) < 0) break;
        r->buf[got] = views[got].buf;
    }
    if (got < 3) {
        while (got-- > 0)
            if (objs[got] != Py_None) PyBuffer_Release(&views[got]);
        PyBuffer_Release(&prog);
        return NULL;
    }
    r->base = (char *)(uintptr_t)base;
    r->line = line; r->hdr_at = hdr_at; r->head = head; r->area = area; r->pids_at = pids_at;
    r->me = me; r->n = n; r->round = (uint32_t)rnd; r->parity = r->round & 1;
    r->call[0] = s0; r->call[1] = s1; r->call[2] = s2;
    r->spin_ns = spin; r->yields = yields; r->dtype = dtype; r->op = op;
    r->peer = -1;
    if (pc > 0) {       /* resumed: what I posted this round, if anything, is in my header */
        volatile uint64_t *h = header(r, r->parity, r->me);
        r->posted = h[NBYTES] ? (char *)(uintptr_t)h[ADDR] : NULL;
    }
    const int64_t *code = (const int64_t *)prog.buf;
    Py_ssize_t len = prog.len / (9 * (Py_ssize_t)sizeof(int64_t));
    int status = DONE;
    Py_BEGIN_ALLOW_THREADS
    for (; pc < len; pc++) {
        status = step(r, code + 9 * pc);
        if (status != DONE) break;
    }
    Py_END_ALLOW_THREADS
    free(r->scratch);
    for (int k = 0; k < 3; k++)
        if (objs[k] != Py_None) PyBuffer_Release(&views[k]);
    PyBuffer_Release(&prog);
    if (status == DONE) return PyLong_FromUnsignedLong(r->round);
    return Py_BuildValue("inkLL", status, pc, (unsigned long)r->round, (long long)r->peer, (long long)r->err);
}

static PyObject *can_reduce(PyObject *self, PyObject *args) {
    (void)self;
    int dtype, op;
    if (!PyArg_ParseTuple(args, "ii", &dtype, &op)) return NULL;
    char a[8] = {0}, b[8] = {0};
    return PyBool_FromLong(dtype >= 0 && op >= 0 && reduce(dtype, op, a, b, 8));
}

static PyObject *overlap(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b;
    Py_buffer va, vb;
    if (!PyArg_ParseTuple(args, "OO", &a, &b)) return NULL;
    if (PyObject_GetBuffer(a, &va, PyBUF_ANY_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(b, &vb, PyBUF_ANY_CONTIGUOUS) < 0) { PyBuffer_Release(&va); return NULL; }
    char *a0 = va.buf, *b0 = vb.buf;
    int hit = va.len && vb.len && a0 < b0 + vb.len && b0 < a0 + va.len;
    PyBuffer_Release(&va);
    PyBuffer_Release(&vb);
    return PyBool_FromLong(hit);
}

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
    {"overlap", overlap, METH_VARARGS, "overlap(a, b) -> bool: do two contiguous buffers share memory?"},
    {"run", run, METH_VARARGS, "Run a compiled segment program from instruction pc (see core/onehost.py)."},
    {"can_reduce", can_reduce, METH_VARARGS, "can_reduce(dtype_code, op_code) -> bool"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "pyxccl._native",
                                    "Segment schedules run in C, without the GIL.", -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
