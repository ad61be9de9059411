/* epp's block keys in C: the same values as `hash((h, tuple(block))) & (2**60 - 1)` chained in
 * Python (epp.kvcache.keys), ~10x faster: no tuple is built. CPython 3.8-3.13's tuple hash (the
 * xxHash-style mixer of Objects/tupleobject.c) is written out below; each token's own hash is
 * CPython's (PyObject_Hash, skipped for the ints in [0, 2**61 - 1) that hash to themselves).
 * tests/kvcache/test_keys.py checks it against Python's `hash` of the tuples.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define XXPRIME_1 11400714785074694791ULL
#define XXPRIME_2 14029467366897019727ULL
#define XXPRIME_5 2870177450012600261ULL
#define XXROTATE(x) (((x) << 31) | ((x) >> 33))
#define HASH_MODULUS ((1ULL << 61) - 1)
#define KEY_MASK ((1ULL << 60) - 1)

static inline uint64_t lane(uint64_t acc, uint64_t h) {
    acc += h * XXPRIME_2;
    acc = XXROTATE(acc);
    return acc * XXPRIME_1;
}

static inline uint64_t finish(uint64_t acc, uint64_t len) {
    acc += len ^ (XXPRIME_5 ^ 3527539ULL);
    return acc == (uint64_t)-1 ? 1546275796ULL : acc;
}

/* CPython's hash of `o`, as an unsigned lane; -1 with an error set. */
static inline int item_hash(PyObject *o, uint64_t *out) {
    if (PyLong_CheckExact(o)) {
        /* A token id is a one-digit int: its digit read in place. The call below took ~40% of a
         * long prompt's keys (a call through the PLT per token). */
#if PY_VERSION_HEX >= 0x030C0000
        if (PyUnstable_Long_IsCompact((PyLongObject *)o)) {
            Py_ssize_t v = PyUnstable_Long_CompactValue((PyLongObject *)o);
            if (v >= 0) {
                *out = (uint64_t)v;
                return 0;
            }
        }
#else
        if (Py_SIZE(o) == 1) {
            *out = (uint64_t)((PyLongObject *)o)->ob_digit[0];
            return 0;
        }
#endif
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (!overflow && v >= 0 && (unsigned long long)v < HASH_MODULUS) {
            *out = (uint64_t)v;
            return 0;
        }
    }
    Py_hash_t h = PyObject_Hash(o);
    if (h == -1) return -1;
    *out = (uint64_t)h;
    return 0;
}

PyDoc_STRVAR(chain_doc,
             "chain(token_ids, block_size, h) -> list[int]\n\n"
             "The chained keys of the full blocks of `token_ids`, starting from `h` (a seed or the\n"
             "parent block's key): key_i = hash((key_{i-1}, tuple(block_i))) & (2**60 - 1).");

static PyObject *chain(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *tokens, *start;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "OnO", &tokens, &size, &start)) return NULL;
    if (size <= 0) {
        PyErr_Format(PyExc_ValueError, "block_size must be > 0, got %zd", size);
        return NULL;
    }
    uint64_t h;
    if (item_hash(start, &h) < 0) return NULL;
    PyObject *fast = PySequence_Fast(tokens, "token_ids must be a sequence");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast) / size;
    PyObject **items = PySequence_Fast_ITEMS(fast);
    PyObject *out = PyList_New(n);
    if (!out) goto fail;
    for (Py_ssize_t b = 0; b < n; b++) {
        uint64_t acc = XXPRIME_5;
        for (Py_ssize_t i = b * size, end = i + size; i < end; i++) {
            uint64_t t;
            if (item_hash(items[i], &t) < 0) goto fail;
            acc = lane(acc, t);
        }
        uint64_t block = finish(acc, (uint64_t)size);
        uint64_t key = finish(lane(lane(XXPRIME_5, h), block), 2) & KEY_MASK;
        PyObject *k = PyLong_FromUnsignedLongLong(key);
        if (!k) goto fail;
        PyList_SET_ITEM(out, b, k);
        h = key; /* below 2**60: an int that hashes to itself */
    }
    Py_DECREF(fast);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(fast);
    return NULL;
}

static PyMethodDef methods[] = {
    {"chain", chain, METH_VARARGS, chain_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "epp.kvcache._keys",
    .m_doc = "epp's chained block keys (see epp.kvcache.keys).", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__keys(void) { return PyModule_Create(&module); }
