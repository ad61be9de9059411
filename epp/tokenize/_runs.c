/* The run rule of `FastEngine.takes` (epp/tokenize/tokenizer.py) in one pass over a str, without
 * the copies, splits and regex scans of the Python form: over the 730 pieces of a cold
 * 100k-token prompt 1.4 ms against 8.7 (of ~85 ms in all, on a slow 2-core VM).
 * tests/tokenize/test_runs.py holds the Python form as the oracle and checks the two agree.
 *
 * fits(text, start) is False when text[start:] has
 *   - a run of more than `max_run` whitespace characters (str.isspace), or
 *   - a word (a maximal run of non-whitespace, as str.split() cuts them) longer than `max_run`
 *     with, if the word is all ASCII and longer than `max_ascii_run`: a run of more than
 *     `max_ascii_run` [A-Za-z0-9], or of more than `max_ascii_run` other characters; if not all
 *     ASCII: a run of more than `max_run` word characters (\w: str.isalnum() or '_'), or of more
 *     than `max_run` characters that are not alphanumeric ('_' counts as both, as it does in the
 *     Python form's two regex classes).
 * Character classes are CPython's own (Py_UNICODE_ISSPACE, Py_UNICODE_ISALNUM), the ones `re`
 * and str.split() use for str.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* ASCII first: CPython's class macros are a table lookup each, four for ISALNUM. */
static inline int is_space(Py_UCS4 ch) {
    return ch < 128 ? ch == ' ' || (ch >= 9 && ch <= 13) || (ch >= 28 && ch <= 31) : Py_UNICODE_ISSPACE(ch);
}

static inline int is_ascii_alnum(Py_UCS4 ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
}

/* Whether a word of more than max_run characters is refused: its runs of \w and of the rest
 * ('_' in both), or, all ASCII and over max_ascii_run, of [A-Za-z0-9] and of the rest. Only long
 * words come here, so the common path is one whitespace test per character. */
#define REFUSED(NAME, TYPE)                                                                     \
    static int NAME(const TYPE *data, Py_ssize_t from, Py_ssize_t to, Py_ssize_t max_run,      \
                    Py_ssize_t max_ascii_run) {                                                \
        Py_ssize_t run_w = 0, run_o = 0, run_an = 0, run_ax = 0, max_an = 0, max_ax = 0;      \
        int ascii = 1, unicode_refused = 0;                                                    \
        for (Py_ssize_t i = from; i < to; i++) {                                               \
            Py_UCS4 ch = data[i];                                                              \
            int alnum = ch < 128 ? is_ascii_alnum(ch) : Py_UNICODE_ISALNUM(ch);               \
            run_w = alnum || ch == '_' ? run_w + 1 : 0;                                        \
            run_o = alnum ? 0 : run_o + 1;                                                     \
            if (run_w > max_run || run_o > max_run) unicode_refused = 1;                       \
            if (ch >= 128) {                                                                   \
                ascii = 0;                                                                     \
                if (unicode_refused) return 1;                                                 \
            } else if (alnum) {                                                                \
                run_ax = 0;                                                                    \
                if (++run_an > max_an) max_an = run_an;                                        \
            } else {                                                                           \
                run_an = 0;                                                                    \
                if (++run_ax > max_ax) max_ax = run_ax;                                        \
            }                                                                                  \
        }                                                                                      \
        if (!ascii) return unicode_refused;                                                    \
        return to - from > max_ascii_run && (max_an > max_ascii_run || max_ax > max_ascii_run); \
    }

/* The scan, one copy per string kind (the per-character kind switch of PyUnicode_READ cost ~2x). */
#define SCAN(NAME, REFUSED_NAME, TYPE)                                                          \
    REFUSED(REFUSED_NAME, TYPE)                                                                 \
    static int NAME(const TYPE *data, Py_ssize_t start, Py_ssize_t n, Py_ssize_t max_run,      \
                    Py_ssize_t max_ascii_run) {                                                \
        Py_ssize_t spaces = 0;                                                                 \
        Py_ssize_t i = start;                                                                  \
        while (i < n) {                                                                        \
            if (is_space(data[i])) {                                                           \
                if (++spaces > max_run) return 0;                                              \
                i++;                                                                           \
                continue;                                                                      \
            }                                                                                  \
            spaces = 0;                                                                        \
            Py_ssize_t from = i;                                                               \
            while (i < n && !is_space(data[i])) i++;                                           \
            if (i - from > max_run && REFUSED_NAME(data, from, i, max_run, max_ascii_run))     \
                return 0;                                                                      \
        }                                                                                      \
        return 1;                                                                              \
    }

SCAN(scan1, refused1, Py_UCS1)
SCAN(scan2, refused2, Py_UCS2)
SCAN(scan4, refused4, Py_UCS4)

PyDoc_STRVAR(fits_doc,
             "fits(text, start, max_run, max_ascii_run) -> bool\n\n"
             "Whether text[start:] passes the run rule of FastEngine.takes (see the module source).");

static PyObject *fits(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *text;
    Py_ssize_t start, max_run, max_ascii_run;
    if (!PyArg_ParseTuple(args, "Unnn", &text, &start, &max_run, &max_ascii_run)) return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (start < 0) start = 0;
    const void *data = PyUnicode_DATA(text);
    int ok;
    switch (PyUnicode_KIND(text)) {
    case PyUnicode_1BYTE_KIND: ok = scan1(data, start, n, max_run, max_ascii_run); break;
    case PyUnicode_2BYTE_KIND: ok = scan2(data, start, n, max_run, max_ascii_run); break;
    default: ok = scan4(data, start, n, max_run, max_ascii_run); break;
    }
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"fits", fits, METH_VARARGS, fits_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "epp.tokenize._runs",
    .m_doc = "The run rule of epp.tokenize.tokenizer.FastEngine.takes in C.", .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__runs(void) { return PyModule_Create(&module); }
