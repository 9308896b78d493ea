/* ts_core.native._kernels: the CPython face of the C kernels (stats.c, compare.c) and the stack
 * walker. Built by setup.py at install time (an optional Extension: without a compiler the
 * install still succeeds and tsprobe takes its pure paths); never compiled at run time.
 *
 * Called on every recorded tensor, so the hot entry points take METH_FASTCALL arguments
 * (a ctypes call cost ~1 us, these ~0.1 us) and release the GIL only for buffers large enough
 * to be worth the switch.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <math.h>
#include "kernels.h"

/* Bump when a signature or result layout changes: ts_core/native/__init__.py refuses a library
 * built from other sources (a stale in-place build in a checkout). */
#define TSP_ABI 4
/* Below this many elements the kernel runs with the GIL held: releasing and taking it back
 * costs more than the pass itself. */
#define GIL_FREE_MIN 32768

static int parse_buffer(PyObject *const *args, Py_ssize_t nargs, const char *fn, void **p, int64_t *n,
                        int *code) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s(address, numel, dtype_code) takes 3 arguments (%zd given)", fn, nargs);
        return -1;
    }
    *p = PyLong_AsVoidPtr(args[0]);
    if (*p == NULL && PyErr_Occurred()) return -1;
    *n = PyLong_AsLongLong(args[1]);
    if (*n == -1 && PyErr_Occurred()) return -1;
    *code = (int)PyLong_AsLong(args[2]);
    if (*code == -1 && PyErr_Occurred()) return -1;
    return 0;
}

static int run_stats(void *p, int64_t n, int code, double *out) {
    int rc;
    if (n >= GIL_FREE_MIN) {
        Py_BEGIN_ALLOW_THREADS
        rc = tsp_stats(p, n, code, out);
        Py_END_ALLOW_THREADS
    } else {
        rc = tsp_stats(p, n, code, out);
    }
    return rc;
}

static PyObject *k_stats(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *p;
    int64_t n;
    int code;
    double out[4];
    if (parse_buffer(args, nargs, "stats", &p, &n, &code) < 0) return NULL;
    if (run_stats(p, n, code, out) != 0) Py_RETURN_NONE;
    return Py_BuildValue("(dddd)", out[0], out[1], out[2], out[3]);
}

static PyObject *k_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    void *p;
    int64_t n;
    int code;
    double out[4];
    if (parse_buffer(args, nargs, "row", &p, &n, &code) < 0) return NULL;
    int rc = run_stats(p, n, code, out);
    if (rc == 2)        /* float64 beyond double's sums: mean and norm already (stats.c, rescue_f64) */
        return Py_BuildValue("(dddd)", out[0], out[1], out[2], out[3]);
    if (rc != 0) Py_RETURN_NONE;
    /* the same two operations as Python's `total / numel` and `math.sqrt(squares)` */
    return Py_BuildValue("(dddd)", out[0], out[1], out[2] / (double)n, sqrt(out[3]));
}

static PyObject *k_compare(PyObject *self, PyObject *args) {
    unsigned long long ga, ta;
    int gc, tc, equal_nan;
    long long begin, end, chunk;
    double rtol, atol, sums[10] = {0};
    int64_t counts[11] = {0};
    int rc;
    if (!PyArg_ParseTuple(args, "KiKiLLLddp:compare", &ga, &gc, &ta, &tc, &begin, &end, &chunk, &rtol, &atol,
                          &equal_nan))
        return NULL;
    counts[10] = -1;
    Py_BEGIN_ALLOW_THREADS
    rc = tsp_compare((const void *)(uintptr_t)ga, gc, (const void *)(uintptr_t)ta, tc, begin, end, chunk, rtol,
                     atol, equal_nan, sums, counts);
    Py_END_ALLOW_THREADS
    if (rc != 0) Py_RETURN_NONE;
    PyObject *s = PyList_New(10), *c = PyList_New(11);
    if (!s || !c) {
        Py_XDECREF(s);
        Py_XDECREF(c);
        return NULL;
    }
    for (int i = 0; i < 10; i++) PyList_SET_ITEM(s, i, PyFloat_FromDouble(sums[i]));
    for (int i = 0; i < 11; i++) PyList_SET_ITEM(c, i, PyLong_FromLongLong(counts[i]));
    return Py_BuildValue("(NN)", s, c);
}

/* The calling thread's Python stack as bytes of int64 (code object address, position) pairs,
 * innermost first: a key for the stack, not its text (ts_core/record/stack.py). The position is
 * the last instruction's offset where the API has it (3.11+: constant time), else the line.
 * None when deeper than max_frames. stack.json needs the stack of every recorded call; walking
 * it in Python costs ~0.25 us a frame (~9 us a call in a transformers model). The addresses
 * identify code objects only while the caller keeps them alive (StackRecorder does). */
static PyObject *k_frames(PyObject *self, PyObject *arg) {
    int64_t max_frames = PyLong_AsLongLong(arg);
    if (max_frames == -1 && PyErr_Occurred()) return NULL;
    if (max_frames <= 0 || max_frames > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "frames(max_frames): 1 .. 2**20");
        return NULL;
    }
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(16 * max_frames));
    if (bytes == NULL) return NULL;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(bytes);
    PyFrameObject *frame = PyEval_GetFrame();   /* borrowed */
    Py_XINCREF(frame);
    int64_t n = 0;
    while (frame != NULL) {
        if (n == max_frames) {
            Py_DECREF(frame);
            Py_DECREF(bytes);
            Py_RETURN_NONE;
        }
        PyCodeObject *code = PyFrame_GetCode(frame);   /* new reference */
        out[2 * n] = (int64_t)(intptr_t)code;
#if PY_VERSION_HEX >= 0x030B0000
        out[2 * n + 1] = PyFrame_GetLasti(frame);
#else
        out[2 * n + 1] = PyFrame_GetLineNumber(frame);
#endif
        Py_DECREF(code);
        n++;
        PyFrameObject *back = PyFrame_GetBack(frame);  /* new reference or NULL */
        Py_DECREF(frame);
        frame = back;
    }
    if (_PyBytes_Resize(&bytes, (Py_ssize_t)(16 * n)) < 0) return NULL;
    return bytes;
}

static PyObject *k_init(PyObject *self, PyObject *arg) {
    int allow = PyObject_IsTrue(arg);
    if (allow < 0) return NULL;
    return PyUnicode_FromString(tsp_stats_init(allow));
}

static PyMethodDef methods[] = {
    {"stats", (PyCFunction)(void (*)(void))k_stats, METH_FASTCALL,
     "stats(address, numel, dtype_code) -> (max, min, sum, sum_of_squares), None on NaN/Inf"},
    {"row", (PyCFunction)(void (*)(void))k_row, METH_FASTCALL,
     "row(address, numel, dtype_code) -> (max, min, mean, norm), None on NaN/Inf"},
    {"compare", k_compare, METH_VARARGS,
     "compare(g_addr, g_code, t_addr, t_code, begin, end, chunk, rtol, atol, equal_nan) -> (sums, counts)"},
    {"frames", k_frames, METH_O, "frames(max_frames) -> bytes of (code address, position) int64 pairs, or None"},
    {"init", k_init, METH_O, "init(allow_simd) -> name of the float loops chosen for this CPU"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels",
                                    "tsprobe's C kernels (see ts_core/native/__init__.py)", -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "ABI", TSP_ABI) < 0 ||
        PyModule_AddStringConstant(m, "ISA", tsp_stats_init(1)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
