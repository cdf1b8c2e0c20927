/* ember.guards._native: the hot leaf checks of a compiled guard set, in C.
 *
 * Plain C over the Python C API only (no torch headers). Torch's tensor
 * metadata getters cost 50-150 ns each on their own, so the gain here is
 * everything around them: no attribute lookup, no bytecode dispatch, no
 * bound-method objects, and one call for all the tensors of a guard set.
 * ember/guards/_accel.py holds the pure-Python twin of every function;
 * tests/test_native.py checks that the two agree.
 *
 * Packed specs (built by _accel.py):
 *   tensor: (type, dtype, device_or_None_for_cpu, layout, sizes, strides_or_None,
 *            requires_grad, inference, conj_or_None, neg)
 *           a None among sizes or strides is a dynamic dim: not compared
 *   module: (training, (forward_pre_ids, forward_ids, backward_pre_ids, backward_ids))
 * Every function returns True/False; an Exception raised by torch or by the
 * object means False; anything else (KeyboardInterrupt, ...) propagates.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

enum { T_TYPE, T_DTYPE, T_DEVICE, T_LAYOUT, T_SIZES, T_STRIDES,
       T_REQUIRES_GRAD, T_INFERENCE, T_CONJ, T_NEG, T_LEN };

static PyTypeObject *tensor_base = NULL;
static PyGetSetDef *g_dtype, *g_shape, *g_requires_grad, *g_is_cpu, *g_device, *g_layout;
static PyMethodDef *m_stride, *m_is_inference, *m_is_conj, *m_is_neg;
static PyObject *empty_tuple, *s_training, *s_hooks[4];
static const char *hook_names[4] = {
    "_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks"};

/* Turn a pending Exception into "no match" (0); keep anything else (-1). */
static int
swallow(void)
{
    if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

static PyObject *
get(PyGetSetDef *def, PyObject *obj)
{
    return def->get(obj, def->closure);
}

/* Call a no-argument method of TensorBase the way its own flags ask. */
static PyObject *
call0(PyMethodDef *def, PyObject *obj)
{
    int flags = def->ml_flags & ~METH_COEXIST;
    void (*fn)(void) = (void (*)(void))def->ml_meth;
    switch (flags) {
    case METH_NOARGS:
        return ((PyCFunction)fn)(obj, NULL);
    case METH_VARARGS:
        return ((PyCFunction)fn)(obj, empty_tuple);
    case METH_VARARGS | METH_KEYWORDS:
        return ((PyCFunctionWithKeywords)fn)(obj, empty_tuple, NULL);
    case METH_FASTCALL:
        return ((_PyCFunctionFast)fn)(obj, NULL, 0);
    case METH_FASTCALL | METH_KEYWORDS:
        return ((_PyCFunctionFastWithKeywords)fn)(obj, NULL, 0, NULL);
    }
    PyErr_SetString(PyExc_SystemError, "unsupported method flags");
    return NULL;
}

/* 1 when got (a tuple, torch.Size included) equals the tuple of ints want
 * (None in want matches any entry). */
static int
ints_equal(PyObject *got, PyObject *want)
{
    Py_ssize_t n = PyTuple_GET_SIZE(want);
    if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != n)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(got, i), *b = PyTuple_GET_ITEM(want, i);
        if (a != b && b != Py_None) {  /* None: a dynamic dim, checked by relation guards */
            int r = PyObject_RichCompareBool(a, b, Py_EQ);
            if (r != 1)
                return r < 0 ? swallow() : 0;
        }
    }
    return 1;
}

/* Compare a getter's result (new reference, may be NULL) with want by identity. */
static int
same(PyObject *got, PyObject *want)
{
    if (got == NULL)
        return swallow();
    Py_DECREF(got);
    return got == want;
}

static int
tuple_field(PyObject *got, PyObject *want)
{
    if (got == NULL)
        return swallow();
    int r = ints_equal(got, want);
    Py_DECREF(got);
    return r;
}

static int
device_field(PyObject *t, PyObject *want)
{
    if (want == Py_None)
        return same(get(g_is_cpu, t), Py_True);
    PyObject *got = get(g_device, t);
    if (got == NULL)
        return swallow();
    int r = PyObject_RichCompareBool(got, want, Py_EQ);
    Py_DECREF(got);
    return r < 0 ? swallow() : r;
}

/* Cheapest and most likely to differ first: type, sizes, dtype, device, strides. */
static int
tensor_match_impl(PyObject *spec, PyObject *t)
{
    int r;
    if (tensor_base == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ember.guards._native.setup() was not called");
        return -1;
    }
    if (!PyTuple_CheckExact(spec) || PyTuple_GET_SIZE(spec) != T_LEN) {
        PyErr_SetString(PyExc_TypeError, "tensor spec must be a packed tuple");
        return -1;
    }
#define F(i) PyTuple_GET_ITEM(spec, i)
    if ((PyObject *)Py_TYPE(t) != F(T_TYPE) || !PyType_IsSubtype(Py_TYPE(t), tensor_base))
        return 0;
    if ((r = tuple_field(get(g_shape, t), F(T_SIZES))) != 1) return r;
    if ((r = same(get(g_dtype, t), F(T_DTYPE))) != 1) return r;
    if ((r = device_field(t, F(T_DEVICE))) != 1) return r;
    if ((r = same(get(g_layout, t), F(T_LAYOUT))) != 1) return r;
    if (F(T_STRIDES) != Py_None
        && (r = tuple_field(call0(m_stride, t), F(T_STRIDES))) != 1) return r;
    if ((r = same(get(g_requires_grad, t), F(T_REQUIRES_GRAD))) != 1) return r;
    if ((r = same(call0(m_is_inference, t), F(T_INFERENCE))) != 1) return r;
    if (F(T_CONJ) != Py_None
        && (r = same(call0(m_is_conj, t), F(T_CONJ))) != 1) return r;
    return same(call0(m_is_neg, t), F(T_NEG));
#undef F
}

static int
hooks_equal(PyObject *hooks, PyObject *want)
{
    if (!PyDict_Check(hooks) || PyDict_GET_SIZE(hooks) != PyTuple_GET_SIZE(want))
        return 0;
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    while (PyDict_Next(hooks, &pos, &key, &value)) {
        PyObject *expected = PyTuple_GET_ITEM(want, i++);
        if (key != expected) {
            int r = PyObject_RichCompareBool(key, expected, Py_EQ);
            if (r != 1)
                return r < 0 ? swallow() : 0;
        }
    }
    return 1;
}

/* Reads the instance dict, where nn.Module keeps training and its hook dicts. */
static int
module_match_impl(PyObject *spec, PyObject *m)
{
    if (!PyTuple_CheckExact(spec) || PyTuple_GET_SIZE(spec) != 2
        || !PyTuple_CheckExact(PyTuple_GET_ITEM(spec, 1))
        || PyTuple_GET_SIZE(PyTuple_GET_ITEM(spec, 1)) != 4) {
        PyErr_SetString(PyExc_TypeError, "module spec must be a packed tuple");
        return -1;
    }
    PyObject *dict = PyObject_GenericGetDict(m, NULL);
    if (dict == NULL)
        return swallow();
    int r = 0;
    PyObject *training = PyDict_GetItemWithError(dict, s_training);
    if (training != PyTuple_GET_ITEM(spec, 0))
        goto done;
    r = 1;
    for (int i = 0; i < 4; i++) {
        PyObject *hooks = PyDict_GetItemWithError(dict, s_hooks[i]);
        r = 0;
        if (hooks == NULL)
            goto done;
        if ((r = hooks_equal(hooks, PyTuple_GET_ITEM(PyTuple_GET_ITEM(spec, 1), i))) != 1)
            goto done;
    }
done:
    Py_DECREF(dict);
    if (PyErr_Occurred())
        return swallow();
    return r;
}

static PyObject *
result(int r)
{
    if (r < 0)
        return NULL;
    return Py_NewRef(r ? Py_True : Py_False);
}

typedef int (*matcher)(PyObject *, PyObject *);

/* (specs, *objs): all(match(spec, obj) for spec, obj in zip(specs, objs, strict=True)) */
static PyObject *
match_many(PyObject *const *args, Py_ssize_t nargs, matcher match)
{
    if (nargs < 1 || !PyTuple_CheckExact(args[0])
        || PyTuple_GET_SIZE(args[0]) != nargs - 1) {
        PyErr_SetString(PyExc_TypeError, "expected (specs, *objects) of equal length");
        return NULL;
    }
    for (Py_ssize_t i = 1; i < nargs; i++) {
        int r = match(PyTuple_GET_ITEM(args[0], i - 1), args[i]);
        if (r != 1)
            return result(r);
    }
    Py_RETURN_TRUE;
}

static PyObject *
tensor_match(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "tensor_match(spec, tensor)");
        return NULL;
    }
    return result(tensor_match_impl(args[0], args[1]));
}

static PyObject *
tensors_match(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return match_many(args, nargs, tensor_match_impl);
}

static PyObject *
module_match(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "module_match(spec, module)");
        return NULL;
    }
    return result(module_match_impl(args[0], args[1]));
}

static PyObject *
modules_match(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return match_many(args, nargs, module_match_impl);
}

/* calls_return(fns, values): all(fn() == value for fn, value in zip(fns, values)) */
static PyObject *
calls_return(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_CheckExact(args[0]) || !PyTuple_CheckExact(args[1])
        || PyTuple_GET_SIZE(args[0]) != PyTuple_GET_SIZE(args[1])) {
        PyErr_SetString(PyExc_TypeError, "calls_return(fns, values) takes two tuples of equal length");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[0]); i++) {
        PyObject *got = PyObject_CallNoArgs(PyTuple_GET_ITEM(args[0], i));
        if (got == NULL)
            return result(swallow());
        int r = PyObject_RichCompareBool(got, PyTuple_GET_ITEM(args[1], i), Py_EQ);
        Py_DECREF(got);
        if (r != 1)
            return result(r < 0 ? swallow() : 0);
    }
    Py_RETURN_TRUE;
}

/* True when no two arguments are the same object. */
static PyObject *
distinct(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    for (Py_ssize_t i = 1; i < nargs; i++)
        for (Py_ssize_t j = 0; j < i; j++)
            if (args[i] == args[j])
                Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

/* size_at(t, dim) / stride_at(t, dim): one entry of torch's own sizes or strides, an int
 * (the fetchers of TensorSize and TensorStride where the C++ matcher is not built). */
static PyObject *
dim_at(PyObject *const *args, Py_ssize_t nargs, int strides)
{
    if (tensor_base == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ember.guards._native.setup() was not called");
        return NULL;
    }
    if (nargs != 2 || !PyType_IsSubtype(Py_TYPE(args[0]), tensor_base)
        || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "expected (tensor, dim)");
        return NULL;
    }
    Py_ssize_t dim = PyLong_AsSsize_t(args[1]);
    if (dim < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_IndexError, "dim must be >= 0");
        return NULL;
    }
    PyObject *ints = strides ? call0(m_stride, args[0]) : get(g_shape, args[0]);
    if (ints == NULL)
        return NULL;
    PyObject *item = NULL;
    if (!PyTuple_Check(ints))
        PyErr_SetString(PyExc_TypeError, "sizes are not a tuple");
    else if (dim >= PyTuple_GET_SIZE(ints))
        PyErr_SetString(PyExc_IndexError, "dim out of range");
    else if (!PyLong_CheckExact(PyTuple_GET_ITEM(ints, dim)))  /* a symbolic size */
        PyErr_SetString(PyExc_TypeError, "size is not an int");
    else
        item = Py_NewRef(PyTuple_GET_ITEM(ints, dim));
    Py_DECREF(ints);
    return item;
}

static PyObject *
size_at(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return dim_at(args, nargs, 0);
}

static PyObject *
stride_at(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return dim_at(args, nargs, 1);
}

static int
find(PyTypeObject *type, const char *name, PyTypeObject *kind, PyObject **out)
{
    PyObject *descr = PyDict_GetItemString(type->tp_dict, name);
    if (descr == NULL || !Py_IS_TYPE(descr, kind)) {
        PyErr_Format(PyExc_TypeError, "TensorBase.%s is not a %s", name, kind->tp_name);
        return -1;
    }
    *out = descr;
    return 0;
}

#define GETTER(var, name)                                                      \
    if (find(type, name, &PyGetSetDescr_Type, &descr) < 0) return NULL;        \
    var = ((PyGetSetDescrObject *)descr)->d_getset;
#define METHOD(var, name)                                                      \
    if (find(type, name, &PyMethodDescr_Type, &descr) < 0) return NULL;        \
    var = ((PyMethodDescrObject *)descr)->d_method;

/* setup(torch._C.TensorBase): resolve the getters and methods once. */
static PyObject *
setup(PyObject *self, PyObject *arg)
{
    if (!PyType_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "setup() takes torch._C.TensorBase");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)arg;
    PyObject *descr;
    GETTER(g_dtype, "dtype") GETTER(g_shape, "shape") GETTER(g_device, "device")
    GETTER(g_requires_grad, "requires_grad") GETTER(g_is_cpu, "is_cpu")
    GETTER(g_layout, "layout")
    METHOD(m_stride, "stride") METHOD(m_is_inference, "is_inference")
    METHOD(m_is_conj, "is_conj") METHOD(m_is_neg, "is_neg")
    Py_INCREF(arg);  /* kept for the life of the process: the descriptors live in it */
    Py_XSETREF(tensor_base, type);
    Py_RETURN_NONE;
}

/* in _stamps.c */
PyObject *stamps_pack(PyObject *, PyObject *const *, Py_ssize_t);
PyObject *stamps_match(PyObject *, PyObject *);
PyObject *stamps_hits(PyObject *, PyObject *);
PyObject *stamps_failure(PyObject *, PyObject *);
PyObject *dict_version(PyObject *, PyObject *);
PyObject *type_version(PyObject *, PyObject *);
PyObject *instance_dict(PyObject *, PyObject *);

static PyMethodDef methods[] = {
    {"setup", setup, METH_O, "setup(TensorBase): resolve torch's getters."},
    {"tensor_match", (PyCFunction)(void (*)(void))tensor_match, METH_FASTCALL,
     "tensor_match(spec, tensor) -> bool"},
    {"tensors_match", (PyCFunction)(void (*)(void))tensors_match, METH_FASTCALL,
     "tensors_match(specs, *tensors) -> bool"},
    {"module_match", (PyCFunction)(void (*)(void))module_match, METH_FASTCALL,
     "module_match(spec, module) -> bool"},
    {"modules_match", (PyCFunction)(void (*)(void))modules_match, METH_FASTCALL,
     "modules_match(specs, *modules) -> bool"},
    {"calls_return", (PyCFunction)(void (*)(void))calls_return, METH_FASTCALL,
     "calls_return(fns, values) -> bool: every fn() == its value"},
    {"distinct", (PyCFunction)(void (*)(void))distinct, METH_FASTCALL,
     "distinct(*objects) -> bool: no two are the same object"},
    {"size_at", (PyCFunction)(void (*)(void))size_at, METH_FASTCALL,
     "size_at(tensor, dim) -> int: tensor.size(dim)"},
    {"stride_at", (PyCFunction)(void (*)(void))stride_at, METH_FASTCALL,
     "stride_at(tensor, dim) -> int: tensor.stride(dim)"},
    {"stamps_pack", (PyCFunction)(void (*)(void))stamps_pack, METH_FASTCALL,
     "stamps_pack(ops, keep) -> program, or None where stamps are not supported"},
    {"stamps_match", stamps_match, METH_O, "stamps_match(program) -> bool (None: False)"},
    {"stamps_hits", stamps_hits, METH_O, "stamps_hits(program) -> int"},
    {"stamps_failure", stamps_failure, METH_O, "stamps_failure(program) -> int (-1: none)"},
    {"dict_version", dict_version, METH_O, "dict_version(d) -> int"},
    {"type_version", type_version, METH_O, "type_version(cls) -> int (0: none)"},
    {"instance_dict", instance_dict, METH_O, "instance_dict(obj) -> dict or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "ember.guards._native",
    .m_doc = "Hot leaf checks of ember guard sets (see ember/guards/_accel.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    empty_tuple = PyTuple_New(0);
    s_training = PyUnicode_InternFromString("training");
    if (empty_tuple == NULL || s_training == NULL)
        return NULL;
    for (int i = 0; i < 4; i++)
        if ((s_hooks[i] = PyUnicode_InternFromString(hook_names[i])) == NULL)
            return NULL;
    return PyModule_Create(&module);
}
