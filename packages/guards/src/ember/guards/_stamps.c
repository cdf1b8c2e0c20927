/* ember.guards._native, part two: stamps, the check of what has changed.
 *
 * A stamp program (built by ember/guards/stamps.py, which explains the idea) is a list
 * of facts about objects that a guard set reads but the frame does not pass in: modules,
 * their dicts, classes, functions. Each fact is a pointer compare or a version compare:
 *
 *   ROOT    a b      weakref a still points at b (the object a pinned argument is)
 *   DICT    a _ tag  dict a's ma_version_tag is tag: nothing was set in it or deleted
 *   OWNDICT a b      object a's instance dict is still dict b
 *   TYPE    a b tag  type(a) is b, and (tag != 0) b's tp_version_tag is still tag
 *   TYPEVER a _ tag  a is a class whose tp_version_tag is still tag
 *   FUNC    a b f    field f of function a (__code__, __defaults__, ...) is still b
 *   CELL    a b      closure cell a (held by the check) still holds b (held in keep)
 *   DICTKEY a k v    dict a maps key k to v (v = 0: has no key k); for a dict that changes
 *                    every call in keys the guards do not read (v is held in keep)
 *
 * Addresses are borrowed: the program only reads through an address the facts before it
 * have shown alive (a value of an unchanged dict, the type of a live object, a weakref's
 * target). What must outlive the program (the weakrefs, module dicts, FUNC values) the
 * Python side passes in `keep`, held by the capsule.
 *
 * The version fields are CPython's own (PEP 509 dict versions, the type attribute cache's
 * tags). They exist in 3.11, the one version this file is verified against; for any other
 * version stamps_pack returns None and every call runs the full check.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define STAMPS_SUPPORTED (PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000)

enum { S_ROOT, S_DICT, S_OWNDICT, S_TYPE, S_TYPEVER, S_FUNC, S_DICTKEY, S_CELL, S_NOPS };
enum { F_CODE, F_DEFAULTS, F_KWDEFAULTS, F_CLOSURE, F_GLOBALS, F_NFIELDS };

typedef struct {
    int op;
    PyObject *a, *b;
    unsigned long long tag;
} stamp_op;

typedef struct {
    Py_ssize_t n;
    Py_ssize_t hits;
    PyObject *keep;
    stamp_op ops[];
} stamp_prog;

static const char *CAPSULE = "ember.guards.stamps";

static void
prog_free(PyObject *capsule)
{
    stamp_prog *prog = (stamp_prog *)PyCapsule_GetPointer(capsule, CAPSULE);
    if (prog != NULL) {
        Py_XDECREF(prog->keep);
        PyMem_Free(prog);
    }
}

static PyObject *
field_of(PyFunctionObject *fn, long field)
{
    switch (field) {
    case F_CODE: return fn->func_code;
    case F_DEFAULTS: return fn->func_defaults;
    case F_KWDEFAULTS: return fn->func_kwdefaults;
    case F_CLOSURE: return fn->func_closure;
    default: return fn->func_globals;
    }
}

/* The index of the first fact that no longer holds, or -1 when all hold. */
static Py_ssize_t
first_failure(const stamp_prog *prog)
{
#if STAMPS_SUPPORTED
    for (Py_ssize_t i = 0; i < prog->n; i++) {
        const stamp_op *s = &prog->ops[i];
        switch (s->op) {
        case S_ROOT:
            if (PyWeakref_GET_OBJECT(s->a) != s->b)
                return i;
            break;
        case S_DICT:
            if (((PyDictObject *)s->a)->ma_version_tag != s->tag)
                return i;
            break;
        case S_OWNDICT: {
            PyObject **slot = _PyObject_GetDictPtr(s->a);
            if (slot == NULL || *slot != s->b)
                return i;
            break;
        }
        case S_TYPE:
            if ((PyObject *)Py_TYPE(s->a) != s->b)
                return i;
            if (s->tag == 0)  /* the class alone, not what its attributes are */
                break;
            if (!PyType_HasFeature((PyTypeObject *)s->b, Py_TPFLAGS_VALID_VERSION_TAG)
                || ((PyTypeObject *)s->b)->tp_version_tag != s->tag)
                return i;
            break;
        case S_TYPEVER:
            if (!PyType_HasFeature((PyTypeObject *)s->a, Py_TPFLAGS_VALID_VERSION_TAG)
                || ((PyTypeObject *)s->a)->tp_version_tag != s->tag)
                return i;
            break;
        case S_DICTKEY: {
            PyObject *found = PyDict_GetItemWithError(s->a, s->b);
            if (found == NULL && PyErr_Occurred())
                PyErr_Clear();
            if ((unsigned long long)(uintptr_t)found != s->tag)
                return i;
            break;
        }
        case S_CELL:
            if (PyCell_GET(s->a) != s->b)
                return i;
            break;
        case S_FUNC:
            if (field_of((PyFunctionObject *)s->a, (long)s->tag) != s->b)
                return i;
            break;
        default:
            return i;
        }
    }
    return -1;
#else
    return 0;
#endif
}

static PyObject *
address(PyObject *value)
{
    return value == Py_None ? NULL : (PyObject *)PyLong_AsVoidPtr(value);
}

/* stamps_pack(ops, keep) -> capsule, or None where stamps are not supported.
 * ops: tuple of (op, a, b, tag) with a and b addresses (ints) or None. */
/* One (op, a, b, tag) tuple into *s; 0 with an exception set if it is malformed. */
static int
unpack(PyObject *item, stamp_op *s)
{
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4) {
        PyErr_SetString(PyExc_TypeError, "a stamp is (op, a, b, tag)");
        return 0;
    }
    s->op = (int)PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
    s->a = address(PyTuple_GET_ITEM(item, 1));
    s->b = address(PyTuple_GET_ITEM(item, 2));
    s->tag = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 3));
    if (PyErr_Occurred())
        return 0;
    if (s->op < 0 || s->op >= S_NOPS || s->a == NULL || (s->op == S_FUNC && s->tag >= F_NFIELDS)) {
        PyErr_SetString(PyExc_ValueError, "bad stamp");
        return 0;
    }
    return 1;
}

/* stamps_pack(ops, keep) -> capsule, or None where stamps are not supported.
 * ops: tuple of (op, a, b, tag) with a and b addresses (ints) or None. */
PyObject *
stamps_pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "stamps_pack(ops: tuple, keep: tuple)");
        return NULL;
    }
    if (!STAMPS_SUPPORTED)
        Py_RETURN_NONE;
    Py_ssize_t n = PyTuple_GET_SIZE(args[0]);
    stamp_prog *prog =
        (stamp_prog *)PyMem_Malloc(sizeof(stamp_prog) + (size_t)n * sizeof(stamp_op));
    if (prog == NULL)
        return PyErr_NoMemory();
    prog->n = n;
    prog->hits = 0;
    prog->keep = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!unpack(PyTuple_GET_ITEM(args[0], i), &prog->ops[i])) {
            PyMem_Free(prog);
            return NULL;
        }
    }
    prog->keep = Py_NewRef(args[1]);
    PyObject *capsule = PyCapsule_New(prog, CAPSULE, prog_free);
    if (capsule == NULL) {
        Py_DECREF(prog->keep);
        PyMem_Free(prog);
    }
    return capsule;
}

/* stamps_match(capsule_or_None) -> bool: every fact still holds (counts a hit). */
PyObject *
stamps_match(PyObject *self, PyObject *arg)
{
    if (arg == Py_None)
        Py_RETURN_FALSE;
    stamp_prog *prog = (stamp_prog *)PyCapsule_GetPointer(arg, CAPSULE);
    if (prog == NULL)
        return NULL;
    if (first_failure(prog) >= 0)
        Py_RETURN_FALSE;
    prog->hits++;
    Py_RETURN_TRUE;
}

/* stamps_failure(capsule) -> int: the index of the first fact that fails, -1 if none. */
PyObject *
stamps_failure(PyObject *self, PyObject *arg)
{
    stamp_prog *prog = (stamp_prog *)PyCapsule_GetPointer(arg, CAPSULE);
    return prog == NULL ? NULL : PyLong_FromSsize_t(first_failure(prog));
}

/* stamps_hits(capsule) -> int: how many times stamps_match said True. */
PyObject *
stamps_hits(PyObject *self, PyObject *arg)
{
    stamp_prog *prog = (stamp_prog *)PyCapsule_GetPointer(arg, CAPSULE);
    return prog == NULL ? NULL : PyLong_FromSsize_t(prog->hits);
}

/* dict_version(d) -> int: d's ma_version_tag. */
PyObject *
dict_version(PyObject *self, PyObject *arg)
{
    if (!PyDict_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "dict_version() needs a dict");
        return NULL;
    }
#if STAMPS_SUPPORTED
    return PyLong_FromUnsignedLongLong(((PyDictObject *)arg)->ma_version_tag);
#else
    return PyLong_FromLong(0);
#endif
}

/* type_version(cls) -> int: cls's attribute-cache tag (assigned now if it has none), or 0
 * when it cannot have one (the tags ran out). */
PyObject *
type_version(PyObject *self, PyObject *arg)
{
    if (!PyType_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "type_version() needs a class");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)arg;
    if (!PyType_HasFeature(type, Py_TPFLAGS_VALID_VERSION_TAG)) {
        /* a lookup through the attribute cache assigns the tag */
        PyObject *name = PyUnicode_InternFromString("__ember_stamp__");
        if (name == NULL)
            return NULL;
        (void)_PyType_Lookup(type, name);
        Py_DECREF(name);
    }
    if (!PyType_HasFeature(type, Py_TPFLAGS_VALID_VERSION_TAG))
        return PyLong_FromLong(0);
    return PyLong_FromUnsignedLong(type->tp_version_tag);
}

/* instance_dict(obj) -> dict or None: the dict generic attribute lookup reads (made now
 * from the inline values where the object has not needed one yet, as __dict__ does). */
PyObject *
instance_dict(PyObject *self, PyObject *arg)
{
    PyObject **slot = _PyObject_GetDictPtr(arg);
    if (slot == NULL || *slot == NULL || !PyDict_Check(*slot))
        Py_RETURN_NONE;
    return Py_NewRef(*slot);
}
