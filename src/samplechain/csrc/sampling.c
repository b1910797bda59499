/* samplechain._csampling: the sampler chain's fused step in one call, for the per-token path of the CPU chain.
 *
 * A CPython extension module (compiled on first use by samplechain/_native.py, for the machine it runs on). It
 * computes exactly what chain.py's _FusedTail computes for full-vocabulary logits in two cases:
 *
 *   top-k (k <= 2048) -> [top-p] -> [min-p] -> [temperature] -> dist
 *   min-p (at most 2048 survivors) -> [temperature] -> dist
 *
 * bit for bit: the same candidates (descending logit, ties by lower position), the same binary32 arithmetic
 * (expf as the binary64 exponential rounded once to binary32, as samplechain/_numeric.py defines it; binary32
 * running sums where llama.cpp's src/llama-sampler.cpp adds floats; binary64 running sums for the draw, as
 * llama_sampler_dist_apply) and the same draw from the uniform double the caller took from the dist sampler's
 * generator. tests/test_native_sampling.py checks it against the NumPy step on every kind of input.
 *
 * Why a compiled step at all: a forward pass runs between two samplings and evicts the caches, and each distinct
 * NumPy call then costs 10-40 us before it does any work; the fused NumPy step makes about twenty. One call here
 * costs what llama.cpp's own llama_sampler_apply costs (benchmarks/bench_chain.py, cold mode).
 *
 * What it does not cover it leaves to the NumPy step (returning -1 before using the draw, or -2 before anything):
 * NaN or +inf logits (the NumPy step raises), every top-k candidate -inf, a temperature that would overflow or
 * is <= 0, k > 2048, input that is not a contiguous 1-D binary32 NumPy array.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    float v;
    int32_t i;
} item;

#define MAX_K 2048
#define MAX_COLS 8192 /* column maxima: vocabularies up to 512k in two passes */

/* The step's working arrays (about 100 KB), one set per calling thread: on the stack they would overflow the small
   stacks some threads have (musl's 128 KiB default, threading.stack_size). */
typedef struct {
    float cm[MAX_COLS];
    item th[MAX_K], h[MAX_K];
    float xs[MAX_K], rows[MAX_K], e[MAX_K];
    double q[MAX_K];
} work;
static _Thread_local work scratch __attribute__((aligned(64)));

/* The calling thread's set, its address taken once per call and passed down as a plain pointer: where the compiler
   sees the thread-local variable inside the loops, each access calls __tls_get_addr (measured: 28 % of the step). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((noinline, noipa))
#else
__attribute__((noinline))
#endif
static work *workspace(void) { return &scratch; }


/* a ranks after b: smaller logit, or the same logit at a higher position */
static inline int worse(item a, item b) { return a.v < b.v || (a.v == b.v && a.i > b.i); }

/* A heap whose root is the worst of the k best so far. */
static void sift_down(item *h, int n, int at) {
    item x = h[at];
    for (;;) {
        int c = 2 * at + 1;
        if (c >= n) break;
        if (c + 1 < n && worse(h[c + 1], h[c])) c++;
        if (!worse(h[c], x)) break;
        h[at] = h[c];
        at = c;
    }
    h[at] = x;
}

static void sift_up(item *h, int at) {
    item x = h[at];
    while (at > 0) {
        int p = (at - 1) / 2;
        if (!worse(x, h[p])) break;
        h[at] = h[p];
        at = p;
    }
    h[at] = x;
}

static inline int bad(float v) { return v != v || v == INFINITY; }

/* After the wide vector code: libm's exp wrapper has legacy SSE instructions, which run some 20x slower while
 * the upper halves of the vector registers are dirty (measured: 40 exponentials in 5.4 us instead of 0.2). */
#if defined(__AVX__) && (defined(__x86_64__) || defined(__i386__))
#define CLEAN_UPPER() __builtin_ia32_vzeroupper()
#else
#define CLEAN_UPPER() ((void)0)
#endif

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef int64_t v8l __attribute__((vector_size(64)));

static inline int any_lane(v16i m) {
    v8l l = (v8l)m;
    return (l[0] | l[1] | l[2] | l[3] | l[4] | l[5] | l[6] | l[7]) != 0;
}

/* Whether any of the 64 logits at x is >= the threshold broadcast in tv. */
static inline int block_reaches(const float *x, v16f tv) {
    v16i hit = {0};
    for (int q = 0; q < 4; q++) {
        v16f v;
        memcpy(&v, x + 16 * q, sizeof v);
        hit |= v >= tv;
    }
    return any_lane(hit);
}

/* Offer (v, j) to the heap of `*filled` (of k) best: it enters a full heap if the root ranks after it. */
static inline void offer(item *h, int k, int *filled, float v, int32_t j) {
    item c = {v, j};
    if (*filled < k) {
        h[*filled] = c;
        sift_up(h, (*filled)++);
    } else if (worse(h[0], c)) {
        h[0] = c;
        sift_down(h, k, 0);
    }
}

#define ROWS 64

/* The k best of x[0..n) into h, best first (k <= n). Returns -1 for NaN or +inf anywhere in x.
 *
 * Where the vocabulary has at least 16 k columns in a (64, n / 64) view, two passes: the column maxima first
 * (vertical, 16 columns per vector operation, with the NaN check), whose k-th largest T is reached by at least k
 * logits, so only logits >= T can rank among the k best; then one contiguous pass offers those to the heap.
 * Otherwise one pass over a heap. */
static int top_k(const float *restrict x, Py_ssize_t n, int k, item *restrict h, work *w) {
    Py_ssize_t cols = n / ROWS, grid = cols * ROWS;
    int filled = 0;
    if (cols >= 16 * (Py_ssize_t)k && cols <= MAX_COLS) {
        float *restrict cm = w->cm;
        v16f inf = {0};
        inf += INFINITY;
        v16i badv = {0};
        Py_ssize_t vc = cols - cols % 16, c;
        int badp = 0;
        for (int r = 0; r < ROWS; r++) { /* row by row: the logits are read in order, the maxima stay in L1 */
            const float *xr = x + r * cols;
            for (c = 0; c < vc; c += 16) {
                v16f v, m;
                memcpy(&v, xr + c, sizeof v);
                badv |= (v != v) | (v == inf);
                if (r == 0) {
                    m = v;
                } else {
                    memcpy(&m, cm + c, sizeof m);
                    v16i g = v > m;
                    m = (v16f)((g & (v16i)v) | (~g & (v16i)m));
                }
                memcpy(cm + c, &m, sizeof m);
            }
            for (; c < cols; c++) {
                float v = xr[c];
                badp |= bad(v);
                cm[c] = r == 0 || v > cm[c] ? v : cm[c];
            }
        }
        for (Py_ssize_t j = grid; j < n; j++) badp |= bad(x[j]);
        if (badp || any_lane(badv)) return -1;
        /* T: the k-th largest column maximum (a heap of values whose root is the smallest) */
        item *restrict th = w->th;
        int tf = 0;
        for (c = 0; c < cols; c++) offer(th, k, &tf, cm[c], 0);
        float t = th[0].v;
        v16f tv = {0};
        tv += t;
        Py_ssize_t j = 0;
        for (; j + 64 <= n; j += 64) { /* contiguous: blocks of 64 with no logit >= T are passed over */
            if (!block_reaches(x + j, tv)) continue;
            for (int q = 0; q < 64; q++)
                if (x[j + q] >= t) offer(h, k, &filled, x[j + q], (int32_t)(j + q));
        }
        for (; j < n; j++)
            if (x[j] >= t) offer(h, k, &filled, x[j], (int32_t)j);
        CLEAN_UPPER();
    } else {
        for (Py_ssize_t j = 0; j < n; j++) {
            if (bad(x[j])) return -1;
            offer(h, k, &filled, x[j], (int32_t)j);
        }
    }
    for (int m = k - 1; m > 0; m--) { /* heap sort: the worst to the end */
        item w = h[0];
        h[0] = h[m];
        h[m] = w;
        sift_down(h, m, 0);
    }
    return 0;
}

static inline float expf_exact(float d) { return (float)exp((double)d); }

/* top-p's cut over descending logits xs[0..n): the smallest prefix whose binary32 running sum of
 * expf(x - x0) / (their binary32 sum) reaches p, at least min_keep; 0 when none (chain.py: nucleus_size of
 * softmax_values). */
static int nucleus(const float *xs, int n, float p, int min_keep, float *e) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        e[i] = expf_exact(xs[i] - xs[0]);
        sum += e[i];
    }
    float run = 0.0f;
    int first = -1;
    for (int i = 0; i < n; i++) {
        run += e[i] / sum;
        if (first < 0 && run >= p) first = i;
    }
    if (!(run >= p)) return 0; /* the running sum is non-decreasing: the last one decides */
    int i = first;
    if (i < min_keep - 1) i = min_keep - 1;
    return i < n ? i + 1 : 0;
}

/* min-p over the full vocabulary, no top-k before it (samplers/probability_filters.py MinP.apply on fresh candidates,
 * then Temperature.apply): the positions whose logit is >= max + log p, in ascending order, into w->h[].i, their
 * logits (divided by t when has_t) into w->rows; their count into *count. -1: NaN or +inf, every logit -inf, or a
 * temperature that does not divide (the NumPy step); -2: more than MAX_K survivors or fewer than min_keep (NumPy
 * then sorts, and its dist over more than 2048 candidates uses NumPy's own exponential). */
static int min_p_unsorted(const float *restrict x, Py_ssize_t n, float log_p, long min_keep, int has_t, float t,
                          work *w, int *count) {
    v16f inf = {0}, mv;
    inf += INFINITY;
    v16i badv = {0};
    float mx = -INFINITY;
    Py_ssize_t j = 0;
    if (n >= 16) {
        memcpy(&mv, x, sizeof mv);
        for (; j + 16 <= n; j += 16) {
            v16f v;
            memcpy(&v, x + j, sizeof v);
            v16i g = v > mv;
            mv = (v16f)((g & (v16i)v) | (~g & (v16i)mv));
            badv |= (v != v) | (v == inf);
        }
        for (int l = 0; l < 16; l++) mx = mv[l] > mx ? mv[l] : mx;
    }
    int badp = 0;
    for (; j < n; j++) {
        badp |= bad(x[j]);
        mx = x[j] > mx ? x[j] : mx;
    }
    int any_bad = badp || any_lane(badv);
    CLEAN_UPPER();
    if (any_bad || mx == -INFINITY) return -1;
    float thr = mx + log_p;
    v16f tv = {0};
    tv += thr;
    int c = 0;
    for (j = 0; j < n; j += 64) { /* blocks of 64 with no logit >= thr are passed over */
        Py_ssize_t end = j + 64 < n ? j + 64 : n;
        if (end - j == 64 && !block_reaches(x + j, tv)) continue;
        for (Py_ssize_t i = j; i < end; i++) {
            if (x[i] >= thr) {
                if (c == MAX_K) return -2;
                w->h[c].i = (int32_t)i;
                w->rows[c++] = x[i];
            }
        }
    }
    CLEAN_UPPER();
    if (c == 0 || c < min_keep) return -2;
    if (has_t) { /* temperature.py divides(): t >= 1, or every |logit| within FLT_MAX * t */
        double tf = t;
        if (!(tf > 0.0)) return -1;
        if (tf < 1.0) {
            double lo = w->rows[0];
            for (int i = 1; i < c; i++) lo = w->rows[i] < lo ? w->rows[i] : lo;
            if (fmax(fabs((double)mx), fabs(lo)) > (double)FLT_MAX * tf) return -1;
        }
        for (int i = 0; i < c; i++) w->rows[i] = w->rows[i] / t;
    }
    *count = c;
    return 0;
}

/* The logits as a contiguous 1-D binary32 NumPy array (read through NumPy's C structure, not the buffer
 * protocol, which costs some 5 us more when the caches are cold); NULL otherwise. */
static const float *logits_of(PyObject *obj, Py_ssize_t *n) {
    if (!PyArray_Check(obj)) return NULL;
    PyArrayObject *a = (PyArrayObject *)obj;
    if (PyArray_NDIM(a) != 1 || PyArray_TYPE(a) != NPY_FLOAT32 || !PyArray_ISNOTSWAPPED(a) ||
        !PyArray_IS_C_CONTIGUOUS(a) || PyArray_DIM(a, 0) == 0)
        return NULL;
    *n = PyArray_DIM(a, 0);
    return (const float *)PyArray_DATA(a);
}

/* llama.cpp's uniform_real_distribution<double>(0, 1) from two words of the generator, the first least
 * significant, rounded once (samplechain/rng.py: LlamaRng.uniform_double). */
static double uniform_double(uint64_t lo, uint64_t hi) {
    double u = (double)(lo | (hi << 32)) / 18446744073709551616.0;
    return u >= 1.0 ? 1.0 - 0x1p-53 : u;
}

/* fused_tail(x, params, words, at, out) -> token, or -1 / -2 (see the top).
 *   params: (k, p, p_min_keep, log_p, m_min_keep, t): k 0: no top-k (then min-p and no top-p); p_min_keep < 0:
 *   no top-p; m_min_keep < 0: no min-p; t None: no temperature.
 *   words, at: the dist sampler's buffered generator words (LlamaRng._buf, a list) and the position of the next
 *   unread one (the caller checked that two are left; it advances the position by two when a token is returned);
 *   or None and the uniform double already drawn.
 *   out: None, or a writable int32 buffer of at least 2 + 3 * K entries, K = min(k or 2048, len(x)), receiving the
 *   count m and the selected position, then m ids, m logits and m probabilities (binary32 bits) at 2, 2 + K and
 *   2 + 2K. */
static PyObject *fused_tail(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5 || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != 6) {
        PyErr_SetString(PyExc_TypeError, "fused_tail(x, params, words, at, out)");
        return NULL;
    }
    PyObject *const *pa = &PyTuple_GET_ITEM(args[1], 0);
    long k_arg = PyLong_AsLong(pa[0]);
    double p = PyFloat_AsDouble(pa[1]);
    long p_min_keep = PyLong_AsLong(pa[2]);
    double log_p_d = PyFloat_AsDouble(pa[3]);
    long m_min_keep = PyLong_AsLong(pa[4]);
    int has_t = pa[5] != Py_None;
    double t_d = has_t ? PyFloat_AsDouble(pa[5]) : 1.0;
    double u;
    if (args[2] == Py_None) {
        u = PyFloat_AsDouble(args[3]);
    } else {
        Py_ssize_t at = PyLong_AsSsize_t(args[3]);
        if (!PyList_Check(args[2]) || at < 0 || at + 2 > PyList_GET_SIZE(args[2])) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "fused_tail: two words are not left");
            return NULL;
        }
        uint64_t lo = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(args[2], at));
        uint64_t hi = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(args[2], at + 1));
        u = uniform_double(lo, hi);
    }
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t n;
    const float *x = logits_of(args[0], &n);
    if (x == NULL || k_arg < 0) return PyLong_FromLong(-2);
    work *w = workspace();
    item *h = w->h;
    float *rows = w->rows, *e = w->e;
    double *q = w->q;
    float t = (float)t_d;
    int kk, k; /* kk: the width of the output (candidates of the top-k path); k: the candidates drawn from */
    float top; /* the largest of rows[0..k) */
    if (k_arg == 0) { /* no top-k: min-p over the full vocabulary, unsorted (no top-p: it would sort) */
        if (m_min_keep < 0 || p_min_keep >= 0) return PyLong_FromLong(-2);
        kk = (int)(n < MAX_K ? n : MAX_K);
        int r = min_p_unsorted(x, n, (float)log_p_d, m_min_keep, has_t, t, w, &k);
        if (r) return PyLong_FromLong(r);
        top = rows[0];
        for (int i = 1; i < k; i++) top = rows[i] > top ? rows[i] : top;
        goto draw;
    }
    kk = (int)(k_arg < n ? k_arg : n);
    if (kk > MAX_K) return PyLong_FromLong(-2);
    if (top_k(x, n, kk, h, w)) return PyLong_FromLong(-1);

    float *xs = w->xs;
    for (int i = 0; i < kk; i++) xs[i] = h[i].v;
    if (xs[0] == -INFINITY) return PyLong_FromLong(-1); /* every candidate masked: dist raises */
    if (has_t) { /* chain.py: the temperature divides (else: greedy masking, left to the members) */
        double tf = t, limit = (double)FLT_MAX * tf;
        int ok = 1.0 > tf && tf > 0.0 && -limit <= xs[kk - 1] && -limit <= xs[0] && xs[0] <= limit;
        if (!ok) {
            if (tf >= 1.0) {
                ok = 1;
            } else if (tf > 0.0) {
                double lo = 0.0;
                for (int i = kk - 1; i >= 0; i--) /* the smallest finite logit (descending order) */
                    if (xs[i] > -INFINITY) {
                        lo = xs[i];
                        break;
                    }
                ok = fmax(fabs((double)xs[0]), fabs(lo)) <= limit;
            }
        }
        if (!ok) return PyLong_FromLong(-1);
    }
    k = kk;
    if (m_min_keep >= 0) { /* min-p over descending logits: the entries >= x0 + log p, at least 1, min_keep */
        float thr = xs[0] + (float)log_p_d;
        int count = 0;
        while (count < kk && xs[count] >= thr) count++;
        if (count == 0) count = 1;
        long floor_keep = m_min_keep < kk ? m_min_keep : kk;
        k = count > floor_keep ? count : (int)floor_keep;
    }
    if (k > 1 && p_min_keep >= 0) {
        int keep = nucleus(xs, kk, (float)p, (int)p_min_keep, e);
        if (0 < keep && keep < k) k = keep;
    }
    for (int i = 0; i < kk; i++) rows[i] = has_t ? xs[i] / t : xs[i];
    top = rows[0];
draw:;
    int sel = 0;
    if (k > 1) {
        double s = 0.0;
        for (int i = 0; i < k; i++) {
            e[i] = expf_exact(rows[i] - top);
            s += (double)e[i];
            q[i] = s;
        }
        double total = q[k - 1], target = total * u;
        sel = 0;
        if (target > 0.0) {
            while (sel < k && !(q[sel] >= target)) sel++;
        } else {
            while (sel < k && !(q[sel] > target)) sel++;
        }
        if (sel > k - 1) sel = k - 1;
        if (args[4] != Py_None) {
            for (int i = 0; i < k; i++) e[i] = (float)((double)e[i] / total);
        }
    } else {
        e[0] = 1.0f;
    }
    if (args[4] != Py_None) {
        Py_buffer ob;
        if (PyObject_GetBuffer(args[4], &ob, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
        if (ob.len < (Py_ssize_t)(4 * (2 + 3 * (Py_ssize_t)kk))) {
            PyBuffer_Release(&ob);
            PyErr_SetString(PyExc_ValueError, "fused_tail: the output buffer is too small");
            return NULL;
        }
        int32_t *o = (int32_t *)ob.buf;
        o[0] = k;
        o[1] = sel;
        for (int i = 0; i < k; i++) {
            o[2 + i] = h[i].i;
            memcpy(o + 2 + kk + i, rows + i, 4);
            memcpy(o + 2 + 2 * kk + i, e + i, 4);
        }
        PyBuffer_Release(&ob);
    }
    return PyLong_FromLong(h[sel].i);
}

/* first_max(x) -> the position of the first largest logit, -1 for NaN or +inf anywhere, -2 for input that is
 * not a contiguous 1-D binary32 NumPy array (greedy's arithmetic: numpy's argmax of validated logits). */
static PyObject *first_max(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "first_max takes 1 argument");
        return NULL;
    }
    Py_ssize_t n;
    const float *x = logits_of(args[0], &n);
    if (x == NULL) return PyLong_FromLong(-2);
    item h[1];
    int r = top_k(x, n, 1, h, workspace());
    return PyLong_FromLong(r ? -1 : h[0].i);
}

static PyMethodDef methods[] = {
    {"fused_tail", (PyCFunction)(void (*)(void))fused_tail, METH_FASTCALL, "The fused sampler step (sampling.c)."},
    {"first_max", (PyCFunction)(void (*)(void))first_max, METH_FASTCALL, "Greedy's selection (sampling.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_csampling", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__csampling(void) {
    import_array();
    return PyModule_Create(&module);
}
