/*
 * libFuzzer target of the compiled column builder (liftbridge_provider/client/_wire_columns.c), built and
 * run by tools/fuzz_wire_columns.py: clang, -fsanitize=fuzzer,address,undefined.
 *
 * The decoder's source is compiled into this program (so its branches guide the fuzzer and the sanitizers
 * watch it) and registered as the built-in module liftbridge_provider.client._wire_columns of an embedded
 * Python, whose tests/unit/wire_cases.check compares it with the pure-Python builder on every input. Its
 * PyMem calls go to counting wrappers around malloc: once the builders of an input are gone, no block of
 * theirs may be left (a leak), and AddressSanitizer sees every buffer at its exact size.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static Py_ssize_t live_blocks;

static void *counted_realloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (q != NULL && p == NULL) live_blocks++;
    return q;
}

static void counted_free(void *p) {
    if (p != NULL) live_blocks--;
    free(p);
}

#define PyMem_Realloc counted_realloc
#define PyMem_Free counted_free
#include "../../liftbridge_provider/client/_wire_columns.c"

static PyObject *check;

static void fail(const char *what) {
    fprintf(stderr, "fuzz_wire_columns: %s\n", what);
    if (PyErr_Occurred()) PyErr_Print();
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *python = getenv("FUZZ_PYTHON"); /* the virtual environment's python: its site-packages */
    if (python == NULL) fail("FUZZ_PYTHON is not set (run tools/fuzz_wire_columns.py)");
    if (PyImport_AppendInittab("liftbridge_provider.client._wire_columns", PyInit__wire_columns) < 0)
        fail("cannot register the decoder");
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    PyStatus status = PyConfig_SetBytesString(&config, &config.program_name, python);
    if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) fail("cannot start Python");
    PyObject *cases = PyImport_ImportModule("tests.unit.wire_cases");
    if (cases == NULL) fail("cannot import tests.unit.wire_cases (PYTHONPATH must hold the checkout)");
    check = PyObject_GetAttrString(cases, "check");
    PyObject *builtin = PyObject_GetAttrString(cases, "columns");
    PyObject *native = builtin ? PyObject_GetAttrString(builtin, "NATIVE") : NULL;
    if (check == NULL || native != Py_True) fail("the compiled builder under test is not the one columns.py uses");
    Py_DECREF(native);
    Py_DECREF(builtin);
    Py_DECREF(cases);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)size);
    if (bytes == NULL) fail("out of memory");
    Py_ssize_t before = live_blocks;
    PyObject *result = PyObject_CallOneArg(check, bytes);
    Py_DECREF(bytes);
    if (result == NULL) fail("the builders disagree, or one raised what it should not");
    Py_DECREF(result);
    if (live_blocks != before) {
        fprintf(stderr, "fuzz_wire_columns: %zd blocks of the decoder left after its builders were freed\n",
                live_blocks - before);
        abort();
    }
    return 0;
}
