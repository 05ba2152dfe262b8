/* The C core of the cost model (the tuner's and the simulator's): walk.py's timed walk (_walk_timed)
 * with tuning/cost.py's Timing semantics for message schedules on a net of hosts alike (the tuner's
 * Net of a regular communicator, the simulator's ClusterNet), over the flat arrays of
 * tuning/compact.py. It must give exactly what the Python reference gives (tuning/fast.py falls back
 * to it whenever this module or the case is missing): same floating-point operations in the same
 * order, same heap order (clock, then index), same wake rule.
 *
 * walk(kind, red, peer, count, step_start, rank_start, ranks, params) -> (time, bytes_sent, messages, stuck,
 *   clocks: each walked rank's clock at its end, float64 bytes)
 *   kind int8 (0 copy, 1 send, 2 recv; a step's ops in that order), red int8, peer int64,
 *   count int64 (elements), step_start int64 (steps + 1), rank_start int64 (schedules + 1),
 *   ranks int64 (the rank of each schedule);
 *   params: (n, per_host, hosts, nics, cpu, reduce_overlap, intra_shared, topology, fold, shm_inside, itemsize,
 *            socket_buffer, intra_alpha, intra_beta, inter_alpha, inter_beta, gamma, copy, stretch,
 *            memshare, membyte, dim0, dim1, dim2, groups)
 *   topology (links between hosts, sim/topology.py's routes): 0 none beyond the NICs (fat tree), 1 ring of
 *   hosts, 2 torus of dim0 x dim1 x dim2 hosts (row-major), 3 dragonfly of groups groups.
 *   shm_inside (CPU machines): the link inside a host is shared memory, copied by the processes (the
 *   sender's and the receiver's copies); 0: TCP on one host ("tcp_local": bytes * beta at the sender).
 *   fold: 0 none (channel a -> b), 1 Shift, 2 Xor (symmetric.py: channel keys, wakes to the rep,
 *   every resource on host 0).
 *   Then movekind, start (each walked rank's clock at the start, or None) and limit: the walk stops at the
 *   first step, or send within a step, that ends after it (the tuner has an estimate at the limit already:
 *   this one is later, since clocks only go on), with no rank called stuck and a time past the limit.
 *   Then rep (int64 per step, or None: each once): a step is run rep times in a row, as that many copies of
 *   it would be (compact.py's run-length steps: a ring's n - 1 alike steps held once), and stride (int64
 *   per op, or None: 0): in the k-th run of its step an op's peer is (peer + k * stride) mod n (a pairwise
 *   exchange's n - 1 steps, to r + k and from r - k). Then times (int64 per op, or None: 1): a copy is made
 *   that many times in a row (a regrouping's thousands of alike copies held once); other ops must have 1.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t n, p, hosts, nics;
    int cpu, overlap, shared, ring, fold, shm_in;   /* ring: the topology code (1 ring, 2 torus, 3 dragonfly) */
    int64_t itemsize, sockbuf;
    double ia, ib, ea, eb, gamma, copy, stretch;
    double memshare, membyte;       /* Timing.memshare, Timing.membyte[i] (the same for every rank) */
    int64_t dims[3], groups;        /* a torus's dimensions (row-major), a dragonfly's groups */
    /* each rank's host (r / p) and place on it (r % p), looked up: a walk asks them of every operation, and a
     * 64-bit division costs tens of cycles (most of the walk's time, measured: the folded pairwise alltoall) */
    const int64_t *host_of, *local_of;
} Params;

/* Timing._cost: nbytes at rate (seconds per byte in cache), touches of them in user buffers */
static inline double cost(const Params *P, int64_t nbytes, double rate, int touches);

/* ---- channels: FIFO queues of messages per key, an open-addressing hash table ---- */

typedef struct { double arrive, extra; int64_t next; } Msg;
typedef struct { int64_t key, head, tail; } Slot;

typedef struct {
    Slot *slots; int64_t cap, used;
    Msg *msgs; int64_t mcap, mused, freelist;
} Chans;

static inline uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static int chans_init(Chans *c) {
    c->cap = 1024; c->used = 0;
    c->slots = malloc(sizeof(Slot) * c->cap);
    c->mcap = 1024; c->mused = 0; c->freelist = -1;
    c->msgs = malloc(sizeof(Msg) * c->mcap);
    if (!c->slots || !c->msgs) return -1;
    for (int64_t i = 0; i < c->cap; i++) c->slots[i].key = -1;
    return 0;
}

static void chans_free(Chans *c) { free(c->slots); free(c->msgs); }

static Slot *chans_find(Chans *c, int64_t key, int create) {
    uint64_t m = (uint64_t)c->cap - 1, h = mix((uint64_t)key) & m;
    while (c->slots[h].key != -1) {
        if (c->slots[h].key == key) return &c->slots[h];
        h = (h + 1) & m;
    }
    if (!create) return NULL;
    if ((c->used + 1) * 2 > c->cap) {          /* grow, then insert */
        int64_t ncap = c->cap * 2;
        Slot *ns = malloc(sizeof(Slot) * ncap);
        if (!ns) return NULL;
        for (int64_t i = 0; i < ncap; i++) ns[i].key = -1;
        uint64_t nm = (uint64_t)ncap - 1;
        for (int64_t i = 0; i < c->cap; i++) {
            if (c->slots[i].key == -1) continue;
            uint64_t g = mix((uint64_t)c->slots[i].key) & nm;
            while (ns[g].key != -1) g = (g + 1) & nm;
            ns[g] = c->slots[i];
        }
        free(c->slots);
        c->slots = ns; c->cap = ncap; m = nm;
        h = mix((uint64_t)key) & m;
        while (c->slots[h].key != -1) h = (h + 1) & m;
    }
    c->used++;
    c->slots[h].key = key; c->slots[h].head = c->slots[h].tail = -1;
    return &c->slots[h];
}

static int chans_push(Chans *c, int64_t key, double arrive, double extra) {
    Slot *s = chans_find(c, key, 1);
    if (!s) return -1;
    int64_t k;
    if (c->freelist >= 0) { k = c->freelist; c->freelist = c->msgs[k].next; }
    else {
        if (c->mused == c->mcap) {
            Msg *nm = realloc(c->msgs, sizeof(Msg) * c->mcap * 2);
            if (!nm) return -1;
            c->msgs = nm; c->mcap *= 2;
        }
        k = c->mused++;
    }
    c->msgs[k].arrive = arrive; c->msgs[k].extra = extra; c->msgs[k].next = -1;
    if (s->tail >= 0) c->msgs[s->tail].next = k; else s->head = k;
    s->tail = k;
    return 0;
}

static int chans_pop(Chans *c, int64_t key, double *arrive, double *extra) {
    Slot *s = chans_find(c, key, 0);
    if (!s || s->head < 0) return 0;
    int64_t k = s->head;
    *arrive = c->msgs[k].arrive; *extra = c->msgs[k].extra;
    s->head = c->msgs[k].next;
    if (s->head < 0) s->tail = -1;
    c->msgs[k].next = c->freelist; c->freelist = k;
    return 1;
}

/* ---- the heap of (clock, index) ---- */

typedef struct { double t; int64_t i; } Entry;

static inline int less(Entry a, Entry b) { return a.t < b.t || (a.t == b.t && a.i < b.i); }

static void heap_push(Entry *h, int64_t *len, Entry e) {
    int64_t k = (*len)++;
    while (k > 0) {
        int64_t up = (k - 1) / 2;
        if (!less(e, h[up])) break;
        h[k] = h[up]; k = up;
    }
    h[k] = e;
}

/* Put e where the top was and restore the heap (heapq's way: the hole goes down to a leaf along the
 * smaller children, then e rises from there). */
static void heap_replace_top(Entry *h, int64_t n, Entry e) {
    int64_t k = 0, c;
    while ((c = 2 * k + 1) < n) {
        if (c + 1 < n && less(h[c + 1], h[c])) c++;
        h[k] = h[c]; k = c;
    }
    while (k > 0) {
        int64_t up = (k - 1) / 2;
        if (!less(e, h[up])) break;
        h[k] = h[up]; k = up;
    }
    h[k] = e;
}

static Entry heap_pop(Entry *h, int64_t *len) {
    Entry top = h[0];
    (*len)--;
    if (*len > 0) heap_replace_top(h, *len, h[*len]);
    return top;
}

/* ---- the model ---- */

static inline double dmax(double a, double b) { return b > a ? b : a; }   /* Python's max(a, b) */

static inline double cost(const Params *P, int64_t nbytes, double rate, int touches) {
    double cpu = rate * P->stretch;
    if (P->memshare == 0.0 || !touches) return (double)nbytes * cpu;
    return (double)nbytes * (cpu * (1 - P->memshare) + P->memshare * dmax(cpu, (double)touches * P->membyte));
}

static inline int64_t chan_key(const Params *P, int64_t a, int64_t b) {
    if (P->fold == 0) return a * P->n + b;
    int64_t ra = P->local_of[a], d = b - a;        /* (a, b in [0, n): b - a in (-n, n)) */
    if (P->fold == 1) return ra * P->n + (d < 0 ? d + P->n : d);
    return ra * P->n + (a ^ b);
}

/* ---- the shared resources' busy intervals (cost.Booked, the same operations in the same order) ---- */

/* A resource's busy intervals in time order, in a gap buffer: the first g at the buffer's start, the
 * others at its end. A rank books its step's messages at later and later times, so its insertions move
 * forward through the intervals: the gap follows them, and each costs what it moved past since the last
 * (a sorted array cost the whole tail every time: the direct alltoall's one step of n - 1 messages a
 * rank, booked into the gaps of another rank's, cost O(messages^2) moves). */
typedef struct { double *s, *e; int64_t len, cap, g; } Busy;

static inline int64_t phys(const Busy *b, int64_t k) { return k < b->g ? k : k + (b->cap - b->len); }
static inline double *S_(const Busy *b, int64_t k) { return b->s + phys(b, k); }
static inline double *E_(const Busy *b, int64_t k) { return b->e + phys(b, k); }

static inline int64_t after(const Busy *b, double s) {     /* bisect_right(ends, s) */
    /* searched from the gap out, doubling: a rank books near where it booked last (the gap), so the
     * interval sought is mostly within a few of it; the answer is bisect_right's all the same */
    int64_t lo, hi, g = b->g, n = b->len, step = 1;
    if (g > 0 && s < *E_(b, g - 1)) {            /* before the gap: in [lo, g - 1] */
        hi = g - 1;
        lo = hi - 1;
        while (lo > 0 && s < *E_(b, lo)) { hi = lo; lo -= (step *= 2); }
        if (lo < 0) lo = 0;
    } else {                                    /* at or after the gap: in [g, hi] */
        lo = g;
        hi = g;
        while (hi < n && !(s < *E_(b, hi))) { lo = hi + 1; hi += (step *= 2); }
        if (hi > n) hi = n;
    }
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (s < *E_(b, mid)) hi = mid; else lo = mid + 1;
    }
    return lo;
}

static void gap_to(Busy *b, int64_t k) {                   /* the first k intervals at the start */
    int64_t gap = b->cap - b->len;
    if (k < b->g) {
        memmove(b->s + k + gap, b->s + k, sizeof(double) * (b->g - k));
        memmove(b->e + k + gap, b->e + k, sizeof(double) * (b->g - k));
    } else if (k > b->g) {
        memmove(b->s + b->g, b->s + b->g + gap, sizeof(double) * (k - b->g));
        memmove(b->e + b->g, b->e + b->g + gap, sizeof(double) * (k - b->g));
    }
    b->g = k;
}

/* The intervals that end at or before `floor` dropped: no booking starts before it (each starts at or after
 * its rank's clock, and floor is every rank's least), and which busy time a booking finds depends only on the
 * time busy after its start. A walk of thousands of ranks kept thousands of intervals a link, and a
 * booking's first read of them missed the cache (the message level's ring on 4,096 ranks). */
static void drop_before(Busy *b, double floor) {
    int64_t k = b->len ? after(b, floor) : 0;
    if (!k) return;
    gap_to(b, k);           /* the first k at the start: dropped with the gap that follows them */
    b->g = 0;
    b->len -= k;
}

/* every how many ranks' turns a walk drops the intervals no booking can take (0: its own choice; tests set 1) */
static int64_t prune_every = 0;

static int grow(Busy *b) {
    int64_t cap = b->cap ? 2 * b->cap : 64, right = b->len - b->g;
    double *ns = realloc(b->s, sizeof(double) * cap);
    if (!ns) return -1;
    b->s = ns;
    double *ne = realloc(b->e, sizeof(double) * cap);
    if (!ne) return -1;
    b->e = ne;
    memmove(b->s + cap - right, b->s + b->cap - right, sizeof(double) * right);
    memmove(b->e + cap - right, b->e + b->cap - right, sizeof(double) * right);
    b->cap = cap;
    return 0;
}

/* Booked.take: the start of the earliest d seconds free on every resource of res at or after t, booked
 * on each; -1 on no memory */
static double book(Busy *B, const int64_t *res, int nr, double t, double d, int *oom, int64_t *cur) {
    if (d <= 0) return t;
    double s = t;
    /* cur[x]: after(res[x], s); s only goes on, so each is moved forward from where it was */
    for (int x = 0; x < nr; x++) cur[x] = B[res[x]].len ? after(&B[res[x]], s) : 0;
    for (int moved = 1; moved;) {
        moved = 0;
        for (int x = 0; x < nr; x++) {
            Busy *b = &B[res[x]];
            if (!b->len) continue;
            int64_t j = cur[x];
            while (j < b->len && !(s < *E_(b, j))) j++;
            cur[x] = j;
            if (j < b->len && *S_(b, j) < s + d) { s = *E_(b, j); moved = 1; }
        }
    }
    double e = s + d;
    for (int x = 0; x < nr; x++) {
        Busy *b = &B[res[x]];
        int64_t j = cur[x];
        while (j < b->len && !(s < *E_(b, j))) j++;         /* after(b, s) */
        if (j && *E_(b, j - 1) == s) {
            if (j < b->len && *S_(b, j) == e) {       /* joins the two around it */
                *E_(b, j - 1) = *E_(b, j);
                gap_to(b, j);
                b->len--;                             /* (interval j was the first after the gap) */
            } else
                *E_(b, j - 1) = e;
        } else if (j < b->len && *S_(b, j) == e)
            *S_(b, j) = s;
        else {
            if (b->len == b->cap && grow(b) < 0) { *oom = 1; return -1; }
            gap_to(b, j);
            b->s[b->g] = s; b->e[b->g] = e;
            b->g++;
            b->len++;
        }
    }
    return s;
}

/* Resources (ClusterNet.route) as indices into one array of busy intervals. */
typedef struct { int64_t out, in, bus, nicout, nicin, hop, total; } Layout;

static int route(const Params *P, const Layout *L, int64_t a, int64_t b, int64_t *res) {
    int64_t ha = P->host_of[a], hb = P->host_of[b];
    int fold = P->fold != 0;
    int k = 0;
    if (ha == hb) {
        if (P->cpu) return 0;
        if (P->shared) { res[k++] = L->bus + (fold ? 0 : ha); return k; }
        res[k++] = L->out + (fold ? P->local_of[a] : a);
        res[k++] = L->in + (fold ? P->local_of[b] : b);
        return k;
    }
    res[k++] = L->nicout + (fold ? 0 : ha) * P->nics + (P->nics > 1 ? P->local_of[a] % P->nics : 0);
    res[k++] = L->nicin + (fold ? 0 : hb) * P->nics + (P->nics > 1 ? P->local_of[b] % P->nics : 0);
    if (P->ring == 1 && P->hosts > 2) {
        int64_t H = P->hosts, fwd = ((hb - ha) % H + H) % H;
        int64_t step = fwd <= H - fwd ? 1 : -1;
        int64_t h = ha;
        if (fold) { res[k++] = L->hop + 0 * 2 + (step == 1 ? 0 : 1); return k; }
        while (h != hb) {
            res[k++] = L->hop + h * 2 + (step == 1 ? 0 : 1);
            h = ((h + step) % H + H) % H;
        }
    } else if (P->ring == 2) {          /* topology.torus_hops: dimension-ordered, the shorter way round */
        int64_t x[3], want[3], stride[3], h = ha;
        stride[2] = 1; stride[1] = P->dims[2]; stride[0] = P->dims[1] * P->dims[2];
        for (int d = 0; d < 3; d++) {
            x[d] = (ha / stride[d]) % P->dims[d];
            want[d] = (hb / stride[d]) % P->dims[d];
        }
        for (int d = 0; d < 3; d++) {
            int64_t size = P->dims[d], fwd = ((want[d] - x[d]) % size + size) % size;
            int64_t step = fwd <= size - fwd ? 1 : -1;
            while (x[d] != want[d]) {
                res[k++] = L->hop + (h * 3 + d) * 2 + (step == 1 ? 0 : 1);
                int64_t nxt = ((x[d] + step) % size + size) % size;
                h += (nxt - x[d]) * stride[d];
                x[d] = nxt;
            }
        }
    } else if (P->ring == 3) {          /* topology.dragonfly_hops: local, global, local */
        int64_t a = P->hosts / P->groups, ga = ha / a, gb = hb / a;
        if (ga == gb) { res[k++] = L->hop + ha * a + hb % a; return k; }
        int64_t gwa = ga * a + gb % a, gwb = gb * a + ga % a;
        if (ha != gwa) res[k++] = L->hop + ha * a + gwa % a;
        res[k++] = L->hop + P->hosts * a + ga * P->groups + gb;
        if (gwb != hb) res[k++] = L->hop + gwb * a + hb % a;
    }
    return k;
}

typedef struct { Py_buffer b; const char *name; Py_ssize_t itemsize; } Arr;

static int get_arr(PyObject *o, Arr *a, const char *name, Py_ssize_t itemsize) {
    a->name = name; a->itemsize = itemsize;
    if (PyObject_GetBuffer(o, &a->b, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (a->b.len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of %zd-byte items", name, a->b.len,
                     itemsize);
        PyBuffer_Release(&a->b);
        return -1;
    }
    return 0;
}

/* (peers, moves in [0, n), checked on entry: (q + d) mod n without a division) */
#define MOVE(q) (movekind == 0 ? (q) : movekind == 1 ? ((q) + d >= P.n ? (q) + d - P.n : (q) + d) : ((q) ^ d))
/* op j's peer in run k of its step */
#define PEER(j, k) (stride && stride[j] ? peer_in_run(peer[j], k, stride[j], P.n) : peer[j])

/* (peer + k * stride) mod n, in [0, n) (peer in [0, n), k >= 0; the stride of either sign) */
static inline int64_t peer_in_run(int64_t peer, int64_t k, int64_t stride, int64_t n) {
    int64_t s = stride > -n && stride < n ? stride : stride % n, v = peer + (k < n ? k : k % n) * s;
    if (v >= 0 && v < n) return v;              /* (a stride of +-1, the usual one: no division) */
    if (v < 0 && v >= -n) return v + n;
    if (v >= n && v < 2 * n) return v - n;
    v %= n;
    return v < 0 ? v + n : v;
}

static PyObject *walk(PyObject *self, PyObject *args) {
    PyObject *o[10];
    Params P;
    int movekind;
    double limit = INFINITY;        /* a step that ends past it ends the walk (its estimate is above it) */
    /* the optional arrays (None: every walked rank's clock 0 at the start, each step once, no stride, each
     * copy once), all of 8-byte items */
    enum { O_START, O_REP, O_STRIDE, O_TIMES, NOPT };
    static const char *opt_names[NOPT] = {"start", "rep", "stride", "times"};
    PyObject *opt_o[NOPT] = {Py_None, Py_None, Py_None, Py_None};
    if (!PyArg_ParseTuple(args, "OOOOOOOOOO(LLLLiiiiiiLLdddddddddLLLL)i|OdOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &o[6], &o[7], &o[8], &o[9], &P.n, &P.p, &P.hosts, &P.nics, &P.cpu, &P.overlap, &P.shared,
                          &P.ring, &P.fold, &P.shm_in, &P.itemsize, &P.sockbuf, &P.ia, &P.ib, &P.ea, &P.eb, &P.gamma, &P.copy,
                          &P.stretch, &P.memshare, &P.membyte, &P.dims[0], &P.dims[1], &P.dims[2], &P.groups,
                          &movekind, &opt_o[O_START], &limit, &opt_o[O_REP], &opt_o[O_STRIDE], &opt_o[O_TIMES]))
        return NULL;
    static const char *names[10] = {"kind", "red", "peer", "count", "step_start", "rank_start", "ranks", "tmpl",
                                    "move", "touch"};
    static const Py_ssize_t sizes[10] = {1, 1, 8, 8, 8, 8, 8, 8, 8, 1};
    Arr A[10], X[NOPT];
    int got = 0, has[NOPT] = {0};
    for (; got < 10; got++)
        if (get_arr(o[got], &A[got], names[got], sizes[got]) < 0) goto fail_buffers;
    for (int k = 0; k < NOPT; k++) {
        if (opt_o[k] == Py_None) continue;
        if (get_arr(opt_o[k], &X[k], opt_names[k], 8) < 0) goto fail_start;
        has[k] = 1;
    }
    const double *start = has[O_START] ? X[O_START].b.buf : NULL;
    const int64_t *rep = has[O_REP] ? X[O_REP].b.buf : NULL, *stride = has[O_STRIDE] ? X[O_STRIDE].b.buf : NULL,
                  *times = has[O_TIMES] ? X[O_TIMES].b.buf : NULL;
    const int8_t *kind = A[0].b.buf, *red = A[1].b.buf;
    const int64_t *peer = A[2].b.buf, *count = A[3].b.buf, *step_start = A[4].b.buf, *rank_start = A[5].b.buf,
                  *ranks = A[6].b.buf, *tmpl = A[7].b.buf, *move = A[8].b.buf;
    const int8_t *touch = A[9].b.buf;
    /* nt schedules of operations (templates); ns ranks walked, rank i running template tmpl[i] with every
     * peer moved by move[i] (movekind 0: not moved, 1: (q + d) mod n, 2: q ^ d) */
    int64_t nops = A[0].b.len, nsteps = A[4].b.len / 8 - 1, nt = A[5].b.len / 8 - 1, ns = A[6].b.len / 8;
    if (A[1].b.len != nops || A[9].b.len != nops || A[2].b.len / 8 != nops || A[3].b.len / 8 != nops || nsteps < 0 || nt < 0 ||
        A[7].b.len / 8 != ns || A[8].b.len / 8 != ns || rank_start[nt] != nsteps || step_start[nsteps] != nops ||
        P.n < 1 || P.p < 1 || P.hosts < 1 || P.nics < 1 || movekind < 0 || movekind > 2 || P.ring < 0 || P.ring > 3 ||
        P.dims[0] < 1 || P.dims[1] < 1 || P.dims[2] < 1 ||
        (P.ring == 2 && P.dims[0] * P.dims[1] * P.dims[2] != P.hosts) ||
        (P.ring == 3 && (P.groups < 1 || P.hosts % P.groups)) || (P.ring >= 2 && P.fold) ||
        (start && X[O_START].b.len / 8 != ns) || (rep && X[O_REP].b.len / 8 != nsteps) ||
        (stride && X[O_STRIDE].b.len / 8 != nops) || (times && X[O_TIMES].b.len / 8 != nops)) {
        PyErr_SetString(PyExc_ValueError, "walk: inconsistent arrays or parameters");
        goto fail_start;
    }
    for (int64_t i = 0; i < ns; i++)
        if (ranks[i] < 0 || ranks[i] >= P.n || tmpl[i] < 0 || tmpl[i] >= nt || move[i] < 0 || move[i] >= P.n) {
            PyErr_SetString(PyExc_ValueError, "walk: a rank outside the cluster, or a template or move out of range");
            goto fail_start;
        }
    if (movekind == 2 && (P.n & (P.n - 1))) {
        PyErr_SetString(PyExc_ValueError, "walk: XOR moves need a power of two of ranks");
        goto fail_start;
    }
    for (int64_t j = 0; j < nops; j++)
        if ((kind[j] != 0 && (peer[j] < 0 || peer[j] >= P.n)) || kind[j] < 0 || kind[j] > 2 ||
            (times && (times[j] < 1 || (kind[j] != 0 && times[j] != 1)))) {
            PyErr_SetString(PyExc_ValueError, "walk: an operation's kind, peer or times is out of range (times: a copy's, at least 1)");
            goto fail_start;
        }
    for (int64_t s = 0; s < nsteps; s++) {
        if (step_start[s + 1] < step_start[s] || (rep && rep[s] < 1)) goto bad_order;
        for (int64_t j = step_start[s] + 1; j < step_start[s + 1]; j++)
            if (kind[j] < kind[j - 1]) goto bad_order;
    }
    for (int64_t i = 0; i < nt; i++)
        if (rank_start[i + 1] < rank_start[i]) goto bad_order;

    Layout L;
    L.out = 0; L.in = L.out + P.n; L.bus = L.in + P.n; L.nicout = L.bus + P.hosts;
    L.nicin = L.nicout + P.hosts * P.nics; L.hop = L.nicin + P.hosts * P.nics;
    /* the links between hosts, directed: a ring's 2 per host, a torus's 2 per host and dimension, a
     * dragonfly's local links (a per host) then its global ones (groups^2) */
    int64_t a_df = P.ring == 3 ? P.hosts / P.groups : 0;
    L.total = L.hop + (P.ring == 2 ? 6 * P.hosts : P.ring == 3 ? P.hosts * a_df + P.groups * P.groups : 2 * P.hosts);

    int64_t maxres = 2 + (P.ring == 1 ? P.hosts : P.ring == 2 ? P.dims[0] + P.dims[1] + P.dims[2]
                          : P.ring == 3 ? 3 : 0);
    double *clock = calloc(ns + 1, sizeof(double)), *T = calloc(ns + 1, sizeof(double)),
           *recv_free = calloc(ns + 1, sizeof(double)), *out_done = calloc(ns + 1, sizeof(double));
    Busy *busy = calloc(L.total ? L.total : 1, sizeof(Busy));
    int64_t *pc = calloc(ns + 1, sizeof(int64_t)), *taken = calloc(ns + 1, sizeof(int64_t)),
            *sent = calloc(ns + 1, sizeof(int64_t)), *again = calloc(ns + 1, sizeof(int64_t)),
            *where = malloc(sizeof(int64_t) * P.n), *host_of = malloc(sizeof(int64_t) * P.n),
            *local_of = malloc(sizeof(int64_t) * P.n),
            *res = malloc(sizeof(int64_t) * maxres), *cur = malloc(sizeof(int64_t) * maxres);
    char *begun = calloc(ns + 1, 1), *queued = calloc(ns + 1, 1), *parked = calloc(ns + 1, 1);
    Entry *heap = malloc(sizeof(Entry) * (ns + 1));
    Chans C;
    int chans_ok = chans_init(&C) == 0;
    PyObject *result = NULL;
    if (!clock || !T || !recv_free || !out_done || !busy || !pc || !taken || !sent || !again || !where || !host_of ||
        !local_of || !res || !cur || !begun || !queued || !parked || !heap || !chans_ok) {
        PyErr_NoMemory();
        goto done;
    }
    for (int64_t r = 0; r < P.n; r++) { where[r] = -1; host_of[r] = r / P.p; local_of[r] = r % P.p; }
    P.host_of = host_of;
    P.local_of = local_of;
    for (int64_t i = 0; i < ns; i++) where[ranks[i]] = i;      /* {s.rank: i}: the last one wins */

    int64_t messages = 0, hlen = 0, turns = 0;
    /* a prune costs a pass over the ranks walked and the links: once in as many turns */
    const int64_t every = prune_every > 0 ? prune_every : 8 * ns + L.total + 1024;
    int oom = 0, cut = 0;
    double cut_at = 0.0;            /* with cut: the time past the limit (a clock mid-step may be before it) */
    const double half_intra = P.ia / 2, half_inter = P.ea / 2;
    Py_BEGIN_ALLOW_THREADS
    if (start)
        for (int64_t i = 0; i < ns; i++) { clock[i] = start[i]; heap_push(heap, &hlen, (Entry){clock[i], i}); }
    else
        for (int64_t i = 0; i < ns; i++) { Entry e = {0.0, i}; heap[hlen++] = e; }  /* sorted: a heap already */
    for (int64_t i = 0; i < ns; i++) queued[i] = 1;
    int64_t next = -1;              /* a rank that went back in the queue: it takes the top's place */
    while ((hlen > 0 || next >= 0) && !oom && !cut) {
        int64_t i;
        if (next >= 0) {            /* heappush then heappop: the top comes out (the pushed is later) */
            i = heap[0].i;
            Entry e = {clock[next], next};
            heap_replace_top(heap, hlen, e);
            next = -1;
        } else
            i = heap_pop(heap, &hlen).i;
        queued[i] = 0;
        if (++turns >= every) {
            turns = 0;
            double floor = INFINITY;        /* the least clock of a rank that may still book */
            for (int64_t x = 0; x < ns; x++)
                if (rank_start[tmpl[x]] + pc[x] < rank_start[tmpl[x] + 1] && clock[x] < floor) floor = clock[x];
            if (floor < INFINITY)
                for (int64_t x = 0; x < L.total; x++) drop_before(&busy[x], floor);
        }
        int64_t r = ranks[i], first = rank_start[tmpl[i]], last = rank_start[tmpl[i] + 1];
        int64_t d = move[i];
        int finished = 0;
        for (;;) {
            if (first + pc[i] >= last) { finished = 1; break; }
            int64_t s = first + pc[i], a = step_start[s], b = step_start[s + 1];
            if (!begun[i]) {
                int64_t j = a;
                for (; j < b && kind[j] == 0; j++)          /* local copies */
                    for (int64_t m = times ? times[j] : 1; m > 0; m--)
                        clock[i] += cost(&P, count[j] * P.itemsize, red[j] ? P.gamma : P.copy, touch[j]);
                T[i] = recv_free[i] = out_done[i] = clock[i];
                int64_t sends = j;
                for (; j < b && kind[j] == 1; j++) {         /* sends */
                    int64_t q = MOVE(PEER(j, again[i])), nb = count[j] * P.itemsize;
                    int inside = host_of[r] == host_of[q];
                    double alpha = inside ? P.ia : P.ea, beta = inside ? P.ib : P.eb;
                    int nr = route(&P, &L, r, q, res);
                    sent[i] += nb;
                    messages++;
                    if (!P.cpu) {
                        double start = book(busy, res, nr, T[i], (double)nb * beta, &oom, cur);
                        if (oom) break;
                        double end = start + (double)nb * beta;
                        out_done[i] = dmax(out_done[i], end);
                        if (chans_push(&C, chan_key(&P, r, q), end + alpha, start) < 0) { oom = 1; break; }
                        if (end > limit) { cut = 1; cut_at = end; break; }
                        continue;
                    }
                    double f = P.stretch, half = (inside ? half_intra : half_inter) * f;
                    double t = T[i] + half, arrive;
                    if (nr) {
                        double m = book(busy, res, nr, t, (double)nb * beta, &oom, cur);
                        if (oom) break;
                        arrive = m + (double)nb * beta;
                        t = dmax(t, arrive - (double)(nb < P.sockbuf ? nb : P.sockbuf) * beta);
                    } else {
                        t += inside && P.shm_in ? cost(&P, nb, beta, 1) : (double)nb * beta;
                        arrive = t;
                    }
                    T[i] = t;
                    if (chans_push(&C, chan_key(&P, r, q), arrive, half) < 0) { oom = 1; break; }
                    if (t > limit) { cut = 1; cut_at = t; break; }    /* (a step of many sends: a direct exchange's) */
                }
                if (oom || cut) break;
                begun[i] = 1;
                taken[i] = j;
                for (int64_t x = sends; x < j; x++) {          /* wake the parked ranks sent to */
                    int64_t q = MOVE(PEER(x, again[i])), w = where[P.fold ? local_of[q] : q];
                    if (w >= 0 && parked[w]) {
                        parked[w] = 0;
                        if (!queued[w]) {
                            queued[w] = 1;
                            Entry e = {clock[w], w};
                            heap_push(heap, &hlen, e);
                        }
                    }
                }
            }
            int64_t j = taken[i];
            for (; j < b; j++) {                              /* receives, in the order written */
                int64_t q = MOVE(PEER(j, again[i])), nb = count[j] * P.itemsize;
                double arrive, extra;
                if (!chans_pop(&C, chan_key(&P, q, r), &arrive, &extra)) break;
                if (!P.cpu) {
                    double done = arrive;
                    if (red[j])
                        done = P.overlap ? dmax(arrive, extra + (double)nb * P.gamma) : arrive + (double)nb * P.gamma;
                    out_done[i] = dmax(out_done[i], done);
                    continue;
                }
                if (P.shm_in && host_of[q] == host_of[r])      /* Timing.take: klass "shm" */
                    arrive = dmax(arrive, recv_free[i] + cost(&P, nb, P.ib, 1 + (red[j] != 0)));
                double done = dmax(recv_free[i], arrive) + extra;
                recv_free[i] = done;
                if (red[j]) done += (double)nb * P.gamma * P.stretch;
                out_done[i] = dmax(out_done[i], done);
            }
            taken[i] = j;
            if (j < b) break;                                  /* waits: parks */
            clock[i] = dmax(out_done[i], T[i]);
            if (!rep || ++again[i] >= rep[s]) {         /* (else the same step again) */
                pc[i]++;
                again[i] = 0;
            }
            begun[i] = 0;
            if (clock[i] > limit) { cut = 1; cut_at = clock[i]; break; }          /* clocks only go on: the end is later still */
            if (hlen > 0 && clock[i] > heap[0].t) {            /* another rank's step comes first */
                queued[i] = 1;
                next = i;
                break;
            }
        }
        if (!finished && !queued[i]) parked[i] = 1;
    }
    Py_END_ALLOW_THREADS
    if (oom) { PyErr_NoMemory(); goto done; }
    {
        double tmax = 0.0;
        int64_t smax = 0;
        for (int64_t i = 0; i < ns; i++) {
            if (i == 0 || clock[i] > tmax) tmax = clock[i];
            if (i == 0 || sent[i] > smax) smax = sent[i];
        }
        if (cut) tmax = dmax(tmax, cut_at);
        PyObject *stuck = PyList_New(0);
        if (!stuck) goto done;
        for (int64_t i = 0; i < ns; i++)
            if (!cut && rank_start[tmpl[i]] + pc[i] < rank_start[tmpl[i] + 1]) {
                PyObject *v = PyLong_FromLongLong(ranks[i]);
                if (!v || PyList_Append(stuck, v) < 0) { Py_XDECREF(v); Py_DECREF(stuck); goto done; }
                Py_DECREF(v);
            }
        PyObject *clocks = PyBytes_FromStringAndSize((const char *)clock, (Py_ssize_t)(sizeof(double) * ns));
        if (!clocks) { Py_DECREF(stuck); goto done; }
        result = Py_BuildValue("(dLLNN)", tmax, (long long)smax, (long long)messages, stuck, clocks);
    }
done:
    free(clock); free(T); free(recv_free); free(out_done);
    if (busy) for (int64_t x = 0; x < L.total; x++) { free(busy[x].s); free(busy[x].e); }
    free(busy); free(pc); free(taken); free(sent); free(again);
    free(where); free(host_of); free(local_of); free(res); free(cur); free(begun); free(queued); free(parked); free(heap);
    if (chans_ok) chans_free(&C);
    for (int k = 0; k < 10; k++) PyBuffer_Release(&A[k].b);
    for (int k = 0; k < NOPT; k++) if (has[k]) PyBuffer_Release(&X[k].b);
    return result;
bad_order:
    PyErr_SetString(PyExc_ValueError, "walk: a step's operations are not in the walker's order (copies, sends, "
                    "receives), the boundaries go backwards or a step is repeated less than once");
fail_start:
    for (int k = 0; k < NOPT; k++) if (has[k]) PyBuffer_Release(&X[k].b);
fail_buffers:
    for (int k = 0; k < got; k++) PyBuffer_Release(&A[k].b);
    return NULL;
}

/* longest(local, copies, first, recv_start, send_step, w, passes) -> the latest step end (tuning/bound.py's
 * _longest, which it must equal to the bit: the same relaxation, in the same order).
 *   local, copies float64 per step (every rank's steps, ranks in the search's order); first int64 (ranks + 1):
 *   each rank's first step; recv_start int64 (steps + 1): each step's receives; per receive send_step int64
 *   (the sender's step that sends it, -1 where the sender was not looked at or sends nothing to match) and
 *   w float64 (from that step's start to the receive's end). */
static PyObject *longest(PyObject *self, PyObject *args) {
    PyObject *o[6];
    int passes;
    if (!PyArg_ParseTuple(args, "OOOOOOi", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &passes)) return NULL;
    static const char *names[6] = {"local", "copies", "first", "recv_start", "send_step", "w"};
    Arr A[6];
    int got = 0;
    for (; got < 6; got++)
        if (get_arr(o[got], &A[got], names[got], 8) < 0) goto fail;
    const double *local = A[0].b.buf, *copies = A[1].b.buf, *w = A[5].b.buf;
    const int64_t *first = A[2].b.buf, *recv_start = A[3].b.buf, *send_step = A[4].b.buf;
    int64_t G = A[0].b.len / 8, R = A[2].b.len / 8 - 1, E = A[4].b.len / 8;
    int ok = A[1].b.len / 8 == G && R >= 0 && A[3].b.len / 8 == G + 1 && A[5].b.len / 8 == E && first[0] == 0 &&
             first[R] == G && recv_start[0] == 0 && recv_start[G] == E;
    for (int64_t i = 0; ok && i < R; i++) ok = first[i] <= first[i + 1];
    for (int64_t g = 0; ok && g < G; g++) ok = recv_start[g] <= recv_start[g + 1];
    for (int64_t e = 0; ok && e < E; e++) ok = send_step[e] >= -1 && send_step[e] < G;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "longest: inconsistent arrays");
        goto fail;
    }
    double *ends = calloc(G ? G : 1, sizeof(double));
    char *is_first = calloc(G ? G : 1, 1);
    if (!ends || !is_first) {
        free(ends); free(is_first);
        PyErr_NoMemory();
        goto fail;
    }
    for (int64_t i = 0; i < R; i++) if (first[i] < first[i + 1]) is_first[first[i]] = 1;
    for (int pass = 0; pass < passes; pass++) {
        int changed = 0;
        for (int64_t i = R - 1; i >= 0; i--) {       /* the farthest first: what they send reaches the nearer */
            double prev = 0.0;
            for (int64_t g = first[i]; g < first[i + 1]; g++) {
                double v = prev + local[g];
                for (int64_t e = recv_start[g]; e < recv_start[g + 1]; e++) {
                    int64_t kk = send_step[e];
                    double start = kk < 0 ? 0.0 : (is_first[kk] ? 0.0 : ends[kk - 1]) + copies[kk];
                    if (start + w[e] > v) v = start + w[e];
                }
                if (v > ends[g]) { ends[g] = v; changed = 1; }
                prev = ends[g];
            }
        }
        if (!changed) break;
    }
    double best = 0.0;
    int any = 0;
    for (int64_t i = 0; i < R; i++)
        if (first[i] < first[i + 1]) {
            double e = ends[first[i + 1] - 1];
            if (!any || e > best) best = e;
            any = 1;
        }
    free(ends); free(is_first);
    for (int k = 0; k < got; k++) PyBuffer_Release(&A[k].b);
    return PyFloat_FromDouble(best);
fail:
    for (int k = 0; k < got; k++) PyBuffer_Release(&A[k].b);
    return NULL;
}

/* ops(flat, kind, red, peer, count, skip, touch, Copy, Send, Recv, call_buffers) -> copies of "in" onto "out"
 * at the same offset (tuning/compact.py's _ops, which it must equal: the Python one is the reference).
 *   flat: a list of Copy/Send/Recv tuples (exact types); the arrays (as many elements as flat, written):
 *   kind int8, red int8, peer int64, count int64, skip bool, touch int8. Raises TypeError on another
 *   operation, or a tuple of the wrong length. */
static int in_calls(PyObject *name, PyObject *calls) {
    Py_ssize_t k = PyTuple_GET_SIZE(calls);
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *c = PyTuple_GET_ITEM(calls, i);
        if (name == c) return 1;
        int eq = PyUnicode_Check(name) ? PyUnicode_Compare(name, c) == 0 : 0;
        if (eq) return 1;
    }
    return 0;
}

static PyObject *ops(PyObject *self, PyObject *args) {
    PyObject *flat, *o[6], *tc, *ts, *tr, *calls;
    if (!PyArg_ParseTuple(args, "O!OOOOOOOOOO!", &PyList_Type, &flat, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &tc, &ts, &tr, &PyTuple_Type, &calls)) return NULL;
    static const char *names[6] = {"kind", "red", "peer", "count", "skip", "touch"};
    static const int sizes[6] = {1, 1, 8, 8, 1, 1};
    Arr A[6];
    int got = 0;
    PyObject *result = NULL;
    Py_ssize_t m = PyList_GET_SIZE(flat);
    for (; got < 6; got++)
        if (get_arr(o[got], &A[got], names[got], sizes[got]) < 0) goto done;
    for (int k = 0; k < 6; k++)
        if (A[k].b.len / sizes[k] != m || A[k].b.readonly) {
            PyErr_Format(PyExc_ValueError, "ops: %s must be a writable array of %zd elements", names[k], m);
            goto done;
        }
    int8_t *kind = A[0].b.buf, *red = A[1].b.buf, *touch = A[5].b.buf;
    int64_t *peer = A[2].b.buf, *count = A[3].b.buf;
    char *skip = A[4].b.buf;
    PyObject *in = PyUnicode_InternFromString("in"), *out = PyUnicode_InternFromString("out");
    if (!in || !out) { Py_XDECREF(in); Py_XDECREF(out); goto done; }
    long long skips = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *x = PyList_GET_ITEM(flat, j), *t = (PyObject *)Py_TYPE(x);
        Py_ssize_t len = PyTuple_Check(x) ? PyTuple_GET_SIZE(x) : -1;
        long long pe = 0, cn;
        int rd = 0, tch = 0, sk = 0;
        if (t == tc && len == 6) {
            PyObject *src = PyTuple_GET_ITEM(x, 0), *dst = PyTuple_GET_ITEM(x, 2);
            cn = PyLong_AsLongLong(PyTuple_GET_ITEM(x, 4));
            rd = PyObject_IsTrue(PyTuple_GET_ITEM(x, 5));
            if (rd < 0) goto fail;
            tch = in_calls(src, calls) + in_calls(dst, calls) * (1 + rd);
            if ((src == in || (PyUnicode_Check(src) && PyUnicode_Compare(src, in) == 0)) &&
                (dst == out || (PyUnicode_Check(dst) && PyUnicode_Compare(dst, out) == 0))) {
                int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(x, 1), PyTuple_GET_ITEM(x, 3), Py_EQ);
                if (eq < 0) goto fail;
                sk = eq;
            }
            kind[j] = 0;
        } else if (t == ts && len == 4) {
            pe = PyLong_AsLongLong(PyTuple_GET_ITEM(x, 0));
            cn = PyLong_AsLongLong(PyTuple_GET_ITEM(x, 3));
            kind[j] = 1;
        } else if (t == tr && len == 5) {
            pe = PyLong_AsLongLong(PyTuple_GET_ITEM(x, 0));
            cn = PyLong_AsLongLong(PyTuple_GET_ITEM(x, 3));
            rd = PyObject_IsTrue(PyTuple_GET_ITEM(x, 4));
            if (rd < 0) goto fail;
            kind[j] = 2;
        } else {
            PyErr_SetString(PyExc_TypeError, "not a message schedule (Get, Post or Sync)");
            goto fail;
        }
        if (PyErr_Occurred()) goto fail;
        red[j] = (int8_t)rd; peer[j] = pe; count[j] = cn; touch[j] = (int8_t)tch; skip[j] = (char)sk;
        skips += sk;
    }
    result = PyLong_FromLongLong(skips);
fail:
    Py_DECREF(in); Py_DECREF(out);
done:
    for (int k = 0; k < got; k++) PyBuffer_Release(&A[k].b);
    return result;
}

static PyObject *pruning(PyObject *self, PyObject *args) {
    long long every;
    if (!PyArg_ParseTuple(args, "L", &every)) return NULL;
    long long was = prune_every;
    prune_every = every;
    return PyLong_FromLongLong(was);
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "The timed walk of message schedules on a net of hosts alike (see tuning/fast.py)."},
    {"longest", longest, METH_VARARGS, "The path bound's relaxation over chains of steps (see tuning/bound.py)."},
    {"ops", ops, METH_VARARGS, "Operations as the walk's arrays (see tuning/compact.py's _ops)."},
    {"pruning", pruning, METH_VARARGS, "pruning(every) -> the previous: a walk drops the busy intervals no "
     "booking can take every that many ranks' turns (0: its own choice)."},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "pyxccl.tuning._simcore",
                                    "The C core of the cost model's timed walk.", -1, methods};

PyMODINIT_FUNC PyInit__simcore(void) { return PyModule_Create(&module); }
