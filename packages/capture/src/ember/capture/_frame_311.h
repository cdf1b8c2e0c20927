/* The C side of ember's one version seam: every fact about a CPython 3.11
 * interpreter frame that the hook needs is read through the functions below.
 * Supporting 3.12 means adding _frame_312.h with the same functions (3.12
 * renames f_func to f_funcobj, and makes the eval function clear the frame),
 * and choosing between the two headers in _eval_frame.c. Nothing else in
 * the hook reads a _PyInterpreterFrame field directly.
 *
 * Facts relied on (see shared/reference/cpython311-jit-notes.md, sections 1.2-1.7):
 *   - the hook receives frames that the *caller* owns and clears (3.11), so the
 *     hook never clears the frame it was given, even when it runs other code;
 *   - for a fresh function frame, arguments are already in localsplus[0..n) in
 *     co_varnames order; MAKE_CELL and COPY_FREE_VARS have not run yet, so a
 *     cell argument still holds its raw value;
 *   - generator frames (owner == FRAME_OWNED_BY_GENERATOR), frames resumed by
 *     throw() (throwflag) and frames already executing (LASTI >= 0) must go
 *     straight to the default evaluator.
 * pycore_frame.h compiles without Py_BUILD_CORE; the Py_BUILD_CORE headers are
 * not needed and not used. Keep this in a .c translation unit (not C++).
 */
#ifndef EMBER_FRAME_311_H
#define EMBER_FRAME_311_H

#include <Python.h>

#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030C0000
#error "ember's frame hook supports CPython 3.11 only; add a _frame_3XX.h for other versions"
#endif

#include <internal/pycore_frame.h>

typedef _PyInterpreterFrame EmberFrame;

static inline PyCodeObject *
ember_frame_code(EmberFrame *f)
{
    return f->f_code;
}

/* The function object being called (a strong reference held by the frame). */
static inline PyFunctionObject *
ember_frame_func(EmberFrame *f)
{
    return f->f_func;
}

/* True for a function call that has not started executing and that the
 * calling thread owns: the only frames the hook may replace. */
static inline int
ember_frame_is_fresh_call(EmberFrame *f, int throwflag)
{
    return !throwflag && f->owner == FRAME_OWNED_BY_THREAD && _PyInterpreterFrame_LASTI(f) < 0;
}

/* The argument slots: positional, keyword-only, then *args, then **kwargs. */
static inline PyObject *const *
ember_frame_args(EmberFrame *f)
{
    return (PyObject *const *)f->localsplus;
}

/* The frame the thread runs now: the caller of a frame the hook was handed (whose own
 * `previous` link is set only once the eval loop starts on it). */
static inline EmberFrame *
ember_current_frame(PyThreadState *tstate)
{
    return tstate->cframe->current_frame;
}

/* The frame below a running frame on the thread's stack (its caller), or NULL. */
static inline EmberFrame *
ember_frame_previous(EmberFrame *f)
{
    return f->previous;
}

/* The frame's globals (a borrowed reference; never NULL for a running frame). */
static inline PyObject *
ember_frame_globals(EmberFrame *f)
{
    return f->f_globals;
}

/* Code flags that make a code object ineligible for interception. */
#define EMBER_UNTRACEABLE_FLAGS \
    (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE)

static inline Py_ssize_t
ember_code_nargs(PyCodeObject *co)
{
    return co->co_argcount + co->co_kwonlyargcount + ((co->co_flags & CO_VARARGS) ? 1 : 0) +
           ((co->co_flags & CO_VARKEYWORDS) ? 1 : 0);
}

#endif /* EMBER_FRAME_311_H */
