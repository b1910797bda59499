/* samplechain's CPU forward: llama.cpp-style quantized dot products, batch-invariant by construction.

   Every output value is reduced in one fixed order that does not depend on how many tokens share the call:
   - matrix products keep 16 output rows in SIMD lanes and walk the input in 32-element blocks, one block after the
     other; a block's integer dot product is exact (int32), the float accumulation across blocks is sequential;
   - the kernel variants (AMX, AVX-512 VNNI, AVX2, portable C) compute the same exact integer sums and the same
     float operations in the same order, so they give the same bits; the runtime times them and keeps the fastest;
   - attention sums over KV cells in cell order; norms reduce in 16 fixed lanes then a fixed tree.
   Compiled with -ffp-contract=off (no implicit FMA) and without -ffast-math (no reassociation); FMAs are explicit.

   Weight formats (prepared at load, tiles of 16 output rows, blocks of 32 inputs; a linear may be a chain of row
   ranges in different formats, `next`):
   - integer kinds store unsigned values u per weight, used as q = u - zero (int16); w = d*q (+ m per 32-block):
     W4 (4-bit: Q4_0 zero 8, Q4_1, Q4_K), W5 (Q5_0 zero 16, Q5_1, Q5_K), W6 (Q6_K, zero 32, a scale per 16
     inputs), W8 (signed bytes: Q8_0). Per tile and block, W4/W5/W6 start with 4 vectors of 64 bytes: vector k, lane r
     holds bytes u[r, 8k+i] & 15 | (u[r, 8k+4+i] & 15) << 4 (i < 4); W5 adds 64 bytes whose byte 4r+i holds bit 4
     of u[r, 8k+4e+i] at bit 2k+e; W6 adds 2 x 64 bytes, vector P byte 4r+i holding bits 4-5 of u[r, 8k+4e+i]
     (k = 2P+h) at bits 2(2h+e). W8: 8 vectors; vector k, lane r holds q[r, 4k+i].
     Scales (`scales`): SF32 float d[16] (m[16]) per tile and block; SF16 the same as f16 bits (GGUF's own, exact);
     SK (k-quants): per tile and 256-block float sd[16] (sm[16]), per tile and block uint8 sc[16] (mn[16]), d = sd*sc,
     m = sm*mn, both exact in float32 (W6: int8 sc[2][16], one per 16-input half).
   - F32 / F16 / BF16: per tile, w[in][16] in that type, converted exactly to float on the fly.
   Activations for the integer kinds are quantized per 32-block to int16 (d = amax/32767, q = round(x/d)): llama.cpp's
   scheme with 16-bit instead of 8-bit activations, which keeps the logits ~100x closer to the dequantized model.
   A block's integer sums are exact in int32 (W6: per 16-input half: 16 * 32 * 32767 < 2^24, exact in float too);
   its float part is, per row: acc = fma(float(isum), d*xd, acc) [W6: then the second half's]; then, with minima,
   acc = fma(m, xd*sum(q_x), acc).
   The _Q8 variants (opt-in) quantize activations to 8 bits instead (d = amax/127, llama.cpp's q8_0): their own family
   of identical bits (generic and AVX2), with the same block structure and float steps.
   One token per call (decode) on x86, 4/5/6-bit weights: the token's int16 activations are split once per linear into
   bytes, q = 256 * hi + lo, and multiplied by the stored weight bytes as they are (vpdpbusd on AVX-512 VNNI, vpmaddubsw
   on AVX2; tile1_avx512vnni / tile1_avx2): the same exact block sums, then the same float steps.
   Several tokens per call (prompt chunks, verify batches, server steps): the AVX2 kernels unpack a chunk of 8 blocks
   of a tile once and run every token of the call over it; each token's sums and float steps are those of the token
   alone, so the bits do not depend on the batch.

   Threads: the engine's own pool of persistent workers (pthreads, below), not OpenMP. libgomp gives every thread
   that opens a parallel region its own team of workers, so a decode from a second thread (a web app's worker, a
   notebook's executor) after the main thread's started a second team: more threads spinning than CPUs, libgomp
   throttling its spinning, every step slower (and torch brings its own libgomp copy with its own teams). The pool
   is one per process whatever thread calls: the caller runs items as worker 0 beside nt - 1 pool workers, one
   parallel region at a time (a mutex; a second calling thread waits for the region in progress). Each output
   value is computed by exactly one item, whichever thread runs it, so the bits do not depend on the thread count
   or on how the items were shared out. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------------------------------------------------------
   the worker pool

   parallel_for(n_items, split, nt, fn, ctx) runs fn(ctx, begin, end, worker) over [0, n_items) in chunks of about
   n_items / (nt * split) items, taken by the calling thread (worker 0) and up to nt - 1 pool workers (1, 2, ...),
   and returns when every item has run.
   - Workers are created on first need (more later if a larger nt is asked) and live as long as the process.
   - A worker waits for its next region by spinning on its own sequence number for SPIN_NS (a forward opens one
     region per linear and per attention, hundreds per token, microseconds apart: a wake through the kernel for each
     would cost more than the work), then blocks on its condition variable, so an idle process uses no CPU; the
     caller signals only the workers that sleep.
   - Chunks are claimed from one 64-bit word, the region's number (high half) and its next item (low half), by
     compare-and-swap; the caller closes the region (next item CLOSED) once every item is done, before it writes the
     next region's fields. A worker that comes late (asleep, or its CPU taken) finds the items taken or the region
     closed, so the caller waits only for the chunks claimed, never for a worker to show up.
   - Regions are serialized by a mutex: concurrent callers (ctypes releases the GIL) take turns region by region.
   Which thread runs an item does not change what it computes, so the results do not depend on the split. */

#define MAX_THREADS 256
#define CLOSED 0xffffffffu
/* How long an idle worker spins before it blocks: far longer than the gaps between a forward's regions (a few
   microseconds in a decode step), shorter than the sampling between two steps (~0.7 ms for SmolLM2), where a spinning
   worker would only take a CPU from Python. 20 us, 100 us and 1 ms gave the same speeds within the noise. A
   region costs ~0.4 us of synchronization on 2 cores (a libgomp region: ~1.1 us). */
#ifndef SPIN_NS
#define SPIN_NS 100000
#endif
/* Chunks per thread (split): SPLIT_BATCH when the items are large (a batch of tokens): a worker that is late or slow
   leaves its chunks to the others; SPLIT_ONE for the small items of one token's step, where one chunk per thread
   (each streams one contiguous range of weights, as with OpenMP's static schedule) decoded up to ~4% faster than
   four; a worker that is late still leaves its chunk to the caller. */
#ifndef SPLIT_BATCH
#define SPLIT_BATCH 4
#endif
#ifndef SPLIT_ONE
#define SPLIT_ONE 1
#endif
/* A batch's claims are guided: each takes half of an equal share of the items left, down to 1 / GUIDED_LEAST of a
   thread's share. With four equal chunks a thread, the last chunk's wait (a thread idle while the other finishes)
   was ~2 % of a 1B prompt on 2 threads of a shared machine. */
#define GUIDED_LEAST 32

static inline void cpu_relax(void) {
#if defined(__x86_64__)
    _mm_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

typedef void (*range_fn)(void *ctx, int begin, int end, int worker);

typedef struct {
    _Alignas(64) uint32_t seq;  /* bumped by the region's caller to call this worker */
    uint32_t sleeping;          /* 1 while the worker blocks, or is about to, on c */
    pthread_mutex_t m;
    pthread_cond_t c;
} pool_slot;

static struct {
    pthread_mutex_t lock;       /* held for a whole region: one region at a time in the process */
    int n_workers;              /* pool threads running (the caller is not one) */
    pool_slot *slots[MAX_THREADS];
    uint32_t region;            /* the current region's number */
    /* the current region, written (under lock) before `claim` announces it */
    range_fn fn;
    void *ctx;
    int n_items, chunk, n_threads, guided;
    _Alignas(64) uint64_t claim;  /* region << 32 | the first item not yet claimed (CLOSED: the region is over) */
    _Alignas(64) int done;        /* items run */
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .claim = CLOSED};

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

/* claim and run chunks of the current region until none is left */
static void run_chunks(int worker) {
    for (;;) {
        uint64_t c = __atomic_load_n(&pool.claim, __ATOMIC_ACQUIRE);
        range_fn fn = LOAD(pool.fn);
        void *ctx = LOAD(pool.ctx);
        uint32_t n = (uint32_t)LOAD(pool.n_items), chunk = (uint32_t)LOAD(pool.chunk), first = (uint32_t)c;
        int nt = LOAD(pool.n_threads);
        if (LOAD(pool.guided)) {  /* half of an equal share of what is left, down to `chunk` */
            uint32_t share = first < n ? (n - first) / (2u * (uint32_t)nt) : 0;
            chunk = share > chunk ? share : chunk;
        }
        /* with the caller's release fence after it closes a region: if these fields are a later region's, c's
           region was closed before, and the exchange below fails */
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (first >= n || worker >= nt) return;  /* if they are a later region's, the worker's post is coming */
        uint32_t end = n - first < chunk ? n : first + chunk;
        if (!__atomic_compare_exchange_n(&pool.claim, &c, (c >> 32 << 32) | end, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_RELAXED))
            continue;
        /* claimed: the region cannot end before these items are counted done, so fn and ctx are its own */
        fn(ctx, (int)first, (int)end, worker);
        __atomic_fetch_add(&pool.done, (int)(end - first), __ATOMIC_RELEASE);
    }
}

/* wait until s->seq differs from seen (spin, then block); returns it */
static uint32_t slot_wait(pool_slot *s, uint32_t seen) {
    uint64_t start = now_ns();
    do {
        for (int i = 0; i < 64; i++) {
            uint32_t g = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
            if (g != seen) return g;
            cpu_relax();
        }
    } while (now_ns() - start < SPIN_NS);
    uint32_t g;
    pthread_mutex_lock(&s->m);
    /* seq_cst store then load here, seq_cst store then load in slot_post: one of the two sees the other's store */
    __atomic_store_n(&s->sleeping, 1, __ATOMIC_SEQ_CST);
    while ((g = __atomic_load_n(&s->seq, __ATOMIC_SEQ_CST)) == seen) pthread_cond_wait(&s->c, &s->m);
    __atomic_store_n(&s->sleeping, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&s->m);
    return g;
}

static void slot_post(pool_slot *s) {
    __atomic_store_n(&s->seq, LOAD(s->seq) + 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->sleeping, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&s->m);
        pthread_cond_signal(&s->c);
        pthread_mutex_unlock(&s->m);
    }
}

typedef struct { pool_slot *slot; int id; } worker_arg;

static void *pool_worker(void *p) {
    worker_arg a = *(worker_arg *)p;
    free(p);
    for (uint32_t seen = 0;;) {
        seen = slot_wait(a.slot, seen);
        run_chunks(a.id);
    }
    return NULL;
}

/* a forked child has the parent's memory but none of its pool threads: it starts a pool of its own */
static void pool_after_fork(void) {
    pthread_mutex_init(&pool.lock, NULL);
    pool.n_workers = 0;  /* the parent's slots are left behind */
    pool.claim = CLOSED;
}

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static void pool_init(void) { pthread_atfork(NULL, NULL, pool_after_fork); }

/* under pool.lock: start workers until there are n (fewer if the system refuses) */
static void pool_grow(int n) {
    if (pool.n_workers >= n) return;
    pthread_once(&pool_once, pool_init);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);  /* workers take no signals: the process's own threads do */
    while (pool.n_workers < n) {
        pool_slot *s = aligned_alloc(64, sizeof(pool_slot));
        worker_arg *a = malloc(sizeof(worker_arg));
        pthread_attr_t attr;
        pthread_t t;
        int ok = s && a && pthread_attr_init(&attr) == 0;
        if (ok) {
            memset(s, 0, sizeof *s);
            pthread_mutex_init(&s->m, NULL);
            pthread_cond_init(&s->c, NULL);
            a->slot = s, a->id = pool.n_workers + 1;
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            ok = pthread_create(&t, &attr, pool_worker, a) == 0;
            pthread_attr_destroy(&attr);
        }
        if (!ok) {
            if (s) { pthread_mutex_destroy(&s->m); pthread_cond_destroy(&s->c); }
            free(s); free(a);
            break;
        }
        pool.slots[pool.n_workers++] = s;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void parallel_for(int n_items, int split, int nt, range_fn fn, void *ctx) {
    if (nt > n_items) nt = n_items;
    if (nt > MAX_THREADS) nt = MAX_THREADS;
    if (nt <= 1) {
        if (n_items > 0) fn(ctx, 0, n_items, 0);
        return;
    }
    pthread_mutex_lock(&pool.lock);
    pool_grow(nt - 1);
    if (nt > pool.n_workers + 1) nt = pool.n_workers + 1;
    uint64_t region = ++pool.region;
    STORE(pool.fn, fn), STORE(pool.ctx, ctx), STORE(pool.n_items, n_items), STORE(pool.n_threads, nt);
    STORE(pool.chunk, (n_items + nt * split - 1) / (nt * split));
    STORE(pool.guided, 0);
    if (split > 1) {  /* guided: large claims first, then smaller ones, so that the threads finish together */
        int least = n_items / (nt * GUIDED_LEAST);
        STORE(pool.chunk, least > 1 ? least : 1), STORE(pool.guided, 1);
    }
    STORE(pool.done, 0);
    __atomic_store_n(&pool.claim, region << 32, __ATOMIC_RELEASE);  /* announces the fields above */
    for (int w = 1; w < nt; w++) slot_post(pool.slots[w - 1]);
    run_chunks(0);
    uint64_t start = 0;
    for (int i = 0; __atomic_load_n(&pool.done, __ATOMIC_ACQUIRE) != n_items; i++) {  /* chunks still running */
        cpu_relax();
        if ((i & 255) == 255) {  /* a long wait: a worker's CPU is taken; offer ours */
            uint64_t t = now_ns();
            if (!start) start = t;
            else if (t - start > 20000) sched_yield();
        }
    }
    __atomic_store_n(&pool.claim, region << 32 | CLOSED, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);  /* the close comes before the next region's fields (see run_chunks) */
    pthread_mutex_unlock(&pool.lock);
}

/* the pool's size, for tests */
int sc_pool_workers(void) {
    pthread_mutex_lock(&pool.lock);
    int n = pool.n_workers;
    pthread_mutex_unlock(&pool.lock);
    return n;
}

#define QK 32
#define TILE 16

enum { SC_F32 = 0, SC_W4 = 1, SC_W8 = 2, SC_W5 = 3, SC_W6 = 4, SC_F16 = 5, SC_BF16 = 6 };
enum { SC_SF32 = 0, SC_SF16 = 1, SC_SK = 2 };  /* how an integer kind's scales are stored */
enum { SC_GENERIC = 0, SC_AVX2 = 1, SC_AVX512VNNI = 2, SC_GENERIC_Q8 = 3, SC_AVX2_Q8 = 4, SC_AMX = 5 };
/* the _Q8 variants quantize activations to 8 bits (llama.cpp's numerics): their own family of identical bits */
static int is_q8(int isa) { return isa == SC_GENERIC_Q8 || isa == SC_AVX2_Q8; }
/* the variant whose code runs where a variant has none of its own (AMX: one token, float weights: AVX-512) */
static int base_isa(int isa) {
    return isa == SC_GENERIC_Q8 ? SC_GENERIC : isa == SC_AVX2_Q8 ? SC_AVX2 : isa == SC_AMX ? SC_AVX512VNNI : isa;
}
#define QK_K 256
#define AMX_ROWS 16   /* AMX: tokens per tile product */
#define AMX_CHUNK 64  /* AMX: tokens per weight block unpacked */
/* AMX: fewer tokens in a call, or in its last group of 16, take the AVX-512 code (the same bits). A forward's cost
   against its tokens (2 vCPUs of a Xeon with AMX): the AVX-512 code's cost grows by ~1.2 ms a token on SmolLM2 and
   ~7.4 ms on the 1B shape, a padded AMX group costs ~15 and ~70 ms, so a short group is cheaper token by token below
   ~12 and ~9 tokens; 17 tokens (a verify batch of 16 drafted) took 26.6 ms as two AMX groups, 22.3 as one and a
   token. */
#define AMX_MIN 8

typedef struct sc_linear {
    int32_t kind, n_out, n_in, pad;
    const uint8_t *q;     /* packed values (integer kinds), or the float / half matrix */
    const void *d, *m;    /* per tile and block: SF32 float, SF16 f16 bits, SK uint8 sc / mn (W6: int8 sc[2][16]) */
    const void *unused;
    int32_t zero, scales; /* q = u - zero; SC_SF32 / SC_SF16 / SC_SK */
    const float *sd, *sm; /* SK: per tile and 256-block float[16] */
    const struct sc_linear *next;  /* the following output rows, in their own format (NULL: none) */
} sc_linear;

typedef struct {
    const float *attn_norm, *ffn_norm, *q_norm, *k_norm, *post_attn_norm, *post_ffn_norm;
    sc_linear qkv, wo, gate_up, down;
    int32_t swa, pad;
    const float *qkv_bias;  /* q|k|v biases (Qwen 2), or NULL */
} sc_layer;

typedef struct {
    int32_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, gelu;
    float eps, attn_scale;
    int32_t kv_size, isa;
    const sc_layer *layers;
    const float *output_norm;
    sc_linear output;
    float attn_softcap;  /* Gemma 2: scores = cap * tanh(scores / cap); 0: none */
    int32_t kv_f16;      /* bit 0: the keys are halves (IEEE binary16) rather than floats; bit 1: the values */
} sc_model;

/* ---------------------------------------------------------------------------------------------------------------
   activations */

typedef struct {
    int16_t *q; float *d; int32_t *s;  /* per token: n_in int16, n_in/32 scales and sums */
    int n_in;
    int8_t *amx;  /* AMX: q = 256 * hi + lo as tiles: per 16 tokens and block, per token 32 hi then 32 lo bytes */
    /* AMX: per 16 tokens and block, the tokens' d then their d * sum(q) (the minima's factor, the same product as the
       others'): the 32 floats a tile's sums are scaled with on two cache lines, where a token's scales strided by
       its row (n_in / 32 floats: at n_in 8192 sixteen tokens' rows fell in four cache sets) */
    float *xs;
    /* one token (decode) on x86: q = 256 * hi + lo as bytes, per block its 32 hi (signed) then its 32 lo (unsigned)
       bytes, and the sums of q over each 16-input half (hs[2b + h]); NULL where the call has several tokens */
    int8_t *xb;
    int32_t *hs;
} q16_rows;

#if defined(__x86_64__)
static int sc_cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

/* Activations, per 32-block: d = amax/qmax, q = roundf(x * qmax/amax) clamped to +-qmax. q8 = 0: int16 values
   (qmax 32767) and one sum per block (s[b]); q8 = 1: int8 values (qmax 127, llama.cpp's q8_0) and the sums of the
   two 16-input halves (s[2b], s[2b + 1]). The AVX2 code gives the generic code's bits: max |x| is exact in any
   order, x * id is the same float product, roundf's half-away-from-zero is trunc(v) + sign(v) where
   |v - trunc(v)| >= 0.5 (v - trunc(v) is exact), the sums are exact in int32. */
__attribute__((target("avx2,fma,f16c")))
static void quantize_row_avx2(const float *x, int n, void *q, float *d, int32_t *s, int q8) {
    const float qmax = q8 ? 127.0f : 32767.0f;
    const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    const __m256i hi = _mm256_set1_epi32((int)qmax), lo = _mm256_set1_epi32(-(int)qmax);
    for (int b = 0; b < n / QK; b++) {
        const float *xb = x + b * QK;
        __m256 v[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {  /* MAXPS returns its second operand where either is a NaN: NaNs are skipped */
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);
        }
        float mm[8], amax = 0.0f;
        _mm256_storeu_ps(mm, m);
        for (int i = 0; i < 8; i++) amax = mm[i] > amax ? mm[i] : amax;
        float db = amax / qmax;
        float id = db != 0.0f ? qmax / amax : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i r[4];
        for (int i = 0; i < 4; i++) {
            __m256 y = _mm256_mul_ps(v[i], vid);
            __m256 t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            __m256 away = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(y, t)), half, _CMP_GE_OQ);
            t = _mm256_add_ps(t, _mm256_and_ps(away, _mm256_or_ps(one, _mm256_and_ps(sign, y))));
            r[i] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvttps_epi32(t), hi), lo);
        }
        __m256i w16a = _mm256_packs_epi32(r[0], r[1]), w16b = _mm256_packs_epi32(r[2], r[3]);  /* lanes interleaved */
        if (q8) {
            __m256i w8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w16a, w16b),
                                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)((int8_t *)q + b * QK), w8);
        } else {
            _mm256_storeu_si256((__m256i *)((int16_t *)q + b * QK), _mm256_permute4x64_epi64(w16a, 0xD8));
            _mm256_storeu_si256((__m256i *)((int16_t *)q + b * QK + 16), _mm256_permute4x64_epi64(w16b, 0xD8));
        }
        int32_t half_sum[2];
        for (int h = 0; h < 2; h++) {
            int32_t ss[8], total = 0;
            _mm256_storeu_si256((__m256i *)ss, _mm256_add_epi32(r[2 * h], r[2 * h + 1]));
            for (int i = 0; i < 8; i++) total += ss[i];
            half_sum[h] = total;
        }
        if (q8)
            s[2 * b] = half_sum[0], s[2 * b + 1] = half_sum[1];
        else
            s[b] = half_sum[0] + half_sum[1];
        d[b] = db;
    }
}

/* what quantize_row_avx512 needs */
static int sc_cpu_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq");
}

/* The int16 quantizer with AVX-512, the same bits again: the maximum of |x| with NaNs skipped (as the scalar loop's
   comparisons skip them; max is exact in any order), the same products and rounding per element, the sum exact. With
   amx, AMX's planes are written from the same registers: token i's block b at ((i / 16) * nb + b) * 1024 +
   (i % 16) * 64 (amx: the row of token i's block 0), its 32 hi bytes then its 32 lo bytes (q = 256 * hi + lo), and
   its scales at ((i / 16) * nb + b) * 32 + i % 16 (xs: token i's of block 0): d, and 16 floats on, d * sum(q). */
__attribute__((target("avx512f,avx512bw,avx512dq")))
static void quantize_row_avx512(const float *x, int n, int16_t *q, float *d, int32_t *s, int8_t *amx, float *xs) {
    const __m512 sign = _mm512_set1_ps(-0.0f), half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512i hi = _mm512_set1_epi32(32767), lo = _mm512_set1_epi32(-32767);
    for (int b = 0; b < n / QK; b++) {
        const float *xb = x + b * QK;
        __m512 v[2] = {_mm512_loadu_ps(xb), _mm512_loadu_ps(xb + 16)};
        __m512 m = _mm512_max_ps(_mm512_andnot_ps(sign, v[1]), _mm512_max_ps(_mm512_andnot_ps(sign, v[0]),
                                                                            _mm512_setzero_ps()));
        float amax = _mm512_reduce_max_ps(m);  /* NaNs skipped above, as the scalar comparisons skip them */
        float db = amax / 32767.0f;
        float id = db != 0.0f ? 32767.0f / amax : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        __m512i r[2];
        for (int i = 0; i < 2; i++) {
            __m512 y = _mm512_mul_ps(v[i], vid);
            __m512 t = _mm512_roundscale_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            __mmask16 away = _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, _mm512_sub_ps(y, t)), half, _CMP_GE_OQ);
            t = _mm512_mask_add_ps(t, away, t, _mm512_or_ps(one, _mm512_and_ps(sign, y)));
            r[i] = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvttps_epi32(t), hi), lo);
            _mm256_storeu_si256((__m256i *)(q + b * QK + 16 * i), _mm512_cvtepi32_epi16(r[i]));
        }
        int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(r[0], r[1]));
        s[b] = sum, d[b] = db;
        if (amx) {
            int8_t *row = amx + (size_t)b * 1024;
            for (int i = 0; i < 2; i++) {
                _mm_storeu_si128((__m128i *)(row + 16 * i), _mm512_cvtepi32_epi8(_mm512_srai_epi32(r[i], 8)));
                _mm_storeu_si128((__m128i *)(row + 32 + 16 * i),
                                 _mm512_cvtepi32_epi8(_mm512_and_si512(r[i], _mm512_set1_epi32(255))));
            }
            xs[(size_t)b * 32] = db, xs[(size_t)b * 32 + 16] = db * (float)sum;
        }
    }
}

/* One token's int16 row as bytes for the one-token kernels: q = 256 * hi + lo exactly, hi = q >> 8 (in [-128, 127]) and
   lo = q & 255 (in [0, 255]); per block its 32 hi bytes then its 32 lo bytes (xb), and the sums of q over each 16-input
   half (hs[2b + h]: exact in int32). */
__attribute__((target("avx2")))
static void split_bytes_avx2(const int16_t *q, int n, int8_t *xb, int32_t *hs) {
    const __m256i low = _mm256_set1_epi16(255), ones = _mm256_set1_epi16(1);
    for (int b = 0; b < n / QK; b++) {
        __m256i v0 = _mm256_loadu_si256((const __m256i *)(q + b * QK));
        __m256i v1 = _mm256_loadu_si256((const __m256i *)(q + b * QK + 16));
        /* packs / packus interleave the 128-bit lanes (v0's 8, v1's 8, v0's next 8, v1's next 8): 0xD8 restores */
        __m256i hi = _mm256_packs_epi16(_mm256_srai_epi16(v0, 8), _mm256_srai_epi16(v1, 8));
        __m256i lo = _mm256_packus_epi16(_mm256_and_si256(v0, low), _mm256_and_si256(v1, low));
        _mm256_storeu_si256((__m256i *)(xb + 64 * b), _mm256_permute4x64_epi64(hi, 0xD8));
        _mm256_storeu_si256((__m256i *)(xb + 64 * b + 32), _mm256_permute4x64_epi64(lo, 0xD8));
        int32_t ss[2][8];
        _mm256_storeu_si256((__m256i *)ss[0], _mm256_madd_epi16(v0, ones));
        _mm256_storeu_si256((__m256i *)ss[1], _mm256_madd_epi16(v1, ones));
        for (int h = 0; h < 2; h++) {
            int32_t total = 0;
            for (int i = 0; i < 8; i++) total += ss[h][i];
            hs[2 * b + h] = total;
        }
    }
}
#endif

static void quantize_row_generic(const float *x, int n, void *q, float *d, int32_t *s, int q8) {
    const float qmax = q8 ? 127.0f : 32767.0f;
    const int lim = (int)qmax;
    for (int b = 0; b < n / QK; b++) {
        const float *xb = x + b * QK;
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) {
            float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        float db = amax / qmax;
        float id = db != 0.0f ? qmax / amax : 0.0f;
        int32_t sum[2] = {0, 0};
        for (int j = 0; j < QK; j++) {
            int v = (int)roundf(xb[j] * id);
            v = v > lim ? lim : v < -lim ? -lim : v;
            if (q8)
                ((int8_t *)q)[b * QK + j] = (int8_t)v;
            else
                ((int16_t *)q)[b * QK + j] = (int16_t)v;
            sum[j >= 16] += v;
        }
        d[b] = db;
        if (q8)
            s[2 * b] = sum[0], s[2 * b + 1] = sum[1];
        else
            s[b] = sum[0] + sum[1];
    }
}

/* one row's 32-blocks quantized (see above): the same bits on every path */
static void quantize_row_any(const float *x, int n, void *q, float *d, int32_t *s, int q8) {
#if defined(__x86_64__)
    if (sc_cpu_has_avx2()) {
        quantize_row_avx2(x, n, q, d, s, q8);
        return;
    }
#endif
    quantize_row_generic(x, n, q, d, s, q8);
}

/* exposed for tests: one row quantized (q8: to 8 bits) by the generic (0), the AVX2 (1) or, int16 only, the AVX-512
   (2) code; -1 where that cannot run */
static int quantize_row_isa(const float *x, int n, void *q, float *d, int32_t *s, int isa, int q8) {
#if defined(__x86_64__)
    if (isa == SC_AVX512VNNI && !q8 && sc_cpu_has_avx512()) {
        quantize_row_avx512(x, n, q, d, s, NULL, NULL);
        return 0;
    }
    if (isa == SC_AVX2 && sc_cpu_has_avx2()) {
        quantize_row_avx2(x, n, q, d, s, q8);
        return 0;
    }
#endif
    if (isa != SC_GENERIC) return -1;
    quantize_row_generic(x, n, q, d, s, q8);
    return 0;
}

int sc_quantize_row(const float *x, int n, int16_t *q, float *d, int32_t *s, int isa) {
    return quantize_row_isa(x, n, q, d, s, isa, 0);
}

int sc_quantize_row8(const float *x, int n, int8_t *q, float *d, int32_t *s, int isa) {
    return quantize_row_isa(x, n, q, d, s, isa, 1);
}

static inline float lanes_sum16(const float *acc) {
    /* a fixed tree over 16 partial sums */
    float a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) a[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++) b[i] = a[i] + a[i + 4];
    for (int i = 0; i < 2; i++) c[i] = b[i] + b[i + 2];
    return c[0] + c[1];
}

/* 16 partial sums as two vectors of 8 (lane l of the pair adds the products of elements i + l, i = 0, 16, 32, ...):
   the scalar loop's order, written so that the compiler keeps the sums in registers (its own vectorisation of the
   scalar form shuffled lanes one by one, and attention's scores spent most of their time there). */
typedef float v8f __attribute__((vector_size(32)));

static inline v8f load8(const float *x) {
    v8f v;
    memcpy(&v, x, sizeof v);
    return v;
}

static inline float sum_pair(v8f a0, v8f a1) {
    float acc[16];
    memcpy(acc, &a0, sizeof a0);
    memcpy(acc + 8, &a1, sizeof a1);
    return lanes_sum16(acc);
}

static inline float dot_f32(const float *x, const float *y, int n) { /* n % 16 == 0 */
    v8f a0 = {0}, a1 = {0};
    for (int i = 0; i < n; i += 16) {
        a0 += load8(x + i) * load8(y + i);
        a1 += load8(x + i + 8) * load8(y + i + 8);
    }
    return sum_pair(a0, a1);
}

/* IEEE binary16 <-> float: f16 -> float is exact (F16C where compiled in: the same values); float -> f16 rounds to
   nearest, ties to even, as F16C's VCVTPS2PH with round-to-nearest and llama.cpp's ggml_compute_fp32_to_fp16 do. */
static float f16_to_f32(uint16_t h);
static uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 | ((ax >> 13) & 0x3ff) : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  /* rounds past 65504: infinity */
    if (ax < 0x38800000u) {  /* below 2^-14: a subnormal half (or zero), rounded to nearest even */
        if (ax < 0x33000000u) return (uint16_t)sign;  /* below half the smallest subnormal (2^-25): zero */
        uint32_t e = ax >> 23, man = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;  /* value = man * 2^(e-150) */
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        q += rem > half || (rem == half && (q & 1));
        return (uint16_t)(sign | q);
    }
    uint32_t q = ((ax - 0x38000000u) >> 13), rem = ax & 0x1fffu;  /* rebias the exponent by 112 */
    q += rem > 0x1000u || (rem == 0x1000u && (q & 1));
    return (uint16_t)(sign | q);
}

#define MAX_HEAD_DIM 512
static void halves_to_floats(const uint16_t *h, float *f, int n) {
    int i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < n; i++) f[i] = f16_to_f32(h[i]);
}

static void floats_to_halves(const float *f, uint16_t *h, int n) {
    int i = 0;
#if defined(__F16C__)  /* VCVTPS2PH, round to nearest even: f32_to_f16's values (NaNs quieted with their top bits) */
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(f + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) h[i] = f32_to_f16(f[i]);
}

static void rms_norm(const float *x, const float *w, float *y, int n, float eps) {
    float mean = dot_f32(x, x, n) / (float)n;
    float r = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < n; i++) y[i] = (x[i] * r) * w[i];
}

/* ---------------------------------------------------------------------------------------------------------------
   quantized weights, one tile (16 output rows) x one token: the three variants give the same bits. A block's integer
   dot products are exact in int32 whatever the order; its float operations are the same in every variant. */

static int is_float_kind(int kind) { return kind == SC_F32 || kind == SC_F16 || kind == SC_BF16; }

static size_t block_bytes(int kind) {
    return kind == SC_W4 ? 256 : kind == SC_W5 ? 320 : kind == SC_W6 ? 384 : 512;
}

static float f16_to_f32(uint16_t h) { /* exact */
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, man = h & 1023, bits;
    if (e == 0) {
        float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    }
    bits = sign | (e == 31 ? 0x7f800000u | (man << 13) : ((e + 112) << 23) | (man << 13));
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* a block's scales for its 16 rows: d[h][r] (h: the 16-input half, W6 only), m[r] when L->m */
static void block_scales(const sc_linear *L, int t, int b, float d[2][TILE], float m[TILE]) {
    size_t blk = (size_t)t * (L->n_in / QK) + b;
    if (L->scales == SC_SF32) {
        for (int r = 0; r < TILE; r++) d[0][r] = ((const float *)L->d)[blk * TILE + r];
        if (L->m)
            for (int r = 0; r < TILE; r++) m[r] = ((const float *)L->m)[blk * TILE + r];
    } else if (L->scales == SC_SF16) {
        for (int r = 0; r < TILE; r++) d[0][r] = f16_to_f32(((const uint16_t *)L->d)[blk * TILE + r]);
        if (L->m)
            for (int r = 0; r < TILE; r++) m[r] = f16_to_f32(((const uint16_t *)L->m)[blk * TILE + r]);
    } else {
        size_t sb = ((size_t)t * (L->n_in / QK_K) + b / 8) * TILE;
        if (L->kind == SC_W6) {
            const int8_t *sc = (const int8_t *)L->d + blk * 2 * TILE;
            for (int h = 0; h < 2; h++)
                for (int r = 0; r < TILE; r++) d[h][r] = L->sd[sb + r] * (float)sc[h * TILE + r];
        } else {
            const uint8_t *sc = (const uint8_t *)L->d + blk * TILE;
            for (int r = 0; r < TILE; r++) d[0][r] = L->sd[sb + r] * (float)sc[r];
        }
        if (L->m) {
            const uint8_t *mn = (const uint8_t *)L->m + blk * TILE;
            for (int r = 0; r < TILE; r++) m[r] = L->sm[sb + r] * (float)mn[r];
        }
    }
}

/* a block's weights as int16: w[s][r][i] is row r, input 4s + i */
static void unpack_block(const sc_linear *L, size_t blk, int16_t w[8][TILE][4]) {
    int z = L->zero;
    if (L->kind == SC_W8) {
        const int8_t *p = (const int8_t *)L->q + blk * 512;
        for (int s = 0; s < 8; s++)
            for (int r = 0; r < TILE; r++)
                for (int i = 0; i < 4; i++) w[s][r][i] = (int16_t)(p[64 * s + 4 * r + i] - z);
        return;
    }
    const uint8_t *p = L->q + blk * block_bytes(L->kind);
    for (int k = 0; k < 4; k++)
        for (int r = 0; r < TILE; r++)
            for (int i = 0; i < 4; i++) {
                int byte = p[64 * k + 4 * r + i], lo = byte & 15, hi = byte >> 4;
                if (L->kind == SC_W5) {
                    int hb = p[256 + 4 * r + i];
                    lo |= ((hb >> (2 * k)) & 1) << 4;
                    hi |= ((hb >> (2 * k + 1)) & 1) << 4;
                } else if (L->kind == SC_W6) {
                    int hb = p[256 + 64 * (k >> 1) + 4 * r + i], sh = 4 * (k & 1);
                    lo |= ((hb >> sh) & 3) << 4;
                    hi |= ((hb >> (sh + 2)) & 3) << 4;
                }
                w[2 * k][r][i] = (int16_t)(lo - z);
                w[2 * k + 1][r][i] = (int16_t)(hi - z);
            }
}

/* one tile x one token, activations int16 (q8 = 0: a sum per block) or int8 (q8 = 1: a sum per 16-input half) */
static void tile_generic_any(const sc_linear *L, int t, const void *xq, int q8, const float *xd, const int32_t *xs,
                             float *out) {
    int nb = L->n_in / QK, split = L->kind == SC_W6;
    float acc[TILE] = {0};
    for (int b = 0; b < nb; b++) {
        int16_t w[8][TILE][4];
        unpack_block(L, (size_t)t * nb + b, w);
        int16_t x[QK];
        for (int i = 0; i < QK; i++) x[i] = q8 ? ((const int8_t *)xq)[b * QK + i] : ((const int16_t *)xq)[b * QK + i];
        int32_t isum[2][TILE] = {{0}};
        for (int s = 0; s < 8; s++) {
            int h = split && s >= 4;
            for (int r = 0; r < TILE; r++)
                for (int i = 0; i < 4; i++) isum[h][r] += w[s][r][i] * x[4 * s + i];
        }
        float d[2][TILE], m[TILE];
        block_scales(L, t, b, d, m);
        for (int h = 0; h <= split; h++)
            for (int r = 0; r < TILE; r++) acc[r] = fmaf((float)isum[h][r], d[h][r] * xd[b], acc[r]);
        if (L->m) {
            float ms = xd[b] * (float)(q8 ? xs[2 * b] + xs[2 * b + 1] : xs[b]);
            for (int r = 0; r < TILE; r++) acc[r] = fmaf(m[r], ms, acc[r]);
        }
    }
    memcpy(out, acc, sizeof acc);
}

static void tile_generic(const sc_linear *L, int t, const int16_t *xq, const float *xd, const int32_t *xs,
                         float *out) {
    tile_generic_any(L, t, xq, 0, xd, xs, out);
}

/* 8-bit activations: a 16-input half's integer sum is exact in int32 whatever the order (the AVX2 code sums u * x and
   takes zero * sum(x) off; the same integer), then the same float steps as tile_generic. */
static void tile8_generic(const sc_linear *L, int t, const int8_t *xq, const float *xd, const int32_t *xs,
                          float *out) {
    tile_generic_any(L, t, xq, 1, xd, xs, out);
}

/* fn(args..., kind) with the weight kind a compile-time constant: each kind gets its own compiled loop */
#define BY_KIND(kind, fn, ...)                                                                                      \
    do {                                                                                                          \
        switch (kind) {                                                                                           \
        case SC_W4: fn(__VA_ARGS__, SC_W4); break;                                                                \
        case SC_W5: fn(__VA_ARGS__, SC_W5); break;                                                                \
        case SC_W6: fn(__VA_ARGS__, SC_W6); break;                                                                \
        default: fn(__VA_ARGS__, SC_W8); break;                                                                   \
        }                                                                                                         \
    } while (0)

#if defined(__x86_64__)
static inline int64_t x4(const int16_t *x) { /* four int16 activations as one 64-bit pattern */
    int64_t v;
    memcpy(&v, x, 8);
    return v;
}

/* d[h][0..1] (rows 0-7, 8-15), m[0..1] */
__attribute__((target("avx2,fma,f16c")))
static inline void scales_avx2(const sc_linear *L, int t, int b, __m256 d[2][2], __m256 m[2]) {
    size_t blk = (size_t)t * (L->n_in / QK) + b;
    if (L->scales == SC_SF32) {
        const float *p = (const float *)L->d + blk * TILE;
        d[0][0] = _mm256_loadu_ps(p), d[0][1] = _mm256_loadu_ps(p + 8);
        if (L->m) {
            p = (const float *)L->m + blk * TILE;
            m[0] = _mm256_loadu_ps(p), m[1] = _mm256_loadu_ps(p + 8);
        }
    } else if (L->scales == SC_SF16) {
        const uint16_t *p = (const uint16_t *)L->d + blk * TILE;
        d[0][0] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        d[0][1] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
        if (L->m) {
            p = (const uint16_t *)L->m + blk * TILE;
            m[0] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
            m[1] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
        }
    } else {
        size_t sb = ((size_t)t * (L->n_in / QK_K) + b / 8) * TILE;
        __m256 D0 = _mm256_loadu_ps(L->sd + sb), D1 = _mm256_loadu_ps(L->sd + sb + 8);
        if (L->kind == SC_W6) {
            const int8_t *sc = (const int8_t *)L->d + blk * 2 * TILE;
            for (int h = 0; h < 2; h++) {
                __m128i v = _mm_loadu_si128((const __m128i *)(sc + h * TILE));
                d[h][0] = _mm256_mul_ps(D0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)));
                d[h][1] = _mm256_mul_ps(D1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))));
            }
        } else {
            __m128i v = _mm_loadu_si128((const __m128i *)((const uint8_t *)L->d + blk * TILE));
            d[0][0] = _mm256_mul_ps(D0, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)));
            d[0][1] = _mm256_mul_ps(D1, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))));
        }
        if (L->m) {
            __m256 M0 = _mm256_loadu_ps(L->sm + sb), M1 = _mm256_loadu_ps(L->sm + sb + 8);
            __m128i v = _mm_loadu_si128((const __m128i *)((const uint8_t *)L->m + blk * TILE));
            m[0] = _mm256_mul_ps(M0, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)));
            m[1] = _mm256_mul_ps(M1, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))));
        }
    }
}

/* vector c of step k of a 4/5/6-bit block widened to int16, offset removed: rows 4c..4c+3 x inputs 8k..8k+3 (*wl)
   and 8k+4..8k+7 (*wh) */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void widen_avx2(const uint8_t *p, int k, int c, const int kind, int zero, __m256i *wl, __m256i *wh) {
    const __m128i lo = _mm_set1_epi8(15), one = _mm_set1_epi8(1), three = _mm_set1_epi8(3);
    __m128i v = _mm_loadu_si128((const __m128i *)(p + 64 * k + 16 * c));
    __m128i l = _mm_and_si128(v, lo), hh = _mm_and_si128(_mm_srli_epi16(v, 4), lo);
    if (kind == SC_W5) {
        __m128i hb = _mm_loadu_si128((const __m128i *)(p + 256 + 16 * c));
        l = _mm_or_si128(l, _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(hb, _mm_cvtsi32_si128(2 * k)), one), 4));
        hh = _mm_or_si128(hh, _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(hb, _mm_cvtsi32_si128(2 * k + 1)), one), 4));
    } else if (kind == SC_W6) {
        __m128i hb = _mm_loadu_si128((const __m128i *)(p + 256 + 64 * (k >> 1) + 16 * c));
        int sh = 4 * (k & 1);
        l = _mm_or_si128(l, _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(hb, _mm_cvtsi32_si128(sh)), three), 4));
        hh = _mm_or_si128(hh, _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(hb, _mm_cvtsi32_si128(sh + 2)), three), 4));
    }
    *wl = _mm256_cvtepu8_epi16(l), *wh = _mm256_cvtepu8_epi16(hh);
    if (zero) {
        const __m256i z = _mm256_set1_epi16((int16_t)zero);
        *wl = _mm256_sub_epi16(*wl, z), *wh = _mm256_sub_epi16(*wh, z);
    }
}

/* the body for one kind (a constant: each kind gets its own compiled loop) */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void tile_avx2_kind(const sc_linear *L, int t, const int16_t *xq, const float *xd, const int32_t *xs,
                                  float *out, const int kind) {
    int nb = L->n_in / QK, split = kind == SC_W6, zero = L->zero;
    size_t bb = block_bytes(kind);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const __m256i z = _mm256_set1_epi16((int16_t)L->zero);
    for (int b = 0; b < nb; b++) {
        size_t blk = (size_t)t * nb + b;
        const int16_t *x = xq + b * QK;
        /* s[h][c]: rows 4c..4c+3 (input half h for W6), each row's sum split over two adjacent int32 lanes */
        __m256i s[2][4];
        for (int h = 0; h < 2; h++)
            for (int c = 0; c < 4; c++) s[h][c] = _mm256_setzero_si256();
        if (kind != SC_W8) {
            const uint8_t *p = L->q + blk * bb;
            for (int k = 0; k < 4; k++) {
                __m256i xl = _mm256_set1_epi64x(x4(x + 8 * k)), xh = _mm256_set1_epi64x(x4(x + 8 * k + 4));
                int h = kind == SC_W6 ? k >> 1 : 0;
                for (int c = 0; c < 4; c++) {
                    __m256i wl, wh;
                    widen_avx2(p, k, c, kind, zero, &wl, &wh);
                    s[h][c] = _mm256_add_epi32(s[h][c], _mm256_add_epi32(_mm256_madd_epi16(wl, xl),
                                                                         _mm256_madd_epi16(wh, xh)));
                }
            }
        } else {
            const uint8_t *p = L->q + blk * 512;
            for (int k = 0; k < 8; k++) {
                __m256i xb = _mm256_set1_epi64x(x4(x + 4 * k));
                for (int c = 0; c < 4; c++) {
                    __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 64 * k + 16 * c)));
                    if (zero) w = _mm256_sub_epi16(w, z);
                    s[0][c] = _mm256_add_epi32(s[0][c], _mm256_madd_epi16(w, xb));
                }
            }
        }
        __m256 d[2][2], m[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        scales_avx2(L, t, b, d, m);
        __m256 dx = _mm256_set1_ps(xd[b]);
        for (int h = 0; h <= split; h++) {
            __m256i s0 = _mm256_permute4x64_epi64(_mm256_hadd_epi32(s[h][0], s[h][1]), 0xD8);
            __m256i s1 = _mm256_permute4x64_epi64(_mm256_hadd_epi32(s[h][2], s[h][3]), 0xD8);
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_mul_ps(d[h][0], dx), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_mul_ps(d[h][1], dx), acc1);
        }
        if (L->m) {
            __m256 ms = _mm256_set1_ps(xd[b] * (float)xs[b]);
            acc0 = _mm256_fmadd_ps(m[0], ms, acc0);
            acc1 = _mm256_fmadd_ps(m[1], ms, acc1);
        }
    }
    _mm256_storeu_ps(out, acc0);
    _mm256_storeu_ps(out + 8, acc1);
}

/* KEEP(v): v is materialized here, in a register: the compiler may not reassociate a chain of integer additions
   across it into a wide tree of temporaries (which spills: 16 vector registers are all AVX2 has). */
#define KEEP(v) __asm__("" : "+x"(v))

/* A block's float step for one token's integer sums: rows 0-7 / 8-15 of s[c] (rows 4c..4c+3, each row's sum split over
   two adjacent int32 lanes) as tile_avx2_kind does it. */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void block_fma_avx2(__m256i s0, __m256i s1, __m256i s2, __m256i s3, __m256 d0, __m256 d1, __m256 dx,
                                  __m256 *acc) {
    __m256i r0 = _mm256_permute4x64_epi64(_mm256_hadd_epi32(s0, s1), 0xD8);
    __m256i r1 = _mm256_permute4x64_epi64(_mm256_hadd_epi32(s2, s3), 0xD8);
    acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(r0), _mm256_mul_ps(d0, dx), acc[0]);
    acc[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(r1), _mm256_mul_ps(d1, dx), acc[1]);
}

/* The same as tile_avx2_kind for up to MULTI_AVX2 tokens: the weights of a chunk of CHUNK16 blocks are widened to
   int16 once (8 KB, kept in L1) and used by every token; a token's float accumulators stay in registers over the
   chunk. Each token's integer sums (exact, whatever the order) and float operations are exactly those of
   tile_avx2_kind. */
#define MULTI_AVX2 64
#define CHUNK16 8
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void tiles_avx2_kind(const sc_linear *L, int t, const int16_t *const *xq, const float *const *xd,
                                   const int32_t *const *xs, int m, float *const *out, const int kind) {
    int nb = L->n_in / QK, split = kind == SC_W6, zero = L->zero;
    size_t bb = block_bytes(kind);
    __m256 acc[MULTI_AVX2][2];
    for (int j = 0; j < m; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    const __m256i z = _mm256_set1_epi16((int16_t)L->zero);
    /* W4/5/6: w[c][8k + 2q + e] inputs 8k + 4e.., rows 4q..; W8: w[c][4k + q] */
    __m256i w[CHUNK16][32] __attribute__((aligned(32)));
    __m256 dc[CHUNK16][2][2], mc[CHUNK16][2];
    for (int b0 = 0; b0 < nb; b0 += CHUNK16) {
        int nc = nb - b0 < CHUNK16 ? nb - b0 : CHUNK16;
        for (int c = 0; c < nc; c++) {
            size_t blk = (size_t)t * nb + b0 + c;
            if (kind != SC_W8) {
                const uint8_t *p = L->q + blk * bb;
                for (int k = 0; k < 4; k++)
                    for (int q = 0; q < 4; q++)
                        widen_avx2(p, k, q, kind, zero, &w[c][8 * k + 2 * q], &w[c][8 * k + 2 * q + 1]);
            } else {
                const uint8_t *p = L->q + blk * 512;
                for (int k = 0; k < 8; k++)
                    for (int q = 0; q < 4; q++) {
                        __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 64 * k + 16 * q)));
                        w[c][4 * k + q] = zero ? _mm256_sub_epi16(v, z) : v;
                    }
            }
            mc[c][0] = mc[c][1] = _mm256_setzero_ps();
            scales_avx2(L, t, b0 + c, dc[c], mc[c]);
        }
        for (int j = 0; j < m; j++) {
            __m256 a[2] = {acc[j][0], acc[j][1]};
            for (int c = 0; c < nc; c++) {
                int b = b0 + c;
                const int16_t *x = xq[j] + b * QK;
                __m256 dx = _mm256_set1_ps(xd[j][b]);
                for (int h = 0; h <= split; h++) {
                    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
                    if (kind != SC_W8) {
                        for (int k = split ? 2 * h : 0; k < (split ? 2 * h + 2 : 4); k++) {
                            const __m256i *wk = w[c] + 8 * k;
                            __m256i xl = _mm256_set1_epi64x(x4(x + 8 * k)), xh = _mm256_set1_epi64x(x4(x + 8 * k + 4));
                            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(wk[0], xl));
                            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(wk[2], xl));
                            s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(wk[4], xl));
                            s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(wk[6], xl));
                            KEEP(s0); KEEP(s1); KEEP(s2); KEEP(s3);
                            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(wk[1], xh));
                            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(wk[3], xh));
                            s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(wk[5], xh));
                            s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(wk[7], xh));
                            KEEP(s0); KEEP(s1); KEEP(s2); KEEP(s3);
                        }
                    } else {
                        for (int k = 0; k < 8; k++) {
                            const __m256i *wk = w[c] + 4 * k;
                            __m256i xb = _mm256_set1_epi64x(x4(x + 4 * k));
                            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(wk[0], xb));
                            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(wk[1], xb));
                            s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(wk[2], xb));
                            s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(wk[3], xb));
                            KEEP(s0); KEEP(s1); KEEP(s2); KEEP(s3);
                        }
                    }
                    block_fma_avx2(s0, s1, s2, s3, dc[c][h][0], dc[c][h][1], dx, a);
                }
                if (L->m) {
                    __m256 ms = _mm256_set1_ps(xd[j][b] * (float)xs[j][b]);
                    a[0] = _mm256_fmadd_ps(mc[c][0], ms, a[0]);
                    a[1] = _mm256_fmadd_ps(mc[c][1], ms, a[1]);
                }
            }
            acc[j][0] = a[0], acc[j][1] = a[1];
        }
    }
    for (int j = 0; j < m; j++) {
        _mm256_storeu_ps(out[j], acc[j][0]);
        _mm256_storeu_ps(out[j] + 8, acc[j][1]);
    }
}

/* step k of a 4/5/6-bit block, rows 8rh..8rh+7: the stored unsigned values of inputs 8k..8k+3 (*l) and 8k+4..8k+7
   (*hh), one byte per weight (lane 4r + i), the offset not removed */
__attribute__((target("avx2"), always_inline))
static inline void unpack_u8_avx2(const uint8_t *p, int k, int rh, const int kind, __m256i *l, __m256i *hh) {
    const __m256i nib = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1), three = _mm256_set1_epi8(3);
    __m256i v = _mm256_loadu_si256((const __m256i *)(p + 64 * k + 32 * rh));
    __m256i a = _mm256_and_si256(v, nib), b = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
    if (kind == SC_W5) {
        __m256i hb = _mm256_loadu_si256((const __m256i *)(p + 256 + 32 * rh));
        __m128i c0 = _mm_cvtsi32_si128(2 * k), c1 = _mm_cvtsi32_si128(2 * k + 1);
        a = _mm256_or_si256(a, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hb, c0), one), 4));
        b = _mm256_or_si256(b, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hb, c1), one), 4));
    } else if (kind == SC_W6) {
        __m256i hb = _mm256_loadu_si256((const __m256i *)(p + 256 + 64 * (k >> 1) + 32 * rh));
        __m128i c2 = _mm_cvtsi32_si128(4 * (k & 1)), c3 = _mm_cvtsi32_si128(4 * (k & 1) + 2);
        a = _mm256_or_si256(a, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hb, c2), three), 4));
        b = _mm256_or_si256(b, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hb, c3), three), 4));
    }
    *l = a, *hh = b;
}

/* 8-bit activations on AVX2, up to MULTI_AVX2 tokens (one: m = 1): a block's weights stay unsigned bytes (u, offset
   not removed), extracted once per block for every token; vpmaddubsw multiplies 32 u x x byte pairs at a time, sums of
   up to 4 products stay in int16 without saturating (4-bit: 8 x 2 x 15 x 127 < 2^15; 5-bit: 4 x 2 x 31 x 127; 6-bit:
   2 x 2 x 63 x 127; Q8_0's signed weights use |w| and x with w's sign: 2 x 128 x 127), vpmaddwd with ones makes
   int32 row sums (a lane per row: 8 rows per vector), then zero * sum(x) is taken off: exactly tile8_generic's
   integers, and its float steps. */
#define MULTI8 64  /* tokens per call */
#define CHUNK8 8   /* blocks whose weights are extracted together */
__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void tiles8_avx2_kind(const sc_linear *L, int t, const int8_t *const *xq, const float *const *xd,
                                    const int32_t *const *xs, int m, float *const *out, const int kind) {
    int nb = L->n_in / QK, zero = L->zero;
    size_t bb = block_bytes(kind);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[MULTI8][2];
    for (int j = 0; j < m; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    /* a chunk of blocks: u[c][4k + 2e + rh] inputs 8k + 4e.., rows 8rh.. (W8: u[c][2k + rh]); scales d, m */
    __m256i u[CHUNK8][16] __attribute__((aligned(32)));
    __m256 dc[CHUNK8][2][2], mc[CHUNK8][2];
    for (int b0 = 0; b0 < nb; b0 += CHUNK8) {
        int nc = nb - b0 < CHUNK8 ? nb - b0 : CHUNK8;
        for (int c = 0; c < nc; c++) {
            const uint8_t *p = L->q + ((size_t)t * nb + b0 + c) * bb;
            if (kind != SC_W8) {
                for (int k = 0; k < 4; k++)
                    for (int rh = 0; rh < 2; rh++) unpack_u8_avx2(p, k, rh, kind, &u[c][4 * k + rh], &u[c][4 * k + 2 + rh]);
            } else {
                for (int k = 0; k < 8; k++)
                    for (int rh = 0; rh < 2; rh++)
                        u[c][2 * k + rh] = _mm256_loadu_si256((const __m256i *)(p + 64 * k + 32 * rh));
            }
            mc[c][0] = mc[c][1] = _mm256_setzero_ps();
            scales_avx2(L, t, b0 + c, dc[c], mc[c]);
        }
        for (int j = 0; j < m; j++) {
            __m256 a[2] = {acc[j][0], acc[j][1]};
            for (int c = 0; c < nc; c++) {
                int b = b0 + c;
                const int8_t *x = xq[j] + b * QK;
                const int32_t *sx = xs[j] + 2 * b;
                __m256 dx = _mm256_set1_ps(xd[j][b]);
                __m256i isum[2][2];  /* [rh][16-input half (W6), else 0] */
                if (kind == SC_W8) {
                    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
                    for (int k = 0; k < 8; k++) {
                        int32_t xv;
                        memcpy(&xv, x + 4 * k, 4);
                        __m256i xb = _mm256_set1_epi32(xv), w0 = u[c][2 * k], w1 = u[c][2 * k + 1];
                        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w0, w0),
                                                                                         _mm256_sign_epi8(xb, w0)), ones));
                        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w1, w1),
                                                                                         _mm256_sign_epi8(xb, w1)), ones));
                        KEEP(s0); KEEP(s1);
                    }
                    isum[0][0] = s0, isum[1][0] = s1;
                } else {
                    for (int rh = 0; rh < 2; rh++) {
                        const __m256i *uc = u[c];
                        __m256i a16 = _mm256_setzero_si256(), s32 = _mm256_setzero_si256();
                        for (int k = 0; k < 4; k++) {
                            int32_t xl, xh;
                            memcpy(&xl, x + 8 * k, 4);
                            memcpy(&xh, x + 8 * k + 4, 4);
                            a16 = _mm256_add_epi16(a16, _mm256_maddubs_epi16(uc[4 * k + rh], _mm256_set1_epi32(xl)));
                            KEEP(a16);
                            a16 = _mm256_add_epi16(a16, _mm256_maddubs_epi16(uc[4 * k + 2 + rh], _mm256_set1_epi32(xh)));
                            KEEP(a16);
                            /* int16 partial sums stay within 2^15: W4 8 vpmaddubsw results, W5 4, W6 2 (see above) */
                            int flush = kind == SC_W6 || (kind == SC_W5 && (k & 1)) || k == 3;
                            if (flush) {
                                s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(a16, ones));
                                a16 = _mm256_setzero_si256();
                                if (kind == SC_W6 && k == 1) {  /* the first 16-input half */
                                    isum[rh][0] = s32;
                                    s32 = _mm256_setzero_si256();
                                }
                            }
                        }
                        isum[rh][kind == SC_W6] = s32;
                    }
                }
                __m256 ms = _mm256_set1_ps(xd[j][b] * (float)(sx[0] + sx[1]));
                for (int rh = 0; rh < 2; rh++) {
                    if (kind == SC_W6) {
                        for (int h = 0; h < 2; h++) {
                            __m256i is = _mm256_sub_epi32(isum[rh][h], _mm256_set1_epi32(zero * sx[h]));
                            a[rh] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dc[c][h][rh], dx), a[rh]);
                        }
                    } else {
                        __m256i is = zero ? _mm256_sub_epi32(isum[rh][0], _mm256_set1_epi32(zero * (sx[0] + sx[1])))
                                          : isum[rh][0];
                        a[rh] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dc[c][0][rh], dx), a[rh]);
                    }
                    if (L->m) a[rh] = _mm256_fmadd_ps(mc[c][rh], ms, a[rh]);
                }
            }
            acc[j][0] = a[0], acc[j][1] = a[1];
        }
    }
    for (int j = 0; j < m; j++) {
        _mm256_storeu_ps(out[j], acc[j][0]);
        _mm256_storeu_ps(out[j] + 8, acc[j][1]);
    }
}

__attribute__((target("avx2,fma,f16c")))
static void tiles8_avx2(const sc_linear *L, int t, const int8_t *const *xq, const float *const *xd,
                        const int32_t *const *xs, int m, float *const *out) {
    BY_KIND(L->kind, tiles8_avx2_kind, L, t, xq, xd, xs, m, out);
}

__attribute__((target("avx2,fma,f16c")))
static void tiles_avx2(const sc_linear *L, int t, const int16_t *const *xq, const float *const *xd,
                       const int32_t *const *xs, int m, float *const *out) {
    BY_KIND(L->kind, tiles_avx2_kind, L, t, xq, xd, xs, m, out);
}

__attribute__((target("avx2,fma,f16c")))
static void tile_avx2(const sc_linear *L, int t, const int16_t *xq, const float *xd, const int32_t *xs,
                      float *out) {
    BY_KIND(L->kind, tile_avx2_kind, L, t, xq, xd, xs, out);
}

__attribute__((target("avx512f,avx512bw,avx512vnni,fma")))
static inline void scales_avx512(const sc_linear *L, int t, int b, __m512 d[2], __m512 *m) {
    size_t blk = (size_t)t * (L->n_in / QK) + b;
    if (L->scales == SC_SF32) {
        d[0] = _mm512_loadu_ps((const float *)L->d + blk * TILE);
        if (L->m) *m = _mm512_loadu_ps((const float *)L->m + blk * TILE);
    } else if (L->scales == SC_SF16) {
        d[0] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)L->d + blk * TILE)));
        if (L->m) *m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)L->m + blk * TILE)));
    } else {
        size_t sb = ((size_t)t * (L->n_in / QK_K) + b / 8) * TILE;
        __m512 D = _mm512_loadu_ps(L->sd + sb);
        if (L->kind == SC_W6) {
            const int8_t *sc = (const int8_t *)L->d + blk * 2 * TILE;
            for (int h = 0; h < 2; h++)
                d[h] = _mm512_mul_ps(D, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                            _mm_loadu_si128((const __m128i *)(sc + h * TILE)))));
        } else {
            d[0] = _mm512_mul_ps(D, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                        _mm_loadu_si128((const __m128i *)((const uint8_t *)L->d + blk * TILE)))));
        }
        if (L->m)
            *m = _mm512_mul_ps(_mm512_loadu_ps(L->sm + sb), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                   _mm_loadu_si128((const __m128i *)((const uint8_t *)L->m + blk * TILE)))));
    }
}

/* Up to 4 tokens at once (one token: m = 1): a block's weights are widened to int16 once and used by every token.
   Each token's sums and float operations are exactly those of tile_generic. */
#define MULTI 4
__attribute__((target("avx512f,avx512bw,avx512vnni,fma"), always_inline))
static inline void tiles_avx512vnni_kind(const sc_linear *L, int t, const int16_t *const *xq, const float *const *xd,
                                         const int32_t *const *xs, int m, float *const *out, const int kind) {
    int nb = L->n_in / QK, split = kind == SC_W6;
    size_t bb = block_bytes(kind);
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512i z = _mm512_set1_epi16((int16_t)L->zero);
    __m512 acc[MULTI];
    for (int j = 0; j < MULTI; j++) acc[j] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        size_t blk = (size_t)t * nb + b;
        __m512i w[16];  /* w[2s + h]: rows 0-7 (h = 0) / 8-15 (h = 1) of step s (inputs 4s..4s+3), int16 pairs */
        if (kind != SC_W8) {
            const uint8_t *p = L->q + blk * bb;
            for (int k = 0; k < 4; k++) {
                for (int h = 0; h < 2; h++) {
                    __m256i l, hh;
                    unpack_u8_avx2(p, k, h, kind, &l, &hh);
                    w[4 * k + h] = _mm512_sub_epi16(_mm512_cvtepu8_epi16(l), z);
                    w[4 * k + 2 + h] = _mm512_sub_epi16(_mm512_cvtepu8_epi16(hh), z);
                }
            }
        } else {
            const uint8_t *p = L->q + blk * 512;
            for (int k = 0; k < 8; k++)
                for (int h = 0; h < 2; h++)
                    w[2 * k + h] = _mm512_sub_epi16(
                        _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p + 64 * k + 32 * h))), z);
        }
        __m512 dv[2], mv = _mm512_setzero_ps();
        scales_avx512(L, t, b, dv, &mv);
        for (int j = 0; j < m; j++) {
            const int16_t *x = xq[j] + b * QK;
            __m512 dx = _mm512_set1_ps(xd[j][b]);
            for (int h = 0; h <= split; h++) {
                __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
                for (int s = split ? 4 * h : 0; s < (split ? 4 * h + 4 : 8); s++) {
                    __m512i xb = _mm512_set1_epi64(x4(x + 4 * s));
                    s0 = _mm512_dpwssd_epi32(s0, w[2 * s], xb);
                    s1 = _mm512_dpwssd_epi32(s1, w[2 * s + 1], xb);
                }
                __m512i sum = _mm512_add_epi32(_mm512_permutex2var_epi32(s0, even, s1),
                                               _mm512_permutex2var_epi32(s0, odd, s1));
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dv[h], dx), acc[j]);
            }
            if (L->m) acc[j] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xd[j][b] * (float)xs[j][b]), acc[j]);
        }
    }
    for (int j = 0; j < m; j++) _mm512_storeu_ps(out[j], acc[j]);
}

__attribute__((target("avx512f,avx512bw,avx512vnni,fma")))
static void tiles_avx512vnni(const sc_linear *L, int t, const int16_t *const *xq, const float *const *xd,
                             const int32_t *const *xs, int m, float *const *out) {
    BY_KIND(L->kind, tiles_avx512vnni_kind, L, t, xq, xd, xs, m, out);
}

__attribute__((target("avx512f,avx512bw,avx512vnni,fma")))
static void tile_avx512vnni(const sc_linear *L, int t, const int16_t *xq, const float *xd, const int32_t *xs,
                            float *out) {
    tiles_avx512vnni(L, t, &xq, &xd, &xs, 1, &out);
}

/* One token (decode) on 4/5/6-bit weights, bytes times bytes. The token's int16 activations are split once per linear
   into q = 256 * hi + lo (split_bytes_avx2: hi = q >> 8 signed, lo = q & 255 unsigned); the weights stay the stored
   unsigned values u (0..63, the offset not removed), one byte per weight, 16 rows x 4 inputs per 64 bytes with lane r
   (4 bytes) row r: the packed layout's own order (vector k's low nibbles are inputs 8k..8k+3, its high nibbles inputs
   8k+4..8k+7). Byte products, 4 to an int32 lane, give sum(u * hi) (u unsigned, hi signed) and sum(lo * u) (lo
   unsigned, u < 128 as signed), and a block's (W6: a 16-input half's) sum is
       sum((u - zero) * q) = 256 * sum(u * hi) + sum(lo * u) - zero * sum(q),
   exact in int32 (|256 * sum(u * hi)| <= 256 * 32 * 63 * 128 < 2^26): the very integers of the int16 kernels, followed
   by their float steps in their order, so the same bits. Against widening the weights to int16 (tiles_avx512vnni_kind,
   tile_avx2_kind) this saves the widening, the offset and the lane shuffles, and unpacks whole vectors: the 6-bit
   values cost about what the 4-bit ones did. */

/* sel(a, b): bits 0-3 of each byte from a, bits 4-7 from b */
#define SEL512(a, b) _mm512_ternarylogic_epi32((a), (b), _mm512_set1_epi8(15), 0xE4)

/* a 4/5/6-bit block's 16 rows x 32 inputs as u bytes: u[s] inputs 4s..4s+3, lane r row r */
__attribute__((target("avx512f,avx512bw"), always_inline))
static inline void unpack_block_avx512(const uint8_t *p, const int kind, __m512i u[8]) {
    const __m512i nib = _mm512_set1_epi8(15);
    if (kind == SC_W6) {
        /* vector P's byte holds the high 2 bits of (h, e) = (0, 0), (0, 1), (1, 0), (1, 1) (k = 2P + h, inputs
           8k + 4e..) at bits 0-1, 2-3, 4-5, 6-7; m keeps bits 0-1 and 4-5, n bits 2-3 and 6-7, so that each shift below
           brings one pair to bits 4-5 with zeros above it (bits 0-3, taken from the nibbles, may hold anything) */
        for (int P = 0; P < 2; P++) {
            __m512i hb = _mm512_loadu_si512(p + 256 + 64 * P);
            __m512i m = _mm512_and_si512(hb, _mm512_set1_epi8(0x33));
            __m512i n = _mm512_and_si512(hb, _mm512_set1_epi8((char)0xCC));
            __m512i v0 = _mm512_loadu_si512(p + 128 * P), v1 = _mm512_loadu_si512(p + 128 * P + 64);
            u[4 * P] = SEL512(v0, _mm512_slli_epi16(m, 4));
            u[4 * P + 1] = SEL512(_mm512_srli_epi16(v0, 4), _mm512_slli_epi16(n, 2));
            u[4 * P + 2] = SEL512(v1, m);
            u[4 * P + 3] = SEL512(_mm512_srli_epi16(v1, 4), _mm512_srli_epi16(n, 2));
        }
        return;
    }
    __m512i hb = kind == SC_W5 ? _mm512_loadu_si512(p + 256) : _mm512_setzero_si512();
    for (int k = 0; k < 4; k++) {
        __m512i v = _mm512_loadu_si512(p + 64 * k);
        if (kind == SC_W5) {  /* bit 4 of inputs 8k + 4e.. at bit j = 2k + e of hb's byte */
            for (int e = 0; e < 2; e++) {
                int j = 2 * k + e;
                __m512i bit = _mm512_and_si512(hb, _mm512_set1_epi8((char)(1 << j)));
                bit = j < 4 ? _mm512_slli_epi16(bit, 4 - j) : j > 4 ? _mm512_srli_epi16(bit, j - 4) : bit;
                u[2 * k + e] = SEL512(e ? _mm512_srli_epi16(v, 4) : v, bit);
            }
        } else {
            u[2 * k] = _mm512_and_si512(v, nib);
            u[2 * k + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
        }
    }
}

/* A decode step streams every weight once, from memory rather than cache: the weights PREFETCH_AHEAD bytes on are
   asked into L2 one block's worth at a time (a thread's tiles are contiguous). Against the hardware prefetchers alone,
   the 128256 x 2048 output matrix (217 MB, Q6_K) read 20 GB/s on 2 threads and 10 on one; with this, 32 and 14 on a
   2-vCPU Xeon (3 to 24 KiB ahead gave within 10% of each other; into L1 a little less). Prefetches do not fault past
   the end of the weights. */
#define PREFETCH_AHEAD 8192
static inline void prefetch_ahead(const uint8_t *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + PREFETCH_AHEAD + o, 0, 2);  /* prefetcht1 */
}

static inline int32_t ld32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

__attribute__((target("avx512f,avx512bw,avx512vnni,fma"), always_inline))
static inline void tile1_avx512vnni_kind(const sc_linear *L, int t, const q16_rows *xq, float *out, const int kind) {
    const int nb = L->n_in / QK, zero = L->zero;
    const size_t bb = block_bytes(kind);
    const float *xd = xq->d;
    const int32_t *xs = xq->s, *hs = xq->hs;
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        size_t blk = (size_t)t * nb + b;
        __m512i u[8];
        prefetch_ahead(L->q + blk * bb, bb);
        unpack_block_avx512(L->q + blk * bb, kind, u);
        const int8_t *xh = xq->xb + 64 * b, *xl = xh + 32;
        /* sh / sl: sum(u * hi) / sum(lo * u); [16-input half] for W6, else [step parity] (shorter chains) */
        __m512i sh[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()}, sl[2] = {sh[0], sh[0]};
        for (int s = 0; s < 8; s++) {
            int a = kind == SC_W6 ? s >> 2 : s & 1;
            sh[a] = _mm512_dpbusd_epi32(sh[a], u[s], _mm512_set1_epi32(ld32(xh + 4 * s)));
            sl[a] = _mm512_dpbusd_epi32(sl[a], _mm512_set1_epi32(ld32(xl + 4 * s)), u[s]);
        }
        __m512 dv[2], mv = _mm512_setzero_ps();
        scales_avx512(L, t, b, dv, &mv);
        __m512 dx = _mm512_set1_ps(xd[b]);
        if (kind == SC_W6) {
            for (int h = 0; h < 2; h++) {
                __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(sh[h], 8), sl[h]);
                sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(zero * hs[2 * b + h]));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dv[h], dx), acc);
            }
        } else {
            __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(sh[0], sh[1]), 8),
                                           _mm512_add_epi32(sl[0], sl[1]));
            if (zero) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(zero * xs[b]));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dv[0], dx), acc);
        }
        if (L->m) acc = _mm512_fmadd_ps(mv, _mm512_set1_ps(xd[b] * (float)xs[b]), acc);
    }
    _mm512_storeu_ps(out, acc);
}

__attribute__((target("avx512f,avx512bw,avx512vnni,fma")))
static void tile1_avx512vnni(const sc_linear *L, int t, const q16_rows *xq, float *out) {
    switch (L->kind) {
    case SC_W4: tile1_avx512vnni_kind(L, t, xq, out, SC_W4); break;
    case SC_W5: tile1_avx512vnni_kind(L, t, xq, out, SC_W5); break;
    default: tile1_avx512vnni_kind(L, t, xq, out, SC_W6); break;
    }
}

/* The same on AVX2: rows 0-7 and 8-15 of a vector are two 32-byte halves (rh); vpmaddubsw makes int16 sums of two
   byte products, which do not saturate: u * hi pairs within [-16128, 16002] (two of them, added, still fit), lo * u
   pairs at most 2 * 255 * 63 = 32130; vpmaddwd with ones makes them int32 row sums (lane r: row 8rh + r). */
__attribute__((target("avx2"), always_inline))
static inline void unpack_half_avx2(const uint8_t *p, int P, int rh, const int kind, __m256i u[4]) {
    /* u[i]: inputs 4(4P + i).., rows 8rh.. (steps 4P..4P+3: the inputs 16P..16P+15) */
    const __m256i nib = _mm256_set1_epi8(15), top = _mm256_set1_epi8(0x30);
    __m256i v0 = _mm256_loadu_si256((const __m256i *)(p + 128 * P + 32 * rh));
    __m256i v1 = _mm256_loadu_si256((const __m256i *)(p + 128 * P + 64 + 32 * rh));
    __m256i a[4] = {_mm256_and_si256(v0, nib), _mm256_and_si256(_mm256_srli_epi16(v0, 4), nib),
                    _mm256_and_si256(v1, nib), _mm256_and_si256(_mm256_srli_epi16(v1, 4), nib)};
    if (kind == SC_W6) {  /* vector P, bits 2(2h + e): see unpack_block_avx512 */
        __m256i hb = _mm256_loadu_si256((const __m256i *)(p + 256 + 64 * P + 32 * rh));
        a[0] = _mm256_or_si256(a[0], _mm256_and_si256(_mm256_slli_epi16(hb, 4), top));
        a[1] = _mm256_or_si256(a[1], _mm256_and_si256(_mm256_slli_epi16(hb, 2), top));
        a[2] = _mm256_or_si256(a[2], _mm256_and_si256(hb, top));
        a[3] = _mm256_or_si256(a[3], _mm256_and_si256(_mm256_srli_epi16(hb, 2), top));
    } else if (kind == SC_W5) {  /* bit 4 of inputs 8k + 4e.. (k = 2P + i / 2, e = i % 2) at bit j = 2k + e */
        __m256i hb = _mm256_loadu_si256((const __m256i *)(p + 256 + 32 * rh));
        for (int i = 0; i < 4; i++) {
            int j = 4 * P + i;
            __m256i bit = _mm256_and_si256(hb, _mm256_set1_epi8((char)(1 << j)));
            bit = j < 4 ? _mm256_slli_epi16(bit, 4 - j) : j > 4 ? _mm256_srli_epi16(bit, j - 4) : bit;
            a[i] = _mm256_or_si256(a[i], bit);
        }
    }
    for (int i = 0; i < 4; i++) u[i] = a[i];
}

__attribute__((target("avx2,fma,f16c"), always_inline))
static inline void tile1_avx2_kind(const sc_linear *L, int t, const q16_rows *xq, float *out, const int kind) {
    const int nb = L->n_in / QK, zero = L->zero, split = kind == SC_W6;
    const size_t bb = block_bytes(kind);
    const float *xd = xq->d;
    const int32_t *xs = xq->s, *hs = xq->hs;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int b = 0; b < nb; b++) {
        size_t blk = (size_t)t * nb + b;
        const uint8_t *p = L->q + blk * bb;
        prefetch_ahead(p, bb);
        const int8_t *xh = xq->xb + 64 * b, *xl = xh + 32;
        __m256 d[2][2], m[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        scales_avx2(L, t, b, d, m);
        __m256 dx = _mm256_set1_ps(xd[b]);
        for (int rh = 0; rh < 2; rh++) {
            __m256i sh[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, sl[2] = {sh[0], sh[0]};
            for (int P = 0; P < 2; P++) {
                __m256i u[4];
                unpack_half_avx2(p, P, rh, kind, u);
                for (int i = 0; i < 4; i += 2) {
                    int s = 4 * P + i;
                    __m256i ph = _mm256_add_epi16(_mm256_maddubs_epi16(u[i], _mm256_set1_epi32(ld32(xh + 4 * s))),
                                                  _mm256_maddubs_epi16(u[i + 1], _mm256_set1_epi32(ld32(xh + 4 * s + 4))));
                    sh[split ? P : 0] = _mm256_add_epi32(sh[split ? P : 0], _mm256_madd_epi16(ph, ones));
                    sl[split ? P : 1] = _mm256_add_epi32(
                        sl[split ? P : 1], _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi32(ld32(xl + 4 * s)), u[i]), ones));
                    sl[split ? P : 0] = _mm256_add_epi32(
                        sl[split ? P : 0],
                        _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi32(ld32(xl + 4 * s + 4)), u[i + 1]), ones));
                }
            }
            if (split) {
                for (int h = 0; h < 2; h++) {
                    __m256i sum = _mm256_add_epi32(_mm256_slli_epi32(sh[h], 8), sl[h]);
                    sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(zero * hs[2 * b + h]));
                    acc[rh] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d[h][rh], dx), acc[rh]);
                }
            } else {
                __m256i sum = _mm256_add_epi32(_mm256_slli_epi32(sh[0], 8), _mm256_add_epi32(sl[0], sl[1]));
                if (zero) sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(zero * xs[b]));
                acc[rh] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d[0][rh], dx), acc[rh]);
            }
            if (L->m) acc[rh] = _mm256_fmadd_ps(m[rh], _mm256_set1_ps(xd[b] * (float)xs[b]), acc[rh]);
        }
    }
    _mm256_storeu_ps(out, acc[0]);
    _mm256_storeu_ps(out + 8, acc[1]);
}

__attribute__((target("avx2,fma,f16c")))
static void tile1_avx2(const sc_linear *L, int t, const q16_rows *xq, float *out) {
    switch (L->kind) {
    case SC_W4: tile1_avx2_kind(L, t, xq, out, SC_W4); break;
    case SC_W5: tile1_avx2_kind(L, t, xq, out, SC_W5); break;
    default: tile1_avx2_kind(L, t, xq, out, SC_W6); break;
    }
}

/* AMX (Advanced Matrix Extensions: TDPBSSD / TDPBUSD, 16 x 16 int32 sums of int8 products per instruction), for
   several tokens at once. A 16-bit activation is q = 256 * hi + lo with hi = q >> 8 (signed byte) and lo = q & 255
   (unsigned byte), so a block's sum over its inputs, sum(w * q) = 256 * sum(w * hi) + sum(w * lo), comes from int8
   tile products as the same exact int32 as the other variants' (|256 * sum(w * hi)| < 2^27); the float steps that
   follow are tile_generic's, in its order, token by token. Weights are q = u - zero in [-128, 127] for every kind.
   A token's block is one 64-byte tile row, its 32 hi bytes then its 32 lo bytes, the rows of 16 tokens' block
   side by side (written by quantize_row_avx512: one contiguous kilobyte per tile, where rows a token apart fell in
   one cache set), times two weight tiles of 16 rows of 4 inputs: the block's weights in rows 0-7 and zeros in 8-15
   give sum(w * hi) (TDPBSSD: signed bytes), zeros then the weights give sum(w * lo) (TDPBUSD: the token's bytes
   unsigned); W6 takes a pair of such tiles per 16-input half, whose scale is its own. Tiles: 0-2 and 3-5 two sets
   of (hi sums, lo sums, tokens), so that one group of 16 tokens is multiplied while the previous group's sums are
   scaled; 6-7 the weights. */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette, start;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* Linux hands out the tile registers' state only to a process that asks (once; every thread then may use them) */
static int amx_permitted(void) {
    static int state = 0; /* 0 unknown, 1 granted, -1 refused */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        s = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s == 1;
}

/* the calling thread's tiles: eight of 16 rows x 64 bytes (the configuration is per thread) */
static void amx_configure(void) {
    static __thread int configured = 0;
    if (configured) return;
    amx_permitted();  /* granted already when the variant was checked; asked here for callers that did not check */
    amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) c.rows[i] = AMX_ROWS, c.colsb[i] = 64;
    /* not _tile_loadconfig: GCC 12's macro tells the compiler it reads 8 bytes, which then drops the other stores */
    __asm__ volatile("ldtilecfg %0" : : "m"(c));
    configured = 1;
}

/* A block's weights as signed bytes in tile rows (row s, byte 4r + i: output row r, input 4s + i) with zero rows
   around, so that a tile read at an offset has them in the rows wanted: w[512 + 64 s + 4 r + i], zeros in w[0, 512)
   and w[1024, 1536). W6: half h's 4 rows at w + AMX_HALF * h + 1024, zeros 1024 bytes before and after. */
#define AMX_HALF 2304
#define AMX_W (2 * AMX_HALF)
__attribute__((target("avx512f,avx512bw"), always_inline))
static inline void amx_weights(const sc_linear *L, size_t blk, const int kind, int8_t *w) {
    const __m512i z = _mm512_set1_epi8((char)L->zero), nib = _mm512_set1_epi8(15);
    int8_t *out = w + 512;
    if (kind == SC_W8) {
        const uint8_t *p = L->q + blk * 512;
        for (int s = 0; s < 8; s++)
            _mm512_store_si512(out + 64 * s, _mm512_sub_epi8(_mm512_loadu_si512(p + 64 * s), z));
        return;
    }
    const uint8_t *p = L->q + blk * block_bytes(kind);
    for (int k = 0; k < 4; k++) {
        __m512i v = _mm512_loadu_si512(p + 64 * k);
        __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
        if (kind == SC_W5) {
            const __m512i one = _mm512_set1_epi8(1);
            __m512i hb = _mm512_loadu_si512(p + 256);
            lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hb, 2 * k), one), 4));
            hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hb, 2 * k + 1), one), 4));
        } else if (kind == SC_W6) {
            const __m512i three = _mm512_set1_epi8(3);
            __m512i hb = _mm512_loadu_si512(p + 256 + 64 * (k >> 1));
            int sh = 4 * (k & 1);
            lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hb, sh), three), 4));
            hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hb, sh + 2), three), 4));
        }
        int8_t *o = kind == SC_W6 ? w + AMX_HALF * (k >> 1) + 1024 + 128 * (k & 1) : out + 128 * k;
        _mm512_store_si512(o, _mm512_sub_epi8(lo, z));      /* inputs 8k..8k+3 */
        _mm512_store_si512(o + 64, _mm512_sub_epi8(hi, z)); /* inputs 8k+4..8k+7 */
    }
}

/* One group of 16 tokens' sums of a block (half h for W6) into tile set `set` and out to hi[16][16] / lo[16][16]:
   the tokens' rows at a (stride ld), the weights' tiles already loaded (6: hi part, 7: lo part). The tile numbers
   must be constants, hence the two copies. */
#define AMX_GROUP(C0, C1, A)                                                                                        \
    do {                                                                                                          \
        _tile_loadd(A, a, ld);                                                                                    \
        _tile_zero(C0);                                                                                           \
        _tile_zero(C1);                                                                                           \
        _tile_dpbssd(C0, A, 6);                                                                                   \
        _tile_dpbusd(C1, A, 7);                                                                                   \
        _tile_stored(C0, hi, 64);                                                                                 \
        _tile_stored(C1, lo, 64);                                                                                 \
    } while (0)

__attribute__((target("amx-tile,amx-int8")))
static inline void amx_group(int set, const int8_t *a, size_t ld, int32_t *hi, int32_t *lo) {
    if (set)
        AMX_GROUP(3, 4, 5);
    else
        AMX_GROUP(0, 1, 2);
}

/* tokens [0, m) (m <= AMX_CHUNK) of xq x one tile; out[j] is token j's 16 values. Units, in order: per block (W6:
   per half), per group of 16 tokens. A unit's products are issued AMX_AHEAD units before its sums are scaled, so
   that the tile stores have landed when they are read; rows past m are padding, computed and dropped. */
#define AMX_AHEAD 2
/* the zero bytes of a weight buffer that its tiles read (amx_weights writes the rest): [0, 512) and [1024, 1536);
   W6: [512, 1024) and [1280, 2048) (half 0), [AMX_HALF + 256, AMX_HALF + 1024) and [AMX_HALF + 1280,
   AMX_HALF + 1792) (half 1) */
__attribute__((target("avx512f"), always_inline))
static inline void amx_zeros(int8_t *w, const int kind) {
    static const int16_t spans[2][4][2] = {{{0, 512}, {1024, 1536}, {0, 0}, {0, 0}},
                                           {{512, 1024}, {1280, 2048}, {AMX_HALF + 256, AMX_HALF + 1024},
                                            {AMX_HALF + 1280, AMX_HALF + 1792}}};
    const int16_t (*sp)[2] = spans[kind == SC_W6];
    __m512i z;
    __asm__("vpxord %0, %0, %0" : "=v"(z));  /* a zero GCC cannot see: it makes memset calls of constant stores */
    for (int r = 0; r < 4; r++)
        for (int i = sp[r][0]; i < sp[r][1]; i += 64) _mm512_store_si512(w + i, z);
}

__attribute__((target("avx512f,avx512bw,avx512vnni,fma,amx-tile,amx-int8"), always_inline))
static inline void tiles_amx_kind(const sc_linear *L, int t, const int8_t *amx, const float *xs0, int m,
                                  float *const *out, const int kind) {
    const int nb = L->n_in / QK, halves = kind == SC_W6 ? 2 : 1, groups = (m + AMX_ROWS - 1) / AMX_ROWS;
    const int units = nb * halves * groups;
    __m512 acc[AMX_CHUNK];  /* set by the first block's scaling (zeroing them first was a memset call per call) */
    /* two blocks' weights: the next block is unpacked once this one's tiles are loaded, so that a tile load never
       waits for the vector stores just before it. Only the zeros that the tiles read around them are written (a
       memset of all 9 KB per call cost 2 % of a 1B prompt) */
    int8_t w[2][AMX_W] __attribute__((aligned(64)));
    for (int k = 0; k < 2; k++) amx_zeros(w[k], kind);
    amx_weights(L, (size_t)t * nb, kind, w[0]);
    int32_t sums[AMX_AHEAD + 1][2][AMX_ROWS][TILE] __attribute__((aligned(64)));  /* [unit % 3][hi, lo] */
    __m512 dv[AMX_AHEAD + 1][2], mv[AMX_AHEAD + 1];  /* [block % 3] */
    /* the unit to issue and the unit to scale, as counters (a division per unit was on the tile load's path):
       group, block, half, unit, unit % 3, block % 3 */
    int ig = 0, ib = 0, ih = 0, iu = 0, iu3 = 0, ib3 = 0, sg = 0, sb = 0, sh = 0, su3 = 0, sb3 = 0;
    for (int u = -AMX_AHEAD; u < units; u++) {
        if (u + AMX_AHEAD < units) {  /* unit u + AMX_AHEAD's products */
            const int g = ig, b = ib, h = ih;
            if (g == 0) {
                if (h == 0) {
                    mv[ib3] = _mm512_setzero_ps();
                    scales_avx512(L, t, b, dv[ib3], &mv[ib3]);
                }
                /* the weights in tile rows 0-7 (hi) / 8-15 (lo); W6: half h's in rows 4h.. (hi) / 8 + 4h.. (lo) */
                const int8_t *wb = w[b & 1], *wh = halves == 2 ? wb + AMX_HALF * h + 1024 - 256 * h : wb + 512;
                _tile_loadd(6, wh, 64);
                _tile_loadd(7, wh - 512, 64);
                if (h == halves - 1 && b + 1 < nb) {
                    prefetch_ahead(L->q + ((size_t)t * nb + b + 1) * block_bytes(kind), block_bytes(kind));
                    amx_weights(L, (size_t)t * nb + b + 1, kind, w[(b + 1) & 1]);
                }
            }
            amx_group(iu & 1, amx + ((size_t)g * nb + b) * 1024, 64, sums[iu3][0][0], sums[iu3][1][0]);
            iu++, iu3 = iu3 == 2 ? 0 : iu3 + 1;
            if (++ig == groups) {
                ig = 0;
                if (++ih == halves) ih = 0, ib++, ib3 = ib3 == 2 ? 0 : ib3 + 1;
            }
        }
        if (u < 0) continue;
        const int g = sg, b = sb, h = sh;
        const int with_m = L->m && h == halves - 1, first = b == 0 && h == 0;
        const __m512 d = dv[sb3][h], mb = mv[sb3];
        const float *xd = xs0 + ((size_t)g * nb + b) * 32, *xms = xd + 16;
        __m512 *ac = acc + g * AMX_ROWS;
        int32_t (*su)[AMX_ROWS][TILE] = sums[su3];
        su3 = su3 == 2 ? 0 : su3 + 1;
        if (++sg == groups) {
            sg = 0;
            if (++sh == halves) sh = 0, sb++, sb3 = sb3 == 2 ? 0 : sb3 + 1;
        }
#pragma GCC unroll 16
        for (int j = 0; j < AMX_ROWS; j++) {
            __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(su[0][j]), 8),
                                           _mm512_load_si512(su[1][j]));
            __m512 a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, _mm512_set1_ps(xd[j])),
                                       first ? _mm512_setzero_ps() : ac[j]);
            ac[j] = with_m ? _mm512_fmadd_ps(mb, _mm512_set1_ps(xms[j]), a) : a;
        }
    }
    for (int j = 0; j < m; j++) _mm512_storeu_ps(out[j], acc[j]);
}

__attribute__((target("avx512f,avx512bw,avx512vnni,fma,amx-tile,amx-int8")))
static void tiles_amx(const sc_linear *L, int t, const int8_t *amx, const float *xs, int m, float *const *out) {
    BY_KIND(L->kind, tiles_amx_kind, L, t, amx, xs, m, out);
}

#endif

typedef void (*tile_fn)(const sc_linear *, int, const int16_t *, const float *, const int32_t *, float *);

static tile_fn tile_kernel(int isa) {
#if defined(__x86_64__)
    if (isa == SC_AVX512VNNI) return tile_avx512vnni;
    if (isa == SC_AVX2) return tile_avx2;
#endif
    (void)isa;
    return tile_generic;
}

int sc_isa_supported(int isa) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (isa == SC_AVX512VNNI || isa == SC_AMX) {
        int ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma");
        if (isa == SC_AMX) {  /* CPUID leaf 7: AMX-TILE (EDX bit 24) and AMX-INT8 (bit 25) */
            unsigned a, b, c, d;
            __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
            /* and AVX512DQ: the AVX-512 quantizer writes the byte planes that the tiles read */
            ok = ok && ((d >> 24) & 3) == 3 && sc_cpu_has_avx512() && amx_permitted();
        }
        return ok;
    }
    if (isa == SC_AVX2 || isa == SC_AVX2_Q8)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
    return isa == SC_GENERIC || isa == SC_GENERIC_Q8;
}

/* Float weights (F32, F16, BF16 converted exactly), up to 4 tokens at once: each token keeps its own accumulators
   and its own order over the inputs (the same as alone); interleaving only hides the FMA latency of one token's
   chain. */
#define F32_GROUP 4

static void f32_generic(const sc_linear *L, int t, const float *const *xs, int m, float *const *outs) {
    size_t base = (size_t)t * L->n_in * TILE;
    const float *wf = (const float *)L->q + base;
    const uint16_t *wh = (const uint16_t *)L->q + base;
    float acc[F32_GROUP][TILE] = {{0}};
    for (int k = 0; k < L->n_in; k++) {
        float w[TILE];
        for (int r = 0; r < TILE; r++)
            w[r] = L->kind == SC_F32 ? wf[k * TILE + r] : L->kind == SC_F16 ? f16_to_f32(wh[k * TILE + r])
                                                                           : bf16_to_f32(wh[k * TILE + r]);
        for (int j = 0; j < m; j++)
            for (int r = 0; r < TILE; r++) acc[j][r] = fmaf(w[r], xs[j][k], acc[j][r]);
    }
    for (int j = 0; j < m; j++) memcpy(outs[j], acc[j], sizeof acc[j]);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c")))
static void f32_avx2(const sc_linear *L, int t, const float *const *xs, int m, float *const *outs) {
    size_t base = (size_t)t * L->n_in * TILE;
    const float *wf = (const float *)L->q + base;
    const uint16_t *wh = (const uint16_t *)L->q + base;
    int kind = L->kind;
    __m256 a[F32_GROUP][2];
    for (int j = 0; j < F32_GROUP; j++) a[j][0] = a[j][1] = _mm256_setzero_ps();
    for (int k = 0; k < L->n_in; k++) {
        __m256 w0, w1;
        if (kind == SC_F32) {
            w0 = _mm256_loadu_ps(wf + k * TILE), w1 = _mm256_loadu_ps(wf + k * TILE + 8);
        } else if (kind == SC_F16) {
            w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wh + k * TILE)));
            w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wh + k * TILE + 8)));
        } else {
            w0 = _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(wh + k * TILE))), 16));
            w1 = _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(wh + k * TILE + 8))), 16));
        }
        for (int j = 0; j < m; j++) {
            __m256 xb = _mm256_set1_ps(xs[j][k]);
            a[j][0] = _mm256_fmadd_ps(w0, xb, a[j][0]);
            a[j][1] = _mm256_fmadd_ps(w1, xb, a[j][1]);
        }
    }
    for (int j = 0; j < m; j++) {
        _mm256_storeu_ps(outs[j], a[j][0]);
        _mm256_storeu_ps(outs[j] + 8, a[j][1]);
    }
}

__attribute__((target("avx512f,fma")))
static void f32_avx512(const sc_linear *L, int t, const float *const *xs, int m, float *const *outs) {
    size_t base = (size_t)t * L->n_in * TILE;
    const float *wf = (const float *)L->q + base;
    const uint16_t *wh = (const uint16_t *)L->q + base;
    int kind = L->kind;
    __m512 a[F32_GROUP];
    for (int j = 0; j < F32_GROUP; j++) a[j] = _mm512_setzero_ps();
    for (int k = 0; k < L->n_in; k++) {
        __m512 wv;
        if (kind == SC_F32)
            wv = _mm512_loadu_ps(wf + k * TILE);
        else if (kind == SC_F16)
            wv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wh + k * TILE)));
        else
            wv = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(wh + k * TILE))), 16));
        for (int j = 0; j < m; j++) a[j] = _mm512_fmadd_ps(wv, _mm512_set1_ps(xs[j][k]), a[j]);
    }
    for (int j = 0; j < m; j++) _mm512_storeu_ps(outs[j], a[j]);
}
#endif

typedef void (*f32_fn)(const sc_linear *, int, const float *const *, int, float *const *);

static f32_fn f32_kernel(int isa) {
#if defined(__x86_64__)
    if (isa == SC_AVX512VNNI) return f32_avx512;
    if (isa == SC_AVX2) return f32_avx2;
#endif
    (void)isa;
    return f32_generic;
}

/* one tile of one segment of a chain for n tokens: y[n, ld] (the segment's own columns) = x[n, n_in] @ W.T, x as float
   or quantized rows */
static void tile_rows(const sc_linear *L, int t, int n, const float *xf, const q16_rows *xq, float *y, int ld, int isa) {
    int nbq = L->n_in / QK;
    if (is_float_kind(L->kind)) {
        f32_fn g = f32_kernel(base_isa(isa));
        for (int i = 0; i < n; i += F32_GROUP) {
            int m = n - i < F32_GROUP ? n - i : F32_GROUP;
            const float *xs[F32_GROUP];
            float *outs[F32_GROUP];
            for (int j = 0; j < m; j++) {
                xs[j] = xf + (size_t)(i + j) * L->n_in;
                outs[j] = y + (size_t)(i + j) * ld + t * TILE;
            }
            g(L, t, xs, m, outs);
        }
        return;
    }
    if (is_q8(isa)) {  /* 8-bit activations: q holds n_in bytes per token, s two sums per block */
        const int8_t *q8 = (const int8_t *)xq->q;
#if defined(__x86_64__)
        if (isa == SC_AVX2_Q8) {
            for (int i = 0; i < n; i += MULTI8) {
                int m = n - i < MULTI8 ? n - i : MULTI8;
                const int8_t *q[MULTI8];
                const float *dd[MULTI8];
                const int32_t *ss[MULTI8];
                float *o[MULTI8];
                for (int j = 0; j < m; j++) {
                    q[j] = q8 + (size_t)(i + j) * L->n_in;
                    dd[j] = xq->d + (size_t)(i + j) * nbq;
                    ss[j] = xq->s + (size_t)(i + j) * 2 * nbq;
                    o[j] = y + (size_t)(i + j) * ld + t * TILE;
                }
                tiles8_avx2(L, t, q, dd, ss, m, o);
            }
            return;
        }
#endif
        for (int i = 0; i < n; i++)
            tile8_generic(L, t, q8 + (size_t)i * L->n_in, xq->d + (size_t)i * nbq, xq->s + (size_t)i * 2 * nbq,
                          y + (size_t)i * ld + t * TILE);
        return;
    }
#if defined(__x86_64__)
    q16_rows rest;
    if (isa == SC_AMX && n >= AMX_MIN && xq->amx) {
        /* whole groups of 16 tokens, and a last group of AMX_MIN or more; a shorter last group (17 = 16 + 1 tokens:
           a verify batch) takes the AVX-512 code below, as a call of fewer than AMX_MIN tokens does */
        int amx_n = n % AMX_ROWS >= AMX_MIN ? n : n / AMX_ROWS * AMX_ROWS;
        /* the planes' pointers read one by one: the caller has just stored them one by one, and the wider loads of a
           struct copy cannot be served from the store buffer, so they waited for every older store, the previous
           item's outputs included (with the memset that took the wait next, 2-3 % of a 1B prompt) */
        const int8_t *amx = xq->amx;
        const float *xs = xq->xs;
        for (int i = 0; i < amx_n; i += AMX_CHUNK) {
            int m = amx_n - i < AMX_CHUNK ? amx_n - i : AMX_CHUNK;
            float *o[AMX_CHUNK];
            for (int j = 0; j < m; j++) o[j] = y + (size_t)(i + j) * ld + t * TILE;
            tiles_amx(L, t, amx + (size_t)i * 2 * L->n_in, xs + (size_t)i * 2 * nbq, m, o);
        }
        if (amx_n == n) return;
        rest = *xq;
        rest.q += (size_t)amx_n * L->n_in, rest.d += (size_t)amx_n * nbq, rest.s += (size_t)amx_n * nbq;
        xq = &rest, y += (size_t)amx_n * ld, n -= amx_n;
    }
    isa = base_isa(isa);
    if (n == 1 && xq->xb && L->kind != SC_W8 && (isa == SC_AVX512VNNI || isa == SC_AVX2)) {  /* decode */
        if (isa == SC_AVX512VNNI)
            tile1_avx512vnni(L, t, xq, y + t * TILE);
        else
            tile1_avx2(L, t, xq, y + t * TILE);
        return;
    }
    if ((isa == SC_AVX512VNNI || isa == SC_AVX2) && n > 1) {  /* several tokens per widened weight block */
        int group = isa == SC_AVX2 ? MULTI_AVX2 : MULTI;
        for (int i = 0; i < n; i += group) {
            int m = n - i < group ? n - i : group;
            const int16_t *q[MULTI_AVX2];
            const float *dd[MULTI_AVX2];
            const int32_t *ss[MULTI_AVX2];
            float *o[MULTI_AVX2];
            for (int j = 0; j < m; j++) {
                q[j] = xq->q + (size_t)(i + j) * L->n_in;
                dd[j] = xq->d + (size_t)(i + j) * nbq;
                ss[j] = xq->s + (size_t)(i + j) * nbq;
                o[j] = y + (size_t)(i + j) * ld + t * TILE;
            }
            if (isa == SC_AVX2)
                tiles_avx2(L, t, q, dd, ss, m, o);
            else
                tiles_avx512vnni(L, t, q, dd, ss, m, o);
        }
        return;
    }
#endif
    tile_fn f = tile_kernel(isa);
    for (int i = 0; i < n; i++)
        f(L, t, xq->q + (size_t)i * L->n_in, xq->d + (size_t)i * nbq, xq->s + (size_t)i * nbq,
          y + (size_t)i * ld + t * TILE);
}

static int chain_quantized(const sc_linear *L) {
    for (; L; L = L->next)
        if (!is_float_kind(L->kind)) return 1;
    return 0;
}

/* y[n, rows of the chain] = x[n, n_in] @ W.T: one parallel loop over the tiles of every segment (of up to 16 at a
   time) and, for many tokens, over chunks of TOKEN_CHUNK tokens: an item is one tile for one chunk, items of a chunk
   are consecutive, so a thread's chunk of activations stays in its cache while the weights stream past (each weight
   tile is read once per chunk, where a tile for every token read all the tokens' activations once per tile). A
   token's values are computed as when alone, whatever its chunk. */
#define MAX_CHAIN 16
#define TOKEN_CHUNK 64
typedef struct {
    const sc_linear *const *seg;
    const int *first, *col;
    int n, ld, isa, tiles;
    const float *xf;
    const q16_rows *xq;
    float *y;
} matmul_job;

static void matmul_tiles(void *p, int begin, int end, int worker) {
    const matmul_job *J = p;
    (void)worker;
#if defined(__x86_64__)
    if (J->isa == SC_AMX) amx_configure();  /* once a range, not once a tile: its check reads thread-local storage */
#endif
    for (int item = begin; item < end; item++) {
        int c = item / J->tiles, g = item % J->tiles, s = 0;
        while (g >= J->first[s + 1]) s++;
        int i0 = c * TOKEN_CHUNK, m = J->n - i0 < TOKEN_CHUNK ? J->n - i0 : TOKEN_CHUNK;
        const sc_linear *L = J->seg[s];
        size_t n_in = (size_t)L->n_in, nb = n_in / QK;
        q16_rows xq = *J->xq;  /* the chunk's rows (8-bit activations: two sums per block) */
        if (xq.q) {
            xq.q = is_q8(J->isa) ? (int16_t *)((int8_t *)xq.q + i0 * n_in) : xq.q + i0 * n_in;
            xq.d += i0 * nb;
            xq.s += i0 * nb * (is_q8(J->isa) ? 2 : 1);
        }
        if (xq.amx) xq.amx += 2 * i0 * n_in, xq.xs += 2 * i0 * nb;  /* i0: whole groups of 16 */
        tile_rows(L, g - J->first[s], m, J->xf ? J->xf + i0 * n_in : NULL, &xq,
                  J->y + (size_t)i0 * J->ld + J->col[s], J->ld, J->isa);
    }
}

static void matmul(const sc_linear *L, int n, const float *xf, const q16_rows *xq, float *y, int isa, int nt) {
    int ld = 0, off = 0, chunks = (n + TOKEN_CHUNK - 1) / TOKEN_CHUNK;
    for (const sc_linear *s = L; s; s = s->next) ld += s->n_out;
    while (L) {
        const sc_linear *seg[MAX_CHAIN];
        int first[MAX_CHAIN + 1], col[MAX_CHAIN], ns = 0;
        first[0] = 0;
        for (; L && ns < MAX_CHAIN; L = L->next, ns++) {
            seg[ns] = L, col[ns] = off, first[ns + 1] = first[ns] + L->n_out / TILE;
            off += L->n_out;
        }
        matmul_job job = {seg, first, col, n, ld, isa, first[ns], xf, xq, y};
        parallel_for(chunks * first[ns], n > 1 ? SPLIT_BATCH : SPLIT_ONE, nt, matmul_tiles, &job);
    }
}

/* token i's row of x quantized into out: int16 (sums per block), or 8 bits (two sums per block) */
static void quantize_one(const float *x, int i, int n_in, q16_rows *out, int q8) {
    const float *xi = x + (size_t)i * n_in;
    float *d = out->d + (size_t)i * (n_in / QK);
    if (q8)
        quantize_row_any(xi, n_in, (int8_t *)out->q + (size_t)i * n_in, d, out->s + (size_t)i * 2 * (n_in / QK), 1);
    else
        quantize_row_any(xi, n_in, out->q + (size_t)i * n_in, d, out->s + (size_t)i * (n_in / QK), 0);
}

typedef struct { const float *x; int n_in; q16_rows *out; int q8, planes; } quantize_job;

static void quantize_range(void *p, int begin, int end, int worker) {
    const quantize_job *J = p;
    (void)worker;
#if defined(__x86_64__)
    if (!J->q8 && sc_cpu_has_avx512()) {  /* with the AMX planes (AMX implies AVX-512) from the same registers */
        const q16_rows *o = J->out;
        size_t n_in = (size_t)J->n_in, nb = n_in / QK;
        for (size_t i = (size_t)begin; i < (size_t)end; i++)
            quantize_row_avx512(J->x + i * n_in, J->n_in, o->q + i * n_in, o->d + i * nb, o->s + i * nb,
                                J->planes ? o->amx + (i / AMX_ROWS) * nb * 1024 + (i % AMX_ROWS) * 64 : NULL,
                                J->planes ? o->xs + (i / AMX_ROWS) * nb * 32 + i % AMX_ROWS : NULL);
    } else
#endif
        for (int i = begin; i < end; i++) quantize_one(J->x, i, J->n_in, J->out, J->q8);
#if defined(__x86_64__)
    if (J->out->xb) split_bytes_avx2(J->out->q, J->n_in, J->out->xb, J->out->hs);  /* one token: row 0 */
#endif
}

/* planes: the AMX byte planes too (the scratch must have them) */
static void quantize_rows(const float *x, int n, int n_in, q16_rows *out, int nt, int q8, int planes) {
    out->n_in = n_in;
    quantize_job job = {x, n_in, out, q8, planes};
    parallel_for(n, SPLIT_BATCH, nt, quantize_range, &job);  /* one row: on the calling thread */
}

/* y = L(x), quantizing x first when some of the weights are integers */
static void linear(const sc_linear *L, int n, const float *x, q16_rows *scratch, float *y, int isa, int nt) {
    q16_rows q = *scratch;
    if (isa != SC_AMX || n < AMX_MIN) q.amx = NULL, q.xs = NULL;  /* tile_rows takes the AMX path where they are set */
    if (n != 1 || is_q8(isa)) q.xb = NULL, q.hs = NULL;  /* and the one-token byte path where these are */
    if (chain_quantized(L)) quantize_rows(x, n, L->n_in, &q, nt, is_q8(isa), q.amx != NULL);
    matmul(L, n, x, &q, y, isa, nt);
}

/* the scratch for n rows of up to n_in inputs (AMX's planes for the AMX variant) and one row of up to one_in (the
   one-token byte path: a forward's last feed-forward pass may be one token of n_ff inputs where n_in, shared by n
   rows, is smaller): 0, or -1 (memory) */
static int q16_alloc(q16_rows *q, int n, size_t n_in, size_t one_in, int isa) {
    memset(q, 0, sizeof *q);
    q->q = malloc(sizeof(int16_t) * (size_t)n * n_in);
    q->d = malloc(sizeof(float) * (size_t)n * (n_in / QK));
    q->s = malloc(sizeof(int32_t) * (size_t)n * (n_in / 16));  /* 8-bit activations: two sums per block */
    int ok = q->q && q->d && q->s;
    if (ok && isa == SC_AMX && n >= AMX_MIN) {  /* rows padded: a tile reads AMX_ROWS of them */
        size_t rows = ((size_t)n + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS;
        q->amx = calloc(rows * n_in, 2);
        q->xs = calloc(2 * rows * (n_in / QK), sizeof(float));
        ok = q->amx && q->xs;
    }
#if defined(__x86_64__)
    if (ok && (isa == SC_AVX2 || isa == SC_AVX512VNNI || isa == SC_AMX)) {  /* one token's bytes (a row's worth) */
        q->xb = malloc(2 * one_in);
        q->hs = malloc(sizeof(int32_t) * (one_in / 16));
        ok = q->xb && q->hs;
    }
#endif
    return ok ? 0 : -1;
}

static void q16_free(q16_rows *q) {
    free(q->q); free(q->d); free(q->s); free(q->amx); free(q->xs); free(q->xb); free(q->hs);
}

/* exposed for tests and kernel timing: one linear on float rows */
int sc_linear_forward(const sc_linear *L, int n, const float *x, float *y, int isa, int nt) {
    q16_rows q = {0};
    if (chain_quantized(L) && q16_alloc(&q, n, (size_t)L->n_in, (size_t)L->n_in, isa) != 0) {
        q16_free(&q);
        return -1;
    }
    linear(L, n, x, &q, y, isa, nt);
    q16_free(&q);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------------
   the forward step */

static void rope(float *x, int n_heads, int hd, const float *cs, const float *sn) {
    for (int h = 0; h < n_heads; h++) {
        float *v = x + h * hd;
        for (int i = 0; i < hd / 2; i++) {
            float a = v[2 * i], b = v[2 * i + 1];
            v[2 * i] = a * cs[i] - b * sn[i];
            v[2 * i + 1] = a * sn[i] + b * cs[i];
        }
    }
}

static float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

/* Attention of n query tokens over the first n_kv cells; mask[i * n_kv + j] says whether token i sees cell j.
   Returns 0, or -1 (memory). */
typedef struct {
    const sc_model *M;
    const float *qkv;
    const void *kc, *vc;  /* float, or f16 bits (M->kv_f16) */
    const uint8_t *mask;
    float *out, *scratch;  /* scratch: n_kv scores per query head of an item, per worker */
    int stride, n_kv, per;  /* per: query heads per item, all of one KV head (its group, or 1) */
} attention_job;

/* The engine's exp, for attention's softmax: glibc's expf algorithm (sysdeps/ieee754/flt-32/e_expf.c, glibc 2.28 on:
   x * 32 / ln 2 = k + r, e^x = 2^(k/32) * 2^(r/32), a 32-entry table of 2^(i/32) and a degree-3 polynomial, in
   binary64), written with every operation separate (no fused multiply-add, which libm's FMA build uses): the same
   bits on every machine whatever its libm, and 16 at a time with AVX-512 (sc_expf16, the same bits as sc_expf). Its
   error is glibc's, within 0.502 ULP of e^x; tests/runtime/test_engine_exp.py compares it with binary64's exp. */
static const uint64_t EXP_TAB[32] = {  /* bits of 2^(i/32) (rounded to nearest) minus i << 47 */
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};
#define EXP_INVLN2N (0x1.71547652b82fep+0 * 32)
#define EXP_SHIFT 0x1.8p+52
#define EXP_C0 (0x1.c6af84b912394p-5 / 32 / 32 / 32)
#define EXP_C1 (0x1.ebfce50fac4f3p-3 / 32 / 32)
#define EXP_C2 (0x1.62e42ff0c52d6p-1 / 32)
#define EXP_HI 0x1.62e42ep6f   /* above: +inf (ln 2^128) */
#define EXP_LO -0x1.9fe368p6f  /* below: 0 (ln 2^-150) */

static float sc_expf(float x) {
    if (x != x) return x + x;
    if (x > EXP_HI) return INFINITY;
    if (x < EXP_LO) return 0.0f;
    double z = EXP_INVLN2N * (double)x, kd = z + EXP_SHIFT;
    uint64_t ki, t;
    memcpy(&ki, &kd, sizeof ki);
    kd -= EXP_SHIFT;
    double r = z - kd, s;
    t = EXP_TAB[ki % 32] + (ki << 47);
    memcpy(&s, &t, sizeof s);
    double p = EXP_C0 * r + EXP_C1, r2 = r * r, y = EXP_C2 * r + 1.0;
    y = p * r2 + y;
    return (float)(y * s);
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define SC_EXPF16 1
static inline __m512d expd8(__m256 x) {
    const __m512i t0 = _mm512_loadu_si512(EXP_TAB), t1 = _mm512_loadu_si512(EXP_TAB + 8),
                  t2 = _mm512_loadu_si512(EXP_TAB + 16), t3 = _mm512_loadu_si512(EXP_TAB + 24);
    __m512d z = _mm512_mul_pd(_mm512_set1_pd(EXP_INVLN2N), _mm512_cvtps_pd(x));
    __m512d kd = _mm512_add_pd(z, _mm512_set1_pd(EXP_SHIFT));
    __m512i ki = _mm512_castpd_si512(kd);
    kd = _mm512_sub_pd(kd, _mm512_set1_pd(EXP_SHIFT));
    __m512d r = _mm512_sub_pd(z, kd);
    __m512i i = _mm512_and_si512(ki, _mm512_set1_epi64(31));
    __m512i lo = _mm512_permutex2var_epi64(t0, i, t1), hi = _mm512_permutex2var_epi64(t2, i, t3);
    __m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(i, _mm512_set1_epi64(16)), lo, hi);
    __m512d s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64(ki, 47)));
    __m512d p = _mm512_add_pd(_mm512_mul_pd(_mm512_set1_pd(EXP_C0), r), _mm512_set1_pd(EXP_C1));
    __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_add_pd(_mm512_mul_pd(_mm512_set1_pd(EXP_C2), r), _mm512_set1_pd(1.0));
    y = _mm512_add_pd(_mm512_mul_pd(p, r2), y);
    return _mm512_mul_pd(y, s);
}

/* sc_expf of 16 values */
static inline __m512 sc_expf16(__m512 x) {
    __m512d a = expd8(_mm512_castps512_ps256(x)), b = expd8(_mm512_extractf32x8_ps(x, 1));
    __m512 y = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(a)), _mm512_cvtpd_ps(b), 1);
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_HI), _CMP_GT_OQ), y, _mm512_set1_ps(INFINITY));
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_LO), _CMP_LT_OQ), y, _mm512_setzero_ps());
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, _mm512_add_ps(x, x));
}
#endif

/* e[j] = sc_expf(e[j] - m) for the cells j < n with mk[j] set (the others are left as they are) */
static void exp_shifted(float *e, const uint8_t *mk, int n, float m) {
    int j = 0;
#if defined(SC_EXPF16)
    const __m512 mv = _mm512_set1_ps(m);
    for (; j < n; j += 16) {
        __mmask16 in = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);
        __mmask16 live = _mm_mask_cmpneq_epi8_mask(in, _mm_maskz_loadu_epi8(in, mk + j), _mm_setzero_si128());
        __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(live, e + j), mv);
        _mm512_mask_storeu_ps(e + j, live, sc_expf16(x));
    }
#endif
    for (; j < n; j++)
        if (mk[j]) e[j] = sc_expf(e[j] - m);
}

/* a[j] = g[j] / (1 + sc_expf(-g[j])) * u[j]: SiLU(g) * u, the feed-forward's gate */
static void silu_gate(const float *g, const float *u, float *a, int n) {
    int j = 0;
#if defined(SC_EXPF16)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; j + 16 <= n; j += 16) {
        __m512 x = _mm512_loadu_ps(g + j);
        __m512 e = sc_expf16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))));
        _mm512_storeu_ps(a + j, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + j)));
    }
#endif
    for (; j < n; j++) a[j] = g[j] / (1.0f + sc_expf(-g[j])) * u[j];
}

/* exposed for tests: sc_expf of n values, 16 at a time where compiled in (vector != 0) or one at a time */
void sc_expf_rows(const float *x, float *y, int n, int vector) {
    int j = 0;
#if defined(SC_EXPF16)
    if (vector)
        for (; j + 16 <= n; j += 16) _mm512_storeu_ps(y + j, sc_expf16(_mm512_loadu_ps(x + j)));
#else
    (void)vector;
#endif
    for (; j < n; j++) y[j] = sc_expf(x[j]);
}

/* 8 vectors of 8 as their transpose: t[l] lane c = s[c] lane l (exact: values only move) */
static inline void transpose8(const v8f s[8], v8f t[8]) {
#if defined(__AVX__)
    __m256 r[8], u[8];
    for (int c = 0; c < 8; c++) memcpy(&r[c], &s[c], sizeof r[c]);
    for (int c = 0; c < 8; c += 2) {
        u[c] = _mm256_unpacklo_ps(r[c], r[c + 1]);
        u[c + 1] = _mm256_unpackhi_ps(r[c], r[c + 1]);
    }
    for (int c = 0; c < 8; c += 4) {
        r[c] = _mm256_shuffle_ps(u[c], u[c + 2], 0x44);
        r[c + 1] = _mm256_shuffle_ps(u[c], u[c + 2], 0xee);
        r[c + 2] = _mm256_shuffle_ps(u[c + 1], u[c + 3], 0x44);
        r[c + 3] = _mm256_shuffle_ps(u[c + 1], u[c + 3], 0xee);
    }
    for (int c = 0; c < 4; c++) {
        __m256 lo = _mm256_permute2f128_ps(r[c], r[c + 4], 0x20), hi = _mm256_permute2f128_ps(r[c], r[c + 4], 0x31);
        memcpy(&t[c], &lo, sizeof lo);
        memcpy(&t[c + 4], &hi, sizeof hi);
    }
#else
    float m[8][8];
    memcpy(m, s, sizeof m);
    for (int l = 0; l < 8; l++)
        for (int c = 0; c < 8; c++) t[l][c] = m[c][l];
#endif
}

/* 8 (16) elements of a row of floats or of halves (k16), as floats; F16C converts in registers */
static inline v8f row8(const void *row, int i, const int k16) {
    if (!k16) return load8((const float *)row + i);
#if defined(__F16C__)
    __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    v8f v;
    memcpy(&v, &f, sizeof v);
    return v;
#else
    float f[8];
    halves_to_floats((const uint16_t *)row + i, f, 8);
    return load8(f);
#endif
}

/* The dot_f32 of q with 8 rows k[c] of floats or halves (n % 16 == 0), each the same sums in the same order as alone;
   lanes_sum16's tree is taken across the 8 at once (after a transpose, 7 vector additions where each dot alone took
   15 scalar ones) */
__attribute__((always_inline))
static inline void dot8(const float *q, const void *const k[8], int n, const int k16, float out[8]) {
    v8f s[8], t[8];
#if defined(__AVX512F__)
    /* a 16-lane vector is the pair of 8-lane accumulators (lanes 0-7: acc[i], 8-15: acc[i + 8]), the same operations */
    __m512 a[8];
    for (int c = 0; c < 8; c++) a[c] = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __m512 qv = _mm512_loadu_ps(q + i);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            __m512 kv = k16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)k[c] + i)))
                            : _mm512_loadu_ps((const float *)k[c] + i);
            a[c] = _mm512_add_ps(a[c], _mm512_mul_ps(qv, kv));
        }
    }
    for (int c = 0; c < 8; c++) {  /* lanes_sum16's a[i] = acc[i] + acc[i + 8] */
        __m256 r = _mm256_add_ps(_mm512_castps512_ps256(a[c]), _mm512_extractf32x8_ps(a[c], 1));
        memcpy(&s[c], &r, sizeof r);
    }
#else
    v8f a0[8], a1[8];
    for (int c = 0; c < 8; c++) a0[c] = (v8f){0}, a1[c] = (v8f){0};
    for (int i = 0; i < n; i += 16) {
        v8f q0 = load8(q + i), q1 = load8(q + i + 8);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            a0[c] += q0 * row8(k[c], i, k16);
            a1[c] += q1 * row8(k[c], i + 8, k16);
        }
    }
    for (int c = 0; c < 8; c++) s[c] = a0[c] + a1[c];  /* lanes_sum16's a[i] = acc[i] + acc[i + 8] */
#endif
    transpose8(s, t);
    v8f r = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));  /* b[i], then c[0] + c[1] */
    memcpy(out, &r, sizeof r);
}

/* One token's attention for `per` query heads of one KV head (items: token x KV head, or token x query head when
   there are too few tokens to keep the threads busy), each head's values computed as one head alone would: scores
   e_j = (q . k_j) * scale over the unmasked cells in order, p_j = sc_expf(e_j - max), the sum of the p_j in cell order,
   o = sum over cells in order of p_j * v_j, then o / sum. A cell's key and value rows are converted from halves once
   for all the item's heads (GQA: 4 heads per KV head in Llama 3.2 1B, 7 in Qwen 2.5 0.5B), not once per head (keys:
   8 cells' rows into a float buffer; values: in registers); the scores are taken 8 cells at a time (dot8), four heads'
   sums of the p_j run as four chains side by side, and the values' sums of V_DIMS dimensions of up to 4 heads stay
   in registers over the cells. */
#define MAX_GROUP 64
#if defined(__AVX512F__)
#define V_DIMS 64
#else
#define V_DIMS 16
#endif
typedef float v16f __attribute__((vector_size(64)));
static inline v16f load16(const float *x) {
    v16f v;
    memcpy(&v, x, sizeof v);
    return v;
}

/* o[h * ld + 16 u + d] = sum over the unmasked cells j in order of e[h * width + j] * v_j[16 u + d], for gs heads and
   nv vectors of 16 dimensions (both constants where inlined); v_j at V + j * row_bytes, floats or halves */
__attribute__((always_inline))
static inline void value_sums(const char *V, size_t row_bytes, int v16, const uint8_t *mk, int n_kv, const float *e,
                              size_t width, const int gs, const int nv, float *o, int ld) {
    v16f acc[4][V_DIMS / 16];
#if !defined(__AVX512F__)
    float vf[V_DIMS] __attribute__((aligned(64)));
#endif
    for (int h = 0; h < gs; h++)
        for (int u = 0; u < nv; u++) acc[h][u] = (v16f){0};
    for (int j = 0; j < n_kv; j++) {
        if (!mk[j]) continue;
        const char *row = V + (size_t)j * row_bytes;
#if !defined(__AVX512F__)
        if (v16) {
            halves_to_floats((const uint16_t *)row, vf, 16 * nv);
            row = (const char *)vf;
        }
#endif
        for (int u = 0; u < nv; u++) {
            v16f vu;
#if defined(__AVX512F__)
            if (v16) {  /* halves converted in registers (through memory, a 64-byte load of two 32-byte stores stalls) */
                __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + 16 * u)));
                memcpy(&vu, &f, sizeof vu);
            } else
#endif
                vu = load16((const float *)row + 16 * u);
            for (int h = 0; h < gs; h++) acc[h][u] += e[h * width + j] * vu;
        }
    }
    for (int h = 0; h < gs; h++)
        for (int u = 0; u < nv; u++) memcpy(o + (size_t)h * ld + 16 * u, &acc[h][u], sizeof acc[h][u]);
}

static void attention_heads(void *p, int begin, int end, int worker) {
    const attention_job *J = p;
    const sc_model *M = J->M;
    int H = M->n_head, hd = M->head_dim, group = H / M->n_head_kv, n_kv = J->n_kv;
    int k16 = M->kv_f16 & 1, v16 = (M->kv_f16 >> 1) & 1;
    size_t ek = k16 ? 2 : 4, ev = v16 ? 2 : 4, width = n_kv > 0 ? (size_t)n_kv : 1;
    int per = J->per, items_per_token = H / per;
    float *e = J->scratch + (size_t)worker * per * width;
    float mx[MAX_GROUP], sum[MAX_GROUP], sc[8], kf[8 * MAX_HEAD_DIM] __attribute__((aligned(64)));
#if defined(__AVX__)
    __m256 mxv[MAX_GROUP];
#endif
    for (int ig = begin; ig < end; ig++) {
        int i = ig / items_per_token, h0 = ig % items_per_token * per, g = h0 / group;
        const float *q = J->qkv + (size_t)i * J->stride + (size_t)h0 * hd;
        const char *K = (const char *)J->kc + (size_t)g * M->kv_size * hd * ek;
        const char *V = (const char *)J->vc + (size_t)g * M->kv_size * hd * ev;
        const uint8_t *mk = J->mask + (size_t)i * n_kv;
        float *o = J->out + (size_t)i * H * hd + (size_t)h0 * hd;
        for (int h = 0; h < per; h++) mx[h] = -INFINITY;
#if defined(__AVX__)
        for (int h = 0; h < per; h++) mxv[h] = _mm256_set1_ps(-INFINITY);
#endif
        /* the loops below run over the cells from the first to the last one the token sees (a prompt's token i:
           the first i + 1 of its sequence), not over all n_kv */
        int jlo = 0, jhi = n_kv, cells[8], nc = 0;
        while (jlo < jhi && !mk[jlo]) jlo++;
        while (jhi > jlo && !mk[jhi - 1]) jhi--;
        if (jlo == jhi) jlo = jhi = 0;  /* none: no pointer past the cache's end */
        for (int j = jlo; j <= jhi; j++) {
            if (j < jhi) {
                if (!mk[j]) continue;
                cells[nc++] = j;
                if (nc < 8) continue;
            }
            if (nc == 0) break;
            const void *kr[8];
            for (int c = 0; c < 8; c++)  /* a short last group repeats its first cell (its scores are dropped) */
                kr[c] = K + (size_t)cells[c < nc ? c : 0] * hd * ek;
            int kh = k16;
            if (k16 && per > 1 && hd <= MAX_HEAD_DIM) {  /* halves converted once for all the heads (exact) */
                for (int c = 0; c < 8; c++) {
                    halves_to_floats((const uint16_t *)kr[c], kf + c * hd, hd);
                    kr[c] = kf + c * hd;
                }
                kh = 0;
            }
            for (int h = 0; h < per; h++) {
                if (kh)
                    dot8(q + h * hd, kr, hd, 1, sc);
                else
                    dot8(q + h * hd, kr, hd, 0, sc);
#if defined(__AVX__)
                if (nc == 8 && M->attn_softcap == 0.0f && cells[7] - cells[0] == 7) {
                    /* 8 consecutive cells (a prompt's): the same products, their maximum lane by lane (MAXPS keeps
                       the running maximum on ties and NaN scores, as `s > mx ? s : mx` does; which of +0 and -0
                       is kept cannot change e - max) */
                    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(sc), _mm256_set1_ps(M->attn_scale));
                    _mm256_storeu_ps(e + h * width + cells[0], v);
                    mxv[h] = _mm256_max_ps(v, mxv[h]);
                    continue;
                }
#endif
                for (int c = 0; c < nc; c++) {
                    float s = sc[c] * M->attn_scale;
                    if (M->attn_softcap != 0.0f) s = tanhf(s / M->attn_softcap) * M->attn_softcap;
                    e[h * width + cells[c]] = s;
                    mx[h] = s > mx[h] ? s : mx[h];
                }
            }
            nc = 0;
        }
        for (int h = 0; h < per; h++) {
#if defined(__AVX__)
            float lanes[8];
            _mm256_storeu_ps(lanes, mxv[h]);
            for (int c = 0; c < 8; c++) mx[h] = lanes[c] > mx[h] ? lanes[c] : mx[h];
#endif
            exp_shifted(e + h * width + jlo, mk + jlo, jhi - jlo, mx[h]);
        }
        int h = 0;
        for (; h + 4 <= per; h += 4) {  /* each head's sum in cell order; four heads' chains side by side */
            const float *e0 = e + (size_t)h * width, *e1 = e0 + width, *e2 = e1 + width, *e3 = e2 + width;
            float t0 = 0.0f, t1 = 0.0f, t2 = 0.0f, t3 = 0.0f;
            for (int j = jlo; j < jhi; j++)
                if (mk[j]) t0 += e0[j], t1 += e1[j], t2 += e2[j], t3 += e3[j];
            sum[h] = t0, sum[h + 1] = t1, sum[h + 2] = t2, sum[h + 3] = t3;
        }
        for (; h < per; h++) {
            const float *eh = e + (size_t)h * width;
            float t = 0.0f;
            for (int j = jlo; j < jhi; j++)
                if (mk[j]) t += eh[j];
            sum[h] = t;
        }
        /* o: V_DIMS dimensions (16 per vector) of up to 4 heads at a time in registers, over the cells in order */
        for (int a = 0; a < per; a += 4) {
            int gs = per - a < 4 ? per - a : 4;
            for (int c = 0; c < hd; c += V_DIMS) {
                int nv = (hd - c < V_DIMS ? hd - c : V_DIMS) / 16;
                const float *ea = e + (size_t)a * width + jlo;
                const char *va = V + ((size_t)jlo * hd + c) * ev;
                float *oa = o + (size_t)a * hd + c;
                switch (gs * 8 + nv) {  /* constant counts, so that the sums are registers */
#define V_CASE(G, N)                                                                                  \
    case (G) * 8 + (N):                                                                              \
        value_sums(va, hd * ev, v16, mk + jlo, jhi - jlo, ea, width, G, N, oa, hd);                 \
        break;
#define V_CASES(N) V_CASE(1, N) V_CASE(2, N) V_CASE(3, N) V_CASE(4, N)
                    V_CASES(1)
#if V_DIMS == 64
                    V_CASES(2) V_CASES(3) V_CASES(4)
#endif
#undef V_CASES
#undef V_CASE
                }
            }
        }
        for (int h = 0; h < per; h++) {
            float inv = sum[h] > 0.0f ? 1.0f / sum[h] : 0.0f, *oh = o + h * hd;
            for (int d = 0; d < hd; d++) oh[d] *= inv;
        }
    }
}

static int attention(const sc_model *M, int n, const float *qkv, int stride, const void *kc, const void *vc, int n_kv,
                     const uint8_t *mask, float *out, int nt) {
    int group = M->n_head / M->n_head_kv;
    if (group > MAX_GROUP) return -1;
    /* a KV head's query heads together, unless that leaves threads idle (decode: one token, few KV heads) */
    int per = n * M->n_head_kv >= 2 * nt ? group : 1, items = n * (M->n_head / per);
    if (nt > items) nt = items;
    if (nt < 1) nt = 1;
    float *scratch = malloc(sizeof(float) * (size_t)nt * per * (n_kv > 0 ? n_kv : 1));
    if (!scratch) return -1;
    attention_job job = {M, qkv, kc, vc, mask, out, scratch, stride, n_kv, per};
    parallel_for(items, n > 1 ? SPLIT_BATCH : SPLIT_ONE, nt, attention_heads, &job);
    free(scratch);
    return 0;
}

/* The per-token steps between the matrix products, one token per item of a parallel loop (each token's values are
   its own: the bits do not depend on how the tokens are shared out) */
enum { STEP_ATTN_NORM, STEP_QKV, STEP_ATTN_OUT, STEP_ACT, STEP_FFN_OUT };
typedef struct {
    const sc_model *M;
    const sc_layer *L;
    int step;
    float *x, *h, *t1, *t2;
    const float *cs, *sn;
    const int64_t *cells;
    char *K, *V;
} token_job;

static void token_steps(void *p, int begin, int end, int worker) {
    const token_job *J = p;
    const sc_model *M = J->M;
    const sc_layer *L = J->L;
    int E = M->n_embd, H = M->n_head, Hkv = M->n_head_kv, hd = M->head_dim, F = M->n_ff;
    int qd = H * hd, kd = Hkv * hd, qkv_n = qd + 2 * kd, half = hd / 2;
    (void)worker;
    for (int i = begin; i < end; i++) {
        float *xi = J->x + (size_t)i * E, *o = J->h + (size_t)i * E;
        switch (J->step) {
        case STEP_ATTN_NORM:
            rms_norm(xi, L->attn_norm, o, E, M->eps);
            break;
        case STEP_QKV: {
            float *r = J->t1 + (size_t)i * qkv_n;
            if (L->qkv_bias)
                for (int j = 0; j < qkv_n; j++) r[j] += L->qkv_bias[j];
            if (L->q_norm) {
                for (int hh = 0; hh < H; hh++) rms_norm(r + hh * hd, L->q_norm, r + hh * hd, hd, M->eps);
                for (int hh = 0; hh < Hkv; hh++) rms_norm(r + qd + hh * hd, L->k_norm, r + qd + hh * hd, hd, M->eps);
            }
            rope(r, H, hd, J->cs + (size_t)i * half, J->sn + (size_t)i * half);
            rope(r + qd, Hkv, hd, J->cs + (size_t)i * half, J->sn + (size_t)i * half);
            for (int g = 0; g < Hkv; g++) {
                size_t at = (size_t)g * M->kv_size + J->cells[i];
                if (M->kv_f16 & 1)
                    floats_to_halves(r + qd + g * hd, (uint16_t *)J->K + at * hd, hd);
                else
                    memcpy((float *)J->K + at * hd, r + qd + g * hd, sizeof(float) * hd);
                if (M->kv_f16 & 2)
                    floats_to_halves(r + qd + kd + g * hd, (uint16_t *)J->V + at * hd, hd);
                else
                    memcpy((float *)J->V + at * hd, r + qd + kd + g * hd, sizeof(float) * hd);
            }
            break;
        }
        case STEP_ATTN_OUT:
            if (L->post_attn_norm) rms_norm(o, L->post_attn_norm, o, E, M->eps);
            for (int j = 0; j < E; j++) xi[j] += o[j];
            rms_norm(xi, L->ffn_norm, o, E, M->eps);
            break;
        case STEP_ACT: {
            const float *g = J->t1 + (size_t)i * 2 * F, *u = g + F;
            float *a = J->t2 + (size_t)i * F;
            if (M->gelu)
                for (int j = 0; j < F; j++) a[j] = gelu_tanh(g[j]) * u[j];
            else
                silu_gate(g, u, a, F);
            break;
        }
        case STEP_FFN_OUT:
            if (L->post_ffn_norm) rms_norm(o, L->post_ffn_norm, o, E, M->eps);
            for (int j = 0; j < E; j++) xi[j] += o[j];
            break;
        }
    }
}

static void per_token(token_job *J, int step, int n, int nt) {
    J->step = step;
    parallel_for(n, n > 1 ? SPLIT_BATCH : SPLIT_ONE, nt, token_steps, J);  /* one token: on the calling thread */
}

/* tokens per pass through the feed-forward: its [tokens, 2 * n_ff] products are the forward's largest buffers (64 MB
   for a 512-token prompt of a 1B model in one pass, 16 MB in passes of 64, 10 MB and 2.5 MB for Qwen 2.5 0.5B); the
   products stream each weight tile once per TOKEN_CHUNK tokens anyway, so passes of 64 cost no more than of 256 (512-
   token prompts of both bench_models shapes within the noise). Each token's values are its own: the bits do not
   change. */
#define FFN_CHUNK 64

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }
static size_t round_up(size_t a, size_t m) { return (a + m - 1) / m * m; }

/* x [n, n_embd] (embeddings, modified); cells [n]: where each token's K/V go; masks [2][n, n_kv] (global, sliding);
   rope cos/sin [2][n, head_dim/2] (global base, sliding base); kc/vc: the cache [n_layer, n_head_kv, kv_size, hd]
   (floats, or halves: M->kv_f16); rows [n_out]: tokens whose logits are wanted, written to logits [n_out, n_vocab].
   Returns 0, or -1 (memory). */
int sc_forward(const sc_model *M, int n, float *x, const int64_t *cells, int n_kv, const uint8_t *mask_global,
               const uint8_t *mask_swa, const float *cos_global, const float *sin_global, const float *cos_swa,
               const float *sin_swa, void *kc, void *vc, const int64_t *rows, int n_out, float *logits, int nt) {
    int E = M->n_embd, H = M->n_head, Hkv = M->n_head_kv, hd = M->head_dim, F = M->n_ff;
    int qd = H * hd, kd = Hkv * hd, qkv_n = qd + 2 * kd;
    int nf = n < FFN_CHUNK ? n : FFN_CHUNK;  /* the feed-forward's tokens per pass */
    /* the activations' scratch holds n tokens of the attention's inputs and nf of the feed-forward's: n rows of
       `width` values (its scales in AMX groups of rows) hold both */
    size_t pad_n = round_up((size_t)n, AMX_ROWS), pad_f = round_up((size_t)nf, AMX_ROWS);
    size_t ffn_width = max_size((pad_f * F + pad_n - 1) / pad_n, ((size_t)nf * F + n - 1) / n);
    size_t width = max_size(max_size((size_t)E, (size_t)qd), round_up(ffn_width, QK));
    float *h = malloc(sizeof(float) * (size_t)n * E);
    float *t1 = malloc(sizeof(float) * max_size((size_t)n * qkv_n, (size_t)nf * 2 * F));
    float *t2 = malloc(sizeof(float) * max_size((size_t)n * qd, (size_t)nf * F));
    q16_rows q;
    int ok = q16_alloc(&q, n, width, max_size(width, (size_t)F), M->isa) == 0 && h && t1 && t2;
    for (int l = 0; ok && l < M->n_layer; l++) {
        const sc_layer *L = &M->layers[l];
        const uint8_t *mask = L->swa ? mask_swa : mask_global;
        size_t layer = (size_t)Hkv * M->kv_size * hd;
        token_job J = {M, L, 0, x, h, t1, t2, L->swa ? cos_swa : cos_global, L->swa ? sin_swa : sin_global, cells,
                       (char *)kc + l * layer * (M->kv_f16 & 1 ? 2 : 4), (char *)vc + l * layer * (M->kv_f16 & 2 ? 2 : 4)};
        per_token(&J, STEP_ATTN_NORM, n, nt);
        linear(&L->qkv, n, h, &q, t1, M->isa, nt);
        per_token(&J, STEP_QKV, n, nt);
        if (attention(M, n, t1, qkv_n, J.K, J.V, n_kv, mask, t2, nt) != 0) {
            ok = 0;
            break;
        }
        linear(&L->wo, n, t2, &q, h, M->isa, nt);
        per_token(&J, STEP_ATTN_OUT, n, nt);
        for (int s = 0; s < n; s += nf) {  /* the feed-forward, nf tokens at a time (t1, t2 hold one pass) */
            int c = n - s < nf ? n - s : nf;
            token_job P = J;
            P.x = x + (size_t)s * E, P.h = h + (size_t)s * E;
            linear(&L->gate_up, c, P.h, &q, t1, M->isa, nt);
            per_token(&P, STEP_ACT, c, nt);
            linear(&L->down, c, t2, &q, P.h, M->isa, nt);
            per_token(&P, STEP_FFN_OUT, c, nt);
        }
    }
    if (ok) {
        for (int i = 0; i < n_out; i++) rms_norm(x + (size_t)rows[i] * E, M->output_norm, h + (size_t)i * E, E, M->eps);
        linear(&M->output, n_out, h, &q, logits, M->isa, nt);
    }
    free(h); free(t1); free(t2);
    q16_free(&q);
    return ok ? 0 : -1;
}

/* exposed for tests: floats to halves and back, as the KV cache stores and reads them */
void sc_f32_to_f16(const float *f, uint16_t *h, int n) { floats_to_halves(f, h, n); }
void sc_f16_to_f32(const uint16_t *h, float *f, int n) { halves_to_floats(h, f, n); }
