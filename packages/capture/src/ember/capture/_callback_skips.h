/* The callbacks that skip a code for themselves (CodeExtra.skipped_by in _eval_frame.c).
 *
 * A skip that depends on the callback (its backend refused the frame, it found nothing to
 * compile under its options) must not bind another callback: each records its own, as a
 * weak reference (the very object ThreadState.callback holds) in a list the code's extra
 * holds. Weak: a callback holds the codes it compiles, and the extra lives inside the
 * code, a cycle the collector cannot see. Included once, by _eval_frame.c.
 */
#ifndef EMBER_CALLBACK_SKIPS_H
#define EMBER_CALLBACK_SKIPS_H

#include <Python.h>

/* Whether `callback` is in `list` (NULL or a CodeExtra's skipped_by): a pointer compare
 * per callback that skipped the code, so a code every active callback skips costs next
 * to nothing per call. */
static inline int
skipped_by_callback(PyObject *list, PyObject *callback)
{
    if (list == NULL) {
        return 0;
    }
    /* wr_object, not PyWeakref_GET_OBJECT: no read of the referent. A dead reference
     * holds Py_None from before its referent's memory is freed, so no new object at
     * that address can match. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        if (((PyWeakReference *)PyList_GET_ITEM(list, i))->wr_object == callback) {
            return 1;
        }
    }
    return 0;
}

/* Add `callback` to *skipped_by (made on first use); dead callbacks' records go. */
static int
skip_for_callback(PyObject **skipped_by, PyObject *callback)
{
    if (*skipped_by == NULL && (*skipped_by = PyList_New(0)) == NULL) {
        return -1;
    }
    PyObject *list = *skipped_by;
    for (Py_ssize_t i = PyList_GET_SIZE(list) - 1; i >= 0; i--) {
        if (PyWeakref_GET_OBJECT(PyList_GET_ITEM(list, i)) == Py_None &&
            PyList_SetSlice(list, i, i + 1, NULL) < 0) {
            return -1;
        }
    }
    PyObject *ref = PyWeakref_NewRef(callback, NULL);
    if (ref == NULL) {
        return -1;
    }
    int status = PyList_Append(list, ref);
    Py_DECREF(ref);
    return status;
}

#endif /* EMBER_CALLBACK_SKIPS_H */
