/* ember.capture._eval_frame: the PEP 523 frame-evaluation hook.
 *
 * This file is deliberately small. It knows three things:
 *   1. per-thread state: which callback (if any) this thread runs under;
 *   2. a per-code cache in co_extra: an ordered list of (check_fn, fn) entries,
 *      a "skip this code" flag, and the callbacks that skip it for themselves;
 *   3. the decision on each fresh function frame: pass through, serve a cache
 *      hit by calling fn(*args), or ask the Python callback on a miss.
 * Everything else (what an entry is, which code to skip, how to compile) is
 * Python's business; see hook.py, the typed wrapper, for the public API.
 *
 * Callback values per thread (ThreadState.callback):
 *   NULL      hook disabled on this thread: every frame goes to the previous
 *             eval function;
 *   Py_False  run-only: serve cache hits, never call the callback;
 *   callable  normal: on a miss call callback(frame) -> (check_fn, fn) | None | False | True
 *             (an entry to add and use now; run normally this time; skip always, for
 *             every callback; skip always for this callback only).
 *
 * The eval function is per interpreter, so it is installed only while at least
 * one thread has a callback (an installed hook costs every Python call about
 * 1.4x, because 3.11 stops inlining Python-to-Python calls), and it chains to
 * whatever eval function was installed before it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structseq.h>

#include "_frame_311.h"
#include "_foreign.h"
#include "_callback_skips.h"

/* ---------------------------------------------------------------- state -- */

typedef struct {
    PyObject *callback;        /* strong; NULL, Py_False or a callable */
    int busy;                  /* >0 while a callback or check_fn runs: pass through */
    int foreign;               /* >0 while another evaluator's own code runs: pass through */
    PyCodeObject *skip_once;   /* borrowed; the next frame of this code is an entry's fn */
} ThreadState;

typedef struct CodeExtra {
    PyObject *entries;         /* list of 2-tuples (check_fn, fn), most recently hit first */
    int skip;                  /* never intercept this code, whatever the callback */
    PyObject *skipped_by;      /* NULL or weak refs to callbacks skipping it: _callback_skips.h */
    struct CodeExtra *prev, *next;
} CodeExtra;

static Py_tss_t thread_key = Py_tss_NEEDS_INIT;
/* The same pointer as thread_key's value, read on the hot path: a compiler
 * thread-local is a few instructions, PyThread_tss_get is a library call. */
static _Thread_local ThreadState *current_state = NULL;
static Py_ssize_t extra_index = -1;
static _PyFrameEvalFunction previous_eval = NULL; /* chained to; valid while installed */
static int installed = 0;                         /* our function is in the chain */
static Py_ssize_t active_threads = 0;
static CodeExtra *all_extras = NULL;              /* every live CodeExtra, for reset() */
static Py_ssize_t live_extras = 0;
static PyTypeObject *FrameType = NULL;

static PyObject *ember_eval_frame(PyThreadState *, EmberFrame *, int);
static void uninstall_hook(void);

/* ------------------------------------------------------- thread state -- */

static void
thread_state_free(PyObject *capsule)
{
    /* Runs when the thread's dict is cleared (thread exit, GIL held). */
    ThreadState *ts = PyCapsule_GetPointer(capsule, "ember.capture.ThreadState");
    if (ts == NULL) {
        PyErr_Clear();
        return;
    }
    if (ts->callback != NULL) {
        Py_CLEAR(ts->callback);
        if (--active_threads == 0 && _PyThreadState_UncheckedGet() != NULL) {
            uninstall_hook();
        }
    }
    if (PyThread_tss_get(&thread_key) == ts) {
        PyThread_tss_set(&thread_key, NULL);
    }
    if (current_state == ts) {
        current_state = NULL;
    }
    PyMem_RawFree(ts);
}

/* This thread's state, created on first use; NULL with an exception on failure. */
static ThreadState *
thread_state(void)
{
    ThreadState *ts = PyThread_tss_get(&thread_key);
    if (ts != NULL) {
        return ts;
    }
    ts = PyMem_RawCalloc(1, sizeof(ThreadState));
    if (ts == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    /* A capsule in the thread's dict frees the state when the thread dies. */
    PyObject *dict = PyThreadState_GetDict();
    PyObject *capsule = PyCapsule_New(ts, "ember.capture.ThreadState", thread_state_free);
    if (dict == NULL || capsule == NULL ||
        PyDict_SetItemString(dict, "ember.capture.ThreadState", capsule) < 0) {
        Py_XDECREF(capsule);
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "ember: no thread-state dict");
        }
        return NULL; /* the capsule (if made) owned ts and freed it */
    }
    Py_DECREF(capsule);
    if (PyThread_tss_set(&thread_key, ts) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "ember: PyThread_tss_set failed");
        return NULL;
    }
    current_state = ts;
    return ts;
}

/* ------------------------------------------------------ install/chain -- */

/* Whether our function can no longer be in the chain: the current eval
 * function is the default one (which chains to nothing) or the one we chained
 * to (someone restored what was below us). Any other function above us may
 * be chaining to us, and installing over it again would make a loop. */
static int
removed_from_chain(_PyFrameEvalFunction current)
{
    return current == _PyEval_EvalFrameDefault || current == previous_eval;
}

static void
install_hook(void)
{
    PyInterpreterState *interp = PyThreadState_GET()->interp;
    _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (current == ember_eval_frame || (installed && !removed_from_chain(current))) {
        installed = 1;
        return;
    }
    previous_eval = current;
    installed = 1;
    _PyInterpreterState_SetEvalFrameFunc(interp, ember_eval_frame);
}

static void
uninstall_hook(void)
{
    PyInterpreterState *interp = PyThreadState_GET()->interp;
    _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (current == ember_eval_frame) {
        _PyInterpreterState_SetEvalFrameFunc(interp, previous_eval);
        installed = 0;
    }
    else if (removed_from_chain(current)) {
        installed = 0;
    }
    /* Otherwise another PEP 523 user sits above us and calls us as its
     * previous function: we stay, passing every frame through. */
}

/* -------------------------------------------------------- code extras -- */

static void
code_extra_free(void *p)
{
    CodeExtra *extra = p;
    if (extra == NULL) {
        return;
    }
    if (extra->prev) extra->prev->next = extra->next;
    else all_extras = extra->next;
    if (extra->next) extra->next->prev = extra->prev;
    live_extras--;
    Py_XDECREF(extra->entries);
    Py_XDECREF(extra->skipped_by);
    PyMem_RawFree(extra);
}

/* The code's cache, or NULL if it has none (and create is 0). NULL with an
 * exception set on failure. */
static CodeExtra *
code_extra(PyCodeObject *code, int create)
{
    CodeExtra *extra = NULL;
    if (_PyCode_GetExtra((PyObject *)code, extra_index, (void **)&extra) < 0) {
        return NULL;
    }
    if (extra != NULL || !create) {
        return extra;
    }
    extra = PyMem_RawCalloc(1, sizeof(CodeExtra));
    if (extra == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    extra->entries = PyList_New(0);
    if (extra->entries == NULL) {
        PyMem_RawFree(extra);
        return NULL;
    }
    extra->next = all_extras;
    if (all_extras) all_extras->prev = extra;
    all_extras = extra;
    live_extras++;
    if (_PyCode_SetExtra((PyObject *)code, extra_index, extra) < 0) {
        code_extra_free(extra);
        return NULL;
    }
    return extra;
}

/* --------------------------------------------------------- hook logic -- */

/* An entry built from one function object may only serve frames of functions
 * that share its globals and its closure cells: fn runs with its own globals
 * and closure, and its guards may have bound them when they were compiled. */
static int
entry_fits_function(PyObject *fn, PyFunctionObject *func)
{
    if (!PyFunction_Check(fn)) {
        return 1;
    }
    PyFunctionObject *f = (PyFunctionObject *)fn;
    if (f->func_globals != func->func_globals) {
        return 0;
    }
    PyObject *a = f->func_closure, *b = func->func_closure;
    if (a == b) {
        return 1;
    }
    if (a == NULL || b == NULL || PyTuple_GET_SIZE(a) != PyTuple_GET_SIZE(b)) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(a); i++) {
        if (PyTuple_GET_ITEM(a, i) != PyTuple_GET_ITEM(b, i)) {
            return 0;
        }
    }
    return 1;
}

/* Call an entry's fn with the frame's arguments; its own frame is not
 * intercepted (frames of the functions it calls are). New reference. */
static PyObject *
call_entry_fn(ThreadState *ts, PyObject *fn, PyObject *const *args, Py_ssize_t nargs)
{
    PyCodeObject *saved = ts->skip_once;
    ts->skip_once = PyFunction_Check(fn) ? (PyCodeObject *)PyFunction_GET_CODE(fn) : NULL;
    PyObject *result = PyObject_Vectorcall(fn, args, nargs, NULL);
    ts->skip_once = saved;
    return result;
}

/* Find an entry whose check passes; move it to the front. Returns a new
 * reference to its fn, NULL with no exception on a miss, NULL with an
 * exception if a check raised. */
static PyObject *
lookup(ThreadState *ts, CodeExtra *extra, PyFunctionObject *func, PyObject *const *args,
       Py_ssize_t nargs)
{
    PyObject *entries = extra->entries;
    Py_INCREF(entries);
    PyObject *found = NULL;
    ts->busy++;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entries); i++) {
        PyObject *entry = PyList_GET_ITEM(entries, i);
        PyObject *fn = PyTuple_GET_ITEM(entry, 1);
        if (!entry_fits_function(fn, func)) {
            continue;
        }
        Py_INCREF(entry);
        PyObject *ok = PyObject_Vectorcall(PyTuple_GET_ITEM(entry, 0), args, nargs, NULL);
        int truth = ok == NULL ? -1 : PyObject_IsTrue(ok);
        Py_XDECREF(ok);
        if (truth < 0) {
            Py_DECREF(entry);
            break;
        }
        if (truth) {
            found = Py_NewRef(PyTuple_GET_ITEM(entry, 1));
            /* most recently hit first; the list may have changed under the check */
            if (i > 0 && i < PyList_GET_SIZE(entries) && PyList_GET_ITEM(entries, i) == entry) {
                memmove(&PyList_GET_ITEM(entries, 1), &PyList_GET_ITEM(entries, 0),
                        (size_t)i * sizeof(PyObject *));
                PyList_SET_ITEM(entries, 0, entry);
            }
            Py_DECREF(entry);
            break;
        }
        Py_DECREF(entry);
    }
    ts->busy--;
    Py_DECREF(entries);
    return found;
}

/* Whether another frame evaluator sits in the chain with ours (above or below). Only
 * then can frames belong to another compiler's region. */
static int
foreign_in_chain(PyThreadState *tstate)
{
    return _PyInterpreterState_GetEvalFrameFunc(tstate->interp) != ember_eval_frame ||
           previous_eval != _PyEval_EvalFrameDefault;
}

/* Build the frame description handed to the callback. */
static PyObject *
make_frame_info(EmberFrame *frame, PyObject *const *args, Py_ssize_t nargs)
{
    PyFunctionObject *func = ember_frame_func(frame);
    PyObject *info = PyStructSequence_New(FrameType);
    PyObject *argtuple = PyTuple_New(nargs);
    if (info == NULL || argtuple == NULL) {
        Py_XDECREF(info);
        Py_XDECREF(argtuple);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyTuple_SET_ITEM(argtuple, i, Py_NewRef(args[i]));
    }
    PyStructSequence_SET_ITEM(info, 0, Py_NewRef(ember_frame_code(frame)));
    PyStructSequence_SET_ITEM(info, 1, Py_NewRef(func));
    PyStructSequence_SET_ITEM(info, 2, Py_NewRef(func->func_globals));
    PyStructSequence_SET_ITEM(info, 3, Py_NewRef(func->func_builtins));
    PyStructSequence_SET_ITEM(info, 4, argtuple);
    return info;
}

static int
valid_entry(PyObject *entry)
{
    return PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 2 &&
           PyCallable_Check(PyTuple_GET_ITEM(entry, 0)) &&
           PyCallable_Check(PyTuple_GET_ITEM(entry, 1));
}

/* A miss in normal mode: ask the callback. Returns a new reference to the fn
 * to call, Py_None to run the frame normally, or NULL with an exception. */
static PyObject *
compile_miss(ThreadState *ts, EmberFrame *frame, CodeExtra *extra, PyObject *const *args,
             Py_ssize_t nargs)
{
    PyObject *info = make_frame_info(frame, args, nargs);
    if (info == NULL) {
        return NULL;
    }
    ts->busy++;
    /* The callback (a compile) passes its frames through, yet an installed hook costs each
     * of its Python calls ~1.4x (see the top): step out while it runs if no other thread
     * has a callback (one that sets one meanwhile installs it again); back in after. */
    int stepped_out = active_threads == 1 && _PyInterpreterState_GetEvalFrameFunc(
                                                 PyThreadState_GET()->interp) == ember_eval_frame;
    if (stepped_out) uninstall_hook();
    PyObject *decision = NULL;
    if (Py_EnterRecursiveCall(" in ember's frame callback") == 0) {
        decision = PyObject_CallOneArg(ts->callback, info);
        Py_LeaveRecursiveCall();
    }
    if (stepped_out && ts->callback != NULL) install_hook();
    ts->busy--;
    Py_DECREF(info);
    if (decision == NULL) {
        return NULL;
    }
    if (decision == Py_None) {
        return decision;
    }
    if (decision == Py_False) {
        extra->skip = 1;
        Py_DECREF(decision);
        Py_RETURN_NONE;
    }
    if (decision == Py_True) {
        Py_DECREF(decision);
        if (skip_for_callback(&extra->skipped_by, ts->callback) < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    if (!valid_entry(decision)) {
        PyErr_Format(PyExc_TypeError,
                     "ember frame callback must return a (check_fn, fn) pair of callables, "
                     "None, False or True, not %R",
                     decision);
        Py_DECREF(decision);
        return NULL;
    }
    /* A tuple subclass (CacheEntry) is stored as given; C reads it as a tuple. */
    if (PyList_Insert(extra->entries, 0, decision) < 0) {
        Py_DECREF(decision);
        return NULL;
    }
    PyObject *fn = Py_NewRef(PyTuple_GET_ITEM(decision, 1));
    Py_DECREF(decision);
    return fn;
}

static PyObject *
ember_eval_frame(PyThreadState *tstate, EmberFrame *frame, int throwflag)
{
    ThreadState *ts = current_state;
    PyCodeObject *code = ember_frame_code(frame);
    if (ts == NULL || ts->callback == NULL || ts->busy || ts->foreign) {
        if (active_threads == 0) {
            /* Left behind: another PEP 523 user restored us after our last
             * thread let go. Step out of the chain now. */
            _PyFrameEvalFunction next = previous_eval;
            uninstall_hook();
            return next(tstate, frame, throwflag);
        }
        return previous_eval(tstate, frame, throwflag);
    }
    if (ts->skip_once == code) {
        ts->skip_once = NULL;
        return previous_eval(tstate, frame, throwflag);
    }
    if (!ember_frame_is_fresh_call(frame, throwflag) || (code->co_flags & EMBER_UNTRACEABLE_FLAGS) ||
        !(code->co_flags & CO_OPTIMIZED)) {
        return previous_eval(tstate, frame, throwflag);
    }
    PyFunctionObject *func = ember_frame_func(frame);
    if (func == NULL || func->func_code != (PyObject *)code) {
        /* Another evaluator runs code of its own in place of the function's (its
         * compiled code): stay out of that code and of everything it calls. */
        ts->foreign++;
        PyObject *result = previous_eval(tstate, frame, throwflag);
        ts->foreign--;
        return result;
    }
    /* Hits are served without a look at the stack unless another evaluator is in the
     * chain; a miss always looks (it is about to call Python, which costs far more). */
    int chained = foreign_in_chain(tstate);
    if (chained && under_foreign_compiler(tstate, frame)) {
        return previous_eval(tstate, frame, throwflag);
    }
    int run_only = ts->callback == Py_False;
    CodeExtra *extra = code_extra(code, !run_only);
    if (extra == NULL) {
        if (PyErr_Occurred()) return NULL;
        return previous_eval(tstate, frame, throwflag);
    }
    if (extra->skip || skipped_by_callback(extra->skipped_by, ts->callback)) {
        return previous_eval(tstate, frame, throwflag);
    }
    PyObject *const *args = ember_frame_args(frame);
    Py_ssize_t nargs = ember_code_nargs(code);
    PyObject *fn = lookup(ts, extra, ember_frame_func(frame), args, nargs);
    if (fn == NULL && !PyErr_Occurred() && !run_only) {
        if (!chained && under_foreign_compiler(tstate, frame)) {
            return previous_eval(tstate, frame, throwflag);
        }
        fn = compile_miss(ts, frame, extra, args, nargs);
    }
    if (fn == NULL) {
        if (PyErr_Occurred()) return NULL;
        return previous_eval(tstate, frame, throwflag);
    }
    if (fn == Py_None) {
        Py_DECREF(fn);
        return previous_eval(tstate, frame, throwflag);
    }
    PyObject *result = call_entry_fn(ts, fn, args, nargs);
    Py_DECREF(fn);
    return result;
}

/* ------------------------------------------------------- Python API -- */

/* Make `callback` (NULL, Py_False or a callable; borrowed) this thread's callback,
 * installing or removing the eval function as threads come and go. Returns the
 * previous callback as a new reference (NULL for none). */
static PyObject *
swap_callback(ThreadState *ts, PyObject *callback)
{
    PyObject *old = ts->callback;
    if (callback != NULL) {
        active_threads += old == NULL;
        install_hook(); /* idempotent; re-installs if someone removed us */
    }
    else if (old != NULL && --active_threads == 0) {
        uninstall_hook();
    }
    ts->callback = Py_XNewRef(callback);
    return old; /* the reference ts held */
}

static int
check_callback(PyObject *callback)
{
    if (callback == Py_None || callback == Py_False || PyCallable_Check(callback)) {
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "callback must be a callable, False (run-only) or None, not %R",
                 callback);
    return -1;
}

static PyObject *
set_callback(PyObject *mod, PyObject *callback)
{
    ThreadState *ts = thread_state();
    if (ts == NULL || check_callback(callback) < 0) {
        return NULL;
    }
    PyObject *old = swap_callback(ts, callback == Py_None ? NULL : callback);
    return old == NULL ? Py_NewRef(Py_None) : old;
}

/* The "force_eager" stance (ember.capture.stance): compiled calls run with the hook off.
 * One int, read per call and written under the GIL: each thread's next call sees it. */
static int force_eager = 0;
static PyObject *
set_force_eager(PyObject *mod, PyObject *flag)
{
    int on = PyObject_IsTrue(flag), previous = force_eager;
    force_eager = on < 0 ? force_eager : on;
    return on < 0 ? NULL : PyBool_FromLong(previous);
}

/* call_with_callback(callback, var, value, fn, *args, **kwargs): fn(*args, **kwargs)
 * with `callback` as this thread's callback and the context variable `var` set to
 * `value` (var may be None), both restored afterwards. What ember.compiler's
 * compiled callables run on every call: one C call instead of two context managers. */
static PyObject *
call_with_callback(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 4) {
        return PyErr_Format(PyExc_TypeError,
                            "call_with_callback(callback, var, value, fn, *args, **kwargs)");
    }
    PyObject *callback = args[0], *var = args[1], *value = args[2], *fn = args[3];
    ThreadState *ts = thread_state();
    if (ts == NULL || check_callback(callback) < 0) {
        return NULL;
    }
    PyObject *token = NULL;
    if (var != Py_None) {
        token = PyContextVar_Set(var, value);
        if (token == NULL) {
            return NULL;
        }
    }
    PyObject *old = swap_callback(ts, callback == Py_None || force_eager ? NULL : callback);
    PyObject *result = PyObject_Vectorcall(fn, args + 4, nargs - 4, kwnames);
    PyObject *mine = swap_callback(ts, old);
    Py_XDECREF(old);
    Py_XDECREF(mine);
    if (token != NULL) {
        if (PyContextVar_Reset(var, token) < 0) {
            Py_CLEAR(result);
        }
        Py_DECREF(token);
    }
    return result;
}

static PyObject *
get_callback(PyObject *mod, PyObject *unused)
{
    ThreadState *ts = PyThread_tss_get(&thread_key);
    if (ts == NULL || ts->callback == NULL) {
        Py_RETURN_NONE;
    }
    return Py_NewRef(ts->callback);
}

static PyCodeObject *
as_code(PyObject *obj)
{
    if (!PyCode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "expected a code object, not %.100s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return (PyCodeObject *)obj;
}

static PyObject *
get_entries(PyObject *mod, PyObject *obj)
{
    PyCodeObject *code = as_code(obj);
    if (code == NULL) return NULL;
    CodeExtra *extra = code_extra(code, 0);
    if (extra == NULL) {
        return PyErr_Occurred() ? NULL : PyList_New(0);
    }
    return PyList_GetSlice(extra->entries, 0, PyList_GET_SIZE(extra->entries));
}

static PyObject *
add_entry(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        return PyErr_Format(PyExc_TypeError, "add_entry(code, entry) takes 2 arguments");
    }
    PyCodeObject *code = as_code(args[0]);
    if (code == NULL) return NULL;
    if (!valid_entry(args[1])) {
        return PyErr_Format(PyExc_TypeError, "entry must be a (check_fn, fn) pair of callables");
    }
    CodeExtra *extra = code_extra(code, 1);
    if (extra == NULL || PyList_Insert(extra->entries, 0, args[1]) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
remove_entry(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        return PyErr_Format(PyExc_TypeError, "remove_entry(code, entry) takes 2 arguments");
    }
    PyCodeObject *code = as_code(args[0]);
    if (code == NULL) return NULL;
    CodeExtra *extra = code_extra(code, 0);
    if (extra == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_FALSE;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(extra->entries); i++) {
        if (PyList_GET_ITEM(extra->entries, i) == args[1]) {
            if (PyList_SetSlice(extra->entries, i, i + 1, NULL) < 0) return NULL;
            Py_RETURN_TRUE;
        }
    }
    Py_RETURN_FALSE;
}

static PyObject *
clear_code(PyObject *mod, PyObject *obj)
{
    PyCodeObject *code = as_code(obj);
    if (code == NULL) return NULL;
    CodeExtra *extra = code_extra(code, 0);
    if (extra != NULL) {
        extra->skip = 0;
        Py_CLEAR(extra->skipped_by);
        if (PyList_SetSlice(extra->entries, 0, PyList_GET_SIZE(extra->entries), NULL) < 0) {
            return NULL;
        }
    }
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyObject *
set_skip(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        return PyErr_Format(PyExc_TypeError, "set_skip(code, flag) takes 2 arguments");
    }
    PyCodeObject *code = as_code(args[0]);
    int flag = PyObject_IsTrue(args[1]);
    if (code == NULL || flag < 0) return NULL;
    CodeExtra *extra = code_extra(code, flag);
    if (extra != NULL) {
        extra->skip = flag;
    }
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyObject *
is_skipped(PyObject *mod, PyObject *obj)
{
    PyCodeObject *code = as_code(obj);
    if (code == NULL) return NULL;
    CodeExtra *extra = code_extra(code, 0);
    if (extra == NULL && PyErr_Occurred()) return NULL;
    return PyBool_FromLong(extra != NULL && extra->skip);
}

static PyObject *
is_skipped_by(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        return PyErr_Format(PyExc_TypeError, "is_skipped_by(code, callback) takes 2 arguments");
    }
    PyCodeObject *code = as_code(args[0]);
    if (code == NULL) return NULL;
    CodeExtra *extra = code_extra(code, 0);
    if (extra == NULL && PyErr_Occurred()) return NULL;
    return PyBool_FromLong(extra != NULL && skipped_by_callback(extra->skipped_by, args[1]));
}

static PyObject *
reset(PyObject *mod, PyObject *unused)
{
    /* Clearing a list can run arbitrary finalizers that free other code
     * objects (and so unlink extras): restart from the head after each. */
    for (;;) {
        CodeExtra *extra = all_extras;
        while (extra != NULL && !extra->skip && extra->skipped_by == NULL &&
               PyList_GET_SIZE(extra->entries) == 0) {
            extra = extra->next;
        }
        if (extra == NULL) break;
        extra->skip = 0;
        Py_CLEAR(extra->skipped_by); /* weak references: clearing runs no user code */
        PyObject *old = extra->entries;
        extra->entries = PyList_New(0);
        if (extra->entries == NULL) {
            extra->entries = old;
            return NULL;
        }
        Py_DECREF(old);
    }
    Py_RETURN_NONE;
}

static PyObject *
hook_state(PyObject *mod, PyObject *unused)
{
    PyInterpreterState *interp = PyThreadState_GET()->interp;
    _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(interp);
    const char *where = current == ember_eval_frame               ? "top"
                        : installed && !removed_from_chain(current) ? "chained"
                        : "absent";
    return Py_BuildValue("{s:s,s:n,s:n}", "installed", where, "active_threads", active_threads,
                         "live_caches", live_extras);
}

/* call_unhooked(fn, *args): fn(*args) with this thread's hook passing every
 * frame through: a compiled graph's own Python code is never intercepted. */
static PyObject *
call_unhooked(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1) {
        return PyErr_Format(PyExc_TypeError, "call_unhooked(fn, *args) needs fn");
    }
    ThreadState *ts = current_state;
    if (ts != NULL) ts->busy++;
    PyObject *result = PyObject_Vectorcall(args[0], args + 1, nargs - 1, NULL);
    if (ts != NULL) ts->busy--;
    return result;
}

static PyMethodDef methods[] = {
    {"call_with_callback", (PyCFunction)(void (*)(void))call_with_callback,
     METH_FASTCALL | METH_KEYWORDS,
     "call_with_callback(callback, var, value, fn, *args, **kwargs): fn(*args, **kwargs) with "
     "callback set on this thread and context variable var set to value."},
    {"set_force_eager", set_force_eager, METH_O, "set_force_eager(flag) -> previous flag"},
    {"call_unhooked", (PyCFunction)(void (*)(void))call_unhooked, METH_FASTCALL,
     "call_unhooked(fn, *args): fn(*args) with no frame intercepted on this thread."},
    {"set_callback", set_callback, METH_O,
     "set_callback(cb) -> previous: cb is a callable, False (run-only) or None (disabled)."},
    {"get_callback", get_callback, METH_NOARGS, "This thread's callback (None if disabled)."},
    {"get_entries", get_entries, METH_O, "A copy of the code's cache entries, most recent first."},
    {"add_entry", (PyCFunction)(void (*)(void))add_entry, METH_FASTCALL,
     "add_entry(code, (check_fn, fn)): put an entry at the front of the code's cache."},
    {"clear_code", clear_code, METH_O, "Forget the code's entries and its skip flag."},
    {"remove_entry", (PyCFunction)(void (*)(void))remove_entry, METH_FASTCALL,
     "remove_entry(code, entry) -> bool: drop that very entry from the code's cache."},
    {"set_skip", (PyCFunction)(void (*)(void))set_skip, METH_FASTCALL,
     "set_skip(code, flag): never (or again) intercept frames of this code."},
    {"is_skipped", is_skipped, METH_O, "Whether frames of this code are never intercepted."},
    {"is_skipped_by", (PyCFunction)(void (*)(void))is_skipped_by, METH_FASTCALL,
     "is_skipped_by(code, callback): whether this callback (as the thread holds it) skips it."},
    {"reset", reset, METH_NOARGS, "Forget every cache entry and skip decision."},
    {"set_foreign_modules", set_foreign_modules, METH_O,
     "set_foreign_modules(prefixes): modules of other evaluators' compilers, stood aside for."},
    {"hook_state", hook_state, METH_NOARGS,
     "{'installed': top|chained|absent, 'active_threads': n, 'live_caches': n}"},
    {NULL, NULL, 0, NULL},
};

static PyStructSequence_Field frame_fields[] = {
    {"code", "the code object about to run"},
    {"function", "the function object being called"},
    {"globals", "the function's globals dict"},
    {"builtins", "the function's builtins dict"},
    {"args", "every argument slot in co_varnames order (positional, keyword-only, *args, **kwargs)"},
    {NULL, NULL},
};

static PyStructSequence_Desc frame_desc = {
    "ember.capture.Frame",
    "A function call the hook intercepted on a cache miss (valid during the callback).",
    frame_fields,
    5,
};

static struct PyModuleDef moduledef = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "ember.capture._eval_frame",
    .m_doc = "ember's PEP 523 frame hook; use ember.capture.hook, its typed wrapper.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__eval_frame(void)
{
    if (PyThread_tss_create(&thread_key) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "ember: cannot create thread-local key");
        return NULL;
    }
    extra_index = _PyEval_RequestCodeExtraIndex(code_extra_free);
    if (extra_index < 0) {
        PyErr_SetString(PyExc_RuntimeError, "ember: no code-extra index left");
        return NULL;
    }
    FrameType = PyStructSequence_NewType(&frame_desc);
    if (FrameType == NULL) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL || PyModule_AddObjectRef(m, "Frame", (PyObject *)FrameType) < 0) {
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
