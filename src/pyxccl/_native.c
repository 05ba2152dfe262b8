/* pyxccl._native: runs a compiled segment schedule (core/onehost.py) without the GIL.
 *
 * The Python executor in core/onehost.py is the reference; this is the same
 * thing, instruction by instruction, for the dtypes and ops it knows
 * (tests/test_executors.py runs every segment schedule through both and
 * compares the bits). A program is the walker's order of one rank's rounds
 * (BEGIN, local ops, PUBLISH, incoming ops), WIDTH (9) int64 per instruction:
 * the opcode and up to 8 arguments (see step()), compiled once per schedule
 * (onehost.program). run() returns after a wait has slept for a while so that
 * Python can check the deadline and the peers, and is then called again from
 * the instruction it stopped at: every instruction waits before it changes
 * anything, so running it again is safe. Before it runs anything, run() checks
 * the program against the buffers and the segment it is given (check()).
 *
 * Everything Python and C must agree on (opcodes, statuses, buffer ids, header
 * fields, the instruction width, dtype and op codes, the segment's layout) is
 * defined here once and exported by tables(); core/onehost.py compares it with
 * its own (and transport/segment.py's layout) at import and refuses this module
 * if they differ. Segment layout: transport/segment.py (offsets are passed in).
 */
#define _GNU_SOURCE          /* sched_getcpu */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <limits.h>
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
#define HAVE_STREAM 1
#elif defined(__aarch64__)
#define PAUSE() __asm__ __volatile__("yield")
#else
#define PAUSE() ((void)0)
#endif

#define YIELD_EVERY_NS 20000
/* Copies into a call's buffer bypass the cache (non-temporal stores) when that buffer on every rank of the
 * segment together is larger than nt_bytes, the cache the ranks share (0: never): the buffers cannot stay in
 * it, and a plain store first reads every line it writes. onehost.py sets it to the last-level cache's size
 * (PYXCCL_NT_BYTES, through nt_threshold()). At 2 ranks, 32 MiB L3, output buffers (huge pages, as numpy's):
 * 64 MiB allgather 7.0-8.9 ms against 9.8-10.4, alltoall 6.2-8.7 against 9.8-10.7, gather 3.0-4.1 against
 * 5.0-5.7; 32 MiB 10-20% faster; 16 MiB (2 x 16 MiB: not larger than the cache) as fast either way.
 * Never into a buffer reduced into (what a copy put there is read back at once) nor, by this rule, into
 * windows (the next reader wants them in the cache; but see nt_windows). glibc's memmove would use such
 * stores only from 3/4 of the shared cache it believes in (here 192 MiB). */
static long long nt_bytes = 0;
static int nt_for(int64_t nbytes, int64_t ranks) { return nt_bytes > 0 && nbytes * ranks > nt_bytes; }
#define NT_MIN_PIECE 4096
#define FUSE_BYTES 4096     /* a move and a reduce into the same bytes from this size: one pass (fuse) */

#define WIDTH 9             /* int64 per instruction: opcode + 8 arguments */
enum { I_BEGIN = 1, I_COPY, I_POST, I_PUBLISH, I_GET, I_SYNC, I_PUT };
enum { B_IN, B_OUT, B_TMP, B_WIN };

/* Copies into one's window by non-temporal stores, or by plain ones. On this project's machine the cost of
 * writing window lines that the peer's core read the round before is bimodal: it moves between two levels
 * within seconds as the host places the two vCPUs (512 KiB: 20-45 us, or 116-141). Non-temporal stores
 * (they take no line back from the other core) cost more in the fast state and less in the slow one: 2
 * ranks, batches alternating in one job, allreduce 1 MiB 126-163 us against 67-112 plain in the fast
 * state, 221-262 against 309-377 in the slow one; 256 KiB 33-45 against 22-39, 56-65 against 75-90; 4 MiB
 * 650-1150 against 500-1000, 843-1095 against 1080-1250. So a Call takes the cheaper way, trying the other
 * now and then (WIN_EXPLORE), and all ranks take one way (the bits are the same either way): rank 0 picks
 * (lead) by timing its runs from when the last rank entered the call (entry_word: a rank that comes late
 * counts for neither way) and says its way in its control line before it writes; the others take it there,
 * or, where rank 0 has not begun the call yet, the way it took on the run before. Until then, and where
 * rank 0's own call moves nothing the way would take, a rank times its own copies into its window per byte
 * and picks alone. Ranks picking alone picked wrong where a way's cost falls on the rank that reads: 2
 * ranks, fast state, a 1 MiB reduce whose ranks each reduce a share, the non-root's copies cost 0.049 ns a
 * byte plain and 0.035 streamed, so it streamed, and the root's reads of them made the call 100-104 us
 * against 58-60 with both plain. (Each rank timing its whole calls alone picked wrong in about half the
 * jobs: a call's time mixes in the peer's own choice.) nt_windows: 0 never, 1 always, 2 so (the default;
 * PYXCCL_NT_WINDOWS, through set_nt_windows()); run() (the full path) copies the way the last Call of its class
 * found the cheaper (win_seed) unless one is forced. */
static int nt_windows = 2;
/* The other way is tried again (for two runs, win_since) every WIN_EXPLORE runs where the two cost about the
 * same, and more rarely the dearer it was, so that trying costs at most a few percent: after WIN_EXPLORE * r * r
 * runs, r the ratio of the two ways' costs, at most WIN_EXPLORE_MAX. In the slow state the plain way's copies
 * cost several times the streamed ones' and a whole 1 MiB call 4-6x (2 ranks, reduce 455 us against 77):
 * trying it every 16th run made the reduce 99-104 us against 76-78 always streamed, the allreduce 111
 * against 90. */
#define WIN_EXPLORE 16
#define WIN_EXPLORE_MAX 512
#define WIN_KEPT 5          /* a way's cost: the median of its last WIN_KEPT runs' (a preempted run moves no median) */
/* per way: recent costs, runs; next: the first of the two runs that try the other way (0: not yet set);
 * first: the way warmed up first */
typedef struct { double t[2][WIN_KEPT]; unsigned n[2], runs, next; int first; } WinPick;
/* Per class of a call's window traffic (seed_class), the way the last Call of the class that had run both ways
 * found the cheaper (-1: none yet; then the nearest class's): the machine's state is the process's (and the
 * host's), so a new Call warms that way up first (three runs) and the full path (run()) takes it. In the slow
 * state a new 64 MiB allreduce's plain runs took 32 ms against 9 streamed (2 ranks), and its first four runs
 * (the full path's and the three warming plain up) were plain ones: a bench's 1 warm-up and 5 timed runs timed
 * 32 ms. By class, since in one state calls of other sizes may find the other way cheaper: one seed for all,
 * a 64 MiB reduce after 1 MiB calls that found plain the cheaper timed 28.7 ms against 9.4. Set once a Call
 * has a kept run each way, not only once it knows both (three each): a bench's 64 MiB cases run 6 times each,
 * which left the large class unset. */
#define SEED_CLASSES 4
static int win_seed[SEED_CLASSES] = {-1, -1, -1, -1};
/* Where no class has one yet (a job's first calls), the largest class streams and the others write plainly:
 * from 16 MiB a run streaming costs up to 2-4x less in the slow state and about as much in the fast one (a
 * 4 MiB allreduce, 2 ranks: 650-1150 us against 500-1000 plain), while a 1 MiB call's plain writes cost 1.6x
 * less in the fast state and 1.35x more in the slow (67-112 us against 126-163, 309-377 against 221-262).
 * Slow state, 2026-11-29, 64 MiB, busbw GB/s plain against streamed (`pyxccl bench` with PYXCCL_NT_WINDOWS
 * never and always, two runs each): 2 ranks allreduce 2.1 against 7.1-8.4, reduce 2.3 against 10.3-10.8,
 * reduce_scatter 3.8-3.9 against 11.3-11.7; 4 ranks allreduce 1.2 against 2.4-2.5, reduce_scatter 1.9
 * against 3.6, allgather 3.2-3.3 against 5.7-6.4. */
static int seed_for(int cls) {      /* its class's, else the nearest class's that has one (the larger first) */
    for (int d = 0; d < SEED_CLASSES; d++)
        for (int e = 0, k = cls + d; e < 2; e++, k = cls - d) {
            int v = k >= 0 && k < SEED_CLASSES ? __atomic_load_n(&win_seed[k], __ATOMIC_RELAXED) : -1;
            if (v >= 0) return v;
        }
    return cls == SEED_CLASSES - 1;
}
static double win_time(const WinPick *w, int way) {
    unsigned k = w->n[way] - 1 < WIN_KEPT ? w->n[way] - 1 : WIN_KEPT;     /* (the first run is not kept) */
    double v[WIN_KEPT] = {0};  /* (callers wait for kept runs: win_known) */
    for (unsigned i = 0; i < k; i++) {          /* insertion sort of at most WIN_KEPT */
        double x = w->t[way][i];
        unsigned j = i;
        for (; j > 0 && v[j - 1] > x; j--) v[j] = v[j - 1];
        v[j] = x;
    }
    return k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
}
static int win_known(const WinPick *w) { return w->n[0] >= 3 && w->n[1] >= 3; }     /* (the first of each warms up) */
/* Runs since the first of the last trial's two (huge before it); the second is the one timed, so that a
 * rank that takes its way from another (lead) a run late tries it too, and the run after it is not timed. */
static unsigned win_since(const WinPick *w) { return w->runs - w->next; }
static int win_explores(const WinPick *w) { return win_known(w) && win_since(w) < 2; }
static int win_pick(const WinPick *w) {
    if (nt_windows != 2) return nt_windows;
    if (w->n[w->first] < 3) return w->first;
    if (w->n[!w->first] < 3) return !w->first;
    int best = win_time(w, 1) < win_time(w, 0);
    return win_explores(w) ? !best : best;
}
/* Is this run timed? Every run until both ways have three, then every WIN_TIMED-th (not the two after a
 * trial's first) and each trial's second: two clock reads a copy, which for a broadcast's 32 KiB pieces
 * come to a few percent of its time. */
#define WIN_TIMED 4
static int win_timing(const WinPick *w) {
    unsigned since = win_since(w);
    return nt_windows == 2 && (!win_known(w) || since == 1 || (w->runs % WIN_TIMED == WIN_TIMED - 1 && since > 2));
}
/* After each run (cost: its copies into the window, per byte; < 0 where it was not timed). The next trial
 * of the other way is set by what this one cost against the way kept (at first: the two medians); one that
 * came out as cheap or cheaper (the machine changed state) is followed by others every WIN_EXPLORE runs,
 * which move that way's median within three. */
static void win_ran(WinPick *w, int way, double cost) {
    int tried = win_known(w) && win_since(w) == 1;
    w->runs++;
    if (cost >= 0 && w->n[way]++ > 0) w->t[way][(w->n[way] - 2) % WIN_KEPT] = cost;
    if (!tried && (w->next || !win_known(w))) return;
    double a = win_time(w, 0), b = win_time(w, 1), r = tried && cost >= 0 ? cost / (way ? a : b) : a > b ? a / b : b / a;
    double every = r > 1 ? r * r * WIN_EXPLORE : r >= 0 ? WIN_EXPLORE : WIN_EXPLORE_MAX;   /* (NaN: the rarest) */
    w->next = w->runs + (unsigned)(every < WIN_EXPLORE_MAX ? every : WIN_EXPLORE_MAX);
}
/* Is instruction i (a COPY or a GET) a copy into my window (not a reduce) that streaming stores would take? */
static inline int timed_into_window(const int64_t *i) { return i[3] == B_WIN && !i[6] && i[5] >= NT_MIN_PIECE; }

/* Is instruction i a COPY or GET into my window (not a reduce), or a GET of a peer's window or posted buffer,
 * in a piece that streaming stores would take? */
static inline int into_window(const int64_t *i) { return (i[0] == I_COPY || i[0] == I_GET) && timed_into_window(i); }
static inline int reads_peer(const int64_t *i, int64_t me) { return i[0] == I_GET && i[1] != me && i[5] >= NT_MIN_PIECE; }

/* Does the program copy into its window (not reducing) in pieces that streaming stores would take? */
static int copies_into_window(const int64_t *code, Py_ssize_t len) {
    for (Py_ssize_t pc = 0; pc < len; pc++)
        if (into_window(code + WIDTH * pc)) return 1;
    return 0;
}
/* A program's window traffic a run: the bytes it copies into its window (not reducing) or reads from the others'
 * in pieces that streaming stores would take (0: none, no way to pick or follow) */
static int64_t window_traffic(const int64_t *code, Py_ssize_t len, int64_t me) {
    int64_t bytes = 0;
    for (Py_ssize_t pc = 0; pc < len; pc++) {
        const int64_t *i = code + WIDTH * pc;
        if (into_window(i) || reads_peer(i, me)) bytes += i[5];
    }
    return bytes;
}
/* Its class for win_seed: < 64 KiB, < 1 MiB, < 16 MiB, more */
static int seed_class(int64_t bytes) { return bytes < (64 << 10) ? 0 : bytes < (1 << 20) ? 1 : bytes < (16 << 20) ? 2 : 3; }
/* run()'s outcomes; BUFFER: a buffer the program uses is missing, read-only where it writes, or too
 * small (peer: the buffer id, err: the bytes it needs), found before anything runs */
enum { DONE = 0, NAPPED, MISMATCH, BOUNDS, CMA_FAILED, UNSUPPORTED, BUFFER };
enum { SEQ, W0, W1, ADDR, NBYTES };             /* uint64 fields of a round header */
/* The segment (transport/segment.py): per rank a control line of uint32 words (its round counter,
 * then a sleep flag per rank, then the CPU it last ran on: word CTL_CPU + n), the pids (PID_WORDS
 * uint64 per rank, the pid first), then per (parity, rank) a header of HEADER_BYTES, then per
 * (parity, rank) a window of `area` bytes. */
#define CTL_COUNTER 0
#define CTL_FLAGS 1             /* rank w's sleep flag: word CTL_FLAGS + w */
#define CTL_CPU 1               /* plus n */
#define CTL_ENTRY 2             /* plus n, two words (by the call's parity): when the rank entered it (ns, low 32 bits) */
#define CTL_WAY 4               /* plus n, in rank 0's line: the way its current call writes windows (lead) */
#define HEADER_BYTES 64
#define PID_WORDS 2

typedef struct {
    char *base;                 /* the segment */
    int64_t line, hdr_at, head, area, pids_at;
    int64_t me, n;
    char *buf[3];               /* in, out, tmp of this call */
    uint64_t call[3];           /* seq, w0, w1 */
    uint32_t round;
    int parity;
    int64_t spin_ns, yields, nap_ns;
    int dtype, op;
    char *posted;               /* what I posted this round (NULL: nothing) */
    int posted_nt;              /* copies into it use non-temporal stores (its buffer's Run.nt) */
    int nt[4];                  /* per buffer id: copies into it use non-temporal stores (see nt_bytes) */
    int win_timing;             /* time the copies into my window (nt_windows): their ns and bytes */
    int64_t win_ns, win_bytes;
    char *scratch;              /* single-copy reads that are reduced land here first */
    int64_t scratch_bytes;
    int64_t peer, err;          /* who failed, and errno or offset */
    int64_t free_round;         /* this round waited for nobody and writes no header (BEGIN's word 1) */
    int64_t entered;            /* when this rank entered a call that moves nothing (see execute) */
} Run;

static inline int ge(uint32_t a, uint32_t b) { return (uint32_t)(a - b) < 0x80000000u; }
static inline volatile uint32_t *counter(Run *r, int64_t p) {
    return (volatile uint32_t *)(r->base + p * r->line) + CTL_COUNTER;
}
static inline volatile uint32_t *word(Run *r, int64_t p, int64_t w) { return (volatile uint32_t *)(r->base + p * r->line) + w; }
static inline volatile uint64_t *header(Run *r, int parity, int64_t p) {
    return (volatile uint64_t *)(r->base + r->hdr_at + (parity * r->n + p) * HEADER_BYTES);
}
static inline volatile uint32_t *my_cpu(Run *r) { return word(r, r->me, CTL_CPU + r->n); }
static inline volatile uint32_t *lead_word(Run *r) { return word(r, 0, CTL_WAY + r->n); }
/* The way rank 0 said for call cseq, or -1 where its word is of another call */
static inline int lead_way_of(Run *r, uint32_t cseq) {
    uint32_t led = __atomic_load_n(lead_word(r), __ATOMIC_ACQUIRE);
    return led >> 1 == (cseq & 0x7fffffffu) ? (int)(led & 1) : -1;
}
static inline volatile uint32_t *entry_word(Run *r, int64_t p, uint32_t cseq) { return word(r, p, CTL_ENTRY + r->n + (cseq & 1)); }
static inline char *window(Run *r, int parity, int64_t p) { return r->base + r->head + (parity * r->n + p) * r->area; }

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* When the last rank entered call cseq, `started` mine (entry_word: low 32 bits of now_ns(), which one
 * clock gives every process of the host; a word of the call two before is older than `started`). */
static int64_t last_entry(Run *r, uint32_t cseq, int64_t started) {
    int64_t last = started;
    for (int64_t p = 0; p < r->n; p++) {
        int32_t later = (int32_t)(*entry_word(r, p, cseq) - (uint32_t)started);
        if (p != r->me && later > 0 && started + later > last) last = started + later;
    }
    return last;
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
    volatile uint32_t *theirs = word(r, p, CTL_CPU + r->n);
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
    volatile uint32_t *flag = word(r, p, CTL_FLAGS + r->me);
    __atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);        /* my flag before their counter: no lost wake-up */
    uint32_t cur = __atomic_load_n(c, __ATOMIC_ACQUIRE);
    if (!ge(cur, target)) {
        struct timespec nap = {(time_t)(r->nap_ns / 1000000000), (long)(r->nap_ns % 1000000000)};
        syscall(SYS_futex, (void *)c, FUTEX_WAIT, cur, &nap, NULL, 0);
    }
    __atomic_store_n(flag, 0, __ATOMIC_RELAXED);
    return ge(__atomic_load_n(c, __ATOMIC_ACQUIRE), target);
}

/* dst = dst (op) src, element-wise, as numpy does (so every rank gets the same bits, whichever executor
 * runs it). Float MIN and MAX as numpy 2's np.minimum/np.maximum: a NaN in dst stays, else a NaN in
 * src is taken, and of two equal values (+0 and -0) src. Which NaN a sum or product of two NaNs gives
 * is left open (the compiler may swap a + b; numpy's own loops pick by position). core/onehost.py
 * checks at import that the installed numpy gives these bits (numpy_differs), else those pairs run
 * in Python. */
/* restrict: the two never overlap (a window and a user buffer, or two user buffers), so the
 * compiler may vectorize without run-time alias checks (-O3 in setup.py). */
/* With `first` (not NULL, apart from dst): dst = first (op) src in one pass, the bits of a copy of first
 * into dst and then the reduce (fuse()). */
#define LOOP(T, EXPR) do { T *restrict d = (T *)dst; const T *restrict s = (const T *)src; \
    int64_t k = nbytes / sizeof(T); \
    if (first) { const T *restrict f = (const T *)first; \
                 for (int64_t i = 0; i < k; i++) { T a = f[i], b = s[i]; d[i] = (EXPR); } } \
    else for (int64_t i = 0; i < k; i++) { T a = d[i], b = s[i]; d[i] = (EXPR); } \
    } while (0)
/* dtype and op codes, in the order of these names (exported by tables()) */
enum { D_F32, D_F64, D_I8, D_I16, D_I32, D_I64, D_U8, D_U16, D_U32, D_U64, N_DTYPES };
static const char *const DTYPE_NAMES[N_DTYPES] = {"float32", "float64", "int8", "int16", "int32", "int64",
                                                  "uint8", "uint16", "uint32", "uint64"};
enum { O_SUM, O_PROD, O_MIN, O_MAX, O_BAND, O_BOR, O_BXOR, O_LAND, O_LOR, N_OPS };
static const char *const OP_NAMES[N_OPS] = {"sum", "prod", "min", "max", "band", "bor", "bxor", "land", "lor"};

#define FLOAT_OPS(T) switch (op) { \
    case O_SUM: LOOP(T, a + b); return 1; case O_PROD: LOOP(T, a * b); return 1; \
    case O_MIN: LOOP(T, (a != a || a < b) ? a : b); return 1; case O_MAX: LOOP(T, (a != a || a > b) ? a : b); return 1; \
    default: return 0; }
#define INT_OPS(T, U) switch (op) { \
    case O_SUM: LOOP(T, (T)((U)a + (U)b)); return 1; case O_PROD: LOOP(T, (T)((U)a * (U)b)); return 1; \
    case O_MIN: LOOP(T, a <= b ? a : b); return 1; case O_MAX: LOOP(T, a >= b ? a : b); return 1; \
    case O_BAND: LOOP(T, a & b); return 1; case O_BOR: LOOP(T, a | b); return 1; case O_BXOR: LOOP(T, a ^ b); return 1; \
    case O_LAND: LOOP(T, (T)(a && b)); return 1; case O_LOR: LOOP(T, (T)(a || b)); return 1; \
    default: return 0; }

static int reduce3(int dtype, int op, char *dst, const char *first, const char *src, int64_t nbytes) {
    switch (dtype) {
    case D_F32: FLOAT_OPS(float)
    case D_F64: FLOAT_OPS(double)
    case D_I8: INT_OPS(int8_t, uint8_t)
    case D_I16: INT_OPS(int16_t, uint16_t)
    case D_I32: INT_OPS(int32_t, uint32_t)
    case D_I64: INT_OPS(int64_t, uint64_t)
    case D_U8: INT_OPS(uint8_t, uint8_t)
    case D_U16: INT_OPS(uint16_t, uint16_t)
    case D_U32: INT_OPS(uint32_t, uint32_t)
    case D_U64: INT_OPS(uint64_t, uint64_t)
    }
    return 0;
}

static int reduce(int dtype, int op, char *dst, const char *src, int64_t nbytes) {
    return reduce3(dtype, op, dst, NULL, src, nbytes);
}

static char *address(Run *r, int64_t buf, int64_t off) {
    return (buf == B_WIN ? window(r, r->parity, r->me) : r->buf[buf]) + off;
}

/* memcpy with non-temporal stores (dst and src apart), unfenced: see copy_nt */
static void stream(char *dst, const char *src, int64_t nbytes) {
#ifdef HAVE_STREAM
    int64_t head = (int64_t)((16 - ((uintptr_t)dst & 15)) & 15), i;
    memcpy(dst, src, (size_t)head);
    for (i = head; i + 64 <= nbytes; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i)), b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32)), d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + i, src + i, (size_t)(nbytes - i));
#else
    memcpy(dst, src, (size_t)nbytes);
#endif
}

static void store_fence(void) {
#ifdef HAVE_STREAM
    _mm_sfence();
#endif
}

/* stream() and the fence that orders its stores before the release store that publishes the round, as
 * plain stores are. */
static void copy_nt(char *dst, const char *src, int64_t nbytes) {
    stream(dst, src, nbytes);
    store_fence();
}

/* A copy whose destination is 1-31 bytes ahead of its source modulo a page (4K aliasing) runs 10-25x
 * slower through `rep movsb`, which glibc's memcpy uses from a few KiB up to about the L2 size and the
 * kernel's copies (process_vm_readv/writev) at every size: on this project's machine (AMD EPYC) a 256 KiB
 * memmove 1.9 GB/s against 36, a 1 MiB process_vm_readv 2.4 against 9. numpy puts large arrays 16 bytes
 * into a page, so a user's buffers meet each other and the windows at such distances often enough (a
 * 2-rank allgather of 1 MiB with its output 16 bytes further into its page than its input: 790 us against
 * 165). Such copies go through vector loads and stores (copy()), and single copies through a bounce
 * buffer at a distance of 0 (bounce()). */
#define PAGE_BYTES 4096
#define SHORT_AHEAD 32
#define VEC_MIN 256                 /* below this memcpy does not use rep movsb */
#define BOUNCE_PIECE (256 << 10)    /* a single copy through the bounce buffer, a piece at a time (in L2) */
static int apart(const char *a, const char *b, int64_t nbytes) { return a + nbytes <= b || b + nbytes <= a; }
static inline int short_ahead(const void *dst, const void *src) {
    uintptr_t d = ((uintptr_t)dst - (uintptr_t)src) & (PAGE_BYTES - 1);
    return d && d < SHORT_AHEAD;
}

#ifdef HAVE_STREAM
/* memcpy by vector loads and stores (dst and src apart) */
__attribute__((target("avx2"))) static void copy_avx2(char *restrict dst, const char *restrict src, int64_t nbytes) {
    int64_t i = 0;
    for (; i + 128 <= nbytes; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(src + i)), b = _mm256_loadu_si256((const __m256i *)(src + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(src + i + 64)), d = _mm256_loadu_si256((const __m256i *)(src + i + 96));
        _mm256_storeu_si256((__m256i *)(dst + i), a);
        _mm256_storeu_si256((__m256i *)(dst + i + 32), b);
        _mm256_storeu_si256((__m256i *)(dst + i + 64), c);
        _mm256_storeu_si256((__m256i *)(dst + i + 96), d);
    }
    memcpy(dst + i, src + i, (size_t)(nbytes - i));     /* (under 128 bytes: no rep movsb) */
}

static void copy_sse2(char *restrict dst, const char *restrict src, int64_t nbytes) {
    int64_t i = 0;
    for (; i + 64 <= nbytes; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i)), b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32)), d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_storeu_si128((__m128i *)(dst + i), a);
        _mm_storeu_si128((__m128i *)(dst + i + 16), b);
        _mm_storeu_si128((__m128i *)(dst + i + 32), c);
        _mm_storeu_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + i, src + i, (size_t)(nbytes - i));
}
#endif

/* memmove, never through rep movsb at a short distance ahead (above) */
static void copy(char *dst, const char *src, int64_t nbytes) {
#ifdef HAVE_STREAM
    if (nbytes >= VEC_MIN && short_ahead(dst, src) && apart(dst, src, nbytes)) {
        if (__builtin_cpu_supports("avx2")) copy_avx2(dst, src, nbytes);
        else copy_sse2(dst, src, nbytes);
        return;
    }
#endif
    memmove(dst, src, (size_t)nbytes);
}

/* nt: dst is in a buffer that copies reach with non-temporal stores (Run.nt) */
static int move(Run *r, char *dst, const char *src, int64_t nbytes, int64_t red, int nt) {
    if (!red) {
        if (dst == src) return DONE;
        if (nt && nbytes >= NT_MIN_PIECE && apart(dst, src, nbytes)) copy_nt(dst, src, nbytes);
        else copy(dst, src, nbytes);
        return DONE;
    }
    return reduce(r->dtype, r->op, dst, src, nbytes) ? DONE : UNSUPPORTED;
}

/* `nbytes` of scratch (Run.scratch) at the same offset in its page as `like`, so that the kernel's copy
 * between the two is at a distance of 0 (short_ahead); NULL when it cannot be allocated. */
static char *bounce(Run *r, const void *like, int64_t nbytes) {
    if (r->scratch_bytes < nbytes + PAGE_BYTES) {
        free(r->scratch);
        r->scratch = malloc((size_t)(nbytes + PAGE_BYTES));
        r->scratch_bytes = r->scratch ? nbytes + PAGE_BYTES : 0;
        if (!r->scratch) return NULL;
    }
    return r->scratch + (((uintptr_t)like - (uintptr_t)r->scratch) & (PAGE_BYTES - 1));
}

/* `nbytes` between `local` here and `remote` in process pid by single copies (process_vm_readv, or
 * process_vm_writev when `writing`), as many as it takes. */
static int single_copy(Run *r, pid_t pid, char *local, char *remote, int64_t nbytes, int writing) {
    for (int64_t done = 0; done < nbytes;) {
        struct iovec l = {local + done, (size_t)(nbytes - done)}, m = {remote + done, (size_t)(nbytes - done)};
        ssize_t got = writing ? process_vm_writev(pid, &l, 1, &m, 1, 0) : process_vm_readv(pid, &l, 1, &m, 1, 0);
        if (got <= 0) { r->err = got < 0 ? errno : EFAULT; return CMA_FAILED; }
        done += got;
    }
    return DONE;
}

/* Does rank p make my call? (Compared in a call's first round, before any of p's data is read.) */
static int agrees(Run *r, int64_t p) {
    volatile uint64_t *h = header(r, r->parity, p);
    return h[SEQ] == r->call[0] && h[W0] == r->call[1] && h[W1] == r->call[2];
}

/* A Get: `nbytes` at `src_off` of p's window of `parity`, or of the buffer p posted. */
static int get(Run *r, int64_t p, int parity, int64_t src_off, char *dst, int64_t nbytes, int64_t red, int nt) {
    if (p == r->me && r->posted && parity == r->parity)
        return move(r, dst, r->posted + src_off, nbytes, red, nt);
    volatile uint64_t *h = header(r, parity, p);
    int64_t posted = (int64_t)h[NBYTES];
    r->peer = p;
    if (!posted) {      /* its window; the offset is the schedule's, the area the segment's */
        if (src_off < 0 || src_off + nbytes > r->area) { r->err = src_off + nbytes; return BOUNDS; }
        return move(r, dst, window(r, parity, p) + src_off, nbytes, red, nt);
    }
    if (src_off < 0 || src_off + nbytes > posted) { r->err = src_off + nbytes; return BOUNDS; }
    pid_t pid = (pid_t)((volatile uint64_t *)(r->base + r->pids_at))[PID_WORDS * p];
    char *from = (char *)(uintptr_t)(h[ADDR] + src_off);
    /* read whole into dst; or, to reduce it or at a short distance ahead, a piece at a time into the
     * bounce buffer, then reduced or copied into dst */
    int direct = !red && !short_ahead(dst, from);
    int64_t piece = direct ? nbytes : BOUNCE_PIECE;
    for (int64_t at = 0; at < nbytes; at += piece) {
        int64_t m = nbytes - at < piece ? nbytes - at : piece;      /* (a multiple of the item size) */
        char *to = direct ? dst : bounce(r, from + at, m);
        if (!to) { r->err = ENOMEM; return CMA_FAILED; }
        if (single_copy(r, pid, to, from + at, m, 0) != DONE) return CMA_FAILED;
        if (!direct && move(r, dst + at, to, m, red, 0) != DONE) return UNSUPPORTED;
    }
    return DONE;
}

/* Where instruction i reads without waiting or a system call: a COPY's source, a GET's of the round
 * before from the peer's window (in bounds); else NULL. */
static const char *local_source(Run *r, const int64_t *i) {
    if (i[0] == I_COPY) return address(r, i[1], i[2]);
    if (i[0] != I_GET || !i[7]) return NULL;
    int parity = r->parity ^ 1;
    if (header(r, parity, i[1])[NBYTES] || i[2] < 0 || i[2] + i[5] > r->area) return NULL;
    return window(r, parity, i[1]) + i[2];
}

/* A tee's pieces may go into the very bytes of an input (in place: the output is the input): each piece is
 * read whole before it is written */
static int tee_safe(const char *t, const char *src, int64_t nbytes) { return t == src || apart(t, src, nbytes); }

/* A plain COPY of exactly the D that instruction x wrote (the tee: a large reduction's own result share,
 * segment._reduction, copied from the window into the output), to T apart from D; else NULL. */
static char *tee_of(Run *r, const int64_t *x, const int64_t *z, const char *d, int64_t nbytes) {
    if (!z || z[0] != I_COPY || z[6] || z[1] != x[3] || z[2] != x[4] || z[5] != nbytes) return NULL;
    char *t = address(r, z[3], z[4]);
    return apart(t, d, nbytes) ? t : NULL;
}

/* D = A (op) B (A NULL: D (op) B) piece by piece, each piece copied into T (if any) while it is in the
 * cache: the bits of the reduce and then the copy (nt: non-temporal, into a buffer that takes them, Run.nt,
 * unless T is a source: in place, its lines were just read into the cache).
 * nt_d: D is my window and this run copies into it by non-temporal stores (nt_windows): each piece is
 * reduced into a private piece of scratch (in the cache) and streamed from there into D, so that a reduce
 * too takes no line of the window back from the peer that read it last (a large allreduce's result share,
 * which every peer reads: in the slow state of nt_windows' note, 2 ranks, 1 MiB allreduce 270-300 us with
 * plain reduces into the window, against 90-100 for the reduce-scatter, whose reduced pieces nobody reads). */
#define TEE_PIECE 8192
static int reduce_tee(Run *r, char *d, const char *a, const char *b, char *t, int nt, int nt_d, int64_t nbytes) {
    char *w = nt_d ? bounce(r, d, TEE_PIECE) : NULL;
    if (!t && !w) return reduce3(r->dtype, r->op, d, a, b, nbytes);
    for (int64_t at = 0; at < nbytes; at += TEE_PIECE) {
        int64_t m = nbytes - at < TEE_PIECE ? nbytes - at : TEE_PIECE;   /* (a multiple of the item size) */
        char *into = w ? w : d + at;
        if (!reduce3(r->dtype, r->op, into, a ? a + at : (w ? d + at : NULL), b + at, m)) return 0;
        if (w) stream(d + at, w, m);            /* (fenced once, below: a fence waits for the stores) */
        if (t && nt) stream(t + at, into, m);
        else if (t) copy(t + at, into, m);
    }
    if (w || (t && nt)) store_fence();
    return 1;
}

/* Does this run stream into D, which instruction x reduces into (reduce_tee's nt_d)? */
static inline int streams_reduce(const Run *r, const int64_t *x) { return x[3] == B_WIN && r->nt[B_WIN]; }

/* Instructions that run as one pass over their bytes (none waits; z: the instruction after y, or NULL):
 * - a plain move into D followed by a reduce into exactly D (COPY, or GET of the round before from a
 *   window: a large reduction's first two inputs, segment._reduction): D = A (op) B, which is what the
 *   two in turn leave (a op b of the same a and b), read and written once less;
 * - either that, or a lone reduce into D, followed by a plain copy of exactly D elsewhere (tee_of): each
 *   piece copied right after it is reduced, the bits of the two in turn, D not read back from memory.
 * Returns how many instructions it ran (2 or 3), 0 where it does not apply (then they run one by one). */
static int fuse(Run *r, const int64_t *x, const int64_t *y, const int64_t *z) {
    /* COPY and GET keep dst buffer, dst offset, bytes and reduce? at 3, 4, 5 and 6 */
    if ((x[0] != I_COPY && x[0] != I_GET) || x[5] < FUSE_BYTES) return 0;
    char *d = address(r, x[3], x[4]), *t;
    if (x[6]) {             /* a lone reduce, then its tee */
        const char *b = local_source(r, x);
        if (!b || !apart(d, b, x[5]) || !(t = tee_of(r, x, y, d, x[5])) || !tee_safe(t, b, x[5])) return 0;
        return reduce_tee(r, d, NULL, b, t, r->nt[y[3]] && t != b, streams_reduce(r, x), x[5]) ? 2 : 0;
    }
    if ((y[0] != I_COPY && y[0] != I_GET) || !y[6] || x[3] != y[3] || x[4] != y[4] || x[5] != y[5]) return 0;
    const char *a = local_source(r, x), *b = local_source(r, y);
    if (!a || !b || !apart(d, a, x[5]) || !apart(d, b, x[5])) return 0;
    t = tee_of(r, x, z, d, x[5]);
    if (t && (!tee_safe(t, a, x[5]) || !tee_safe(t, b, x[5]))) t = NULL;       /* (then the copy runs after) */
    if (!reduce_tee(r, d, a, b, t, t && r->nt[z[3]] && t != a && t != b, streams_reduce(r, x), x[5])) return 0;
    return t ? 3 : 2;
}

/* A Put: `nbytes` at `src` into the buffer p posted this round, `dst_off` bytes in (mine: a copy). */
static int put_into(Run *r, int64_t p, int64_t dst_off, const char *src, int64_t nbytes) {
    volatile uint64_t *h = header(r, r->parity, p);
    int64_t posted = p == r->me && !r->posted ? 0 : (int64_t)h[NBYTES];
    r->peer = p;
    if (dst_off < 0 || dst_off + nbytes > posted) { r->err = dst_off + nbytes; return BOUNDS; }
    if (p == r->me) return move(r, r->posted + dst_off, src, nbytes, 0, r->posted_nt);
    pid_t pid = (pid_t)((volatile uint64_t *)(r->base + r->pids_at))[PID_WORDS * p];
    char *into = (char *)(uintptr_t)(h[ADDR] + dst_off);
    /* written whole from src; at a short distance ahead, a piece at a time from the bounce buffer */
    int direct = !short_ahead(into, src);
    int64_t piece = direct ? nbytes : BOUNCE_PIECE;
    for (int64_t at = 0; at < nbytes; at += piece) {
        int64_t m = nbytes - at < piece ? nbytes - at : piece;
        char *from = (char *)(uintptr_t)(src + at);     /* (only read: process_vm_writev's iovec is not const) */
        if (!direct) {
            if (!(from = bounce(r, into + at, m))) { r->err = ENOMEM; return CMA_FAILED; }
            copy(from, src + at, m);
        }
        if (single_copy(r, pid, from, into + at, m, 1) != DONE) return CMA_FAILED;
    }
    return DONE;
}

/* A COPY's or GET's copy into my window, timed when the Call times its runs (nt_windows): the clock before
 * it (0: not timed), then its time and bytes added up. */
static inline int64_t window_clock(const Run *r, const int64_t *i) {
    return r->win_timing && timed_into_window(i) ? now_ns() : 0;
}
static inline void window_timed(Run *r, const int64_t *i, int64_t t0) {
    if (!t0) return;
    r->win_ns += now_ns() - t0;
    r->win_bytes += i[5];
}

/* One instruction: i[0] the opcode, then (k: the round's index in the call, 0 in its first)
 *   BEGIN
 *   COPY     src buffer, src offset, dst buffer, dst offset, bytes, reduce?
 *   POST     buffer, offset, bytes, written? (the others Put into it: it must be writable)
 *   PUBLISH  k
 *   GET      peer, offset in its window (or posted buffer), dst buffer, dst offset, bytes, reduce?,
 *            prev? (the round before, read before publishing), k
 *   SYNC     peer, k
 *   PUT      peer, offset in the buffer it posted, src buffer, src offset, bytes, k
 * (offsets and sizes in bytes). */
static int step(Run *r, const int64_t *i) {
    switch (i[0]) {
    case I_BEGIN: {      /* my window of this parity is free once everyone published the round before */
        uint32_t prev = r->round;
        r->free_round = i[1];       /* (a free round writes nothing the others read: walk.py's rule 1) */
        if (!r->free_round)
            for (int64_t p = 0; p < r->n; p++)
                if (p != r->me && !wait_for(r, p, prev)) { r->peer = p; return NAPPED; }
        r->round = prev + 1;
        r->parity = r->round & 1;
        r->posted = NULL;
        if (!r->free_round) header(r, r->parity, r->me)[NBYTES] = 0;
        return DONE;
    }
    case I_COPY: {
        int64_t t0 = window_clock(r, i);
        int rc = move(r, address(r, i[3], i[4]), address(r, i[1], i[2]), i[5], i[6], r->nt[i[3]]);
        window_timed(r, i, t0);
        return rc;
    }
    case I_POST: {
        volatile uint64_t *h = header(r, r->parity, r->me);
        r->posted = address(r, i[1], i[2]);
        r->posted_nt = i[1] != B_WIN && r->nt[i[1]];
        h[ADDR] = (uint64_t)(uintptr_t)r->posted;
        h[NBYTES] = (uint64_t)i[3];
        return DONE;
    }
    case I_PUBLISH: {
        volatile uint64_t *h = header(r, r->parity, r->me);
        if (!r->free_round) { h[SEQ] = r->call[0]; h[W0] = r->call[1]; h[W1] = r->call[2]; }
        volatile uint32_t *c = counter(r, r->me);
        *my_cpu(r) = (uint32_t)sched_getcpu();
        __atomic_store_n(c, r->round, __ATOMIC_RELEASE);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);    /* my counter before their flags (and counters) */
        for (int64_t w = 0; w < r->n; w++)
            if (*word(r, r->me, CTL_FLAGS + w)) { syscall(SYS_futex, (void *)c, FUTEX_WAKE, (int)r->n, NULL, NULL, 0); break; }
        if (i[1] == 0)      /* a call's first round: the peers already in it make my call? */
            for (int64_t p = 0; p < r->n; p++)
                if (p != r->me && ge(__atomic_load_n(counter(r, p), __ATOMIC_ACQUIRE), r->round) && !agrees(r, p)) {
                    r->peer = p;    /* (acquire: its header is read after its counter, on any CPU) */
                    return MISMATCH;
                }
        return DONE;
    }
    case I_GET:
    case I_SYNC: {
        int64_t p = i[1];
        if (i[0] == I_GET && i[7])      /* the round before: read before publishing, no wait */
            return get(r, p, r->parity ^ 1, i[2], address(r, i[3], i[4]), i[5], i[6], r->nt[i[3]]);
        if (p != r->me) {
            if (!wait_for(r, p, r->round)) { r->peer = p; return NAPPED; }
            if (i[0] == I_SYNC ? i[2] == 0 : i[8] == 0) {
                if (!agrees(r, p)) { r->peer = p; return MISMATCH; }
            }
        }
        if (i[0] == I_SYNC) return DONE;
        int64_t t0 = window_clock(r, i);
        int rc = get(r, p, r->parity, i[2], address(r, i[3], i[4]), i[5], i[6], r->nt[i[3]]);
        window_timed(r, i, t0);
        return rc;
    }
    case I_PUT: {       /* once p has published this round (its buffer is posted), as a GET waits */
        int64_t p = i[1];
        if (p != r->me) {
            if (!wait_for(r, p, r->round)) { r->peer = p; return NAPPED; }
            if (i[6] == 0 && !agrees(r, p)) { r->peer = p; return MISMATCH; }
        }
        return put_into(r, p, i[2], address(r, i[3], i[4]), i[5]);
    }
    }
    return UNSUPPORTED;
}

/* Before running anything: is `code` a program this executor can run on this segment, and what does it
 * touch? need[b]: the bytes of buffer b it reads or writes (0: none), writes[b]: does it write b (bit 1)
 * and does it reduce into b (bit 2).
 * Returns NULL, or why not (a program not made by onehost.program, or for another segment). */
static const char *check(const int64_t *code, Py_ssize_t len, int64_t n, int64_t need[4], int writes[4]) {
    for (Py_ssize_t pc = 0; pc < len; pc++) {
        const int64_t *i = code + WIDTH * pc;
        int64_t buf = -1, off = 0, nbytes = 0, buf2 = -1, off2 = 0, peer = -1;
        switch (i[0]) {
        case I_BEGIN: case I_PUBLISH: continue;
        case I_COPY: buf = i[1]; off = i[2]; buf2 = i[3]; off2 = i[4]; nbytes = i[5]; break;
        case I_POST: buf = i[1]; off = i[2]; nbytes = i[3]; break;
        case I_PUT: peer = i[1]; buf = i[3]; off = i[4]; nbytes = i[5]; break;
        case I_GET: peer = i[1]; buf2 = i[3]; off2 = i[4]; nbytes = i[5]; break;
        case I_SYNC: peer = i[1]; break;
        default: return "an unknown opcode";
        }
        if (i[0] == I_GET || i[0] == I_SYNC || i[0] == I_PUT) {
            if (peer < 0 || peer >= n) return "a peer outside the communicator";
            if ((i[0] == I_GET || i[0] == I_PUT) && i[2] < 0) return "a negative offset";
        }
        if (nbytes < 0 || off < 0 || off2 < 0) return "a negative size or offset";
        if (nbytes > INT64_MAX - off || nbytes > INT64_MAX - off2) return "an offset past any buffer";
        if ((buf != -1 && (buf < B_IN || buf > B_WIN)) || (buf2 != -1 && (buf2 < B_IN || buf2 > B_WIN)))
            return "an unknown buffer";
        if (!nbytes) continue;
        if (buf >= 0 && need[buf] < off + nbytes) need[buf] = off + nbytes;
        if (i[0] == I_POST && i[4]) writes[buf] |= 1;      /* the others write into it */
        if (buf2 >= 0) {
            if (need[buf2] < off2 + nbytes) need[buf2] = off2 + nbytes;
            writes[buf2] |= 1 | ((i[0] == I_COPY || i[0] == I_GET) && i[6] ? 2 : 0);     /* 2: reduces into it */
        }
    }
    return NULL;
}

/* run(program, pc, segment, round, call, buffers, settings) -> the new round when done (the common
 * case, kept cheap), else (status, pc, round, peer, err)
 *   program:  C-contiguous int64, WIDTH values per instruction (opcode + 8 arguments)
 *   segment:  (base, line, hdr_at, head, area, pids_at, me, n): where things are in it
 *   round:    the segment's round counter (returned advanced)
 *   call:     (seq, w0, w1), the call's fingerprint
 *   buffers:  (in, out, tmp), contiguous arrays or None (those the program does not use are ignored)
 *   settings: (spin_ns, yields, nap_ns, dtype code, op code): spin, then yield, then sleep at most nap_ns
 *             before returning NAPPED (the caller looks at the deadline and the peers, and runs on)
 * A buffer the program uses that is None, read-only where it writes, or shorter than it reaches (or a
 * segment's window shorter than its window offsets) stops it before anything runs: status BUFFER,
 * peer = the buffer id, err = the bytes the program needs of it. */
/* run()'s arguments, read as PyArg_ParseTuple's "y*n(KLLLLLLL)k(KKK)(OOO)(LLLii)" would (the same
 * conversions: K and k without overflow checks, L and n with, i within int), written out because this
 * is on every call and the generic parser cost about as much as a small call's round. */
static int items(PyObject *t, Py_ssize_t n, int arg) {
    if (PyTuple_Check(t) && PyTuple_GET_SIZE(t) == n) return 1;
    PyErr_Format(PyExc_TypeError, "pyxccl._native.run: argument %d must be a tuple of %zd items, not %.50s", arg,
                 n, Py_TYPE(t)->tp_name);
    return 0;
}
static int as_ull(PyObject *o, unsigned long long *v) {     /* K */
    if (!PyLong_Check(o)) { PyErr_Format(PyExc_TypeError, "an int is required, not %.50s", Py_TYPE(o)->tp_name); return 0; }
    *v = PyLong_AsUnsignedLongLongMask(o);
    return !(*v == (unsigned long long)-1 && PyErr_Occurred());
}
static int as_ll(PyObject *o, long long *v) {               /* L */
    *v = PyLong_AsLongLong(o);
    return !(*v == -1 && PyErr_Occurred());
}
static int as_int(PyObject *o, int *v) {                    /* i */
    long x = PyLong_AsLong(o);
    if (x == -1 && PyErr_Occurred()) return 0;
    if (x < INT_MIN || x > INT_MAX) { PyErr_SetString(PyExc_OverflowError, "signed integer is out of range"); return 0; }
    *v = (int)x;
    return 1;
}

/* Is the program only rounds and waits (a barrier)? */
static int moves_nothing(const int64_t *code, Py_ssize_t len) {
    for (Py_ssize_t pc = 0; pc < len; pc++)
        if (code[WIDTH * pc] != I_BEGIN && code[WIDTH * pc] != I_PUBLISH && code[WIDTH * pc] != I_SYNC) return 0;
    return 1;
}
/* At the end of a call that moves nothing (a barrier), where a rank on my CPU entered it before me and is
 * still in it, let that one run first: of two ranks taking turns on a core, the one that came first is
 * the one whose next call the other waits for. A barrier then a call, looped (`pyxccl bench`), at 4 ranks
 * on 2 cores: the root's core-mate came to the barrier first in a reduce or a gather, the root in a
 * broadcast or a scatter (docs/design.md). */
static void yield_to_earlier_mate(Run *r) {
    uint32_t cpu = *my_cpu(r), cseq = (uint32_t)r->call[0];
    for (int64_t q = 0; q < r->n; q++) {
        if (q == r->me || *word(r, q, CTL_CPU + r->n) != cpu) continue;
        if ((int32_t)(*entry_word(r, q, cseq) - (uint32_t)r->entered) < 0
            && !ge(__atomic_load_n(counter(r, q), __ATOMIC_ACQUIRE), r->round + 1)) {
            sched_yield();
            return;
        }
    }
}

/* The program from instruction *pc on, without the GIL; returns the status (*pc: where it stopped). */
static int execute(Run *r, const int64_t *code, Py_ssize_t len, Py_ssize_t *pc) {
    int status = DONE;
    Py_ssize_t at = *pc;
    int syncs_only = moves_nothing(code, len);
    volatile uint32_t *entry = entry_word(r, r->me, (uint32_t)r->call[0]);
    if (syncs_only) {       /* (resumed: when I entered it, as I noted then) */
        r->entered = at == 0 ? now_ns() : *entry;
        *entry = (uint32_t)r->entered;
    }
    for (Py_ssize_t b = at - 1; b >= 0; b--)        /* resumed: the round I am in is free or not */
        if (code[WIDTH * b] == I_BEGIN) { r->free_round = code[WIDTH * b + 1]; break; }
    Py_BEGIN_ALLOW_THREADS
    for (; at < len; at++) {
        const int64_t *i = code + WIDTH * at;
        int fused = at + 1 < len ? fuse(r, i, i + WIDTH, at + 2 < len ? i + 2 * WIDTH : NULL) : 0;
        if (fused) {
            at += fused - 1;
            continue;
        }
        status = step(r, i);
        if (status != DONE) break;
    }
    if (status == DONE && syncs_only) yield_to_earlier_mate(r);
    Py_END_ALLOW_THREADS
    free(r->scratch);
    r->scratch = NULL;
    r->scratch_bytes = 0;
    *pc = at;
    return status;
}

/* run()'s result: the new round when done, else (status, pc, round, peer, err). */
static PyObject *outcome(Run *r, int status, Py_ssize_t pc) {
    if (status == DONE) return PyLong_FromUnsignedLong(r->round);
    return Py_BuildValue("inkLL", status, pc, (unsigned long)r->round, (long long)r->peer, (long long)r->err);
}

/* A run's fixed part: the segment's layout, the call's fingerprint words and settings, and the buffers that
 * copies reach with non-temporal stores (need, writes: check()'s). run() fills it on every call, Call once. */
static void fixed(Run *r, unsigned long long base, long long line, long long hdr_at, long long head, long long area,
                  long long pids_at, long long me, long long n, unsigned long long w0, unsigned long long w1,
                  long long spin, long long yields, long long nap, int dtype, int op, const int64_t *need, const int *writes) {
    r->base = (char *)(uintptr_t)base;
    r->line = line; r->hdr_at = hdr_at; r->head = head; r->area = area; r->pids_at = pids_at;
    r->me = me; r->n = n;
    r->call[1] = w0; r->call[2] = w1;
    r->spin_ns = spin; r->yields = yields; r->nap_ns = nap > 0 ? nap : 1; r->dtype = dtype; r->op = op;
    for (int b = 0; b < 3; b++) r->nt[b] = nt_for(need[b], n) && !(writes[b] & 2);
    r->nt[B_WIN] = nt_windows == 1;      /* (run() takes its class's win_seed; a Call picks on each run: go()) */
}

static PyObject *run(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    Py_buffer prog, views[3];
    PyObject *objs[3];
    Py_ssize_t pc;
    unsigned long long base, s0, s1, s2, rnd_;
    long long line, hdr_at, head, area, pids_at, me, n, spin, yields, nap;
    unsigned long rnd;
    int dtype, op;
    if (argc != 7) {
        PyErr_Format(PyExc_TypeError, "pyxccl._native.run takes 7 arguments (%zd given)", argc);
        return NULL;
    }
    PyObject *lay = argv[2], *call = argv[4], *bufs = argv[5], *set = argv[6];
    if (!items(lay, 8, 3) || !items(call, 3, 5) || !items(bufs, 3, 6) || !items(set, 5, 7)) return NULL;
    pc = PyNumber_AsSsize_t(argv[1], PyExc_OverflowError);
    if (pc == -1 && PyErr_Occurred()) return NULL;
    if (!as_ull(PyTuple_GET_ITEM(lay, 0), &base) || !as_ll(PyTuple_GET_ITEM(lay, 1), &line)
        || !as_ll(PyTuple_GET_ITEM(lay, 2), &hdr_at) || !as_ll(PyTuple_GET_ITEM(lay, 3), &head)
        || !as_ll(PyTuple_GET_ITEM(lay, 4), &area) || !as_ll(PyTuple_GET_ITEM(lay, 5), &pids_at)
        || !as_ll(PyTuple_GET_ITEM(lay, 6), &me) || !as_ll(PyTuple_GET_ITEM(lay, 7), &n)
        || !as_ull(argv[3], &rnd_) || !as_ull(PyTuple_GET_ITEM(call, 0), &s0)
        || !as_ull(PyTuple_GET_ITEM(call, 1), &s1) || !as_ull(PyTuple_GET_ITEM(call, 2), &s2)
        || !as_ll(PyTuple_GET_ITEM(set, 0), &spin) || !as_ll(PyTuple_GET_ITEM(set, 1), &yields)
        || !as_ll(PyTuple_GET_ITEM(set, 2), &nap) || !as_int(PyTuple_GET_ITEM(set, 3), &dtype)
        || !as_int(PyTuple_GET_ITEM(set, 4), &op))
        return NULL;
    rnd = (unsigned long)rnd_;          /* k: PyLong_AsUnsignedLongMask, the same bits on LP64 */
    for (int b = 0; b < 3; b++) objs[b] = PyTuple_GET_ITEM(bufs, b);
    if (PyObject_GetBuffer(argv[0], &prog, PyBUF_SIMPLE) < 0) return NULL;     /* y* */
    const int64_t *code = (const int64_t *)prog.buf;
    Py_ssize_t len = prog.len / (WIDTH * (Py_ssize_t)sizeof(int64_t));
    int64_t need[4] = {0, 0, 0, 0};
    int writes[4] = {0, 0, 0, 0};
    const char *bad = prog.len % (WIDTH * (Py_ssize_t)sizeof(int64_t)) ? "a length that is not whole instructions"
                      : ((uintptr_t)prog.buf & 7) ? "an unaligned buffer" : check(code, len, n, need, writes);
    if (!bad && (n < 1 || me < 0 || me >= n || area < 0 || pc < 0 || pc > len)) bad = "another segment or pc";
    if (bad) {
        PyBuffer_Release(&prog);
        PyErr_Format(PyExc_ValueError, "pyxccl._native.run: not a program of this executor (%s); compile it with "
                     "onehost.program", bad);
        return NULL;
    }
    Run run_, *r = &run_;
    memset(r, 0, sizeof *r);
    r->round = (uint32_t)rnd;
    r->peer = -1;
    int status = DONE, held[3] = {0, 0, 0};
    if (need[B_WIN] > area) { status = BUFFER; r->peer = B_WIN; r->err = need[B_WIN]; }
    for (int b = 0; b < 3 && status == DONE; b++) {
        if (!need[b]) continue;             /* not used: not even looked at */
        if (objs[b] != Py_None) {
            int same = -1;                  /* in place (out is in): its view once, as a buffer costs ~100 ns */
            for (int j = 0; j < b; j++)
                if (held[j] && objs[j] == objs[b]) same = j;
            if (same >= 0) {
                views[b] = views[same];
            } else {
                if (PyObject_GetBuffer(objs[b], &views[b], PyBUF_ANY_CONTIGUOUS) < 0) { status = -1; break; }
                held[b] = 1;
            }
            r->buf[b] = views[b].buf;
            if (views[b].len >= need[b] && !(writes[b] && views[b].readonly)) continue;
        }
        status = BUFFER; r->peer = b; r->err = need[b];
    }
    if (status != DONE) {
        for (int b = 0; b < 3; b++)
            if (held[b]) PyBuffer_Release(&views[b]);
        PyBuffer_Release(&prog);
        if (status < 0) return NULL;        /* not a buffer at all: that TypeError */
        return Py_BuildValue("inkLL", status, pc, (unsigned long)r->round, (long long)r->peer, (long long)r->err);
    }
    fixed(r, base, line, hdr_at, head, area, pids_at, me, n, s1, s2, spin, yields, nap, dtype, op, need, writes);
    if (nt_windows == 2) r->nt[B_WIN] = seed_for(seed_class(window_traffic(code, len, me)));
    r->parity = r->round & 1;
    r->call[0] = s0;
    if (pc > 0) {       /* resumed: what I posted this round, if anything, is in my header */
        volatile uint64_t *h = header(r, r->parity, r->me);
        r->posted = h[NBYTES] ? (char *)(uintptr_t)h[ADDR] : NULL;
        r->posted_nt = 0;       /* (which buffer it is in is not kept: plain stores, as correct) */
    }
    status = execute(r, code, len, &pc);
    for (int b = 0; b < 3; b++)
        if (held[b]) PyBuffer_Release(&views[b]);
    PyBuffer_Release(&prog);
    return outcome(r, status, pc);
}

/* Lock: threading.Lock's interface (acquire(blocking=True, timeout=-1), release(), locked(), with), for the
 * engine's two locks (core/engine.py), so that a Call takes and checks them in C instead of through three
 * Python calls a call (~0.25 us of a ~2 us 8-byte call). The lock is PyThread's, as threading.Lock's is;
 * `held` (read and written under the GIL) says that a thread that got it has got the GIL back. */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    int held;
} LockObject;

static PyTypeObject LockType;

static inline int lock_try(LockObject *l) {        /* (GIL held) take it if free, without waiting */
    if (l->held || !PyThread_acquire_lock(l->lock, NOWAIT_LOCK)) return 0;
    l->held = 1;
    return 1;
}

static inline int lock_busy(LockObject *l) {       /* as threading.Lock.locked(): taken, maybe by a thread
                                                     * that has not got the GIL back yet */
    if (l->held) return 1;
    if (!PyThread_acquire_lock(l->lock, NOWAIT_LOCK)) return 1;
    PyThread_release_lock(l->lock);
    return 0;
}

static inline void lock_release(LockObject *l) {   /* (GIL held, held) */
    l->held = 0;
    PyThread_release_lock(l->lock);
}

static PyObject *lock_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "Lock() takes no arguments");
        return NULL;
    }
    LockObject *l = (LockObject *)type->tp_alloc(type, 0);
    if (!l) return NULL;
    if (!(l->lock = PyThread_allocate_lock())) {
        Py_DECREF(l);
        return PyErr_NoMemory();
    }
    return (PyObject *)l;
}

static void lock_dealloc(PyObject *self) {
    LockObject *l = (LockObject *)self;
    if (l->lock) {
        if (l->held) PyThread_release_lock(l->lock);
        PyThread_free_lock(l->lock);
    }
    Py_TYPE(self)->tp_free(self);
}

/* Wait for it (timeout < 0: for ever) with the GIL released, as threading.Lock.acquire; signals wake the
 * wait so that their handlers run (their exception ends it). */
static PyObject *lock_wait(LockObject *l, double timeout) {
    if (lock_try(l)) Py_RETURN_TRUE;
    int64_t deadline = timeout >= 0 ? now_ns() + (int64_t)(timeout * 1e9) : 0;
    for (;;) {
        PY_TIMEOUT_T us = -1;
        if (timeout >= 0) {
            int64_t left = deadline - now_ns();
            if (left <= 0) Py_RETURN_FALSE;
            us = (PY_TIMEOUT_T)(left / 1000);
        }
        PyLockStatus st;
        Py_BEGIN_ALLOW_THREADS
        st = PyThread_acquire_lock_timed(l->lock, us, 1);
        Py_END_ALLOW_THREADS
        if (st == PY_LOCK_ACQUIRED) {
            l->held = 1;
            Py_RETURN_TRUE;
        }
        if (st == PY_LOCK_FAILURE) Py_RETURN_FALSE;
        if (PyErr_CheckSignals() < 0) return NULL;     /* PY_LOCK_INTR */
    }
}

static PyObject *lock_acquire(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|pd:acquire", kwlist, &blocking, &timeout)) return NULL;
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    LockObject *l = (LockObject *)self;
    if (!blocking) return PyBool_FromLong(lock_try(l));
    return lock_wait(l, timeout);
}

static PyObject *lock_enter(PyObject *self, PyObject *unused) {
    (void)unused;
    return lock_wait((LockObject *)self, -1);
}

static PyObject *lock_release_py(PyObject *self, PyObject *unused) {
    (void)unused;
    LockObject *l = (LockObject *)self;
    if (!l->held) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    lock_release(l);
    Py_RETURN_NONE;
}

static PyObject *lock_exit(PyObject *self, PyObject *args) {
    (void)args;
    return lock_release_py(self, NULL);
}

static PyObject *lock_locked(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(lock_busy((LockObject *)self));
}

static PyMethodDef lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))lock_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool, as threading.Lock's"},
    {"release", lock_release_py, METH_NOARGS, "release(): RuntimeError when it is not held"},
    {"locked", lock_locked, METH_NOARGS, "locked() -> bool"},
    {"__enter__", lock_enter, METH_NOARGS, NULL},
    {"__exit__", lock_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pyxccl._native.Lock",
    .tp_basicsize = sizeof(LockObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A lock with threading.Lock's interface that a Call takes in C (the engine's locks).",
    .tp_new = lock_new,
    .tp_methods = lock_methods,
    .tp_dealloc = lock_dealloc,
};

/* --- Books and Count: the fields a call reads and writes, as C members -------------------------------
 *
 * core/context.py's Context is a subclass of Books and core/counters.py's Tally one of Count: Python
 * reads and writes these fields as attributes (member descriptors, as __slots__ are), and a Call
 * (below) as struct fields, without a dict lookup or an int object per call. Where the module is not
 * built the same attributes are ordinary ones. */
typedef struct {
    PyObject_HEAD
    long long seq;                  /* every call */
    unsigned int coll_seq;          /* collectives, modulo 2**32 (their messages' key) */
    char closed;
    PyObject *error, *segment;
    PyObject *recent, *recent_calls;    /* lists: at cseq & (len - 1), the collective's cseq and its record */
} BooksObject;

static int books_traverse(PyObject *self, visitproc visit, void *arg) {
    BooksObject *k = (BooksObject *)self;
    Py_VISIT(k->error); Py_VISIT(k->segment); Py_VISIT(k->recent); Py_VISIT(k->recent_calls);
    return 0;
}

static int books_clear(PyObject *self) {
    BooksObject *k = (BooksObject *)self;
    Py_CLEAR(k->error); Py_CLEAR(k->segment); Py_CLEAR(k->recent); Py_CLEAR(k->recent_calls);
    return 0;
}

/* A dealloc of the types below: their references cleared by `clear` (a subclass's own slots, dict and
 * type reference are subtype_dealloc's) */
static void dealloc_cleared(PyObject *self, inquiry clear) {
    PyObject_GC_UnTrack(self);
    clear(self);
    Py_TYPE(self)->tp_free(self);
}

static void books_dealloc(PyObject *self) { dealloc_cleared(self, books_clear); }

static PyMemberDef books_members[] = {
    {"seq", T_LONGLONG, offsetof(BooksObject, seq), 0, "the number of the last call (every call)"},
    {"coll_seq", T_UINT, offsetof(BooksObject, coll_seq), 0, "the number of the last collective, modulo 2**32"},
    {"closed", T_BOOL, offsetof(BooksObject, closed), 0, "close() was called"},
    {"error", T_OBJECT, offsetof(BooksObject, error), 0, "why the communicator failed (None: it has not)"},
    {"segment", T_OBJECT, offsetof(BooksObject, segment), 0, "the one-host fast path's HostSegment (or None)"},
    {"recent", T_OBJECT, offsetof(BooksObject, recent), 0, "the last collectives' numbers (at cseq & (len - 1))"},
    {"recent_calls", T_OBJECT, offsetof(BooksObject, recent_calls), 0, "their records, at the same index"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject BooksType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pyxccl._native.Books",
    .tp_basicsize = sizeof(BooksObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The C part of a communicator's context (core/context.py): the fields every call reads and writes.",
    .tp_new = PyType_GenericNew,
    .tp_traverse = books_traverse,
    .tp_clear = books_clear,
    .tp_dealloc = books_dealloc,
    .tp_members = books_members,
};

typedef struct {
    PyObject_HEAD
    long long calls;
} CountObject;

static PyMemberDef count_members[] = {
    {"calls", T_LONGLONG, offsetof(CountObject, calls), 0, "calls since the counters were last read"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject CountType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pyxccl._native.Count",
    .tp_basicsize = sizeof(CountObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The C part of a prepared call's tally (core/counters.py): its count of calls.",
    .tp_new = PyType_GenericNew,
    .tp_members = count_members,
};

/* --- Call: a prepared blocking call, run with its bookkeeping in one C call ------------------------
 *
 * core/prepared.py makes one per Prepared that the native executor runs (Prepared.fast). Calling it,
 * call(in, out, tmp), does for a blocking call what Prepared.start and _execute do when the engine is
 * idle: checks
 * the buffers as Prepared.again does (C-contiguous, the output writable if the call writes it, and
 * what the program reaches of each), claims the engine (Engine.claim), takes the sequence numbers
 * (Context.seq, Context.coll_seq), opens the flight-recorder entry (Recorder.begin's), keeps the
 * call in Context.recent and recent_calls, counts it (Tally.count), runs the program, ends the entry
 * (recorder.ended) and releases the engine (Engine.release). Those Python definitions are the
 * reference; the state it reads and writes is theirs (the objects' own attributes; the context's
 * and the tally's that every call touches are their C bases' members, Books and Count), so every other
 * path sees the same numbers, entries and counts (tests/test_floor.py compares the two, entry by
 * entry). Returns
 *   True   done (the call's result is the caller's);
 *   False  nothing ran: the engine is busy, another thread takes numbers, the communicator is closed
 *          or failed, or its segment changed: Prepared.start takes it from there;
 *   None   nothing ran: a buffer is not one this call can use as it is (Prepared.start, or the full
 *          path for a plain repeat, says why);
 *   (done, entry, seq, cseq, t0)  the engine is claimed, the numbers taken and the entry open, and
 *          the caller finishes (then releases the engine): done is run()'s result (the new round,
 *          already stored, or why it stopped), or None when the communicator failed before it ran;
 *          t0 the monotonic clock when it was numbered (the deadline counts from it).
 * With finish=False (AVG divides after the rounds) a finished run is returned that way too.
 *
 * Numbering without the engine's lock: the GIL is held from the checks to the entry (nothing in
 * between can run Python code: what may collect garbage is allocated before), and a thread that
 * holds the lock is taking numbers of its own, so the call goes the slow way then. */
static PyObject *S_pending, *S_round, *S_waiting, *S_traffic, *S_dtype, *S_thread_check, *S_here, *S_me, *S__name;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Py_buffer prog;
    const int64_t *code;
    Py_ssize_t len;
    int64_t need[4];
    int writes[4];
    int out_writes, finish;
    Run fixed;                  /* what every run of it starts from (fixed()) */
    unsigned long long recent_mask;
    PyObject *ctx, *ctx_dict, *seg, *seg_dict, *eng_dict, *lock, *exec, *ops_append, *trace, *what, *record,
        *tally, *running, *done;
    /* again()'s: the arrays a repeat of its key has (expect()); array_type NULL until then; and the objects
     * its root, op, algorithm and timeout were, and the issuing thread's word (Context.thread_word) */
    PyObject *array_type, *in_dtype, *out_dtype, *root, *opobj, *algorithm, *timeout;
    Py_ssize_t in_nbytes, out_nbytes, at;        /* at: primitives.apart's in-place offset (-1: none) */
    long long thread;
    /* thread_word()'s last answer from the Python lookup: for the thread state numbered tw_id, whose Thread
     * (tw_thread) had the name object tw_name, the word tw_word */
    uint64_t tw_id;
    PyObject *tw_thread, *tw_name;
    long long tw_word;
    int inplace, gathers;
    int win_copies;             /* the program copies into its window (copies_into_window): a way to pick */
    int window_sized;           /* it copies into its window or reads the others' in pieces streaming would take */
    int leads;                  /* rank 0 of the segment, window-sized: it picks for all (lead) */
    int lead_way;               /* (the others) the way rank 0 took on the last run it was seen on (-1: none) */
    int last_way;               /* the way of its last run */
    WinPick pick;               /* (nt_windows) how its runs went with plain and with non-temporal stores */
    int seed_class;             /* its class of window traffic (seed_class): which win_seed it takes and sets */
} CallObject;

static double clock_s(clockid_t id) {       /* as time.time() and time.monotonic() give it */
    struct timespec t;
    clock_gettime(id, &t);
    return (double)((int64_t)t.tv_sec * 1000000000 + t.tv_nsec) / 1e9;
}

/* The call on args = (in, out, tmp); exact: again()'s, the sizes those of expect() and in and out apart. */
static PyObject *go(CallObject *c, PyObject *const *args, int exact) {
    Py_buffer views[3];
    int held[3] = {0, 0, 0};
    Run run_ = c->fixed, *r = &run_;
    PyObject *result = Py_None, *entry = NULL, *seq = NULL, *cseq = NULL;
    BooksObject *k = (BooksObject *)c->ctx;
    /* the buffers, as Prepared.again takes them (in and out checked even where the program does not reach) */
    for (int b = 0; b < 3; b++) {
        PyObject *o = args[b];
        int wneed = c->writes[b] || (b == B_OUT && c->out_writes);
        if (o == Py_None) {
            if (c->need[b]) goto refused;
            continue;
        }
        if (b == B_TMP && !c->need[b]) continue;
        Py_buffer *v = NULL;
        for (int j = 0; j < b; j++)
            if (held[j] && args[j] == o) v = &views[j];     /* in place: one view */
        if (!v) {
            if (PyObject_GetBuffer(o, &views[b], PyBUF_C_CONTIGUOUS) < 0) {
                PyErr_Clear();      /* not contiguous, or no buffer: the slower paths say what */
                goto refused;
            }
            held[b] = 1;
            v = &views[b];
        }
        if (v->len < c->need[b] || (wneed && v->readonly)) goto refused;
        if (exact && b < B_TMP && v->len != (b == B_IN ? c->in_nbytes : c->out_nbytes)) goto refused;
        r->buf[b] = v->buf;
    }
    if (exact && held[B_IN] && held[B_OUT] && views[B_IN].len && views[B_OUT].len
        && (char *)views[B_IN].buf < (char *)views[B_OUT].buf + views[B_OUT].len
        && (char *)views[B_OUT].buf < (char *)views[B_IN].buf + views[B_IN].len) {
        /* they overlap: only in the in-place form (primitives.apart: the inner one at `at` in the outer) */
        char *inner = views[c->gathers ? B_IN : B_OUT].buf, *outer = views[c->gathers ? B_OUT : B_IN].buf;
        if (c->at < 0 || inner != outer + c->at) goto refused;
    }
    /* what may collect garbage (and so run Python code), before the checks */
    entry = PyList_New(9);
    if (!entry) goto failed;
    /* the engine idle and this thread's (Engine.claim), no other thread taking numbers */
    PyObject *pending = PyDict_GetItemWithError(c->eng_dict, S_pending);
    if (k->closed || (k->error && k->error != Py_None) || k->segment != c->seg || !pending || !PyLong_Check(pending)
        || PyLong_AsLongLong(pending) != 0) {
        if (PyErr_Occurred()) goto failed;
        result = Py_False;
        goto refused;
    }
    if (lock_busy((LockObject *)c->lock) || !lock_try((LockObject *)c->exec)) {      /* Engine.claim's acquire(False) */
        result = Py_False;
        goto refused;
    }
    /* the numbers (Prepared.start's) and the entry (Recorder.begin's) */
    unsigned int ncseq = k->coll_seq + 1;
    seq = PyLong_FromLongLong(k->seq + 1);
    cseq = PyLong_FromUnsignedLong(ncseq);
    if (!seq || !cseq) goto claimed_failed;
    k->seq++;
    k->coll_seq = ncseq;
    double t0 = clock_s(CLOCK_MONOTONIC), now = clock_s(CLOCK_REALTIME);
    PyObject *issued = PyFloat_FromDouble(now), *zero = PyFloat_FromDouble(0.0);
    if (!issued || !zero) { Py_XDECREF(issued); Py_XDECREF(zero); goto claimed_failed; }
    Py_INCREF(seq); PyList_SET_ITEM(entry, 0, seq);
    Py_INCREF(cseq); PyList_SET_ITEM(entry, 1, cseq);
    Py_INCREF(c->what); PyList_SET_ITEM(entry, 2, c->what);
    Py_INCREF(Py_None); PyList_SET_ITEM(entry, 3, Py_None);
    Py_INCREF(issued); PyList_SET_ITEM(entry, 4, issued);
    PyList_SET_ITEM(entry, 5, issued);
    PyList_SET_ITEM(entry, 6, zero);
    Py_INCREF(c->running); PyList_SET_ITEM(entry, 7, c->running);
    Py_INCREF(Py_None); PyList_SET_ITEM(entry, 8, Py_None);
    PyObject *ok = PyObject_CallOneArg(c->ops_append, entry);
    if (!ok) goto claimed_failed;
    Py_DECREF(ok);
    if (c->trace != Py_None && PyList_Append(c->trace, entry) < 0) goto claimed_failed;
    /* named in a mismatch error (Context.recent, recent_calls), counted (Tally.count) */
    Py_ssize_t at = (Py_ssize_t)(ncseq & c->recent_mask);
    if (!k->recent || !k->recent_calls || !PyList_Check(k->recent) || !PyList_Check(k->recent_calls)
        || PyList_GET_SIZE(k->recent) <= at || PyList_GET_SIZE(k->recent_calls) <= at) {
        PyErr_SetString(PyExc_TypeError, "pyxccl._native.Call: the context's recent lists are not as it made them");
        goto claimed_failed;
    }
    Py_INCREF(cseq);
    PyList_SetItem(k->recent, at, cseq);
    Py_INCREF(c->record);
    PyList_SetItem(k->recent_calls, at, c->record);
    long long ncalls = ((CountObject *)c->tally)->calls++;
    int rc;
    if (!ncalls) {          /* the first since the counters were read: listed to be added then */
        PyObject *traffic = PyObject_GetAttr(c->tally, S_traffic);
        PyObject *w = traffic ? PyObject_CallMethodOneArg(traffic, S_waiting, c->tally) : NULL;
        Py_XDECREF(traffic);
        if (!w) goto claimed_failed;
        Py_DECREF(w);
    }
    PyObject *ran;
    if (!ncalls && (k->closed || (k->error && k->error != Py_None))) {     /* waiting() ran Python code */
        ran = Py_None;          /* aborted by another thread meanwhile (Prepared._execute asks too) */
        Py_INCREF(ran);
    } else {
        PyObject *rnd = PyDict_GetItemWithError(c->seg_dict, S_round);
        if (!rnd) { if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "round"); goto claimed_failed; }
        r->round = (uint32_t)PyLong_AsUnsignedLongMask(rnd);
        if (PyErr_Occurred()) goto claimed_failed;
        r->peer = -1;
        r->parity = r->round & 1;
        r->call[0] = ncseq;
        int way = 0, timed = 0, own = 0;
        int64_t started = c->window_sized ? now_ns() : 0;       /* (leads implies window_sized) */
        if (c->window_sized) *entry_word(r, r->me, ncseq) = (uint32_t)started;
        if (c->leads) {
            way = win_pick(&c->pick);
            timed = win_timing(&c->pick);
            __atomic_store_n(lead_word(r), (ncseq << 1) | (uint32_t)way, __ATOMIC_RELEASE);
        } else if (c->win_copies) {
            int led = lead_way_of(r, ncseq);
            if (nt_windows != 2) way = nt_windows;
            else if (led >= 0) way = led;
            else if (c->lead_way >= 0) way = c->lead_way;
            else own = 1, way = win_pick(&c->pick), timed = win_timing(&c->pick);
        }
        r->nt[B_WIN] = c->last_way = way;
        r->win_timing = own && timed;
        Py_ssize_t pc = 0;
        int status = execute(r, c->code, c->len, &pc);
        if (status == DONE && nt_windows == 2) {
            if (c->leads)
                win_ran(&c->pick, way, timed ? (double)(now_ns() - last_entry(r, ncseq, started)) : -1.0);
            else if (c->win_copies) {
                int led = lead_way_of(r, ncseq);
                if (led >= 0) c->lead_way = led;
                else if (own) win_ran(&c->pick, way, timed && r->win_bytes ? (double)r->win_ns / (double)r->win_bytes : -1.0);
            }
            if ((c->leads || own) && c->pick.n[0] >= 2 && c->pick.n[1] >= 2)     /* (a kept run each way) */
                __atomic_store_n(&win_seed[c->seed_class], win_time(&c->pick, 1) < win_time(&c->pick, 0), __ATOMIC_RELAXED);
        }
        for (int b = 0; b < 3; b++)
            if (held[b]) { PyBuffer_Release(&views[b]); held[b] = 0; }
        if (status == DONE) {
            PyObject *newround = PyLong_FromUnsignedLong(r->round);
            rc = newround ? PyDict_SetItem(c->seg_dict, S_round, newround) : -1;
            Py_XDECREF(newround);
            if (rc < 0) goto claimed_failed;
            if (c->finish) {        /* recorder.ended(entry), Engine.release() */
                PyObject *ended = PyFloat_FromDouble(clock_s(CLOCK_REALTIME));
                if (!ended) goto claimed_failed;
                PyList_SetItem(entry, 6, ended);
                Py_INCREF(c->done);
                PyList_SetItem(entry, 7, c->done);
                lock_release((LockObject *)c->exec);
                Py_DECREF(entry); Py_DECREF(seq); Py_DECREF(cseq);
                Py_RETURN_TRUE;
            }
        }
        ran = outcome(r, status, pc);
        if (!ran) goto claimed_failed;
    }
    PyObject *t = PyFloat_FromDouble(t0);
    PyObject *back = t ? PyTuple_Pack(5, ran, entry, seq, cseq, t) : NULL;
    Py_XDECREF(t);
    Py_DECREF(ran); Py_DECREF(entry); Py_DECREF(seq); Py_DECREF(cseq);
    if (!back) lock_release((LockObject *)c->exec);
    return back;

claimed_failed: {       /* an error of Python's own (memory): the engine is not kept */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        lock_release((LockObject *)c->exec);
        PyErr_Restore(et, ev, tb);
    }
failed:
    result = NULL;
refused:
    for (int b = 0; b < 3; b++)
        if (held[b]) PyBuffer_Release(&views[b]);
    Py_XDECREF(entry); Py_XDECREF(seq); Py_XDECREF(cseq);
    Py_XINCREF(result);
    return result;
}

static PyObject *call_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 3 || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "pyxccl._native.Call takes 3 positional arguments (in, out, tmp)");
        return NULL;
    }
    return go((CallObject *)self, args, 0);
}

/* Context.thread_word() for the calling thread, or -1 where only Python can tell (the thread's first call,
 * or it was renamed since: thread_word() finds the word then, and stores it where this reads it). */
static long long thread_word(CallObject *c) {
    PyObject *on = PyDict_GetItemWithError(c->ctx_dict, S_thread_check);
    if (!on) { PyErr_Clear(); return -1; }
    if (on == Py_False) return 0;
    /* the thread asked last, not renamed since (a thread state's id is never reused in a process) */
    uint64_t id = PyThreadState_GetID(PyThreadState_Get());
    if (c->tw_thread && id == c->tw_id) {
        PyObject *name = PyObject_GetAttr(c->tw_thread, S__name);
        Py_XDECREF(name);       /* (only its identity is compared) */
        if (name && name == c->tw_name) return c->tw_word;
        PyErr_Clear();
    }
    PyObject *here = on == Py_True ? PyDict_GetItemWithError(c->ctx_dict, S_here) : NULL;
    if (!here) { PyErr_Clear(); return -1; }
    PyObject *me = PyObject_GetAttr(here, S_me);     /* (thread, its name, its name in fingerprints, word) */
    if (!me) { PyErr_Clear(); return -1; }
    long long w = -1;
    if (PyTuple_Check(me) && PyTuple_GET_SIZE(me) == 4) {
        PyObject *name = PyObject_GetAttr(PyTuple_GET_ITEM(me, 0), S__name);
        if (name && PyObject_RichCompareBool(name, PyTuple_GET_ITEM(me, 1), Py_EQ) == 1)
            w = PyLong_AsLongLong(PyTuple_GET_ITEM(me, 3));
        if (PyErr_Occurred()) { PyErr_Clear(); w = -1; }
        if (w >= 0) {
            c->tw_id = id; c->tw_word = w;
            Py_INCREF(PyTuple_GET_ITEM(me, 0)); Py_XSETREF(c->tw_thread, PyTuple_GET_ITEM(me, 0));
            Py_INCREF(name); Py_XSETREF(c->tw_name, name);
        }
        Py_XDECREF(name);
    }
    Py_DECREF(me);
    return w;
}

/* again(in, out, root, op, algorithm, timeout): the call (as call(in, out, None) answers) when it is a
 * repeat of the call expect() described: in and out arrays as its key's (the same array type and dtype
 * objects, the same sizes, in place or apart as then, no scratch; out None where that call had no output),
 * root, op, algorithm and timeout the same objects, from the thread it was prepared for (its word). Else None
 * with nothing done: the caller takes the key's way (comm.py, core/prepared.py). */
static PyObject *again(CallObject *c, PyObject *const *args) {
    PyObject *inp = args[0], *out = args[1];
    if (!c->array_type || c->need[B_TMP] || args[2] != c->root || args[3] != c->opobj || args[4] != c->algorithm
        || args[5] != c->timeout)
        Py_RETURN_NONE;
    if (c->out_dtype == Py_None ? out != Py_None : Py_TYPE(out) != (PyTypeObject *)c->array_type) Py_RETURN_NONE;
    if (c->in_dtype == Py_None ? inp != Py_None
                               : Py_TYPE(inp) != (PyTypeObject *)c->array_type || (inp == out) != c->inplace)
        Py_RETURN_NONE;
    for (int b = B_IN; b <= B_OUT; b++) {
        PyObject *o = b == B_IN ? inp : out, *want = b == B_IN ? c->in_dtype : c->out_dtype;
        if (o == Py_None || (b == B_OUT && o == inp)) continue;
        PyObject *dt = PyObject_GetAttr(o, S_dtype);
        if (!dt) return NULL;
        Py_DECREF(dt);
        if (dt != want) Py_RETURN_NONE;
    }
    if (thread_word(c) != c->thread) Py_RETURN_NONE;
    PyObject *three[3] = {inp, out, Py_None};
    return go(c, three, 1);
}

static PyObject *call_again(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) { PyErr_SetString(PyExc_TypeError, "again(in, out, root, op, algorithm, timeout)"); return NULL; }
    return again((CallObject *)self, args);
}

/* thread_word(): what again() takes for the calling thread's word (-1: none; tests/test_floor.py compares it
 * with Context.thread_word's). */
static PyObject *call_thread_word(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromLongLong(thread_word((CallObject *)self));
}

/* expect(array_type, in_dtype, in_nbytes, out_dtype, out_nbytes, inplace, at, gathers, root, op, algorithm,
 * timeout): what again() takes (in_dtype or out_dtype None: no input or output; at, gathers:
 * primitives.apart's rule for an input and output that overlap, at -1 for none). */
static PyObject *call_expect(PyObject *self, PyObject *args) {
    CallObject *c = (CallObject *)self;
    PyObject *at, *idt, *odt, *root, *op, *algorithm, *timeout;
    Py_ssize_t inb, outb, off;
    int inplace, gathers;
    if (!PyArg_ParseTuple(args, "OOnOnpnpOOOO:expect", &at, &idt, &inb, &odt, &outb, &inplace, &off, &gathers,
                          &root, &op, &algorithm, &timeout))
        return NULL;
    c->at = off; c->gathers = gathers;
    if (!PyType_Check(at)) { PyErr_SetString(PyExc_TypeError, "expect: an array type"); return NULL; }
    Py_INCREF(at); Py_XSETREF(c->array_type, at);
    Py_INCREF(idt); Py_XSETREF(c->in_dtype, idt);
    Py_INCREF(odt); Py_XSETREF(c->out_dtype, odt);
    Py_INCREF(root); Py_XSETREF(c->root, root);
    Py_INCREF(op); Py_XSETREF(c->opobj, op);
    Py_INCREF(algorithm); Py_XSETREF(c->algorithm, algorithm);
    Py_INCREF(timeout); Py_XSETREF(c->timeout, timeout);
    c->in_nbytes = inb; c->out_nbytes = outb; c->inplace = inplace;
    Py_RETURN_NONE;
}

static PyObject *call_window_runs(PyObject *self, PyObject *unused) {
    (void)unused;
    CallObject *c = (CallObject *)self;
    return Py_BuildValue("(II)", c->pick.n[0], c->pick.n[1]);
}

static PyObject *call_window_costs(PyObject *self, PyObject *unused) {
    (void)unused;
    CallObject *c = (CallObject *)self;
    if (!win_known(&c->pick)) Py_RETURN_NONE;
    return Py_BuildValue("(ddi)", win_time(&c->pick, 0), win_time(&c->pick, 1), (int)(c->pick.next - c->pick.runs));
}

static PyObject *call_window_way(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromLong(((CallObject *)self)->last_way);
}

static PyObject *call_window_class(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromLong(((CallObject *)self)->seed_class);
}

static PyMethodDef call_methods[] = {
    {"again", (PyCFunction)(void (*)(void))call_again, METH_FASTCALL,
     "again(in, out, root, op, algorithm, timeout): the call on a repeat's arrays and objects, or None"},
    {"expect", call_expect, METH_VARARGS, "expect(array_type, in_dtype, in_nbytes, out_dtype, out_nbytes, inplace, at, "
     "gathers, root, op, algorithm, timeout)"},
    {"thread_word", call_thread_word, METH_NOARGS, "thread_word(): the calling thread's word as again() finds it"},
    {"window_runs", call_window_runs, METH_NOARGS, "window_runs() -> (plain, non_temporal): its timed runs each way "
     "(set_nt_windows(2): every run until each way has three, then every 4th); (0, 0) where it copies into no window"},
    {"window_costs", call_window_costs, METH_NOARGS, "window_costs() -> (plain, non_temporal, trial): what each way "
     "cost lately (the median of its last timed runs: ns a run where it leads, on rank 0, else ns a byte of its "
     "copies into its window), and in how many runs it tries the way it does not take (< 0: trying it); None "
     "before it has three runs each way (set_nt_windows(2))"},
    {"window_class", call_window_class, METH_NOARGS, "window_class() -> its class of window traffic a run (0: < 64 "
     "KiB, 1: < 1 MiB, 2: < 16 MiB, 3: more), whose seed way its first runs take (set_window_seeds)"},
    {"window_way", call_window_way, METH_NOARGS, "window_way() -> 1 where its last run wrote its window by "
     "non-temporal stores, 0 where not or where it copies into none"},
    {NULL, NULL, 0, NULL},
};

/* Call(program, segment, words, settings, ctx, engine, recorder, what, record, tally, writes, finish,
 *      recent_calls, states, thread) -- see above; segment: the HostSegment (its layout is read once), words:
 *      the call's fingerprint words (w0, w1), settings: as run()'s, states: (RUNNING, DONE), thread: the word
 *      of the thread it was prepared for (Context.thread_word's; its fingerprint names that thread). */
static PyObject *call_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *program, *seg, *ctx, *eng, *rec, *what, *record, *tally, *running, *done;
    unsigned long long w0, w1, recent;
    long long spin, yields, nap;
    int dtype, op, writes, finish;
    if (kw && PyDict_GET_SIZE(kw)) { PyErr_SetString(PyExc_TypeError, "Call takes no keywords"); return NULL; }
    long long thread;
    if (!PyArg_ParseTuple(args, "OO(KK)(LLLii)OOOOOOppK(OO)L:Call", &program, &seg, &w0, &w1, &spin, &yields, &nap,
                          &dtype, &op, &ctx, &eng, &rec, &what, &record, &tally, &writes, &finish, &recent, &running,
                          &done, &thread))
        return NULL;
    if (!recent || (recent & (recent - 1))) { PyErr_SetString(PyExc_ValueError, "Call: recent_calls must be a power of 2"); return NULL; }
    CallObject *c = (CallObject *)type->tp_alloc(type, 0);
    if (!c) return NULL;
    c->vectorcall = call_vectorcall;
    if (PyObject_GetBuffer(program, &c->prog, PyBUF_SIMPLE) < 0) { c->prog.obj = NULL; Py_DECREF(c); return NULL; }
    c->code = (const int64_t *)c->prog.buf;
    c->len = c->prog.len / (WIDTH * (Py_ssize_t)sizeof(int64_t));
    PyObject *lay = PyObject_GetAttrString(seg, "layout");
    if (!lay) { Py_DECREF(c); return NULL; }
    unsigned long long base;
    long long line, hdr_at, head, area, pids_at, me, n;
    int ok = PyArg_ParseTuple(lay, "KLLLLLLL", &base, &line, &hdr_at, &head, &area, &pids_at, &me, &n);
    Py_DECREF(lay);
    if (!ok) { Py_DECREF(c); return NULL; }
    const char *bad = c->prog.len % (WIDTH * (Py_ssize_t)sizeof(int64_t)) ? "a length that is not whole instructions"
                      : ((uintptr_t)c->prog.buf & 7) ? "an unaligned buffer" : check(c->code, c->len, n, c->need, c->writes);
    if (!bad && (n < 1 || me < 0 || me >= n || area < 0)) bad = "another segment";
    if (!bad && c->need[B_WIN] > area) bad = "windows larger than the segment's";
    if (bad) {
        PyErr_Format(PyExc_ValueError, "pyxccl._native.Call: not a program of this executor for this segment (%s)", bad);
        Py_DECREF(c);
        return NULL;
    }
    fixed(&c->fixed, base, line, hdr_at, head, area, pids_at, me, n, w0, w1, spin, yields, nap, dtype, op, c->need, c->writes);
    c->win_copies = copies_into_window(c->code, c->len);
    int64_t traffic = window_traffic(c->code, c->len, me);
    c->window_sized = traffic > 0;
    c->leads = me == 0 && n > 1 && c->window_sized;
    c->lead_way = -1;
    c->seed_class = seed_class(traffic);
    c->pick.first = seed_for(c->seed_class);
    c->out_writes = writes; c->finish = finish; c->recent_mask = recent - 1; c->thread = thread;
    PyObject *ops = NULL;
    if (!PyObject_TypeCheck(ctx, &BooksType) || !PyObject_TypeCheck(tally, &CountType)) {
        PyErr_SetString(PyExc_TypeError, "pyxccl._native.Call: a context that is not a Books or a tally not a Count");
        Py_DECREF(c);
        return NULL;
    }
    Py_INCREF(ctx); c->ctx = ctx;
    c->ctx_dict = PyObject_GetAttrString(ctx, "__dict__");
    c->seg_dict = PyObject_GetAttrString(seg, "__dict__");
    c->eng_dict = PyObject_GetAttrString(eng, "__dict__");
    c->lock = PyObject_GetAttrString(eng, "lock");
    c->exec = PyObject_GetAttrString(eng, "_exec");
    ops = PyObject_GetAttrString(rec, "ops");
    c->trace = PyObject_GetAttrString(rec, "trace");
    if (ops) c->ops_append = PyObject_GetAttrString(ops, "append");
    Py_XDECREF(ops);
    Py_INCREF(seg); c->seg = seg;
    Py_INCREF(what); c->what = what;
    Py_INCREF(record); c->record = record;
    Py_INCREF(tally); c->tally = tally;
    Py_INCREF(running); c->running = running;
    Py_INCREF(done); c->done = done;
    if (!c->ctx_dict || !c->seg_dict || !c->eng_dict || !c->trace || !c->lock || !c->exec || !c->ops_append) {
        Py_DECREF(c);
        return NULL;
    }
    if (!PyDict_Check(c->ctx_dict) || !PyDict_Check(c->seg_dict) || !PyDict_Check(c->eng_dict)
        || (c->trace != Py_None && !PyList_Check(c->trace)) || Py_TYPE(c->lock) != &LockType
        || Py_TYPE(c->exec) != &LockType) {
        PyErr_SetString(PyExc_TypeError, "pyxccl._native.Call: a context, segment, engine or recorder of another kind");
        Py_DECREF(c);
        return NULL;
    }
    return (PyObject *)c;
}

#define CALL_OBJECTS(X) X(ctx) X(ctx_dict) X(seg) X(seg_dict) X(eng_dict) X(lock) X(exec) X(ops_append) \
    X(trace) X(what) X(record) X(tally) X(running) X(done) X(array_type) X(in_dtype) \
    X(out_dtype) X(root) X(opobj) X(algorithm) X(timeout) X(tw_thread) X(tw_name)

static int call_traverse(PyObject *self, visitproc visit, void *arg) {
    CallObject *c = (CallObject *)self;
#define VISIT(f) Py_VISIT(c->f);
    CALL_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int call_clear(PyObject *self) {
    CallObject *c = (CallObject *)self;
#define CLEAR(f) Py_CLEAR(c->f);
    CALL_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void call_dealloc(PyObject *self) {
    CallObject *c = (CallObject *)self;
    PyObject_GC_UnTrack(self);
    call_clear(self);
    if (c->prog.obj) PyBuffer_Release(&c->prog);
    Py_TYPE(self)->tp_free(self);
}

static PyTypeObject CallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pyxccl._native.Call",
    .tp_basicsize = sizeof(CallObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A prepared blocking call run with its bookkeeping in one C call (see _native.c).",
    .tp_new = call_new,
    .tp_methods = call_methods,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(CallObject, vectorcall),
    .tp_traverse = call_traverse,
    .tp_clear = call_clear,
    .tp_dealloc = call_dealloc,
};

/* --- Request: a persistent collective's blocking start in one C call ---------------------------------
 *
 * core/persistent.py's PersistentRequest is a subclass: the fields below are its attributes (_work,
 * _freed, _mine, _inp, _out, result), so that calling a request (req() or req.run()) reads them
 * here. Where it is inactive, not freed, and its init's Call (_mine) runs on this thread, the call is
 * that Call's call(_inp, _out, None) without a Python frame: done, it returns `result`; started but left to
 * finish (or the engine busy), self._settle(answer). Anything else is self._run(): the request's own
 * Python definition (refusals, another thread's Prepared, a buffer the C call takes no view of). */
static PyObject *S__run, *S__settle;

typedef struct {
    PyObject_HEAD
    PyObject *work, *mine, *inp, *out, *result;
    char freed;
} RequestObject;

static PyObject *request_run(PyObject *self, PyObject *unused) {
    (void)unused;
    RequestObject *q = (RequestObject *)self;
    if ((q->work == NULL || q->work == Py_None) && !q->freed && q->mine && Py_TYPE(q->mine) == &CallType) {
        CallObject *c = (CallObject *)q->mine;
        if (thread_word(c) == c->thread) {
            PyObject *three[3] = {q->inp ? q->inp : Py_None, q->out ? q->out : Py_None, Py_None};
            /* held for the call: Python code it may run (a collection, the counters' listing) could drop
             * the request's references */
            Py_INCREF(c); Py_INCREF(three[0]); Py_INCREF(three[1]);
            PyObject *done = go(c, three, 0);
            Py_DECREF(c); Py_DECREF(three[0]); Py_DECREF(three[1]);
            if (!done) return NULL;
            if (done == Py_True) {
                Py_DECREF(done);
                PyObject *res = q->result ? q->result : Py_None;
                Py_INCREF(res);
                return res;
            }
            if (done != Py_None) {
                PyObject *back = PyObject_CallMethodOneArg(self, S__settle, done);
                Py_DECREF(done);
                return back;
            }
            Py_DECREF(done);
        }
    }
    return PyObject_CallMethodNoArgs(self, S__run);
}

static PyObject *request_call(PyObject *self, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "a persistent request is called with no arguments: req()");
        return NULL;
    }
    return request_run(self, NULL);
}

static int request_traverse(PyObject *self, visitproc visit, void *arg) {
    RequestObject *q = (RequestObject *)self;
    Py_VISIT(q->work); Py_VISIT(q->mine); Py_VISIT(q->inp); Py_VISIT(q->out); Py_VISIT(q->result);
    return 0;
}

static int request_clear(PyObject *self) {
    RequestObject *q = (RequestObject *)self;
    Py_CLEAR(q->work); Py_CLEAR(q->mine); Py_CLEAR(q->inp); Py_CLEAR(q->out); Py_CLEAR(q->result);
    return 0;
}

static void request_dealloc(PyObject *self) { dealloc_cleared(self, request_clear); }

static PyMemberDef request_members[] = {
    {"_work", T_OBJECT, offsetof(RequestObject, work), 0, "the started call's Work while active (None: inactive)"},
    {"_freed", T_BOOL, offsetof(RequestObject, freed), 0, "free() was called"},
    {"_mine", T_OBJECT, offsetof(RequestObject, mine), 0, "the init thread's Call (None: every start in Python)"},
    {"_inp", T_OBJECT, offsetof(RequestObject, inp), 0, "the input array of init"},
    {"_out", T_OBJECT, offsetof(RequestObject, out), 0, "the output array of init"},
    {"result", T_OBJECT, offsetof(RequestObject, result), 0, "what a start returns (the plain call's result)"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef request_methods[] = {
    {"run", request_run, METH_NOARGS, "Start and wait, on the calling thread (as the plain call without async_op); "
     "returns what the plain call returns. Calling the request is the same."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RequestType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pyxccl._native.Request",
    .tp_basicsize = sizeof(RequestObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The C part of a persistent request (core/persistent.py): its blocking start.",
    .tp_new = PyType_GenericNew,
    .tp_call = request_call,
    .tp_traverse = request_traverse,
    .tp_clear = request_clear,
    .tp_dealloc = request_dealloc,
    .tp_members = request_members,
    .tp_methods = request_methods,
};

/* --- repeat: comm.py's _call, a blocking repeat run without a Python frame -------------------------------
 *
 * repeat(comm, name, inp, out, root, op, async_op, algorithm, timeout, *args) is comm.py's _repeat in C: a
 * blocking call whose output array's last repeat on this thread ran in C (PreparedCalls.last, by (name,
 * id(out)); then .forms, by the ids of root, op, algorithm and timeout too) is that Prepared's Call.again;
 * done, it returns out; started and left to finish (or nothing ran, the engine busy), Prepared.settle. Anything
 * else is comm.py's _full(comm, name, ...) with the same arguments, as _repeat's is (set_repeat gives it). */
static PyObject *S__ctx, *S_prepared, *S_last, *S_forms, *S_fast, *S_settle;
static PyObject *repeat_full, *repeat_full_path;   /* comm.py's _full; core/prepared.py's FULL_PATH */

/* p.fast.again(args): None where p's fast is no Call (PreparedCalls keeps only those that have one). */
static PyObject *again_of(PyObject *p, PyObject *const *args) {
    PyObject *fast = PyObject_GetAttr(p, S_fast);
    if (!fast) return NULL;
    PyObject *res = Py_TYPE(fast) == &CallType ? again((CallObject *)fast, args) : Py_NewRef(Py_None);
    Py_DECREF(fast);
    return res;
}

static PyObject *id_tuple(PyObject *name, PyObject *const *objs, int n) {    /* (name, id(o), ...) */
    PyObject *t = PyTuple_New(n + 1);
    if (!t) return NULL;
    PyTuple_SET_ITEM(t, 0, Py_NewRef(name));
    for (int i = 0; i < n; i++) {
        PyObject *id = PyLong_FromVoidPtr(objs[i]);
        if (!id) { Py_DECREF(t); return NULL; }
        PyTuple_SET_ITEM(t, i + 1, id);
    }
    return t;
}

static PyObject *repeat(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 9) {
        PyErr_SetString(PyExc_TypeError, "repeat(comm, name, inp, out, root, op, async_op, algorithm, timeout, *args)");
        return NULL;
    }
    if (!repeat_full) { PyErr_SetString(PyExc_RuntimeError, "repeat: set_repeat(full, FULL_PATH) first"); return NULL; }
    PyObject *name = args[1], *out = args[3];
    PyObject *six[6] = {args[2], out, args[4], args[5], args[7], args[8]};     /* again()'s arguments */
    PyObject *kept = NULL, *last = NULL, *k = NULL, *p = NULL, *res = NULL;
    if (args[6] != Py_False) goto full;
    PyObject *ctx = PyObject_GetAttr(args[0], S__ctx);
    if (!ctx) return NULL;
    kept = PyObject_GetAttr(ctx, S_prepared);
    Py_DECREF(ctx);
    if (!kept || !(last = PyObject_GetAttr(kept, S_last)) || !(k = id_tuple(name, &out, 1))) goto fail;
    p = Py_XNewRef(PyDict_GetItemWithError(last, k));
    if (!p) {
        if (PyErr_Occurred()) goto fail;
        goto full;
    }
    if (!(res = again_of(p, six))) goto fail;
    if (res == Py_None) {       /* another form of the call on this output: the one remembered for this one? */
        PyObject *forms = PyObject_GetAttr(kept, S_forms), *k6 = NULL, *q = NULL;
        PyObject *ids[5] = {out, args[4], args[5], args[7], args[8]};
        if (forms && (k6 = id_tuple(name, ids, 5)))
            q = Py_XNewRef(PyDict_GetItemWithError(forms, k6));
        Py_XDECREF(forms); Py_XDECREF(k6);
        if (PyErr_Occurred()) { Py_XDECREF(q); goto fail; }
        if (q) {
            Py_DECREF(res);
            Py_SETREF(p, q);
            PyObject *now = (res = again_of(p, six)) ? PyObject_GetAttr(kept, S_last) : NULL;
            int bad = !now || PyObject_SetItem(now, k, p) < 0;
            Py_XDECREF(now);
            if (bad) goto fail;
        }
    }
    if (res == Py_True) {
        Py_DECREF(res); Py_DECREF(p); Py_DECREF(k); Py_DECREF(last); Py_DECREF(kept);
        return Py_NewRef(out);
    }
    if (res != Py_None) {
        PyObject *done = PyObject_CallMethodObjArgs(p, S_settle, args[2], out, repeat_full_path, res, NULL);
        Py_DECREF(res); Py_DECREF(p); Py_DECREF(k); Py_DECREF(last); Py_DECREF(kept);
        if (done != repeat_full_path) return done;
        Py_DECREF(done);
        return PyObject_Vectorcall(repeat_full, args, nargs, NULL);
    }
full:
    Py_XDECREF(res); Py_XDECREF(p); Py_XDECREF(k); Py_XDECREF(last); Py_XDECREF(kept);
    return PyObject_Vectorcall(repeat_full, args, nargs, NULL);
fail:
    Py_XDECREF(res); Py_XDECREF(p); Py_XDECREF(k); Py_XDECREF(last); Py_XDECREF(kept);
    return NULL;
}

static PyObject *set_repeat(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *full, *path;
    if (!PyArg_ParseTuple(args, "OO", &full, &path)) return NULL;
    if (!PyCallable_Check(full)) { PyErr_SetString(PyExc_TypeError, "set_repeat: full must be callable"); return NULL; }
    Py_INCREF(full); Py_XSETREF(repeat_full, full);
    Py_INCREF(path); Py_XSETREF(repeat_full_path, path);
    Py_RETURN_NONE;
}

static PyObject *can_reduce(PyObject *self, PyObject *args) {
    (void)self;
    int dtype, op;
    if (!PyArg_ParseTuple(args, "ii", &dtype, &op)) return NULL;
    char a[8] = {0}, b[8] = {0};
    return PyBool_FromLong(dtype >= 0 && op >= 0 && reduce(dtype, op, a, b, 8));
}

/* reduce_into(dtype_code, op_code, dst, src) -> bool: dst = dst (op) src with the executor's own loop
 * (False: a pair it does not reduce). For the check at import that it gives numpy's bits. */
static PyObject *reduce_into(PyObject *self, PyObject *args) {
    (void)self;
    int dtype, op;
    Py_buffer d, s;
    if (!PyArg_ParseTuple(args, "iiw*y*", &dtype, &op, &d, &s)) return NULL;
    int ok = d.len == s.len;
    if (ok) ok = dtype >= 0 && op >= 0 && reduce(dtype, op, d.buf, s.buf, d.len);
    PyBuffer_Release(&d);
    PyBuffer_Release(&s);
    if (d.len != s.len) { PyErr_SetString(PyExc_ValueError, "reduce_into: dst and src differ in size"); return NULL; }
    return PyBool_FromLong(ok);
}

/* copy_into(dst, src, nt) -> None: dst = src as the executor copies into a call's buffer, with non-temporal
 * stores when nt (see nt_bytes). For sim/calibrate.py's figures of copies. */
static PyObject *copy_into(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer d, s;
    int nt;
    if (!PyArg_ParseTuple(args, "w*y*p", &d, &s, &nt)) return NULL;
    int same = d.len == s.len;
    if (same) {
        Py_BEGIN_ALLOW_THREADS
        move(NULL, d.buf, s.buf, d.len, 0, nt);     /* (a move that does not reduce uses no Run) */
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&d);
    PyBuffer_Release(&s);
    if (!same) { PyErr_SetString(PyExc_ValueError, "copy_into: dst and src differ in size"); return NULL; }
    Py_RETURN_NONE;
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

/* A full memory barrier, for the Python executor on CPUs that reorder loads and stores
 * (transport/segment.py: between writing a window and publishing it, and between seeing a
 * counter and reading what it covers). */
static PyObject *fence(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

static int put(PyObject *d, const char *key, PyObject *v) {
    int rc = v ? PyDict_SetItemString(d, key, v) : -1;
    Py_XDECREF(v);
    return rc;
}

/* tables() -> dict: what core/onehost.py and transport/segment.py must agree on with this file. */
static PyObject *tables(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    PyObject *d = PyDict_New(), *dt = PyDict_New(), *ops = PyDict_New(), *pairs = PyList_New(0);
    if (!d || !dt || !ops || !pairs) goto fail;
    char a[8] = {0}, b[8] = {0};
    for (int t = 0; t < N_DTYPES; t++) {
        if (put(dt, DTYPE_NAMES[t], PyLong_FromLong(t)) < 0) goto fail;
        for (int o = 0; o < N_OPS; o++)
            if (reduce(t, o, a, b, 8)) {
                PyObject *pair = Py_BuildValue("(ss)", DTYPE_NAMES[t], OP_NAMES[o]);
                int rc = pair ? PyList_Append(pairs, pair) : -1;
                Py_XDECREF(pair);
                if (rc < 0) goto fail;
            }
    }
    for (int o = 0; o < N_OPS; o++)
        if (put(ops, OP_NAMES[o], PyLong_FromLong(o)) < 0) goto fail;
    if (put(d, "width", PyLong_FromLong(WIDTH)) < 0
        || put(d, "opcodes", Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "BEGIN", I_BEGIN, "COPY", I_COPY,
                                           "POST", I_POST, "PUBLISH", I_PUBLISH, "GET", I_GET, "SYNC", I_SYNC,
                                           "PUT", I_PUT)) < 0
        || put(d, "status", Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "DONE", DONE, "NAPPED", NAPPED,
                                          "MISMATCH", MISMATCH, "BOUNDS", BOUNDS, "CMA_FAILED", CMA_FAILED,
                                          "UNSUPPORTED", UNSUPPORTED, "BUFFER", BUFFER)) < 0
        || put(d, "buffers", Py_BuildValue("{s:i,s:i,s:i,s:i}", "in", B_IN, "out", B_OUT, "tmp", B_TMP, "win", B_WIN)) < 0
        || put(d, "header", Py_BuildValue("{s:i,s:i,s:i,s:i,s:i}", "SEQ", SEQ, "W0", W0, "W1", W1, "ADDR", ADDR,
                                          "NBYTES", NBYTES)) < 0
        || put(d, "segment", Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "counter_word", CTL_COUNTER, "flags_word", CTL_FLAGS,
                                           "cpu_word_plus_n", CTL_CPU, "entry_words_plus_n", CTL_ENTRY,
                                           "way_word_plus_n", CTL_WAY, "header_bytes", HEADER_BYTES,
                                           "pid_words", PID_WORDS)) < 0
        || put(d, "layout", Py_BuildValue("(ssssssss)", "base", "line", "hdr_at", "head", "area", "pids_at", "me",
                                          "n")) < 0
        || PyDict_SetItemString(d, "dtypes", dt) < 0 || PyDict_SetItemString(d, "ops", ops) < 0
        || PyDict_SetItemString(d, "reduces", pairs) < 0
        /* where fuse() applies and the pieces of its tee (for the tests that must reach them) */
        || put(d, "fuse", Py_BuildValue("{s:i,s:i}", "bytes", FUSE_BYTES, "tee_piece", TEE_PIECE)) < 0
        /* set_nt_windows()'s ways (PYXCCL_NT_WINDOWS) */
        || put(d, "windows", Py_BuildValue("{s:i,s:i,s:i}", "never", 0, "always", 1, "auto", 2)) < 0)
        goto fail;
    Py_DECREF(dt); Py_DECREF(ops); Py_DECREF(pairs);
    return d;
fail:
    Py_XDECREF(dt); Py_XDECREF(ops); Py_XDECREF(pairs); Py_XDECREF(d);
    return NULL;
}

static PyObject *nt_threshold(PyObject *self, PyObject *arg) {
    (void)self;
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    if (v < 0) { PyErr_SetString(PyExc_ValueError, "nt_threshold: bytes must be 0 (never) or more"); return NULL; }
    long long was = nt_bytes;
    nt_bytes = v;
    return PyLong_FromLongLong(was);
}

static PyObject *set_nt_windows(PyObject *self, PyObject *arg) {
    (void)self;
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    if (v < 0 || v > 2) { PyErr_SetString(PyExc_ValueError, "set_nt_windows: 0 (never), 1 (always) or 2 (the faster)"); return NULL; }
    int was = nt_windows;
    nt_windows = (int)v;
    return PyLong_FromLong(was);
}

/* set_window_seeds(ways) -> the ones before (win_seed, a way or -1 per class; for tests) */
static PyObject *set_window_seeds(PyObject *self, PyObject *arg) {
    (void)self;
    int v[SEED_CLASSES];
    if (!PyArg_ParseTuple(arg, "iiii", &v[0], &v[1], &v[2], &v[3])) return NULL;
    for (int k = 0; k < SEED_CLASSES; k++)
        if (v[k] < -1 || v[k] > 1) { PyErr_SetString(PyExc_ValueError, "set_window_seeds: 0, 1 or -1 (none) a class"); return NULL; }
    PyObject *was = PyTuple_New(SEED_CLASSES);
    for (int k = 0; was && k < SEED_CLASSES; k++)
        PyTuple_SET_ITEM(was, k, PyLong_FromLong(__atomic_exchange_n(&win_seed[k], v[k], __ATOMIC_RELAXED)));
    return was;
}

/* window_picks(plain_costs, nt_costs, first=0) -> the ways (0 plain, 1 non-temporal) a Call's policy picks for
 * runs whose copies into the window would cost plain_costs[k] or nt_costs[k] (per byte) in run k, warming up
 * way `first` first: win_pick, win_timing and win_ran alone, for tests. */
static PyObject *window_picks(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b;
    int first = 0;
    if (!PyArg_ParseTuple(args, "OO|p", &a, &b, &first)) return NULL;
    PyObject *costs[2] = {PySequence_Fast(a, "window_picks: plain_costs must be a sequence"), NULL};
    if (costs[0]) costs[1] = PySequence_Fast(b, "window_picks: nt_costs must be a sequence");
    PyObject *out = NULL;
    if (costs[1] && PySequence_Fast_GET_SIZE(costs[0]) != PySequence_Fast_GET_SIZE(costs[1]))
        PyErr_SetString(PyExc_ValueError, "window_picks: as many costs each way");
    else if (costs[1])
        out = PyList_New(0);
    WinPick w;
    memset(&w, 0, sizeof w);
    w.first = first;
    for (Py_ssize_t k = 0; out && k < PySequence_Fast_GET_SIZE(costs[0]); k++) {
        int way = win_pick(&w), timed = win_timing(&w);
        double cost = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(costs[way], k));
        PyObject *v = cost == -1.0 && PyErr_Occurred() ? NULL : PyLong_FromLong(way);
        if (v && nt_windows == 2) win_ran(&w, way, timed ? cost : -1.0);
        if (!v || PyList_Append(out, v) < 0) Py_CLEAR(out);
        Py_XDECREF(v);
    }
    Py_XDECREF(costs[0]); Py_XDECREF(costs[1]);
    return out;
}

static PyMethodDef methods[] = {
    {"set_nt_windows", set_nt_windows, METH_O, "set_nt_windows(way) -> the one before: calls copy into their "
     "windows with plain stores (0), non-temporal ones (1), or (2, the default) prepared calls whichever cost less"},
    {"window_picks", window_picks, METH_VARARGS, "window_picks(plain_costs, nt_costs, first=0) -> [way, ...]: what "
     "set_nt_windows(2) picks for runs whose copies into the window would cost those, warming up way first first "
     "(its policy alone, for tests)"},
    {"set_window_seeds", set_window_seeds, METH_O, "set_window_seeds((way, way, way, way)) -> the ones before: per "
     "class of window traffic a run (< 64 KiB, < 1 MiB, < 16 MiB, more), the way new calls warm up first and the full "
     "path takes (-1: none, then the nearest class's; set_nt_windows(2); each call that has run both ways sets its "
     "class's to its cheaper)"},
    {"nt_threshold", nt_threshold, METH_O, "nt_threshold(nbytes) -> the one before: calls made from now on copy with "
     "non-temporal stores into a buffer that on every rank of the segment together is larger than nbytes (0: never)"},
    {"tables", tables, METH_NOARGS, "tables() -> dict: the codes and layout this executor assumes (see core/onehost.py)"},
    {"fence", fence, METH_NOARGS, "fence(): a full memory barrier"},
    {"overlap", overlap, METH_VARARGS, "overlap(a, b) -> bool: do two contiguous buffers share memory?"},
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL, "Run a compiled segment program from instruction pc (see core/onehost.py)."},
    {"repeat", (PyCFunction)(void (*)(void))repeat, METH_FASTCALL, "repeat(comm, name, inp, out, root, op, async_op, "
     "algorithm, timeout, *args): comm.py's _call, a blocking repeat that ran in C before run again without Python"},
    {"set_repeat", set_repeat, METH_VARARGS, "set_repeat(full, FULL_PATH): what repeat() calls for anything else"},
    {"can_reduce", can_reduce, METH_VARARGS, "can_reduce(dtype_code, op_code) -> bool"},
    {"reduce_into", reduce_into, METH_VARARGS, "reduce_into(dtype_code, op_code, dst, src) -> bool: dst = dst (op) src"},
    {"copy_into", copy_into, METH_VARARGS, "copy_into(dst, src, nt): dst = src as a call's copy (nt: non-temporal stores)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "pyxccl._native",
                                    "Segment schedules run in C, without the GIL.", -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    struct { PyObject **at; const char *name; } names[] = {
        {&S_pending, "_pending"}, {&S_round, "round"}, {&S_waiting, "waiting"}, {&S_traffic, "traffic"},
        {&S_dtype, "dtype"}, {&S_thread_check, "thread_check"}, {&S_here, "_here"}, {&S_me, "me"},
        {&S__name, "_name"}, {&S__run, "_run"}, {&S__settle, "_settle"}, {&S__ctx, "_ctx"},
        {&S_prepared, "prepared"}, {&S_last, "last"}, {&S_forms, "forms"}, {&S_fast, "fast"}, {&S_settle, "settle"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*names[i].at = PyUnicode_InternFromString(names[i].name))) return NULL;
    if (PyType_Ready(&CallType) < 0 || PyType_Ready(&LockType) < 0 || PyType_Ready(&RequestType) < 0
        || PyType_Ready(&BooksType) < 0 || PyType_Ready(&CountType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&CallType);
    if (PyModule_AddObject(m, "Call", (PyObject *)&CallType) < 0) { Py_DECREF(&CallType); Py_DECREF(m); return NULL; }
    Py_INCREF(&LockType);
    if (PyModule_AddObject(m, "Lock", (PyObject *)&LockType) < 0) { Py_DECREF(&LockType); Py_DECREF(m); return NULL; }
    PyTypeObject *types[] = {&RequestType, &BooksType, &CountType};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, strrchr(types[i]->tp_name, '.') + 1, (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]); Py_DECREF(m); return NULL;
        }
    }
    return m;
}
