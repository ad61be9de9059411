/* The KV index's record table: (pod slot, tier, engine hash) -> block key, ~30 bytes a record.
 *
 * Why C: the same table as Python dicts and ints held 215-314 bytes per record in steady state
 * (docs/bench/microbenchmarks.md#kv-index: a 32-byte key int, a 48-byte record int, two dict
 * entries, dicts kept at 3x their live size by churn). epp.kvcache.index keeps the event logic;
 * this file only stores.
 *
 * Layout (structure of arrays, so scans touch only the array they need):
 * - the slab: record i is key[i] (uint64), eng[i] (uint64), meta[i] (uint32: slot 16 bits, tier
 *   4, recency stamp 12). Ids start at 1; freed ids are chained through eng[] and reused first,
 *   so in steady state the slab is as large as the most records ever held at once (it grows by
 *   1/8, in place: large blocks are mmap'ed and realloc remaps them). 20-22.5 bytes.
 * - two Robin Hood hash indexes of uint32 entries (id 28 bits, probe distance 4 bits, saturated
 *   at 15: a longer distance is computed from the slab), one by key (a multimap: a key's holders
 *   sit together after its home slot) and one by (slot, tier, engine hash) (unique). Both hold one
 *   entry per record and grow together by 1.25x at 90% load, so they cost 8.9-11.1 bytes a record.
 *   Robin Hood order lets a lookup skip entries of other homes by their distance alone, without
 *   reading the slab, and lets a deletion shift its cluster back without re-hashing.
 * - extra copies of a record (vLLM may store one hash twice) in a dict {id: copies}, rare.
 *
 * Recency: a key's records carry the stamp of the epoch it was last stored or matched in (all of
 * a key's records share it); an epoch ends after max_entries/64 records were stamped (so the cap
 * sees 64 of them: LRU to 1/64 of the cap). Past the cap, whole keys of the oldest epoch go,
 * found by a hand walking the stamps in slab order (~64 stamps read per record evicted). Stamps
 * are 12 bits: before an epoch would alias a live one, the oldest half is merged into one epoch.
 *
 * One writer, any number of readers: the table lives in one mapping (anonymous, or a memfd that
 * other processes map: `epp --workers N` shares the supervisor's index with its workers), laid out
 * for the most records `max_entries` allows, so nothing ever moves: pages are committed as they
 * are first touched, and the two indexes are double-buffered (a rebuild fills the idle copy, then
 * switches; the old copy's pages are given back). The writer brackets every change of the
 * indexes with a sequence counter (odd while it changes them); a reader (RecordTable.attach)
 * looks up each block's records, then checks the counter did not move, and looks again if it
 * did: a seqlock, so the writer never waits for a reader. Readers do not restamp: they mark the
 * records they matched in a byte array the writer reads when it evicts (a marked key is
 * restamped instead: a second chance).
 *
 * Within a process every method runs holding the GIL, so a call sees no other half done.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ID_BITS 28
#define ID_MASK ((1u << ID_BITS) - 1u)
#define MAX_ID ID_MASK
#define DIST_SAT 15u
#define FREE_SLOT 0xFFFFu
#define MAX_SLOT (FREE_SLOT - 1u)
#define MAX_TIER 15u
#define STAMP_BITS 12
#define STAMPS (1u << STAMP_BITS)
#define STAMP_MASK (STAMPS - 1u)
#define MAX_LOAD_NUM 9u /* grow the indexes past 9/10 full */
#define MAX_LOAD_DEN 10u
#define EPOCHS_PER_CAP 64u
#define REGION_MAGIC 0x3178646e69766b65ULL /* "ekvindx1" */
#define PAGE 4096u
#define RD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)

#define META(st, stamp) (((uint32_t)(st) << STAMP_BITS) | ((stamp) & STAMP_MASK))
#define M_ST(m) ((m) >> STAMP_BITS)          /* slot << 4 | tier */
#define M_SLOT(m) ((m) >> (STAMP_BITS + 4))
#define M_TIER(m) (((m) >> STAMP_BITS) & 15u)
#define M_STAMP(m) ((m) & STAMP_MASK)
#define FREE_META ((uint32_t)FREE_SLOT << (STAMP_BITS + 4))
#define IS_FREE(m) (M_SLOT(m) == FREE_SLOT)

/* Shared by the writer and its readers, at the start of the mapping. */
typedef struct {
    uint64_t magic;
    uint64_t seq; /* odd while the writer changes the indexes */
    uint64_t max_entries;
    uint64_t max_slab; /* ids below it fit the slab */
    uint64_t max_cap;  /* entries each index copy has room for */
    uint64_t off_key, off_eng, off_meta, off_ref, off_ix[4]; /* key index copies 0, 1; engine 0, 1 */
    uint64_t size;
    uint64_t entries, keys, evictions;
    uint64_t fill; /* records stamped in this epoch */
    uint64_t epoch_len;
    uint32_t top;       /* ids below it were used at some time */
    uint32_t free_head; /* freed ids, chained through eng[] */
    uint32_t cap;       /* entries of the active index copies */
    uint32_t active;    /* which copies: 0 or 1 */
    uint32_t epoch;     /* absolute; its stamp is epoch & STAMP_MASK */
    uint32_t oldest;    /* no live record is older */
    uint32_t hand;      /* the eviction scan's next id */
    uint32_t reserved;
    uint32_t count[STAMPS]; /* records per stamp */
} Header;

typedef struct {
    PyObject_HEAD
    void *base; /* the mapping */
    size_t size;
    int writer;
    Header *h;
    uint64_t *key;
    uint64_t *eng;
    uint32_t *meta;
    uint8_t *ref; /* a reader matched the record since the writer last looked */
    uint32_t *ixr[4];
    /* the writer's view of the active copies */
    uint32_t *ia; /* by key */
    uint32_t *ib; /* by (slot, tier, engine) */
    uint32_t cap;
    PyObject *dups; /* {id: extra copies}, the writer's */
    /* match scratch, per slot */
    uint32_t nscratch;
    int32_t *alive_pos;
    uint32_t *seen;
    uint32_t *offmark;
    uint32_t *offgpu;
    uint32_t *alive;
    /* a key's records: ids (and, for readers, their meta as read) */
    uint32_t *ids;
    uint32_t *metas;
    uint32_t ids_cap;
    /* match: the walk's records of each matched key (run[i] .. run[i + 1]), touched after it */
    uint32_t *run_ids;
    uint32_t *run_off;
    size_t run_ids_cap, run_off_cap;
} Table;

/* --- hashing ---------------------------------------------------------------------------------- */

static inline uint64_t mix(uint64_t x) { /* murmur3's finalizer: keys and engine hashes may be small ints */
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static inline uint32_t home_of(uint64_t h, uint32_t cap) { return (uint32_t)(((h >> 32) * (uint64_t)cap) >> 32); }
static inline uint64_t hash_a(uint64_t key) { return mix(key); }
static inline uint64_t hash_b(uint32_t st, uint64_t eng) { return mix(eng ^ ((uint64_t)st * 0x9E3779B97F4A7C15ULL)); }
static inline uint32_t home_a(const Table *t, uint32_t id, uint32_t cap) { return home_of(hash_a(t->key[id]), cap); }
static inline uint32_t home_b(const Table *t, uint32_t id, uint32_t cap) {
    return home_of(hash_b(M_ST(t->meta[id]), t->eng[id]), cap);
}
static inline uint32_t next_pos(uint32_t p, uint32_t cap) { return p + 1 == cap ? 0 : p + 1; }
static inline uint32_t pack(uint32_t id, uint32_t dist) { return ((dist < DIST_SAT ? dist : DIST_SAT) << ID_BITS) | id; }

/* The probe distance of entry x at pos of an index of `cap` entries, `which` (0: by key, 1: by engine). */
static inline uint32_t dist_of(const Table *t, int which, uint32_t x, uint32_t pos, uint32_t cap) {
    uint32_t d = x >> ID_BITS;
    if (d < DIST_SAT) return d;
    uint32_t id = x & ID_MASK;
    uint32_t home = which ? home_b(t, id, cap) : home_a(t, id, cap);
    return pos >= home ? pos - home : pos + cap - home;
}

/* The writer brackets every change of the indexes (readers retry a lookup that overlapped one). */
static inline void write_begin(Table *t) {
    uint64_t s = t->h->seq;
    __atomic_store_n(&t->h->seq, s + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

static inline void write_end(Table *t) { __atomic_store_n(&t->h->seq, t->h->seq + 1, __ATOMIC_RELEASE); }

static void ix_insert(Table *t, int which, uint32_t *e, uint32_t cap, uint32_t home, uint32_t id) {
    uint32_t pos = home, dist = 0, cur = id;
    for (;;) {
        uint32_t x = e[pos];
        if (!x) {
            e[pos] = pack(cur, dist);
            return;
        }
        uint32_t xd = dist_of(t, which, x, pos, cap);
        if (xd < dist) { /* Robin Hood: the richer entry moves on */
            e[pos] = pack(cur, dist);
            cur = x & ID_MASK;
            dist = xd;
        }
        pos = next_pos(pos, cap);
        dist++;
    }
}

static void ix_delete_at(Table *t, int which, uint32_t *e, uint32_t pos) {
    for (;;) {
        uint32_t nxt = next_pos(pos, t->cap);
        uint32_t x = e[nxt];
        if (!x) break;
        uint32_t xd = dist_of(t, which, x, nxt, t->cap);
        if (!xd) break;
        e[pos] = pack(x & ID_MASK, xd - 1);
        pos = nxt;
    }
    e[pos] = 0;
}

/* Position in the key index of record `id`, or UINT32_MAX. */
static uint32_t find_a_id(const Table *t, uint32_t id) {
    uint32_t pos = home_a(t, id, t->cap), dist = 0;
    for (;;) {
        uint32_t x = t->ia[pos];
        if (!x) return UINT32_MAX;
        if ((x & ID_MASK) == id) return pos;
        if (dist_of(t, 0, x, pos, t->cap) < dist) return UINT32_MAX;
        pos = next_pos(pos, t->cap);
        dist++;
    }
}

/* Position in the engine index of (st, eng), or UINT32_MAX. */
static uint32_t find_b(const Table *t, uint32_t st, uint64_t eng) {
    if (!t->cap) return UINT32_MAX;
    uint32_t pos = home_of(hash_b(st, eng), t->cap), dist = 0;
    for (;;) {
        uint32_t x = t->ib[pos];
        if (!x) return UINT32_MAX;
        uint32_t xd = dist_of(t, 1, x, pos, t->cap);
        if (xd < dist) return UINT32_MAX;
        if (xd == dist) {
            uint32_t id = x & ID_MASK;
            if (t->eng[id] == eng && M_ST(t->meta[id]) == st) return pos;
        }
        pos = next_pos(pos, t->cap);
        dist++;
    }
}

/* Room for n + 1 ids (and metas) in the scratch: 0, or -1 (memory error set). */
static int reserve_ids(Table *t, Py_ssize_t n) {
    if ((uint32_t)n < t->ids_cap) return 0;
    uint32_t ncap = t->ids_cap ? t->ids_cap * 2 : 64;
    uint32_t *ids = PyMem_Realloc(t->ids, (size_t)ncap * sizeof(uint32_t));
    if (ids) t->ids = ids;
    uint32_t *metas = PyMem_Realloc(t->metas, (size_t)ncap * sizeof(uint32_t));
    if (metas) t->metas = metas;
    if (!ids || !metas) {
        PyErr_NoMemory();
        return -1;
    }
    t->ids_cap = ncap;
    return 0;
}

/* The writer: the records holding `key` into t->ids; their number, or -1 (memory error). */
static Py_ssize_t holders(Table *t, uint64_t key) {
    Py_ssize_t n = 0;
    if (!t->cap) return 0;
    uint32_t pos = home_of(hash_a(key), t->cap), dist = 0;
    for (;;) {
        uint32_t x = t->ia[pos];
        if (!x) return n;
        uint32_t xd = dist_of(t, 0, x, pos, t->cap);
        if (xd < dist) return n;
        if (xd == dist) {
            uint32_t id = x & ID_MASK;
            if (t->key[id] == key) {
                if (reserve_ids(t, n) < 0) return -1;
                t->ids[n++] = id;
            }
        }
        pos = next_pos(pos, t->cap);
        dist++;
    }
}

/* A reader: the records holding `key` into t->ids and their meta into t->metas, as the writer
 * left them between two changes (retried until no change overlapped); their number, or -1. */
static Py_ssize_t holders_read(Table *t, uint64_t key) {
    Header *h = t->h;
    uint32_t max_slab = (uint32_t)h->max_slab;
    for (unsigned spins = 0;; spins++) {
        uint64_t s1 = __atomic_load_n(&h->seq, __ATOMIC_ACQUIRE);
        if (s1 & 1) {
            if (spins > 64) sched_yield(); /* the writer is in a change (microseconds) */
            continue;
        }
        uint32_t cap = RD(h->cap);
        const uint32_t *ia = t->ixr[RD(h->active) & 1];
        Py_ssize_t n = 0;
        int torn = 0;
        if (cap) {
            uint32_t pos = home_of(hash_a(key), cap), dist = 0;
            for (uint32_t steps = 0;; steps++) {
                uint32_t x = RD(ia[pos]);
                uint32_t id = x & ID_MASK;
                if (!x) break;
                if (id >= max_slab || steps > cap) { /* a torn read: look again */
                    torn = 1;
                    break;
                }
                uint32_t xd = x >> ID_BITS;
                if (xd == DIST_SAT) {
                    uint32_t home = home_of(hash_a(RD(t->key[id])), cap);
                    xd = pos >= home ? pos - home : pos + cap - home;
                }
                if (xd < dist) break;
                if (xd == dist && RD(t->key[id]) == key) {
                    if (reserve_ids(t, n) < 0) return -1;
                    t->ids[n] = id;
                    t->metas[n++] = RD(t->meta[id]);
                }
                pos = next_pos(pos, cap);
                dist++;
            }
        }
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (!torn && __atomic_load_n(&h->seq, __ATOMIC_RELAXED) == s1) return n;
    }
}

/* --- layout and growth ------------------------------------------------------------------------ */

static uint64_t round_page(uint64_t n) { return (n + PAGE - 1) / PAGE * PAGE; }

/* The index capacities the table grows through: 64, then 1.25x each time. */
static uint64_t next_cap(uint64_t cap) { return cap ? cap + cap / 4 : 64; }

/* The mapping's layout for `max_entries`: header fields set, size returned. */
static uint64_t layout(Header *h, uint64_t max_entries) {
    /* Room for one event's blocks past the cap before it evicts, and for id 0. */
    uint64_t slab = max_entries + (max_entries / 8 > 65536 ? max_entries / 8 : 65536) + 1;
    if (slab > (uint64_t)MAX_ID + 1) slab = (uint64_t)MAX_ID + 1;
    uint64_t cap = 0;
    while (cap * MAX_LOAD_NUM < slab * MAX_LOAD_DEN) cap = next_cap(cap);
    h->max_entries = max_entries;
    h->max_slab = slab;
    h->max_cap = cap;
    uint64_t off = round_page(sizeof(Header));
    h->off_key = off;
    off = round_page(off + slab * sizeof(uint64_t));
    h->off_eng = off;
    off = round_page(off + slab * sizeof(uint64_t));
    h->off_meta = off;
    off = round_page(off + slab * sizeof(uint32_t));
    h->off_ref = off;
    off = round_page(off + slab);
    for (int i = 0; i < 4; i++) {
        h->off_ix[i] = off;
        off = round_page(off + cap * sizeof(uint32_t));
    }
    h->size = off;
    return off;
}

static void point(Table *t) {
    char *b = t->base;
    Header *h = t->h = (Header *)t->base;
    t->key = (uint64_t *)(b + h->off_key);
    t->eng = (uint64_t *)(b + h->off_eng);
    t->meta = (uint32_t *)(b + h->off_meta);
    t->ref = (uint8_t *)(b + h->off_ref);
    for (int i = 0; i < 4; i++) t->ixr[i] = (uint32_t *)(b + h->off_ix[i]);
    t->ia = t->ixr[h->active];
    t->ib = t->ixr[2 + h->active];
    t->cap = h->cap;
}

/* Give an index copy's pages back (they read as zeros again). */
static void release(uint32_t *region, uint64_t entries) {
    uint64_t bytes = round_page(entries * sizeof(uint32_t));
    if (!bytes) return;
    /* A shared mapping (memfd) frees its pages with MADV_REMOVE, a private one with DONTNEED. */
    if (madvise(region, bytes, MADV_REMOVE) != 0 && madvise(region, bytes, MADV_DONTNEED) != 0) {
        memset(region, 0, entries * sizeof(uint32_t));
    }
}

/* Fill the idle index copies for `ncap` entries, then switch to them. Readers go on reading the
 * active copies meanwhile (the slab does not change): only the switch is a change to them. */
static void rebuild(Table *t, uint32_t ncap) {
    Header *h = t->h;
    uint32_t idle = h->active ^ 1;
    uint32_t *ia = t->ixr[idle], *ib = t->ixr[2 + idle];
    for (uint32_t id = 1; id < h->top; id++) {
        if (IS_FREE(t->meta[id])) continue;
        ix_insert(t, 0, ia, ncap, home_a(t, id, ncap), id);
        ix_insert(t, 1, ib, ncap, home_b(t, id, ncap), id);
    }
    uint32_t *old_a = t->ia, *old_b = t->ib, old_cap = t->cap;
    write_begin(t);
    h->cap = ncap;
    h->active = idle;
    write_end(t);
    t->ia = ia;
    t->ib = ib;
    t->cap = ncap;
    release(old_a, old_cap);
    release(old_b, old_cap);
}

static uint64_t evict_to(Table *t, uint64_t limit);

/* Room for one more record in the slab and the indexes; its id, or 0 (error set). */
static uint32_t alloc_id(Table *t) {
    Header *h = t->h;
    if ((uint64_t)(h->entries + 1) * MAX_LOAD_DEN > (uint64_t)t->cap * MAX_LOAD_NUM) {
        uint64_t ncap = next_cap(t->cap);
        if (ncap > h->max_cap) ncap = h->max_cap;
        if (ncap > t->cap) rebuild(t, (uint32_t)ncap);
    }
    if (!h->free_head && h->top == h->max_slab) {
        /* One event brought more blocks than the slab's room past the cap: make room now. */
        evict_to(t, h->entries ? h->entries - 1 : 0);
    }
    uint32_t id = h->free_head;
    if (id) {
        h->free_head = (uint32_t)t->eng[id];
        return id;
    }
    if (h->top == h->max_slab) {
        PyErr_SetString(PyExc_MemoryError, "KV index: no room for another record");
        return 0;
    }
    if (h->top == 0) h->top = 1; /* id 0 marks an empty index slot */
    return h->top++;
}

/* --- recency ---------------------------------------------------------------------------------- */

static inline uint32_t age_of(const Table *t, uint32_t m) { return (t->h->epoch - M_STAMP(m)) & STAMP_MASK; }

/* Merge every record older than half the stamp range into one epoch, so the next ones never
 * alias a live stamp. Runs once per STAMPS/2 epochs at most. */
static void renormalize(Table *t) {
    uint32_t limit = STAMPS / 2;
    uint32_t to = (t->h->epoch - limit) & STAMP_MASK;
    for (uint32_t id = 1; id < t->h->top; id++) {
        uint32_t m = t->meta[id];
        if (IS_FREE(m) || age_of(t, m) <= limit) continue;
        t->h->count[M_STAMP(m)]--;
        t->h->count[to]++;
        t->meta[id] = META(M_ST(m), to);
    }
    t->h->oldest = t->h->epoch - limit;
}

/* Called between operations on whole keys, never within one: a key's records share a stamp. */
static inline void maybe_advance(Table *t) {
    if (t->h->fill < t->h->epoch_len) return;
    t->h->fill = 0;
    while (t->h->oldest != t->h->epoch && !t->h->count[t->h->oldest & STAMP_MASK]) t->h->oldest++;
    if (t->h->epoch + 1 - t->h->oldest >= STAMPS - 1) renormalize(t);
    t->h->epoch++;
}

static inline void stamp(Table *t, uint32_t id) {
    uint32_t m = t->meta[id], s = t->h->epoch & STAMP_MASK;
    if (M_STAMP(m) == s) return;
    t->h->count[M_STAMP(m)]--;
    t->h->count[s]++;
    t->meta[id] = META(M_ST(m), s);
    t->h->fill++;
}

/* --- records ---------------------------------------------------------------------------------- */

static void free_record(Table *t, uint32_t id) {
    uint32_t m = t->meta[id];
    t->h->count[M_STAMP(m)]--;
    t->meta[id] = FREE_META;
    t->eng[id] = t->h->free_head;
    t->h->free_head = id;
    t->h->entries--;
}

/* Drop record `id` (found at `pos_b` in the engine index) and its copies. 1 if it was the key's
 * last record. */
static int drop_record(Table *t, uint32_t id, uint32_t pos_b) {
    uint64_t key = t->key[id];
    uint32_t pos_a = find_a_id(t, id);
    write_begin(t);
    ix_delete_at(t, 1, t->ib, pos_b);
    if (pos_a != UINT32_MAX) ix_delete_at(t, 0, t->ia, pos_a);
    free_record(t, id);
    write_end(t);
    if (PyDict_GET_SIZE(t->dups)) {
        PyObject *k = PyLong_FromUnsignedLong(id);
        if (k) {
            if (PyDict_DelItem(t->dups, k) < 0) PyErr_Clear();
            Py_DECREF(k);
        } else {
            PyErr_Clear();
        }
    }
    Py_ssize_t left = holders(t, key);
    if (left < 0) PyErr_Clear();
    if (left == 0) {
        t->h->keys--;
        return 1;
    }
    return 0;
}

/* Add copy number +1 of record `id`: 0 or -1. */
static int add_copy(Table *t, uint32_t id, long delta, long *left) {
    PyObject *k = PyLong_FromUnsignedLong(id);
    if (!k) return -1;
    PyObject *v = PyDict_GetItemWithError(t->dups, k);
    if (!v && PyErr_Occurred()) {
        Py_DECREF(k);
        return -1;
    }
    long n = (v ? PyLong_AsLong(v) : 0) + delta;
    if (left) *left = n;
    int rc;
    if (n > 0) {
        PyObject *nv = PyLong_FromLong(n);
        rc = nv ? PyDict_SetItem(t->dups, k, nv) : -1;
        Py_XDECREF(nv);
    } else {
        rc = v ? PyDict_DelItem(t->dups, k) : 0;
    }
    Py_DECREF(k);
    return rc;
}

/* Touch every record of `key` (a use): 0, or -1 on a memory error. */
static int touch(Table *t, uint64_t key) {
    Py_ssize_t n = holders(t, key);
    if (n < 0) return -1;
    for (Py_ssize_t i = 0; i < n; i++) stamp(t, t->ids[i]);
    return 0;
}

/* Record (st, eng) -> key, touching the key: 1 if new, 0 for another copy, -1 on error. */
static int add(Table *t, uint32_t st, uint64_t eng, uint64_t key) {
    maybe_advance(t);
    uint32_t pos = find_b(t, st, eng);
    if (pos != UINT32_MAX) {
        /* Another copy of a block this pod and tier hold; its key stays the first one. */
        uint32_t id = t->ib[pos] & ID_MASK;
        if (add_copy(t, id, 1, NULL) < 0) return -1;
        return touch(t, t->key[id]);
    }
    uint32_t id = alloc_id(t); /* first: it may rebuild the indexes, or evict */
    if (!id) return -1;
    Py_ssize_t n = holders(t, key);
    if (n < 0) {
        t->meta[id] = FREE_META;
        t->eng[id] = t->h->free_head;
        t->h->free_head = id;
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) stamp(t, t->ids[i]);
    uint32_t s = t->h->epoch & STAMP_MASK;
    t->key[id] = key;
    t->eng[id] = eng;
    t->meta[id] = META(st, s);
    t->ref[id] = 0;
    t->h->count[s]++;
    t->h->fill++;
    t->h->entries++;
    if (!n) t->h->keys++;
    write_begin(t);
    ix_insert(t, 0, t->ia, t->cap, home_a(t, id, t->cap), id);
    ix_insert(t, 1, t->ib, t->cap, home_b(t, id, t->cap), id);
    write_end(t);
    return 1;
}

/* Evict whole keys, oldest epoch first, until at most `limit` records are left. A key a reader
 * matched since the writer last looked (its records' `ref` marks) is restamped instead. */
static uint64_t evict_to(Table *t, uint64_t limit) {
    Header *h = t->h;
    uint64_t evicted = 0;
    while (h->entries > limit) {
        while (h->oldest != h->epoch && !h->count[h->oldest & STAMP_MASK]) h->oldest++;
        uint32_t want = h->oldest & STAMP_MASK;
        if (!h->count[want]) break; /* nothing live: cannot happen while entries > 0 */
        uint32_t id = h->hand;
        uint64_t scanned = 0;
        for (;; id++) {
            if (id == 0 || id >= h->top) id = 1;
            uint32_t m = t->meta[id];
            if (!IS_FREE(m) && M_STAMP(m) == want) break;
            if (++scanned > 2 * (uint64_t)h->top) { /* counts disagree: cannot happen */
                h->evictions += evicted;
                return evicted;
            }
        }
        h->hand = id + 1;
        Py_ssize_t n = holders(t, t->key[id]);
        if (n <= 0) { /* a memory error (or a record not in the key index: cannot happen) */
            PyErr_Clear();
            break;
        }
        int used = 0;
        for (Py_ssize_t i = 0; i < n; i++) used |= RD(t->ref[t->ids[i]]);
        if (used) { /* a second chance: the key is as young as the epoch */
            for (Py_ssize_t i = 0; i < n; i++) {
                t->ref[t->ids[i]] = 0;
                stamp(t, t->ids[i]);
            }
            continue;
        }
        uint32_t *pos_b = t->metas; /* the scratch's second array: the engine index positions */
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t r = t->ids[i];
            pos_b[i] = find_b(t, M_ST(t->meta[r]), t->eng[r]);
            if (PyDict_GET_SIZE(t->dups)) {
                PyObject *k = PyLong_FromUnsignedLong(r);
                if (!k || PyDict_DelItem(t->dups, k) < 0) PyErr_Clear();
                Py_XDECREF(k);
            }
        }
        write_begin(t);
        /* Positions move as entries are deleted: look each up again but for the first. */
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t r = t->ids[i];
            uint32_t pb = i ? find_b(t, M_ST(t->meta[r]), t->eng[r]) : pos_b[0];
            if (pb != UINT32_MAX) ix_delete_at(t, 1, t->ib, pb);
            uint32_t pa = find_a_id(t, r);
            if (pa != UINT32_MAX) ix_delete_at(t, 0, t->ia, pa);
        }
        for (Py_ssize_t i = 0; i < n; i++) free_record(t, t->ids[i]);
        write_end(t);
        h->keys--;
        evicted += (uint64_t)n;
    }
    h->evictions += evicted;
    return evicted;
}

static uint64_t evict(Table *t) { return evict_to(t, t->h->max_entries); }

/* --- Python methods --------------------------------------------------------------------------- */

static int not_writer(Table *t) {
    if (t->writer) return 0;
    PyErr_SetString(PyExc_TypeError, "a reader of the KV index cannot change it");
    return 1;
}

static int check_st(long slot, long tier) {
    if (slot < 0 || slot > (long)MAX_SLOT || tier < 0 || tier > (long)MAX_TIER) {
        PyErr_Format(PyExc_ValueError, "slot %ld or tier %ld out of range", slot, tier);
        return -1;
    }
    return 0;
}

static int u64(PyObject *o, uint64_t *out) {
#if ULONG_MAX == UINT64_MAX
    /* CPython 3.11's PyLong_AsUnsignedLongLong takes a two-digit int (every key past 2**30) through
     * _PyLong_AsByteArray; PyLong_AsUnsignedLong reads its digits directly: ~1/5 of a match's
     * time per key went to the former. */
    unsigned long v = PyLong_AsUnsignedLong(o);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
#else
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
#endif
    *out = (uint64_t)v;
    return 0;
}

PyDoc_STRVAR(store_doc,
             "store(slot, tier, engine_hashes, keys) -> (added, evicted)\n\n"
             "Record each engine hash -> key for (slot, tier), last first (the first block ends\n"
             "youngest), touching each key; then evict past the cap. `added` counts new records.");

static PyObject *Table_store(Table *t, PyObject *args) {
    if (not_writer(t)) return NULL;
    long slot, tier;
    PyObject *engs, *keys;
    if (!PyArg_ParseTuple(args, "llOO", &slot, &tier, &engs, &keys) || check_st(slot, tier) < 0) return NULL;
    PyObject *fe = PySequence_Fast(engs, "engine_hashes must be a sequence");
    if (!fe) return NULL;
    PyObject *fk = PySequence_Fast(keys, "keys must be a sequence");
    if (!fk) {
        Py_DECREF(fe);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fe);
    PyObject *out = NULL;
    long added = 0;
    if (PySequence_Fast_GET_SIZE(fk) != n) {
        PyErr_SetString(PyExc_ValueError, "engine_hashes and keys differ in length");
        goto done;
    }
    uint32_t st = (uint32_t)(slot << 4 | tier);
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        uint64_t e, k;
        if (u64(PySequence_Fast_GET_ITEM(fe, i), &e) < 0 || u64(PySequence_Fast_GET_ITEM(fk, i), &k) < 0) goto done;
        int r = add(t, st, e, k);
        if (r < 0) goto done;
        added += r;
    }
    out = Py_BuildValue("lK", added, (unsigned long long)evict(t));
done:
    Py_DECREF(fe);
    Py_DECREF(fk);
    return out;
}

static uint32_t resolve_pos(Table *t, long slot, long tier, unsigned long tiers, uint64_t e) {
    uint32_t pos = find_b(t, (uint32_t)(slot << 4 | tier), e);
    for (unsigned long rest = tiers & ~(1ul << tier), ti = 0; pos == UINT32_MAX && rest; ti++, rest >>= 1) {
        if (rest & 1) pos = find_b(t, (uint32_t)(slot << 4 | (long)ti), e);
    }
    return pos;
}

PyDoc_STRVAR(resolve_doc,
             "resolve(slot, tier, tiers, engine_hash) -> key | None\n\n"
             "The key `engine_hash` stands for on the pod, in `tier` first, then in each other tier\n"
             "of the bit mask `tiers`, lowest first.");

static PyObject *Table_resolve(Table *t, PyObject *args) {
    if (not_writer(t)) return NULL;
    long slot, tier;
    unsigned long tiers;
    PyObject *eo;
    uint64_t e;
    if (!PyArg_ParseTuple(args, "llkO", &slot, &tier, &tiers, &eo) || check_st(slot, tier) < 0) return NULL;
    if (u64(eo, &e) < 0) return NULL;
    uint32_t pos = resolve_pos(t, slot, tier, tiers, e);
    if (pos == UINT32_MAX) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(t->key[t->ib[pos] & ID_MASK]);
}

PyDoc_STRVAR(retier_doc,
             "retier(slot, tier, tiers, engine_hashes) -> (stored, orphans, added, evicted)\n\n"
             "An offloading connector's placeholder: each hash the pod knows (resolve) gets a record\n"
             "in `tier`; the others are orphans. Then evict past the cap.");

static PyObject *Table_retier(Table *t, PyObject *args) {
    if (not_writer(t)) return NULL;
    long slot, tier;
    unsigned long tiers;
    PyObject *engs;
    if (!PyArg_ParseTuple(args, "llkO", &slot, &tier, &tiers, &engs) || check_st(slot, tier) < 0) return NULL;
    PyObject *fe = PySequence_Fast(engs, "engine_hashes must be a sequence");
    if (!fe) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fe);
    long stored = 0, orphans = 0, added = 0;
    uint32_t st = (uint32_t)(slot << 4 | tier);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t e;
        if (u64(PySequence_Fast_GET_ITEM(fe, i), &e) < 0) {
            Py_DECREF(fe);
            return NULL;
        }
        uint32_t pos = resolve_pos(t, slot, tier, tiers, e);
        if (pos == UINT32_MAX) {
            orphans++;
            continue;
        }
        int r = add(t, st, e, t->key[t->ib[pos] & ID_MASK]);
        if (r < 0) {
            Py_DECREF(fe);
            return NULL;
        }
        added += r;
        stored++;
    }
    Py_DECREF(fe);
    return Py_BuildValue("lllK", stored, orphans, added, (unsigned long long)evict(t));
}

PyDoc_STRVAR(remove_doc,
             "remove(slot, tier, engine_hashes) -> (removed, missed, deduplicated)\n\n"
             "Drop one copy of each record; hashes not held are counted as missed. `deduplicated`\n"
             "counts the removals (of `removed`) that left another copy, so the record stays.");

static PyObject *Table_remove(Table *t, PyObject *args) {
    if (not_writer(t)) return NULL;
    long slot, tier;
    PyObject *engs;
    if (!PyArg_ParseTuple(args, "llO", &slot, &tier, &engs) || check_st(slot, tier) < 0) return NULL;
    PyObject *fe = PySequence_Fast(engs, "engine_hashes must be a sequence");
    if (!fe) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fe);
    long removed = 0, missed = 0, deduplicated = 0;
    uint32_t st = (uint32_t)(slot << 4 | tier);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t e;
        if (u64(PySequence_Fast_GET_ITEM(fe, i), &e) < 0) {
            Py_DECREF(fe);
            return NULL;
        }
        uint32_t pos = find_b(t, st, e);
        if (pos == UINT32_MAX) {
            missed++;
            continue;
        }
        removed++;
        uint32_t id = t->ib[pos] & ID_MASK;
        if (PyDict_GET_SIZE(t->dups)) {
            long left = 0;
            if (add_copy(t, id, -1, &left) < 0) {
                Py_DECREF(fe);
                return NULL;
            }
            if (left >= 0) { /* another copy remains */
                deduplicated++;
                continue;
            }
        }
        drop_record(t, id, pos);
    }
    Py_DECREF(fe);
    return Py_BuildValue("lll", removed, missed, deduplicated);
}

PyDoc_STRVAR(clear_doc, "clear(slot) -> records dropped\n\nEvery record of the pod in `slot` (a walk of the slab).");

static PyObject *Table_clear(Table *t, PyObject *arg) {
    if (not_writer(t)) return NULL;
    long slot = PyLong_AsLong(arg);
    if (slot == -1 && PyErr_Occurred()) return NULL;
    if (check_st(slot, 0) < 0) return NULL;
    long dropped = 0;
    for (uint32_t id = 1; id < t->h->top; id++) {
        uint32_t m = t->meta[id];
        if (IS_FREE(m) || M_SLOT(m) != (uint32_t)slot) continue;
        uint32_t pos = find_b(t, M_ST(m), t->eng[id]);
        if (pos == UINT32_MAX) continue; /* not in the engine index: cannot happen */
        drop_record(t, id, pos);
        dropped++;
    }
    return PyLong_FromLong(dropped);
}

static int reserve_scratch(Table *t, uint32_t slots) {
    if (slots <= t->nscratch) return 0;
    uint32_t n = slots < 64 ? 64 : slots;
    int32_t *ap = PyMem_Realloc(t->alive_pos, n * sizeof(int32_t));
    if (ap) t->alive_pos = ap;
    uint32_t *a = PyMem_Realloc(t->seen, n * sizeof(uint32_t));
    if (a) t->seen = a;
    uint32_t *b = PyMem_Realloc(t->offmark, n * sizeof(uint32_t));
    if (b) t->offmark = b;
    uint32_t *c = PyMem_Realloc(t->offgpu, n * sizeof(uint32_t));
    if (c) t->offgpu = c;
    uint32_t *d = PyMem_Realloc(t->alive, n * sizeof(uint32_t));
    if (d) t->alive = d;
    if (!ap || !a || !b || !c || !d) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint32_t i = t->nscratch; i < n; i++) t->alive_pos[i] = -1;
    t->nscratch = n;
    return 0;
}

/* The most records a match keeps from its walk for its touch (4 MiB of ids). */
#define MATCH_KEPT_IDS ((size_t)1 << 20)

/* Room for `n` uint32s in *buf (of *cap); -1 with MemoryError. */
static int reserve_u32(uint32_t **buf, size_t *cap, size_t n) {
    if (n <= *cap) return 0;
    size_t ncap = *cap ? *cap : 256;
    while (ncap < n) ncap *= 2;
    uint32_t *b = PyMem_Realloc(*buf, ncap * sizeof(uint32_t));
    if (!b) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = b;
    *cap = ncap;
    return 0;
}

static int emit(PyObject *out, uint32_t slot, uint32_t blocks, uint32_t off) {
    PyObject *item = Py_BuildValue("III", slot, blocks, blocks - off);
    if (!item) return -1;
    int rc = PyList_Append(out, item);
    Py_DECREF(item);
    return rc;
}

PyDoc_STRVAR(match_doc,
             "match(keys, slots) -> [(slot, blocks, gpu_blocks), ...]\n\n"
             "Each pod's (of `slots`) run of leading blocks of `keys` it holds in any tier, and how\n"
             "many of them on GPU (tier 0); pods with none are left out. The walk stops at the first\n"
             "block no pod still in the running holds. The matched keys are touched.");

static PyObject *Table_match(Table *t, PyObject *args) {
    PyObject *keys, *slots;
    if (!PyArg_ParseTuple(args, "OO", &keys, &slots)) return NULL;
    PyObject *fk = PySequence_Fast(keys, "keys must be a sequence");
    if (!fk) return NULL;
    PyObject *fs = PySequence_Fast(slots, "slots must be a sequence");
    if (!fs) {
        Py_DECREF(fk);
        return NULL;
    }
    PyObject *out = PyList_New(0);
    uint32_t nalive = 0;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(fs);
    if (!out) goto fail;
    for (Py_ssize_t i = 0; i < ns; i++) {
        long s = PyLong_AsLong(PySequence_Fast_GET_ITEM(fs, i));
        if (s == -1 && PyErr_Occurred()) goto fail;
        if (check_st(s, 0) < 0 || reserve_scratch(t, (uint32_t)s + 1) < 0) goto fail;
        if (t->alive_pos[s] >= 0) continue; /* listed twice */
        t->alive_pos[s] = (int32_t)nalive;
        t->alive[nalive++] = (uint32_t)s;
        t->seen[s] = t->offmark[s] = t->offgpu[s] = 0;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fk), run = 0;
    size_t nids = 0;
    Py_ssize_t recorded = 0; /* keys 0..recorded-1 have their records kept for the touch */
    if (reserve_u32(&t->run_off, &t->run_off_cap, 1) < 0) goto fail;
    t->run_off[0] = 0;
    for (; run < n && nalive; run++) {
        uint64_t k;
        if (u64(PySequence_Fast_GET_ITEM(fk, run), &k) < 0) goto fail;
        Py_ssize_t h = t->writer ? holders(t, k) : holders_read(t, k);
        if (h < 0) goto fail;
        /* Kept for the touch below, which so needs no second lookup per key (a match that
         * looked every key up twice spent ~40% of its time in the second), up to MATCH_KEPT_IDS
         * records (a long prompt every pod of a large pool holds); keys past them are looked up
         * again. */
        if (recorded == run && nids + (size_t)h <= MATCH_KEPT_IDS) {
            if (reserve_u32(&t->run_ids, &t->run_ids_cap, nids + (size_t)h) < 0 ||
                reserve_u32(&t->run_off, &t->run_off_cap, (size_t)run + 2) < 0)
                goto fail;
            memcpy(t->run_ids + nids, t->ids, (size_t)h * sizeof(uint32_t));
            nids += (size_t)h;
            t->run_off[run + 1] = (uint32_t)nids;
            recorded = run + 1;
        }
        uint32_t mark = (uint32_t)run + 1, seen = 0;
        for (Py_ssize_t j = 0; j < h; j++) {
            uint32_t m = t->writer ? t->meta[t->ids[j]] : t->metas[j], s = M_SLOT(m);
            if (s >= t->nscratch || t->alive_pos[s] < 0) continue;
            if (t->seen[s] != mark) {
                t->seen[s] = mark;
                seen++;
                if (M_TIER(m)) {
                    t->offgpu[s]++;
                    t->offmark[s] = mark;
                }
            } else if (!M_TIER(m) && t->offmark[s] == mark) {
                t->offgpu[s]--; /* on GPU too */
                t->offmark[s] = 0;
            }
        }
        if (!seen) break;
        if (seen < nalive) { /* some pods' runs end before this block */
            for (uint32_t a = 0; a < nalive;) {
                uint32_t s = t->alive[a];
                if (t->seen[s] == mark) {
                    a++;
                    continue;
                }
                if (run && emit(out, s, (uint32_t)run, t->offgpu[s]) < 0) goto fail;
                t->alive_pos[s] = -1;
                if (a != --nalive) {
                    t->alive[a] = t->alive[nalive];
                    t->alive_pos[t->alive[a]] = (int32_t)a;
                }
            }
        }
    }
    for (uint32_t a = 0; a < nalive; a++) {
        uint32_t s = t->alive[a];
        if (run && emit(out, s, (uint32_t)run, t->offgpu[s]) < 0) goto fail;
        t->alive_pos[s] = -1;
    }
    nalive = 0;
    /* Touch the matched keys, the last first, so the leading ones end youngest; a reader marks
     * their records for the writer instead (a byte store: a lost or stray mark only moves one
     * key's place in the eviction order). */
    for (Py_ssize_t i = run - 1; i >= 0; i--) {
        const uint32_t *ids;
        Py_ssize_t h;
        if (i < recorded) { /* nothing between the walk and here changed which records hold a key */
            ids = t->run_ids + t->run_off[i];
            h = (Py_ssize_t)(t->run_off[i + 1] - t->run_off[i]);
        } else { /* not kept: looked up again */
            uint64_t k;
            if (u64(PySequence_Fast_GET_ITEM(fk, i), &k) < 0) goto fail;
            h = t->writer ? holders(t, k) : holders_read(t, k);
            if (h < 0) goto fail;
            ids = t->ids;
        }
        if (t->writer) {
            maybe_advance(t);
            for (Py_ssize_t j = 0; j < h; j++) stamp(t, ids[j]);
        } else {
            for (Py_ssize_t j = 0; j < h; j++) __atomic_store_n(&t->ref[ids[j]], 1, __ATOMIC_RELAXED);
        }
    }
    Py_DECREF(fk);
    Py_DECREF(fs);
    return out;
fail:
    for (uint32_t a = 0; a < nalive; a++) t->alive_pos[t->alive[a]] = -1;
    Py_XDECREF(out);
    Py_DECREF(fk);
    Py_DECREF(fs);
    return NULL;
}

static PyObject *Table_records(Table *t, PyObject *Py_UNUSED(ignored)) {
    if (not_writer(t)) return NULL;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (uint32_t id = 1; id < t->h->top; id++) {
        uint32_t m = t->meta[id];
        if (IS_FREE(m)) continue;
        PyObject *k = PyLong_FromUnsignedLong(id);
        if (!k) goto fail;
        PyObject *v = PyDict_GetItemWithError(t->dups, k);
        Py_DECREF(k);
        if (!v && PyErr_Occurred()) goto fail;
        long copies = 1 + (v ? PyLong_AsLong(v) : 0);
        PyObject *item = Py_BuildValue("IIKKlI", M_SLOT(m), M_TIER(m), (unsigned long long)t->eng[id],
                                       (unsigned long long)t->key[id], copies, age_of(t, m));
        if (!item || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

#define CHECK(cond, what)                                                                         \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            PyErr_Format(PyExc_AssertionError, "record table: %s (id %u)", what, (unsigned)id);   \
            goto fail;                                                                            \
        }                                                                                         \
    } while (0)

static PyObject *Table_check(Table *t, PyObject *Py_UNUSED(ignored)) {
    if (not_writer(t)) return NULL;
    uint32_t counts[STAMPS] = {0};
    uint64_t live = 0, in_a = 0, in_b = 0;
    uint32_t id = 0;
    PyObject *keyset = PySet_New(NULL);
    if (!keyset) return NULL;
    for (id = 1; id < t->h->top; id++) {
        uint32_t m = t->meta[id];
        if (IS_FREE(m)) continue;
        live++;
        counts[M_STAMP(m)]++;
        CHECK(age_of(t, m) <= t->h->epoch - t->h->oldest, "a record older than the oldest epoch");
        CHECK(find_a_id(t, id) != UINT32_MAX, "a record missing from the key index");
        uint32_t pos = find_b(t, M_ST(m), t->eng[id]);
        CHECK(pos != UINT32_MAX && (t->ib[pos] & ID_MASK) == id, "a record missing from the engine index");
        Py_ssize_t n = holders(t, t->key[id]);
        CHECK(n >= 1, "a key without its record");
        for (Py_ssize_t i = 0; i < n; i++) CHECK(M_STAMP(t->meta[t->ids[i]]) == M_STAMP(m), "a key's records of two epochs");
        PyObject *k = PyLong_FromUnsignedLongLong(t->key[id]);
        if (!k || PySet_Add(keyset, k) < 0) {
            Py_XDECREF(k);
            goto fail;
        }
        Py_DECREF(k);
    }
    id = 0;
    CHECK(live == t->h->entries, "entries miscounted");
    CHECK((uint64_t)PySet_GET_SIZE(keyset) == t->h->keys, "keys miscounted");
    CHECK(memcmp(counts, t->h->count, sizeof(counts)) == 0, "stamp counts wrong");
    CHECK(t->cap == t->h->cap && t->ia == t->ixr[t->h->active] && t->ib == t->ixr[2 + t->h->active], "stale view");
    for (uint32_t p = 0; p < t->cap; p++) {
        for (int which = 0; which < 2; which++) {
            uint32_t x = (which ? t->ib : t->ia)[p];
            if (!x) continue;
            id = x & ID_MASK;
            CHECK(id < t->h->top && !IS_FREE(t->meta[id]), "an index entry for a free id");
            uint32_t home = which ? home_b(t, id, t->cap) : home_a(t, id, t->cap);
            uint32_t d = p >= home ? p - home : p + t->cap - home;
            CHECK((x >> ID_BITS) == (d < DIST_SAT ? d : DIST_SAT), "a wrong probe distance");
            which ? in_b++ : in_a++;
        }
    }
    id = 0;
    CHECK(in_a == live && in_b == live, "index sizes differ from the slab");
    PyObject *key, *value;
    Py_ssize_t i = 0;
    while (PyDict_Next(t->dups, &i, &key, &value)) {
        id = (uint32_t)PyLong_AsUnsignedLong(key);
        CHECK(id && id < t->h->top && !IS_FREE(t->meta[id]) && PyLong_AsLong(value) > 0, "copies of a free id");
    }
    Py_DECREF(keyset);
    Py_RETURN_NONE;
fail:
    Py_DECREF(keyset);
    return NULL;
}

static PyObject *Table_stats(Table *t, PyObject *Py_UNUSED(ignored)) {
    Header *h = t->h;
    return Py_BuildValue("KKK", (unsigned long long)RD(h->entries), (unsigned long long)RD(h->keys),
                         (unsigned long long)RD(h->evictions));
}

static PyObject *Table_nbytes(Table *t, PyObject *Py_UNUSED(ignored)) {
    /* What the records use: the slab up to its highest id ever used, the active index copies. */
    Header *h = t->h;
    uint64_t n = round_page(sizeof(Header)) + (uint64_t)RD(h->top) * (2 * sizeof(uint64_t) + sizeof(uint32_t) + 1) +
                 (uint64_t)RD(h->cap) * 2 * sizeof(uint32_t);
    return PyLong_FromUnsignedLongLong(n);
}

static PyObject *Table_mapped(Table *t, PyObject *Py_UNUSED(ignored)) { return PyLong_FromSize_t(t->size); }

static PyMethodDef Table_methods[] = {
    {"store", (PyCFunction)Table_store, METH_VARARGS, store_doc},
    {"retier", (PyCFunction)Table_retier, METH_VARARGS, retier_doc},
    {"resolve", (PyCFunction)Table_resolve, METH_VARARGS, resolve_doc},
    {"remove", (PyCFunction)Table_remove, METH_VARARGS, remove_doc},
    {"clear", (PyCFunction)Table_clear, METH_O, clear_doc},
    {"match", (PyCFunction)Table_match, METH_VARARGS, match_doc},
    {"stats", (PyCFunction)Table_stats, METH_NOARGS, "stats() -> (entries, keys, evictions)"},
    {"nbytes", (PyCFunction)Table_nbytes, METH_NOARGS, "nbytes() -> bytes the records use (slab, active indexes)"},
    {"mapped", (PyCFunction)Table_mapped, METH_NOARGS, "mapped() -> bytes of address space mapped (committed as used)"},
    {"records", (PyCFunction)Table_records, METH_NOARGS,
     "records() -> [(slot, tier, engine_hash, key, copies, age), ...] (tests)"},
    {"check", (PyCFunction)Table_check, METH_NOARGS, "check(): raise AssertionError if the structures disagree (tests)"},
    {NULL, NULL, 0, NULL},
};

static int map_region(Table *t, int fd, size_t size, int shared) {
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE,
                      shared ? MAP_SHARED : (MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE), fd, 0);
    if (base == MAP_FAILED) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    t->base = base;
    t->size = size;
    return 0;
}

static int Table_init(Table *t, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"max_entries", "fd", "attach", NULL};
    unsigned long long max_entries = 0;
    int fd = -1, attach = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|Kip", kwlist, &max_entries, &fd, &attach)) return -1;
    if (t->base) {
        PyErr_SetString(PyExc_RuntimeError, "RecordTable is initialised once");
        return -1;
    }
    if (attach) { /* a reader of another process's table */
        Header probe;
        if (fd < 0 || pread(fd, &probe, sizeof(probe), 0) != (ssize_t)sizeof(probe)) {
            PyErr_SetString(PyExc_ValueError, "attach needs the fd of a KV index");
            return -1;
        }
        if (probe.magic != REGION_MAGIC) {
            PyErr_SetString(PyExc_ValueError, "not a KV index (bad magic)");
            return -1;
        }
        if (map_region(t, fd, probe.size, 1) < 0) return -1;
        t->writer = 0;
        point(t);
        return 0;
    }
    if (max_entries == 0 || max_entries > (unsigned long long)MAX_ID - (1u << 20)) {
        PyErr_Format(PyExc_ValueError, "max_entries must be in [1, %u]", MAX_ID - (1u << 20));
        return -1;
    }
    Header h;
    memset(&h, 0, sizeof(h));
    uint64_t size = layout(&h, max_entries);
    if (fd >= 0 && ftruncate(fd, (off_t)size) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if (map_region(t, fd, size, fd >= 0) < 0) return -1;
    t->dups = PyDict_New();
    if (!t->dups) return -1;
    h.top = 1; /* id 0 marks an empty index slot */
    h.epoch_len = max_entries / EPOCHS_PER_CAP ? max_entries / EPOCHS_PER_CAP : 1;
    h.magic = 0;
    memcpy(t->base, &h, sizeof(h));
    __atomic_store_n(&((Header *)t->base)->magic, REGION_MAGIC, __ATOMIC_RELEASE);
    t->writer = 1;
    point(t);
    return 0;
}

static void Table_dealloc(Table *t) {
    if (t->base) munmap(t->base, t->size);
    PyMem_Free(t->alive_pos);
    PyMem_Free(t->seen);
    PyMem_Free(t->offmark);
    PyMem_Free(t->offgpu);
    PyMem_Free(t->alive);
    PyMem_Free(t->ids);
    PyMem_Free(t->metas);
    PyMem_Free(t->run_ids);
    PyMem_Free(t->run_off);
    Py_XDECREF(t->dups);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "epp.kvcache._records.RecordTable",
    .tp_doc = PyDoc_STR("RecordTable(max_entries, fd=-1): (slot, tier, engine hash) -> key records, capped;\n"
                        "in a memfd when fd >= 0. RecordTable(fd=fd, attach=True): a reader of one."),
    .tp_basicsize = sizeof(Table),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Table_init,
    .tp_dealloc = (destructor)Table_dealloc,
    .tp_methods = Table_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "epp.kvcache._records",
    .m_doc = "The KV index's record table (see epp.kvcache.index).", .m_size = -1,
};

PyMODINIT_FUNC PyInit__records(void) {
    if (PyType_Ready(&TableType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&TableType);
    if (PyModule_AddObject(m, "RecordTable", (PyObject *)&TableType) < 0) {
        Py_DECREF(&TableType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "MAX_SLOTS", MAX_SLOT + 1) < 0 || PyModule_AddIntConstant(m, "MAX_TIERS", MAX_TIER + 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
