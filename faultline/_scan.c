/* faultline._scan: one native pass over a block of log bytes (bench/README.md, "bigfile").
 *
 * For every line of a block it does what collectors/files.read_blocks and collect_lines.LineCollector
 * do with Polars and Python for that line, with the same results (tests/test_native.py checks them
 * against the Python path): split at \n, \r\n or a lone \r; replace invalid UTF-8 the way Python's
 * decode(errors="replace") does and count U+FFFD; strip ANSI CSI sequences; cut an over-long line with
 * the marker; then, in one Aho-Corasick automaton pass, whether the line holds a rule literal (the
 * prefilter, ASCII case-insensitive), whether it holds "loss" (training progress) and the substrings the
 * who-spoke key depends on. Lines are counted per who-spoke key (logparse.with_identity_keys, and the
 * refinements argued at key_for_line); only candidate lines, distinct keys and counts come back to
 * Python. The block is split in two at a line break and scanned on two threads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* automaton flags of a state (what ends there) */
#define F_LIT 1u     /* a prefilter literal */
#define F_LOSS 2u    /* "loss" (any case; the exact case is checked) */
#define F_SPB 4u     /* " [" */
#define F_LRANK 8u   /* "[rank" (any case) */
#define F_RANK 16u   /* "rank " (any case) */
#define F_BRK 32u    /* \n or \r */
#define F_HIGH 64u   /* a byte >= 0x80 */
#define F_ESC 128u   /* ESC */

/* line flags */
#define L_LIT 1u
#define L_LOSS 2u     /* "loss", "Loss" or "LOSS" */
#define L_SPB 4u      /* " [" */
#define L_NCCL 8u     /* an NCCL `host:pid:tid [gpu] ` could match around some " [" */
#define L_LRANK 16u   /* "[rank" */
#define L_RANK 32u    /* "Rank " */
#define L_C10D 64u    /* "Rank " followed by 1-6 digits and "]" */
#define L_HIGH 128u
#define L_ESC 256u

/* Literals longer than KEEP bytes enter the automaton by their first KEEP bytes (a small table stays in
 * the core's cache: ~2,150 states instead of ~9,500); where such a head ends, the rest is compared. */
#define KEEP 8
#define F_VER 256u   /* the head of a longer literal ends here (in the state's flags16) */

typedef struct Scanner {
    uint32_t *T;       /* transitions, premultiplied by ncls */
    uint16_t *flags;   /* per state */
    int32_t *vhead;    /* per state: the nearest state on its failure chain that owns heads, or -1 */
    int32_t *vnext;    /* per state: the next such state after it */
    int32_t *vstart;   /* per state: its own heads' literals, vlit[vstart[s] .. vstart[s + 1]) */
    int32_t *vlit;
    uint8_t **lit;     /* the literals, lower-cased */
    int32_t *litlen;
    Py_ssize_t nlit;
    uint8_t cls[256];
    uint32_t ncls, nstates, thr, brk, high, esc; /* thr, brk, high, esc premultiplied */
} Scanner;

static void scanner_free(PyObject *cap) {
    Scanner *sc = PyCapsule_GetPointer(cap, "faultline._scan.Scanner");
    if (!sc) return;
    for (Py_ssize_t i = 0; i < sc->nlit; i++) free(sc->lit[i]);
    free(sc->lit); free(sc->litlen); free(sc->vhead); free(sc->vnext); free(sc->vstart); free(sc->vlit);
    free(sc->T); free(sc->flags); free(sc);
}

static inline uint8_t lower(uint8_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }
static inline int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static inline int is_alnum(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static inline int is_space(uint8_t c) { return c == ' ' || (c >= 9 && c <= 13); }

/* build(literals: list[bytes], route=False) -> capsule; None if a literal holds a byte the automaton reserves.
 * route: an automaton for `route` (which literals a line holds), not for `scan`: no extra substrings, and
 * every literal is in its head state's list (a literal of up to KEEP bytes with nothing left to compare). */
static PyObject *build(PyObject *self, PyObject *args) {
    PyObject *lits;
    int route = 0;
    if (!PyArg_ParseTuple(args, "O!|p", &PyList_Type, &lits, &route)) return NULL;
    Py_ssize_t nlit = PyList_GET_SIZE(lits);
    const char *extra[] = {"loss", " [", "[rank", "rank "};
    uint8_t extra_f[] = {F_LOSS, F_SPB, F_LRANK, F_RANK};
    Py_ssize_t npat = nlit + (route ? 0 : 4), total = 0;
    const uint8_t **pat = malloc(sizeof(*pat) * npat);
    Py_ssize_t *plen = malloc(sizeof(*plen) * npat);
    uint8_t *pf = malloc(npat);
    for (Py_ssize_t i = 0; i < nlit; i++) {
        PyObject *b = PyList_GET_ITEM(lits, i);
        if (!PyBytes_Check(b)) { free(pat); free(plen); free(pf); PyErr_SetString(PyExc_TypeError, "bytes expected"); return NULL; }
        pat[i] = (const uint8_t *)PyBytes_AS_STRING(b); plen[i] = PyBytes_GET_SIZE(b); pf[i] = F_LIT;
    }
    for (int i = 0; i < npat - nlit; i++) { pat[nlit + i] = (const uint8_t *)extra[i]; plen[nlit + i] = strlen(extra[i]); pf[nlit + i] = extra_f[i]; }
    uint8_t cls[256]; memset(cls, 0, sizeof cls);
    uint32_t ncls = 1;
    for (Py_ssize_t i = 0; i < npat; i++) {
        if (plen[i] == 0) { free(pat); free(plen); free(pf); Py_RETURN_NONE; }
        total += plen[i];
        for (Py_ssize_t j = 0; j < plen[i]; j++) {
            uint8_t c = lower(pat[i][j]);
            if (c == '\n' || c == '\r' || c == 0x1b || c >= 0x80) { free(pat); free(plen); free(pf); Py_RETURN_NONE; }
            if (!cls[c]) cls[c] = ncls++;
        }
    }
    for (int c = 'A'; c <= 'Z'; c++) cls[c] = cls[c + 32];
    uint32_t c_brk = ncls++, c_high = ncls++, c_esc = ncls++;
    cls['\n'] = cls['\r'] = c_brk; cls[0x1b] = c_esc;
    for (int c = 0x80; c < 256; c++) cls[c] = c_high;
    uint32_t maxst = total + 4;
    int32_t *go = malloc(sizeof(int32_t) * maxst * ncls);
    uint16_t *fl = calloc(maxst, sizeof(uint16_t));
    int32_t *owner = malloc(sizeof(int32_t) * npat); /* state whose own head list holds literal i, or -1 */
    int32_t *fail = calloc(maxst, sizeof(int32_t)), *queue = malloc(sizeof(int32_t) * maxst);
    for (size_t i = 0; i < (size_t)maxst * ncls; i++) go[i] = -1;
    uint32_t n = 1; /* state 0: root */
    for (Py_ssize_t i = 0; i < npat; i++) {
        int32_t s = 0;
        Py_ssize_t keep = (pf[i] == F_LIT && plen[i] > KEEP) ? KEEP : plen[i];
        for (Py_ssize_t j = 0; j < keep; j++) {
            uint32_t c = cls[lower(pat[i][j])];
            if (go[s * ncls + c] < 0) go[s * ncls + c] = n++;
            s = go[s * ncls + c];
        }
        owner[i] = keep < plen[i] || route ? s : -1;
        if (keep < plen[i] || route) fl[s] |= F_VER; else fl[s] |= pf[i];
    }
    uint32_t S_BRK = n++, S_HIGH = n++, S_ESC = n++;
    fl[S_BRK] = F_BRK; fl[S_HIGH] = F_HIGH; fl[S_ESC] = F_ESC;
    /* breadth first: failure links, outputs along them, the complete transition table */
    uint32_t qh = 0, qt = 0;
    for (uint32_t c = 0; c < ncls; c++) {
        int32_t t = go[c];
        if (t > 0) { fail[t] = 0; queue[qt++] = t; } else go[c] = 0;
    }
    while (qh < qt) {
        int32_t s = queue[qh++];
        fl[s] |= fl[fail[s]];
        for (uint32_t c = 0; c < ncls; c++) {
            int32_t t = go[s * ncls + c];
            if (t >= 0 && c != c_brk && c != c_high && c != c_esc) { fail[t] = go[fail[s] * ncls + c]; queue[qt++] = t; }
            else go[s * ncls + c] = go[fail[s] * ncls + c];
        }
    }
    for (uint32_t s = 0; s < n; s++) {
        if (s == S_BRK || s == S_HIGH || s == S_ESC) for (uint32_t c = 0; c < ncls; c++) go[s * ncls + c] = go[c];
        go[s * ncls + c_brk] = S_BRK; go[s * ncls + c_high] = S_HIGH; go[s * ncls + c_esc] = S_ESC;
    }
    /* renumber: states without flags first (root stays 0), so one compare finds every event */
    uint32_t *map = malloc(sizeof(uint32_t) * n), k = 0;
    for (uint32_t s = 0; s < n; s++) if (!fl[s]) map[s] = k++;
    uint32_t thr = k;
    for (uint32_t s = 0; s < n; s++) if (fl[s]) map[s] = k++;
    Scanner *sc = calloc(1, sizeof(Scanner));
    sc->T = malloc(sizeof(uint32_t) * n * ncls);
    sc->flags = malloc(sizeof(uint16_t) * n);
    for (uint32_t s = 0; s < n; s++) {
        sc->flags[map[s]] = fl[s];
        for (uint32_t c = 0; c < ncls; c++) sc->T[map[s] * ncls + c] = map[go[s * ncls + c]] * ncls;
    }
    /* heads to compare: each state's own literals, and the chain of suffix states that own some */
    sc->nlit = nlit;
    sc->lit = calloc(nlit ? nlit : 1, sizeof(uint8_t *));
    sc->litlen = malloc(sizeof(int32_t) * (nlit ? nlit : 1));
    for (Py_ssize_t i = 0; i < nlit; i++) {
        sc->lit[i] = malloc(plen[i]);
        for (Py_ssize_t j = 0; j < plen[i]; j++) sc->lit[i][j] = lower(pat[i][j]);
        sc->litlen[i] = (int32_t)plen[i];
    }
    sc->vstart = calloc(n + 1, sizeof(int32_t));
    sc->vlit = malloc(sizeof(int32_t) * (npat ? npat : 1));
    for (Py_ssize_t i = 0; i < npat; i++) if (owner[i] >= 0) sc->vstart[map[owner[i]] + 1]++;
    for (uint32_t s = 0; s < n; s++) sc->vstart[s + 1] += sc->vstart[s];
    int32_t *fillp = malloc(sizeof(int32_t) * (n + 1));
    memcpy(fillp, sc->vstart, sizeof(int32_t) * (n + 1));
    for (Py_ssize_t i = 0; i < npat; i++) if (owner[i] >= 0) sc->vlit[fillp[map[owner[i]]]++] = (int32_t)i;
    free(fillp);
    sc->vhead = malloc(sizeof(int32_t) * n);
    sc->vnext = malloc(sizeof(int32_t) * n);
    int32_t *vh = malloc(sizeof(int32_t) * n);  /* in old numbering */
    vh[0] = -1;
    sc->vhead[map[0]] = -1; sc->vnext[map[0]] = -1;
    for (uint32_t i = 0; i < qt; i++) {  /* breadth first: a state's failure target comes before it */
        int32_t st = queue[i];
        int32_t own = sc->vstart[map[st] + 1] > sc->vstart[map[st]];
        vh[st] = own ? st : vh[fail[st]];
        sc->vhead[map[st]] = vh[st] < 0 ? -1 : (int32_t)map[vh[st]];
        sc->vnext[map[st]] = vh[fail[st]] < 0 ? -1 : (int32_t)map[vh[fail[st]]];
    }
    for (uint32_t st = 0; st < n; st++) if (st == S_BRK || st == S_HIGH || st == S_ESC) { sc->vhead[map[st]] = -1; sc->vnext[map[st]] = -1; }
    free(vh); free(owner);
    free(pat); free(plen); free(pf);
    memcpy(sc->cls, cls, 256);
    sc->ncls = ncls; sc->nstates = n; sc->thr = thr * ncls;
    sc->brk = map[S_BRK] * ncls; sc->high = map[S_HIGH] * ncls; sc->esc = map[S_ESC] * ncls;
    free(map); free(go); free(fl); free(fail); free(queue);
    return PyCapsule_New(sc, "faultline._scan.Scanner", scanner_free);
}

/* An NCCL prefix `host:pid:tid [gpu] ` could end around this " [" (sp at the space): `:\d+:\d+` with
 * an alphanumeric before it, then `\d{1,2}] `. A necessary condition for logparse._NCCL to match there. */
static int nccl_possible(const uint8_t *ls, const uint8_t *sp, const uint8_t *end) {
    const uint8_t *q = sp - 1;
    int n = 0;
    while (q >= ls && is_digit(*q)) { q--; n++; }
    if (!n || q < ls || *q != ':') return 0;
    q--; n = 0;
    while (q >= ls && is_digit(*q)) { q--; n++; }
    if (!n || q < ls || *q != ':') return 0;
    q--;
    if (q < ls || !is_alnum(*q)) return 0;
    const uint8_t *r = sp + 2;
    n = 0;
    while (r < end && is_digit(*r) && n < 3) { r++; n++; }
    if (n < 1 || n > 2) return 0;
    return r + 1 < end && r[0] == ']' && r[1] == ' ';
}

/* logparse._C10D_RANK could match at this "Rank ": 1-6 digits, then "]" */
static int c10d_possible(const uint8_t *p, const uint8_t *end) {
    int n = 0;
    while (p < end && is_digit(*p) && n < 7) { p++; n++; }
    return n >= 1 && n <= 6 && p < end && *p == ']';
}

#define BREAK UINT32_MAX
#define NPARTS 9  /* part 0: the decoded lines before the data; then up to 8 parts of the data */

/* An automaton state s >= thr was reached at p: BREAK at a line break, else the line's flags into *fp and
 * the state to go on from (the root after a byte that is never part of a literal). `end` bounds the
 * look-arounds. The state goes in and out by value: its address taken, the hot loops would keep it in
 * memory, and a store and load would join the chain of table lookups. */
static uint32_t on_event(const Scanner *sc, const uint8_t *ls, const uint8_t *p, const uint8_t *end,
                         uint32_t s, uint32_t *fp) {
    uint32_t f = *fp;
    if (s == sc->brk) return BREAK;
    if (s == sc->high) { *fp = f | L_HIGH; return 0; }
    if (s == sc->esc) { *fp = f | L_ESC; return 0; }
    uint32_t st = s / sc->ncls;
    uint16_t g = sc->flags[st];
    if (g & F_LIT) f |= L_LIT;
    else if ((g & F_VER) && !(f & L_LIT)) {
        for (int32_t t = sc->vhead[st]; t >= 0 && !(f & L_LIT); t = sc->vnext[t])
            for (int32_t v = sc->vstart[t]; v < sc->vstart[t + 1]; v++) {
                int32_t li = sc->vlit[v], rest = sc->litlen[li] - KEEP;
                const uint8_t *lt = sc->lit[li] + KEEP;
                if (end - (p + 1) < rest) continue;
                int32_t j = 0;
                while (j < rest && lower(p[1 + j]) == lt[j]) j++;
                if (j == rest) { f |= L_LIT; break; }
            }
    }
    if ((g & F_LOSS) && (!memcmp(p - 3, "loss", 4) || !memcmp(p - 3, "Loss", 4) || !memcmp(p - 3, "LOSS", 4))) f |= L_LOSS;
    if (g & F_SPB) { f |= L_SPB; if (!(f & L_NCCL) && nccl_possible(ls, p - 1, end)) f |= L_NCCL; }
    if ((g & F_LRANK) && !memcmp(p - 4, "[rank", 5)) f |= L_LRANK;
    if ((g & F_RANK) && !memcmp(p - 4, "Rank ", 5)) { f |= L_RANK; if (c10d_possible(p + 1, end)) f |= L_C10D; }
    *fp = f;
    return s;
}

/* The automaton over one line from p: returns the position of the line break (or end); flags in *lf. */
static const uint8_t *scan_line(const Scanner *sc, const uint8_t *ls, const uint8_t *p, const uint8_t *end,
                                uint32_t *lf) {
    const uint32_t *T = sc->T;
    const uint8_t *cls = sc->cls;
    uint32_t s = 0, thr = sc->thr, f = 0;
    for (; p < end; p++) {
        s = T[s + cls[*p]];
        if (s >= thr && (s = on_event(sc, ls, p, end, s, &f)) == BREAK) break;
    }
    *lf = f;
    return p;
}

/* ---------------------------------------------------------------- UTF-8, as CPython decodes */

/* length of a valid sequence at p, or 0 (then *bad = bytes that make one replaced error) */
static int utf8_seq(const uint8_t *p, const uint8_t *end, int *bad) {
    uint8_t c = p[0];
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) need = 2;
    else if (c == 0xED) { need = 2; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) need = 2;
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) { need = 3; hi = 0x8F; }
    else { *bad = 1; return 0; }
    int i = 1;
    for (; i <= need; i++) {
        if (p + i >= end) { *bad = i; return 0; }
        uint8_t d = p[i];
        if (i == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) { *bad = i; return 0; }
    }
    return need + 1;
}

static int utf8_valid(const uint8_t *p, const uint8_t *end) {
    while (p < end) {
        if (*p < 0x80) { p++; continue; }
        int bad, n = utf8_seq(p, end, &bad);
        if (!n) return 0;
        p += n;
    }
    return 1;
}

static Py_ssize_t count_fffd(const uint8_t *p, const uint8_t *end) {
    Py_ssize_t n = 0;
    for (; p + 2 < end; p++) if (p[0] == 0xEF && p[1] == 0xBF && p[2] == 0xBD) { n++; p += 2; }
    return n;
}

/* ---------------------------------------------------------------- per-thread results */

typedef struct Chunk { struct Chunk *next; size_t used, cap; uint8_t data[]; } Chunk;
typedef struct { Chunk *head; } Arena;

static uint8_t *arena_alloc(Arena *a, size_t n) {
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > (1 << 20) ? n : (1 << 20);
        Chunk *c = malloc(sizeof(Chunk) + cap);
        if (!c) return NULL;
        c->next = a->head; c->used = 0; c->cap = cap; a->head = c;
    }
    uint8_t *p = a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void arena_free(Arena *a) {
    while (a->head) { Chunk *n = a->head->next; free(a->head); a->head = n; }
}

typedef struct { const uint8_t *p; uint32_t len, count, ord; uint64_t h; } Entry;
typedef struct { Py_ssize_t idx; const uint8_t *p; Py_ssize_t len; uint32_t key; } Line;
typedef struct Pair { Py_ssize_t row; int32_t lit; } Pair;

typedef struct {
    const Scanner *sc;
    const uint8_t *base, *start, *end;  /* base: the first byte of the data (start: of this part) */
    int final;                 /* the data is the last bytes of the file (may end without a break) */
    Py_ssize_t max_lines, limit, max_line;
    const uint8_t *th, *tt;    /* the truncation marker around its number */
    Py_ssize_t thn, ttn;
    /* results */
    Entry *tab; uint32_t cap, used;
    Line *cand; Py_ssize_t ncand, candcap;
    Line *unsure; Py_ssize_t nunsure, unsurecap;
    Line *loss; Py_ssize_t nloss, losscap;  /* ASCII lines holding "loss", for settle_progress */
    Py_ssize_t lines, progress, replaced, truncated;
    Arena arena;
    int oom;
    const struct Scanner *rt;  /* a router (route=True): the candidates' literals come along, or NULL */
    struct Pair *pairs; Py_ssize_t npair, paircap;  /* (candidate of this part, literal) */
} Part;

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) { uint64_t v; memcpy(&v, p, 8); h = (h ^ v) * 0x100000001b3ull; h ^= h >> 29; p += 8; n -= 8; }
    uint64_t v = 0;
    memcpy(&v, p, n);
    h = (h ^ v) * 0xff51afd7ed558ccdull;
    return h ^ (h >> 32);
}

static int grow(void **arr, Py_ssize_t *cap, size_t elem) {
    Py_ssize_t nc = *cap ? *cap * 2 : 1024;
    void *n = realloc(*arr, nc * elem);
    if (!n) return 0;
    *arr = n; *cap = nc;
    return 1;
}

/* index of the key's entry (first-seen order), counted once more */
static int64_t count_key(Part *w, const uint8_t *p, size_t n) {
    if (w->used * 2 >= w->cap) {
        uint32_t nc = w->cap ? w->cap * 2 : 4096;
        Entry *t = calloc(nc, sizeof(Entry));
        if (!t) return -1;
        for (uint32_t i = 0; i < w->cap; i++) if (w->tab[i].p) {
            uint32_t j = (uint32_t)w->tab[i].h & (nc - 1);
            while (t[j].p) j = (j + 1) & (nc - 1);
            t[j] = w->tab[i];
        }
        free(w->tab); w->tab = t; w->cap = nc;
    }
    uint64_t h = hash_bytes(p, n);
    uint32_t j = (uint32_t)h & (w->cap - 1);
    static const uint8_t empty = 0;
    if (!n) p = &empty; /* a non-null pointer marks a used slot */
    while (w->tab[j].p) {
        Entry *e = &w->tab[j];
        if (e->h == h && e->len == n && !memcmp(e->p, p, n)) { e->count++; return e->ord; }
        j = (j + 1) & (w->cap - 1);
    }
    w->tab[j].p = p; w->tab[j].len = (uint32_t)n; w->tab[j].count = 1; w->tab[j].h = h; w->tab[j].ord = w->used;
    return w->used++;
}

/* ---------------------------------------------------------------- who spoke: the key of a line */

/* logparse._SPOKE_PREFIX at the start of s: its end, or -1 when a byte >= 0x80 stands where the regex
 * tests `\d` (Unicode digits: the Python path would decide; the caller then keys the whole line).
 * *tags: the prefix starts with a torchrun tag; *rank: it holds a `[rankN]:` tag; *nccl: it ends with
 * the NCCL part. */
static Py_ssize_t spoke_prefix(const uint8_t *s, Py_ssize_t n, int *tags, int *rank, int *nccl) {
    Py_ssize_t pos = 0;
    *tags = *rank = *nccl = 0;
    for (;;) {
        if (pos >= n || s[pos] != '[') break;
        Py_ssize_t q = pos + 1, maxd;
        int isrank = 0;
        if (n - q >= 7 && (!memcmp(s + q, "default", 7) || !memcmp(s + q, "trainer", 7))) { q += 7; maxd = 4; }
        else if (n - q >= 6 && !memcmp(s + q, "worker", 6)) { q += 6; maxd = 4; }
        else if (n - q >= 4 && !memcmp(s + q, "rank", 4)) { q += 4; maxd = 6; isrank = 1; }
        else break;
        Py_ssize_t d = 0;
        while (d < maxd && q < n && is_digit(s[q])) { q++; d++; }
        if (d < maxd && q < n && s[q] >= 0x80) return -1;
        if (!d || q + 1 >= n || s[q] != ']' || s[q + 1] != ':') break;
        pos = q + 2;
        *tags = 1;
        if (isrank) *rank = 1;
    }
    /* the NCCL part: [A-Za-z0-9.\-_]*[A-Za-z0-9]:\d+:\d+ \[\d{1,2}\] */
    Py_ssize_t q = pos;
    while (q < n && (is_alnum(s[q]) || s[q] == '.' || s[q] == '-' || s[q] == '_')) q++;
    if (q == pos || !is_alnum(s[q - 1]) || q >= n || s[q] != ':') return pos;
    for (int part = 0; part < 2; part++) {
        q++;
        Py_ssize_t d = 0;
        while (q < n && is_digit(s[q])) { q++; d++; }
        if (q < n && s[q] >= 0x80) return -1;
        if (!d) return pos;
        if (part == 0 && (q >= n || s[q] != ':')) return pos;
    }
    if (q + 1 >= n || s[q] != ' ' || s[q + 1] != '[') return pos;
    q += 2;
    Py_ssize_t d = 0;
    while (d < 2 && q < n && is_digit(s[q])) { q++; d++; }
    if (d < 2 && q < n && s[q] >= 0x80) return -1;
    if (!d || q + 1 >= n || s[q] != ']' || s[q + 1] != ' ') return pos;
    *nccl = 1;
    return q + 2;
}

/* logparse._SYSLOG from pos on (after the optional grep file name): the host's span, or 0. ASCII only. */
static int syslog_at(const uint8_t *s, Py_ssize_t n, Py_ssize_t p, Py_ssize_t *h0, Py_ssize_t *h1) {
    if (p < n && s[p] == '<') {
        Py_ssize_t q = p + 1, d = 0;
        while (q < n && is_digit(s[q])) { q++; d++; }
        if (d && q < n && s[q] == '>') p = q + 1;
    }
    if (p + 3 > n || !(s[p] >= 'A' && s[p] <= 'Z') || !(s[p + 1] >= 'a' && s[p + 1] <= 'z') || !(s[p + 2] >= 'a' && s[p + 2] <= 'z')) return 0;
    p += 3;
    if (p >= n || s[p] != ' ') return 0;
    p++;
    if (p < n && s[p] == ' ') p++;
    Py_ssize_t d = 0;
    while (d < 2 && p < n && is_digit(s[p])) { p++; d++; }
    if (!d || p >= n || s[p] != ' ') return 0;
    p++;
    for (int k = 0; k < 3; k++) {
        if (p + 2 > n || !is_digit(s[p]) || !is_digit(s[p + 1])) return 0;
        p += 2;
        if (k < 2) { if (p >= n || s[p] != ':') return 0; p++; }
    }
    if (p + 1 < n && s[p] == '.' && is_digit(s[p + 1])) { p++; while (p < n && is_digit(s[p])) p++; }
    if (p >= n || s[p] != ' ') return 0;
    p++;
    if (p >= n || !is_alnum(s[p])) return 0;
    *h0 = p;
    while (p < n && (is_alnum(s[p]) || s[p] == '.' || s[p] == '-')) p++;
    *h1 = p;
    if (p >= n || s[p] != ' ') return 0;
    p++;
    if (n - p >= 7 && !memcmp(s + p, "kernel:", 7)) return 1;
    Py_ssize_t q = p;
    while (q < n && (is_alnum(s[q]) || s[q] == '_' || s[q] == '.' || s[q] == '-' || s[q] == '/')) q++;
    if (q == p) return 0;
    if (q < n && s[q] == '[') {
        Py_ssize_t r = q + 1, dd = 0;
        while (r < n && is_digit(s[r])) { r++; dd++; }
        if (dd && r + 1 < n && s[r] == ']' && s[r + 1] == ':') return 1;
    }
    return q < n && s[q] == ':';
}

static int syslog_host(const uint8_t *s, Py_ssize_t n, Py_ssize_t *h0, Py_ssize_t *h1) {
    Py_ssize_t q = 0;
    while (q < n && (is_alnum(s[q]) || s[q] == '_' || s[q] == '.' || s[q] == '/' || s[q] == '-')) q++;
    if (q > 0 && q < n && s[q] == ':' && syslog_at(s, n, q + 1, h0, h1)) return 1;
    return syslog_at(s, n, 0, h0, h1);
}

#define SYSLOG_KEY "Jan  1 00:00:00 "
#define SYSLOG_KEY_END " kernel:"

/* The who-spoke key of a line: a string whose `logparse.identity_exprs` node and rank are the line's.
 * - logparse.with_identity_keys' key (the argument is in the comment above logparse._SPOKE_PREFIX):
 *   the prefix where it settles node and rank, else the line;
 * - refinements for ASCII lines, where every test below is exact:
 *   a line that starts with torchrun tags has its node settled when no NCCL `host:pid:tid [gpu] ` can
 *   match anywhere in it (every anchored node pattern fails on such a line, see that comment);
 *   its rank is settled (null) when it holds no `[rank` and no `Rank ` followed by 1-6 digits and `]`
 *   (what the torchrun and c10d patterns need; the Open MPI tag is anchored and needs `[` and a digit);
 *   a syslog line (logparse._SYSLOG matches) whose rank is settled so is keyed by a fixed syslog header
 *   with its host: the node is that host, first in identity_exprs' coalesce, and the rank null. */
static int key_for_line(Part *w, const uint8_t *s, Py_ssize_t n, uint32_t f, const uint8_t **kp, Py_ssize_t *kn) {
    int tags, rank, nccl, ascii = !(f & L_HIGH);
    Py_ssize_t pe = spoke_prefix(s, n, &tags, &rank, &nccl);
    *kp = s; *kn = n;
    if (pe < 0) return 0;
    int no_rank = ascii ? !(f & L_LRANK) && !(f & L_C10D) : !(f & (L_LRANK | L_RANK));
    if (pe > 0) {
        int node_ok = nccl || (tags && (!(f & L_SPB) || (ascii && !(f & L_NCCL))));
        if (node_ok && (rank || no_rank)) { *kn = pe; return 0; }
        return 0;
    }
    Py_ssize_t h0, h1;
    if (ascii && no_rank && syslog_host(s, n, &h0, &h1)) {
        size_t a = sizeof(SYSLOG_KEY) - 1, b = sizeof(SYSLOG_KEY_END) - 1;
        uint8_t *k = arena_alloc(&w->arena, a + (h1 - h0) + b);
        if (!k) return -1;
        memcpy(k, SYSLOG_KEY, a); memcpy(k + a, s + h0, h1 - h0); memcpy(k + a + (h1 - h0), SYSLOG_KEY_END, b);
        *kp = k; *kn = a + (h1 - h0) + b;
    }
    return 0;
}

/* logparse.PROGRESS on an ASCII line: (?i)loss['"]?\s*(?:[:=]|value:)\s*['"]?(?:tensor\()?\s*-?\d
 * (every optional part is taken greedily: giving one back can never let the rest match) */
static int ci_eq(const uint8_t *s, const char *lit, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) if (lower(s[i]) != (uint8_t)lit[i]) return 0;
    return 1;
}

static int progress_match(const uint8_t *s, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i + 4 <= n; i++) {
        if (!ci_eq(s + i, "loss", 4)) continue;
        Py_ssize_t j = i + 4;
        if (j < n && (s[j] == '\'' || s[j] == '"')) j++;
        while (j < n && is_space(s[j])) j++;
        if (j < n && (s[j] == ':' || s[j] == '=')) j++;
        else if (n - j >= 6 && ci_eq(s + j, "value:", 6)) j += 6;
        else continue;
        while (j < n && is_space(s[j])) j++;
        if (j < n && (s[j] == '\'' || s[j] == '"')) j++;
        if (n - j >= 7 && ci_eq(s + j, "tensor(", 7)) j += 7;
        while (j < n && is_space(s[j])) j++;
        if (j < n && s[j] == '-') j++;
        if (j < n && is_digit(s[j])) return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- one line, one part */

static int add_line(Part *w, const uint8_t *s, Py_ssize_t n, uint32_t f) {
    const uint8_t *kp;
    Py_ssize_t kn;
    if (key_for_line(w, s, n, f, &kp, &kn) < 0) return -1;
    int64_t key = count_key(w, kp, kn);
    if (key < 0) return -1;
    Py_ssize_t idx = w->lines++;
    if (f & L_LIT) {
        if (w->ncand == w->candcap && !grow((void **)&w->cand, &w->candcap, sizeof(Line))) return -1;
        w->cand[w->ncand++] = (Line){idx, s, n, (uint32_t)key};
    }
    if (f & L_LOSS) {
        if (!(f & L_HIGH)) {
            if (w->nloss == w->losscap && !grow((void **)&w->loss, &w->losscap, sizeof(Line))) return -1;
            w->loss[w->nloss++] = (Line){idx, s, n, 0};
        }
        else {
            if (w->nunsure == w->unsurecap && !grow((void **)&w->unsure, &w->unsurecap, sizeof(Line))) return -1;
            w->unsure[w->nunsure++] = (Line){idx, s, n, 0};
        }
    }
    return 0;
}

/* flags of a line's final text (after decoding, ANSI stripping, cutting) */
static uint32_t rescan(const Scanner *sc, const uint8_t *s, Py_ssize_t n) {
    uint32_t f = 0, acc = 0;
    const uint8_t *p = s, *end = s + n;
    while (p < end) {  /* a \r or \n cannot be in a line; if one is, scan on after it */
        p = scan_line(sc, s, p, end, &f);
        acc |= f;
        if (p < end) p++;
    }
    return acc & ~L_ESC;
}

/* ANSI CSI sequences out (files._ANSI: \x1b\[[0-9;?]*[ -/]*[@-~]); greedy is exact: the classes are disjoint */
static Py_ssize_t strip_ansi(const uint8_t *s, Py_ssize_t n, uint8_t *out) {
    Py_ssize_t o = 0, i = 0;
    while (i < n) {
        if (s[i] == 0x1b && i + 1 < n && s[i + 1] == '[') {
            Py_ssize_t j = i + 2;
            while (j < n && (is_digit(s[j]) || s[j] == ';' || s[j] == '?')) j++;
            while (j < n && s[j] >= 0x20 && s[j] <= 0x2f) j++;
            if (j < n && s[j] >= 0x40 && s[j] <= 0x7e) { i = j + 1; continue; }
        }
        out[o++] = s[i++];
    }
    return o;
}

/* decoded, stripped, cut: the final text of a raw line; *f updated */
static int finish_line(Part *w, const uint8_t **sp, Py_ssize_t *np, uint32_t *f, int raw) {
    const uint8_t *s = *sp;
    Py_ssize_t n = *np;
    int changed = 0;
    if (raw && (*f & L_HIGH)) {
        if (utf8_valid(s, s + n)) w->replaced += count_fffd(s, s + n);
        else {
            uint8_t *o = arena_alloc(&w->arena, n * 3);
            if (!o) return -1;
            Py_ssize_t k = 0;
            const uint8_t *p = s, *end = s + n;
            while (p < end) {
                if (*p < 0x80) { o[k++] = *p++; continue; }
                int bad, m = utf8_seq(p, end, &bad);
                if (m) { memcpy(o + k, p, m); k += m; p += m; }
                else { o[k++] = 0xEF; o[k++] = 0xBF; o[k++] = 0xBD; p += bad; }
            }
            s = o; n = k;
            w->replaced += count_fffd(s, s + n);
        }
    }
    if (raw && (*f & L_ESC)) {
        uint8_t *o = arena_alloc(&w->arena, n ? n : 1);
        if (!o) return -1;
        n = strip_ansi(s, n, o);
        s = o;
        changed = 1;
    }
    if (!raw && n && s[n - 1] == '\r') { n--; changed = 1; }  /* _frame's strip_suffix("\r") */
    if (n > w->limit) {
        Py_ssize_t chars = 0, cut = -1;
        for (Py_ssize_t i = 0; i < n; i++) if ((s[i] & 0xC0) != 0x80) { if (chars == w->max_line) cut = i; chars++; }
        if (chars > w->limit) {
            if (cut < 0) cut = n;
            char num[32];
            int nn = snprintf(num, sizeof num, "%zd", n - cut);
            uint8_t *o = arena_alloc(&w->arena, cut + w->thn + nn + w->ttn);
            if (!o) return -1;
            memcpy(o, s, cut); memcpy(o + cut, w->th, w->thn); memcpy(o + cut + w->thn, num, nn);
            memcpy(o + cut + w->thn + nn, w->tt, w->ttn);
            s = o; n = cut + w->thn + nn + w->ttn;
            w->truncated++;
            changed = 1;
        }
    }
    if (changed || !raw) *f = rescan(w->sc, s, n);
    *sp = s; *np = n;
    return 0;
}

/* The line [ls, le) of part w is complete (le: its break, or the part's end): decoded, cut, counted.
 * Returns where the next line starts, or NULL out of memory (w->oom). */
static const uint8_t *line_done(Part *w, const uint8_t *ls, const uint8_t *le, uint32_t f) {
    const uint8_t *s = ls, *p = le, *end = w->end;
    Py_ssize_t n = le - ls;
    uint32_t raw = f;
    if (p < end) { p += (*p == '\r' && p + 1 < end && p[1] == '\n') ? 2 : 1; }
    else if (w->final && n && ls[n - 1] == '\r') n--;
    if ((f & (L_HIGH | L_ESC)) || n > w->limit) { if (finish_line(w, &s, &n, &f, 1) < 0) { w->oom = 1; return NULL; } }
    /* The Python path takes ANSI sequences out of the data before it splits: a lone \r, sequences only,
     * then \n, is one \r\n break there, not a break and an empty line. */
    if ((raw & L_ESC) && n == 0 && le < end && *le == '\n' && ls > w->base && ls[-1] == '\r') return p;
    /* past max_lines, lines are still decoded and cut (the counts are the whole piece's) */
    if ((w->max_lines < 0 || w->lines < w->max_lines) && add_line(w, s, n, f) < 0) { w->oom = 1; return NULL; }
    return p;
}

/* The rest of part w, from p inside the line that starts at ls, the automaton in state s with flags f. */
static void run_from(Part *w, const uint8_t *ls, const uint8_t *p, uint32_t s, uint32_t f) {
    const Scanner *sc = w->sc;
    const uint32_t *T = sc->T;
    const uint8_t *cls = sc->cls, *end = w->end;
    uint32_t thr = sc->thr;
    for (;;) {
        for (; p < end; p++) {
            s = T[s + cls[*p]];
            if (s >= thr && (s = on_event(sc, ls, p, end, s, &f)) == BREAK) break;
        }
        /* a last line without a break is a line only at the end of the file (blocks end with a break) */
        if (p >= end) { if (ls < end && w->final) line_done(w, ls, end, f); return; }
        if (!(p = line_done(w, ls, p, f))) return;
        ls = p; s = 0; f = 0;
    }
}

static void run_part(Part *w) { run_from(w, w->start, w->start, 0, 0); }

/* Two parts in one loop, a byte of each per step. Why: the automaton's next state depends on a table
 * load of the one before (a chain of ~5 cycles a byte); two independent chains overlap in the core. */
static void run_pair(Part *a, Part *b) {
    const Scanner *sc = a->sc;
    const uint32_t *T = sc->T;
    const uint8_t *cls = sc->cls, *ea = a->end, *eb = b->end;
    const uint8_t *pa = a->start, *pb = b->start, *la = pa, *lb = pb;
    uint32_t thr = sc->thr, sa = 0, sb = 0, fa = 0, fb = 0;
    while (pa < ea && pb < eb) {
        sa = T[sa + cls[*pa]];
        sb = T[sb + cls[*pb]];
        if (sa >= thr && (sa = on_event(sc, la, pa, ea, sa, &fa)) == BREAK) {
            if (!(pa = line_done(a, la, pa, fa))) return;
            la = pa; sa = 0; fa = 0;
        } else pa++;
        if (sb >= thr && (sb = on_event(sc, lb, pb, eb, sb, &fb)) == BREAK) {
            if (!(pb = line_done(b, lb, pb, fb))) return;
            lb = pb; sb = 0; fb = 0;
        } else pb++;
    }
    run_from(a, la, pa, sa, fa);
    if (!a->oom) run_from(b, lb, pb, sb, fb);
}


/* The literals of router `sc` in line `row` (p, n), each once (`seen`: per literal, the last row holding
 * it), appended to *pairs. 0, or -1 out of memory. */
static int route_line(const Scanner *sc, const uint8_t *p, Py_ssize_t n, Py_ssize_t row, Py_ssize_t *seen,
                      Pair **pairs, Py_ssize_t *npair, Py_ssize_t *cap) {
    const uint32_t *T = sc->T;
    const uint8_t *end = p + n;
    uint32_t s = 0;
    for (; p < end; p++) {
        s = T[s + sc->cls[*p]];
        if (s < sc->thr) continue;
        uint32_t st = s / sc->ncls;
        if (!(sc->flags[st] & F_VER)) { s = 0; continue; }  /* a line break, a byte >= 0x80, ESC */
        for (int32_t t = sc->vhead[st]; t >= 0; t = sc->vnext[t])
            for (int32_t v = sc->vstart[t]; v < sc->vstart[t + 1]; v++) {
                int32_t li = sc->vlit[v], rest = sc->litlen[li] > KEEP ? sc->litlen[li] - KEEP : 0;
                if (seen[li] == row || end - (p + 1) < rest) continue;
                const uint8_t *lt = sc->lit[li] + (sc->litlen[li] - rest);
                int32_t j = 0;
                while (j < rest && lower(p[1 + j]) == lt[j]) j++;
                if (j < rest) continue;
                seen[li] = row;
                if (*npair == *cap && !grow((void **)pairs, cap, sizeof(Pair))) return -1;
                (*pairs)[(*npair)++] = (Pair){row, li};
            }
    }
    return 0;
}

/* The routes of a scanned part's candidates (in its worker thread, after the scan) */
static void route_part(Part *w) {
    if (!w->rt || w->oom || !w->ncand) return;
    Py_ssize_t *seen = malloc(sizeof(Py_ssize_t) * (w->rt->nlit ? w->rt->nlit : 1));
    if (!seen) { w->oom = 1; return; }
    for (Py_ssize_t i = 0; i < w->rt->nlit; i++) seen[i] = -1;
    for (Py_ssize_t j = 0; j < w->ncand; j++)
        if (route_line(w->rt, w->cand[j].p, w->cand[j].len, j, seen, &w->pairs, &w->npair, &w->paircap) < 0) { w->oom = 1; break; }
    free(seen);
}

/* Four parts in one loop, a byte of each per step: four independent chains of table loads in flight
 * instead of two (the loop is bound by the latency of each load, not by the core's throughput). */
#define STEP(i)                                                                                   \
    do {                                                                                          \
        s##i = T[s##i + cls[*p##i]];                                                              \
        if (s##i >= thr && (s##i = on_event(sc, l##i, p##i, e##i, s##i, &f##i)) == BREAK) {        \
            if (!(p##i = line_done(w[i], l##i, p##i, f##i))) return;                              \
            l##i = p##i; s##i = 0; f##i = 0;                                                      \
        } else p##i++;                                                                            \
    } while (0)

static void run_quad(Part **w) {
    const Scanner *sc = w[0]->sc;
    const uint32_t *T = sc->T;
    const uint8_t *cls = sc->cls;
    const uint8_t *e0 = w[0]->end, *e1 = w[1]->end, *e2 = w[2]->end, *e3 = w[3]->end;
    const uint8_t *p0 = w[0]->start, *p1 = w[1]->start, *p2 = w[2]->start, *p3 = w[3]->start;
    const uint8_t *l0 = p0, *l1 = p1, *l2 = p2, *l3 = p3;
    uint32_t thr = sc->thr, s0 = 0, s1 = 0, s2 = 0, s3 = 0, f0 = 0, f1 = 0, f2 = 0, f3 = 0;
    while (p0 < e0 && p1 < e1 && p2 < e2 && p3 < e3) { STEP(0); STEP(1); STEP(2); STEP(3); }
    run_from(w[0], l0, p0, s0, f0);
    if (!w[0]->oom) run_from(w[1], l1, p1, s1, f1);
    if (!w[1]->oom) run_from(w[2], l2, p2, s2, f2);
    if (!w[2]->oom) run_from(w[3], l3, p3, s3, f3);
}
#undef STEP

/* A job: `n` consecutive parts of the data (4, 2 or 1), run interleaved */
typedef struct { Part *w[4]; int n; } Job;

static void *run_job(void *arg) {
    Job *j = arg;
    if (j->n == 4) run_quad(j->w);
    else if (j->n == 2) run_pair(j->w[0], j->w[1]);
    else for (int i = 0; i < j->n; i++) run_part(j->w[i]);
    for (int i = 0; i < j->n; i++) route_part(j->w[i]);
    return NULL;
}

/* Only the last line showing progress counts: the ASCII "loss" lines are matched from the last one back
 * (most of them match, so this reads one or two lines instead of a fifth of the file). */
static void settle_progress(Part *w) {
    for (Py_ssize_t j = w->nloss - 1; j >= 0; j--)
        if (progress_match(w->loss[j].p, w->loss[j].len)) { w->progress = w->loss[j].idx; return; }
}

static void part_free(Part *w) {
    free(w->tab); free(w->cand); free(w->unsure); free(w->loss); free(w->pairs);
    arena_free(&w->arena);
}

static PyObject *str_of(const uint8_t *p, Py_ssize_t n) {
    return PyUnicode_DecodeUTF8((const char *)p, n, "replace");
}

/* scan(scanner, data, pre, final, max_lines, max_line, limit, marker_head, marker_tail, threads, router=None)
 * -> (lines, keys, counts, cand_index, cand_text, cand_key, progress, unsure_index, unsure_text,
 *     replaced, truncated, route_rows, route_lits)
 * route_rows, route_lits: with a router, what `route(router, cand_text)` gives, found by each part's worker
 * thread right after its scan; else None.
 * `pre`: lines already decoded (str) that come before the lines of `data` (bytes-like, ending with a
 * line break unless `final`). Indices count from 0 over pre's lines then data's. */
static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *cap, *pre;
    Py_buffer buf;
    int final, threads;
    Py_ssize_t max_lines, max_line, limit;
    const char *th, *tt;
    Py_ssize_t thn, ttn;
    PyObject *rtcap = Py_None;
    if (!PyArg_ParseTuple(args, "Oy*O!pnnny#y#i|O", &cap, &buf, &PyList_Type, &pre, &final, &max_lines, &max_line,
                          &limit, &th, &thn, &tt, &ttn, &threads, &rtcap)) return NULL;
    Scanner *sc = PyCapsule_GetPointer(cap, "faultline._scan.Scanner");
    if (!sc) { PyBuffer_Release(&buf); return NULL; }
    const Scanner *rt = NULL;
    if (rtcap != Py_None && !(rt = PyCapsule_GetPointer(rtcap, "faultline._scan.Scanner"))) { PyBuffer_Release(&buf); return NULL; }
    Part parts[NPARTS];  /* the decoded lines before the data, then the data's parts */
    memset(parts, 0, sizeof parts);
    for (int i = 0; i < NPARTS; i++) {
        parts[i].sc = sc; parts[i].max_line = max_line; parts[i].limit = limit;
        parts[i].th = (const uint8_t *)th; parts[i].thn = thn; parts[i].tt = (const uint8_t *)tt; parts[i].ttn = ttn;
        parts[i].progress = -1; parts[i].max_lines = -1; parts[i].rt = rt;
    }
    PyObject *result = NULL;
    /* part 0: the already decoded lines */
    Part *w0 = &parts[0];
    Py_ssize_t npre = PyList_GET_SIZE(pre);
    for (Py_ssize_t i = 0; i < npre; i++) {
        Py_ssize_t n;
        const char *u = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(pre, i), &n);
        if (!u) goto done;
        const uint8_t *s = (const uint8_t *)u;
        uint32_t f = 0;
        if (finish_line(w0, &s, &n, &f, 0) < 0
            || ((max_lines < 0 || w0->lines < max_lines) && add_line(w0, s, n, f) < 0)) { PyErr_NoMemory(); goto done; }
    }
    const uint8_t *d = buf.buf, *de = d + buf.len;
    /* The data in up to 8 parts cut at line breaks (two threads, four interleaved parts each; two or one
     * each for smaller data), unless the line limit can end it: a part cannot know how many lines the
     * parts before it hold (it can end the data only if it is below the data's bytes, each line but a last
     * one holding a break byte). */
    Py_ssize_t left = max_lines < 0 ? -1 : (max_lines > w0->lines ? max_lines - w0->lines : 0);
    int unlimited = left < 0 || left >= buf.len;
    int nth = (threads > 1 && unlimited && buf.len > (1 << 20)) ? 2 : 1;
    int per = !unlimited ? 1 : buf.len / nth > (256 << 10) ? 4 : buf.len / nth > (64 << 10) ? 2 : 1;
    int want = nth * per, np = 1;
    Part *dp = parts + 1;
    dp[0].start = d;
    for (int i = 0; i < NPARTS - 1; i++) dp[i].base = d;
    if (!unlimited) dp[0].max_lines = left;
    for (int i = 1; i < want; i++) {
        const uint8_t *m = d + buf.len / want * i;
        if (m < dp[np - 1].start) m = dp[np - 1].start;
        while (m < de && *m != '\n' && *m != '\r') m++;
        if (m < de) m += (*m == '\r' && m + 1 < de && m[1] == '\n') ? 2 : 1;
        if (m >= de) break;
        dp[np - 1].end = m;
        dp[np++].start = m;
    }
    dp[np - 1].end = de;
    dp[np - 1].final = final;
    Job jobs[2];
    memset(jobs, 0, sizeof jobs);
    int njobs;
    if (np == want) {  /* thread j runs parts j * per .. j * per + per - 1 */
        njobs = nth;
        for (int j = 0; j < nth; j++) { jobs[j].n = per; for (int i = 0; i < per; i++) jobs[j].w[i] = &dp[j * per + i]; }
    }
    else njobs = 0;  /* a few long lines: fewer parts than wanted, one after the other */
    Py_BEGIN_ALLOW_THREADS
    route_part(w0);
    if (njobs == 0) for (int i = 0; i < np; i++) { run_part(&dp[i]); route_part(&dp[i]); }
    else {
        pthread_t t;
        int started = njobs == 2 && pthread_create(&t, NULL, run_job, &jobs[1]) == 0;
        run_job(&jobs[0]);
        if (njobs == 2) { if (started) pthread_join(t, NULL); else run_job(&jobs[1]); }
    }
    Py_END_ALLOW_THREADS
    for (int i = 0; i < NPARTS; i++) if (parts[i].oom) { PyErr_NoMemory(); goto done; }
    /* Python objects, parts in order */
    Py_ssize_t nkeys = 0, ncand = 0, nuns = 0, npair = 0, lines = 0, progress = -1, replaced = 0, truncated = 0;
    for (int i = 0; i < NPARTS; i++) {
        nkeys += parts[i].used; ncand += parts[i].ncand; nuns += parts[i].nunsure; npair += parts[i].npair;
    }
    PyObject *keys = PyList_New(nkeys), *counts = PyList_New(nkeys), *ci = PyList_New(ncand), *ct = PyList_New(ncand),
             *ck = PyList_New(ncand), *ui = PyList_New(nuns), *ut = PyList_New(nuns);
    PyObject *rr = rt ? PyList_New(npair) : Py_NewRef(Py_None), *rl = rt ? PyList_New(npair) : Py_NewRef(Py_None);
    if (!keys || !counts || !ci || !ct || !ck || !ui || !ut || !rr || !rl) goto fail;
    Py_ssize_t kbase = 0, cc = 0, uc = 0, pc = 0;
    for (int i = 0; i < NPARTS; i++) {
        Part *w = &parts[i];
        for (uint32_t j = 0; j < w->cap; j++) {
            Entry *e = &w->tab[j];
            if (!e->p) continue;
            PyObject *k = str_of(e->p, e->len), *c = PyLong_FromUnsignedLong(e->count);
            if (!k || !c) { Py_XDECREF(k); Py_XDECREF(c); goto fail; }
            PyList_SET_ITEM(keys, kbase + e->ord, k); PyList_SET_ITEM(counts, kbase + e->ord, c);
        }
        for (Py_ssize_t j = 0; j < w->npair; j++) {  /* rows: candidates of the parts before, then this one's */
            PyObject *x = PyLong_FromSsize_t(cc + w->pairs[j].row), *y = PyLong_FromLong(w->pairs[j].lit);
            if (!x || !y) { Py_XDECREF(x); Py_XDECREF(y); goto fail; }
            PyList_SET_ITEM(rr, pc, x); PyList_SET_ITEM(rl, pc, y); pc++;
        }
        for (Py_ssize_t j = 0; j < w->ncand; j++) {
            Line *l = &w->cand[j];
            PyObject *x = PyLong_FromSsize_t(lines + l->idx), *y = str_of(l->p, l->len),
                     *z = PyLong_FromSsize_t(kbase + l->key);
            if (!x || !y || !z) { Py_XDECREF(x); Py_XDECREF(y); Py_XDECREF(z); goto fail; }
            PyList_SET_ITEM(ci, cc, x); PyList_SET_ITEM(ct, cc, y); PyList_SET_ITEM(ck, cc, z); cc++;
        }
        for (Py_ssize_t j = 0; j < w->nunsure; j++) {
            Line *l = &w->unsure[j];
            PyObject *x = PyLong_FromSsize_t(lines + l->idx), *y = str_of(l->p, l->len);
            if (!x || !y) { Py_XDECREF(x); Py_XDECREF(y); goto fail; }
            PyList_SET_ITEM(ui, uc, x); PyList_SET_ITEM(ut, uc, y); uc++;
        }
        settle_progress(w);
        if (w->progress >= 0) progress = lines + w->progress;
        kbase += w->used;
        lines += w->lines; replaced += w->replaced; truncated += w->truncated;
    }
    result = Py_BuildValue("nNNNNNnNNnnNN", lines, keys, counts, ci, ct, ck, progress, ui, ut, replaced, truncated, rr, rl);
    goto done;
fail:
    Py_XDECREF(keys); Py_XDECREF(counts); Py_XDECREF(ci); Py_XDECREF(ct); Py_XDECREF(ck); Py_XDECREF(ui); Py_XDECREF(ut);
    Py_XDECREF(rr); Py_XDECREF(rl);
done:
    for (int i = 0; i < NPARTS; i++) part_free(&parts[i]);
    PyBuffer_Release(&buf);
    return result;
}


/* route(router, lines: list[str]) -> (rows, literals): every (line, literal) pair of a literal the line holds
 * (ASCII case-insensitive, each pair once, lines in order, literals in the order found), `router` built with
 * route=True. What rules.extract._routes asked Polars' extract_many(overlapping=True) for: the candidate
 * lines' rules, from one automaton pass in C instead of a second Aho-Corasick pass in Polars. The pass runs
 * without the GIL (the native reader routes a piece's candidates in its thread). */

static PyObject *route(PyObject *self, PyObject *args) {
    PyObject *cap, *lines;
    if (!PyArg_ParseTuple(args, "OO!", &cap, &PyList_Type, &lines)) return NULL;
    Scanner *sc = PyCapsule_GetPointer(cap, "faultline._scan.Scanner");
    if (!sc) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(lines), npair = 0, cap_pairs = 0;
    const uint8_t **text = malloc(sizeof(*text) * (n ? n : 1));
    Py_ssize_t *tlen = malloc(sizeof(*tlen) * (n ? n : 1));
    Py_ssize_t *seen = malloc(sizeof(Py_ssize_t) * (sc->nlit ? sc->nlit : 1));  /* the last line holding it */
    Pair *pairs = NULL;
    PyObject *rows = NULL, *hits = NULL;
    int oom = 0;
    if (!text || !tlen || !seen) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {  /* the UTF-8 of each str stays valid while `lines` holds it */
        const char *u = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(lines, i), &tlen[i]);
        if (!u) goto done;
        text[i] = (const uint8_t *)u;
    }
    for (Py_ssize_t i = 0; i < sc->nlit; i++) seen[i] = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && !oom; i++)
        if (route_line(sc, text[i], tlen[i], i, seen, &pairs, &npair, &cap_pairs) < 0) oom = 1;
    Py_END_ALLOW_THREADS
    if (oom) { PyErr_NoMemory(); goto done; }
    rows = PyList_New(npair); hits = PyList_New(npair);
    if (!rows || !hits) goto done;
    for (Py_ssize_t k = 0; k < npair; k++) {
        PyObject *a = PyLong_FromSsize_t(pairs[k].row), *b = PyLong_FromLong(pairs[k].lit);
        if (!a || !b) { Py_XDECREF(a); Py_XDECREF(b); goto done; }
        PyList_SET_ITEM(rows, k, a); PyList_SET_ITEM(hits, k, b);
    }
    free(text); free(tlen); free(seen); free(pairs);
    return Py_BuildValue("NN", rows, hits);
done:
    free(text); free(tlen); free(seen); free(pairs);
    Py_XDECREF(rows); Py_XDECREF(hits);
    return NULL;
}

static PyMethodDef methods[] = {
    {"build", build, METH_VARARGS, "build(literals: list[bytes], route=False) -> scanner (or router), or None"},
    {"route", route, METH_VARARGS, "route(router, lines: list[str]) -> (rows, literals) of the literals each line holds"},
    {"scan", scan, METH_VARARGS, "scan one block of lines (see faultline/_scan.c)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&mod); }
