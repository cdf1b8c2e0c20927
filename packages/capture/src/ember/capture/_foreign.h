/* Other frame evaluators' compilers, for ember's hook to stand aside from.
 *
 * While another PEP 523 evaluator is chained with ember's and one of its compiler's
 * frames is on the thread's stack (it is compiling, or its compiled code runs), every
 * frame goes to the next evaluator: ember must not compile the other compiler, the code
 * it generates, or frames it owns. The module prefixes come from Python
 * (hook.foreign_compilers(), found by what they hold). Included once, by _eval_frame.c.
 */
#ifndef EMBER_FOREIGN_H
#define EMBER_FOREIGN_H

#include <Python.h>

#include "_frame_311.h"

/* Module prefixes of other frame evaluators' compilers (hook.foreign_compilers()): while
 * one of their frames is on the stack and their evaluator is in the chain, ember stands
 * aside. A tuple of str; empty until hook.py sets it. */
static PyObject *foreign_modules = NULL;

/* Whether `name` (a module name) is one of foreign_modules or below one. */
static int
foreign_module(PyObject *name)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(foreign_modules); i++) {
        PyObject *prefix = PyTuple_GET_ITEM(foreign_modules, i);
        Py_ssize_t n = PyUnicode_GET_LENGTH(prefix);
        if (PyUnicode_Tailmatch(name, prefix, 0, n, -1) == 1 &&
            (PyUnicode_GET_LENGTH(name) == n || PyUnicode_READ_CHAR(name, n) == '.')) {
            return 1;
        }
    }
    return 0;
}

/* Whether `f` runs code of a module in foreign_modules. */
static int
foreign_frame(EmberFrame *f)
{
    static PyObject *key = NULL;
    if (key == NULL && (key = PyUnicode_InternFromString("__name__")) == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *globals = ember_frame_globals(f);
    PyObject *name = globals && PyDict_Check(globals) ? PyDict_GetItem(globals, key) : NULL;
    return name != NULL && PyUnicode_Check(name) && foreign_module(name);
}

/* Whether a frame of another compiler's module is `frame` or on this thread's stack
 * below it: that compiler is compiling, or its compiled code is running. */
static int
under_foreign_compiler(PyThreadState *tstate, EmberFrame *frame)
{
    if (foreign_modules == NULL || PyTuple_GET_SIZE(foreign_modules) == 0) {
        return 0;
    }
    if (foreign_frame(frame)) {
        return 1;
    }
    for (EmberFrame *f = ember_current_frame(tstate); f != NULL; f = ember_frame_previous(f)) {
        if (foreign_frame(f)) {
            return 1;
        }
    }
    return 0;
}

static PyObject *
set_foreign_modules(PyObject *mod, PyObject *prefixes)
{
    if (!PyTuple_Check(prefixes)) {
        return PyErr_Format(PyExc_TypeError, "expected a tuple of module names");
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes); i++) {
        if (!PyUnicode_Check(PyTuple_GET_ITEM(prefixes, i))) {
            return PyErr_Format(PyExc_TypeError, "expected a tuple of module names");
        }
    }
    Py_XSETREF(foreign_modules, Py_NewRef(prefixes));
    Py_RETURN_NONE;
}

#endif /* EMBER_FOREIGN_H */
