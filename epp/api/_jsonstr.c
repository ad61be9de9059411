/* One JSON string literal (a `msgspec.Raw` slice of a request body, quotes included) as a str.
 *
 * msgspec decodes a string with escapes (every prompt with a newline) through a scratch buffer it
 * grows by 1.5x from 8 bytes, one realloc at a time, afresh for every body. In a process whose
 * heap is fragmented (a tokenizer loaded, bodies of every size), glibc's realloc searches its
 * bins each time: a 276 KB completions body took 0.45 ms to decode, 0.16 ms in a fresh process.
 * Here the output buffer is allocated once, at the input's size (an escape never decodes to more
 * bytes than it takes), and the text between escapes is found sixteen bytes at a time (SSE2;
 * eight elsewhere).
 *
 * offset(raw, body) says where such a slice lies in the body it came from (`decode_body` decodes a
 * chat body again for its template with the long strings it already has cut out).
 *
 * string(raw) answers exactly what msgspec would, or None wherever it might not: an escape other
 * than \" \\ \/ \b \f \n \r \t \uXXXX, an unpaired UTF-16 surrogate, a raw control character or
 * quote inside, invalid UTF-8, no quotes around. The caller then decodes with msgspec, which
 * gives the same string or its own error (tests/api/test_jsonstr.py compares the two).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* High bit set in each byte of `x` that is < 0x20, '"' or '\\' (and possibly in bytes above the
 * first such one, from the borrow: only the lowest flag is read). Bytes >= 0x80 never match. */
static inline uint64_t specials(uint64_t x) {
    uint64_t control = (x - 0x20 * ONES) & ~x;
    uint64_t q = x ^ ('"' * ONES);
    uint64_t b = x ^ ('\\' * ONES);
    return (control | ((q - ONES) & ~q) | ((b - ONES) & ~b)) & HIGHS;
}

static inline int is_special(unsigned char c) { return c < 0x20 || c == '"' || c == '\\'; }

#if defined(__SSE2__)
/* Sixteen bytes at a time where SSE2 is there (every x86-64): a bit per special byte of v. */
static inline unsigned specials16(__m128i v) {
    __m128i control = _mm_cmpeq_epi8(_mm_max_epu8(v, _mm_set1_epi8(0x1F)), _mm_set1_epi8(0x1F));
    __m128i q = _mm_cmpeq_epi8(v, _mm_set1_epi8('"'));
    __m128i b = _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'));
    return (unsigned)_mm_movemask_epi8(_mm_or_si128(control, _mm_or_si128(q, b)));
}
#endif

/* The offset of the first special byte in p[0:n], or n; ORs the bytes before it into *seen. With
 * `out`, those bytes are copied there as they are scanned, a whole block at a time (up to 16 bytes
 * past the offset are written: the caller's buffer has that slack). A memcpy per run between
 * escapes cost more than this: a prose prompt escapes a newline every ~50 bytes. Inlined, so each
 * caller gets the copy or not compiled in. */
static inline __attribute__((always_inline)) Py_ssize_t scan(const unsigned char *p, Py_ssize_t n,
                                                             uint64_t *seen, unsigned char *out) {
    Py_ssize_t i = 0;
    uint64_t acc = 0;
#if defined(__SSE2__)
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
        if (out) _mm_storeu_si128((__m128i *)(out + i), v);
        unsigned m = specials16(v), high = (unsigned)_mm_movemask_epi8(v);
        if (m) {
            if (high & ((1u << __builtin_ctz(m)) - 1)) acc |= HIGHS;
            *seen |= acc;
            return i + __builtin_ctz(m);
        }
        if (high) acc |= HIGHS;
    }
#endif
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, p + i, 8);
        if (out) memcpy(out + i, &x, 8);
        uint64_t m = specials(x);
        if (m) {
            unsigned k = __builtin_ctzll(m) >> 3;
            acc |= x & ((1ULL << (8 * k)) - 1);
            *seen |= acc;
            return i + k;
        }
        acc |= x;
    }
    for (; i < n && !is_special(p[i]); i++) {
        acc |= p[i];
        if (out) out[i] = p[i];
    }
    *seen |= acc;
    return i;
}

static int hex4(const unsigned char *p, unsigned int *out) {
    unsigned int v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char c = p[k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return -1;
    }
    *out = v;
    return 0;
}

static unsigned char *put_utf8(unsigned char *w, unsigned int cp) {
    if (cp < 0x80) {
        *w++ = (unsigned char)cp;
    } else if (cp < 0x800) {
        *w++ = 0xC0 | (cp >> 6);
        *w++ = 0x80 | (cp & 0x3F);
    } else if (cp < 0x10000) {
        *w++ = 0xE0 | (cp >> 12);
        *w++ = 0x80 | ((cp >> 6) & 0x3F);
        *w++ = 0x80 | (cp & 0x3F);
    } else {
        *w++ = 0xF0 | (cp >> 18);
        *w++ = 0x80 | ((cp >> 12) & 0x3F);
        *w++ = 0x80 | ((cp >> 6) & 0x3F);
        *w++ = 0x80 | (cp & 0x3F);
    }
    return w;
}

/* A str of the UTF-8 in p[0:n] (all ASCII when !(seen & 0x80)); None on invalid UTF-8. */
static PyObject *as_str(const unsigned char *p, Py_ssize_t n, uint64_t seen) {
    if (!(seen & HIGHS)) {
        PyObject *out = PyUnicode_New(n, 127);
        if (out != NULL) memcpy(PyUnicode_DATA(out), p, n);
        return out;
    }
    PyObject *out = PyUnicode_DecodeUTF8((const char *)p, n, NULL);
    if (out == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return out;
}

/* The escaped string p[0:n] (quotes stripped) unescaped into a fresh buffer, p[first] being its
 * first special byte; None where msgspec should answer. The buffer has 16 bytes of slack for
 * `scan`'s last block. */
static PyObject *unescape(const unsigned char *p, Py_ssize_t n, Py_ssize_t first, uint64_t seen) {
    unsigned char *buf = PyMem_RawMalloc(n + 16);
    if (buf == NULL) return PyErr_NoMemory();
    memcpy(buf, p, first);
    unsigned char *w = buf + first;
    Py_ssize_t i = first;
    while (i < n) {
        if (p[i] != '\\' || i + 1 == n) goto fallback; /* a raw control character or quote */
        unsigned char c = p[i + 1];
        i += 2;
        switch (c) {
            case '"': *w++ = '"'; break;
            case '\\': *w++ = '\\'; break;
            case '/': *w++ = '/'; break;
            case 'b': *w++ = '\b'; break;
            case 'f': *w++ = '\f'; break;
            case 'n': *w++ = '\n'; break;
            case 'r': *w++ = '\r'; break;
            case 't': *w++ = '\t'; break;
            case 'u': {
                unsigned int cp, lo;
                if (n - i < 4 || hex4(p + i, &cp) < 0) goto fallback;
                i += 4;
                if (cp >= 0xDC00 && cp <= 0xDFFF) goto fallback;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (n - i < 6 || p[i] != '\\' || p[i + 1] != 'u' || hex4(p + i + 2, &lo) < 0) goto fallback;
                    if (lo < 0xDC00 || lo > 0xDFFF) goto fallback;
                    i += 6;
                    cp = 0x10000 + (((cp - 0xD800) << 10) | (lo - 0xDC00));
                }
                if (cp >= 0x80) seen |= HIGHS;
                w = put_utf8(w, cp);
                break;
            }
            default:
                goto fallback;
        }
        /* Copy up to the next special byte. */
        Py_ssize_t k = scan(p + i, n - i, &seen, w);
        i += k;
        w += k;
    }
    PyObject *out = as_str(buf, w - buf, seen);
    PyMem_RawFree(buf);
    return out;
fallback:
    PyMem_RawFree(buf);
    Py_RETURN_NONE;
}

static PyObject *string(PyObject *Py_UNUSED(module), PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *data = view.buf;
    Py_ssize_t len = view.len;
    PyObject *out;
    if (len < 2 || data[0] != '"' || data[len - 1] != '"') {
        out = Py_NewRef(Py_None);
    } else {
        const unsigned char *p = data + 1;
        Py_ssize_t n = len - 2;
        uint64_t seen = 0;
        Py_ssize_t at = scan(p, n, &seen, NULL);
        out = at == n ? as_str(p, n, seen) : unescape(p, n, at, seen);
    }
    PyBuffer_Release(&view);
    return out;
}

/* Where the buffer `inner` starts in the buffer `outer` (a msgspec.Raw's place in the body it was
 * decoded from, zero-copy), or -1 when it does not lie inside it. */
static PyObject *offset(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "offset(inner, outer) takes two buffers");
        return NULL;
    }
    Py_buffer in, out;
    if (PyObject_GetBuffer(args[0], &in, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &out, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&in);
        return NULL;
    }
    uintptr_t a = (uintptr_t)in.buf, b = (uintptr_t)out.buf;
    Py_ssize_t at = -1;
    if (a >= b && a - b <= (uintptr_t)out.len && (uintptr_t)in.len <= (uintptr_t)out.len - (a - b)) at = (Py_ssize_t)(a - b);
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return PyLong_FromSsize_t(at);
}

static PyMethodDef methods[] = {
    {"offset", (PyCFunction)(void (*)(void))offset, METH_FASTCALL,
     "offset(inner, outer) -> int: where the buffer inner starts inside the buffer outer, or -1."},
    {"string", string, METH_O,
     "string(raw) -> str | None: a JSON string literal (quotes included) decoded as msgspec would, "
     "or None where msgspec must answer (an unusual escape, a lone surrogate, invalid UTF-8)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jsonstr", NULL, 0, methods};

PyMODINIT_FUNC PyInit__jsonstr(void) { return PyModule_Create(&module); }
