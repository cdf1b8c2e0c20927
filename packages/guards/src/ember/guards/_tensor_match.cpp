// ember.guards._tensor_match: the tensor check of a guard set, against torch's C++ tensor.
//
// The pure-C accelerator (_native.c) can only reach a tensor's metadata through
// torch's Python getters (about 870 ns per tensor: each builds a torch.Size or
// a tuple). Built against torch's headers, the same check reads the C++ tensor
// directly (about 80 ns). Same signatures and answers as _native.tensor_match /
// tensors_match and their Python twins in _accel.py, which the tests compare.
//
// A packed spec is the 10-tuple made by _accel.pack_tensor:
//   (cls, dtype, device | None for cpu, layout, sizes, strides | None,
//    requires_grad, inference, conj | None, neg)
// where a None among sizes or strides is a dynamic dim, not compared.
#include <Python.h>

#include <algorithm>
#include <vector>

#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/autograd/python_variable.h>

namespace {

constexpr Py_ssize_t kSpecSize = 10;

bool same_ints(PyObject* expected, c10::IntArrayRef actual) {
  const Py_ssize_t n = PyTuple_GET_SIZE(expected);
  if (n != static_cast<Py_ssize_t>(actual.size())) {
    return false;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* item = PyTuple_GET_ITEM(expected, i);
    if (item == Py_None) continue;  // a dynamic dim: relation guards check its value
    const long long want = PyLong_AsLongLong(item);
    if (want != actual[i]) {
      return false;
    }
  }
  return true;
}

// Whether `obj` matches `spec`; -1 with a Python error for a malformed spec.
int match(PyObject* spec, PyObject* obj) {
  if (!PyTuple_CheckExact(spec) || PyTuple_GET_SIZE(spec) != kSpecSize) {
    PyErr_SetString(PyExc_TypeError, "tensor spec must be a packed tuple");
    return -1;
  }
  PyObject* const* f = &PyTuple_GET_ITEM(spec, 0);
  if (reinterpret_cast<PyObject*>(Py_TYPE(obj)) != f[0] || !THPVariable_Check(obj)) {
    return 0;
  }
  try {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (t.scalar_type() != reinterpret_cast<THPDtype*>(f[1])->scalar_type) return 0;
    if (f[2] == Py_None ? !t.is_cpu() : t.device() != reinterpret_cast<THPDevice*>(f[2])->device)
      return 0;
    if (t.layout() != reinterpret_cast<THPLayout*>(f[3])->layout) return 0;
    if (!same_ints(f[4], t.sizes())) return 0;
    if (f[5] != Py_None && !same_ints(f[5], t.strides())) return 0;
    if (t.requires_grad() != (f[6] == Py_True)) return 0;
    if (t.is_inference() != (f[7] == Py_True)) return 0;
    if (f[8] != Py_None && t.is_conj() != (f[8] == Py_True)) return 0;
    if (t.is_neg() != (f[9] == Py_True)) return 0;
  } catch (...) {
    // Symbolic sizes, a sparse tensor asked for strides, ...: not the tensor we guard for.
    PyErr_Clear();
    return 0;
  }
  if (PyErr_Occurred()) {  // an int in a spec too large for long long
    PyErr_Clear();
    return 0;
  }
  return 1;
}

PyObject* tensor_match(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "tensor_match(spec, obj) takes 2 arguments");
    return nullptr;
  }
  const int ok = match(args[0], args[1]);
  if (ok < 0) return nullptr;
  return PyBool_FromLong(ok);
}

PyObject* tensors_match(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != nargs - 1) {
    PyErr_SetString(PyExc_TypeError, "expected (specs, *objects) of equal length");
    return nullptr;
  }
  for (Py_ssize_t i = 1; i < nargs; i++) {
    const int ok = match(PyTuple_GET_ITEM(args[0], i - 1), args[i]);
    if (ok < 0) return nullptr;
    if (ok == 0) Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

// The storage of `obj` (a tensor: checked by the caller), or its own address without one.
const void* storage_of(PyObject* obj) {
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!t.has_storage()) return obj;
  return t.storage().unsafeGetStorageImpl();
}

// Whether the storages are pairwise distinct (sorted in place).
bool all_distinct(const void** first, const void** last) {
  std::sort(first, last);
  return std::adjacent_find(first, last) == last;
}

// storage_groups((groups, offsets), *tensors): the tensors share storage exactly as
// _accel.storage_layout says (tensor i with the first tensor groups[i], and only those),
// each shared one at offsets[i]; empty groups: no two share. Linear in the tensors plus a
// sort of their storages: this runs on every call of a frame with two or more tensor inputs,
// after the tensor checks, and costs about what they do.
PyObject* storage_groups(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 2) {
    PyErr_SetString(PyExc_TypeError, "expected ((groups, offsets), *tensors)");
    return nullptr;
  }
  PyObject* groups = PyTuple_GET_ITEM(args[0], 0);
  PyObject* offsets = PyTuple_GET_ITEM(args[0], 1);
  const Py_ssize_t n = nargs - 1;
  const bool apart = PyTuple_Check(groups) && PyTuple_GET_SIZE(groups) == 0;
  if (!PyTuple_Check(groups) || !PyTuple_Check(offsets) ||
      (!apart && (PyTuple_GET_SIZE(groups) != n || PyTuple_GET_SIZE(offsets) != n))) {
    PyErr_SetString(PyExc_TypeError, "groups and offsets must be tuples, one per tensor");
    return nullptr;
  }
  constexpr Py_ssize_t kStack = 64;
  const void* stack[kStack];
  std::vector<const void*> heap;
  const void** storages = stack;
  if (n > kStack) {
    heap.resize(n);
    storages = heap.data();
  }
  Py_ssize_t firsts = 0;  // storages[0:firsts]: those of the first tensor of each group
  try {
    for (Py_ssize_t i = 0; i < n; i++) {
      PyObject* obj = args[i + 1];
      if (!THPVariable_Check(obj)) Py_RETURN_FALSE;
      const void* storage = storage_of(obj);
      if (apart) {
        storages[firsts++] = storage;
        continue;
      }
      const Py_ssize_t group = PyLong_AsSsize_t(PyTuple_GET_ITEM(groups, i));
      if (group < 0 || group > i) {
        PyErr_Clear();
        Py_RETURN_FALSE;
      }
      if (group == i) {
        storages[firsts++] = storage;
      } else if (storage != storage_of(args[group + 1])) {
        Py_RETURN_FALSE;
      }
      const long long offset = PyLong_AsLongLong(PyTuple_GET_ITEM(offsets, i));
      if (offset >= 0 && THPVariable_Unpack(obj).storage_offset() != offset) Py_RETURN_FALSE;
    }
  } catch (...) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  if (!all_distinct(storages, storages + firsts)) Py_RETURN_FALSE;
  Py_RETURN_TRUE;
}

// size_at(t, dim) / stride_at(t, dim): one entry of the sizes or strides, read from the
// C++ tensor (no torch.Size built, no Python override run); the fetchers of the
// TensorSize and TensorStride sources, which the relation guards read on every call.
template <bool kStrides>
PyObject* dim_at(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !THPVariable_Check(args[0]) || !PyLong_CheckExact(args[1])) {
    PyErr_SetString(PyExc_TypeError, "expected (tensor, dim)");
    return nullptr;
  }
  const Py_ssize_t dim = PyLong_AsSsize_t(args[1]);
  if (dim < 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "dim must be >= 0");
    return nullptr;
  }
  try {
    const at::Tensor& t = THPVariable_Unpack(args[0]);
    const c10::IntArrayRef ints = kStrides ? t.strides() : t.sizes();
    if (static_cast<size_t>(dim) >= ints.size()) {
      PyErr_SetString(PyExc_IndexError, "dim out of range");
      return nullptr;
    }
    return PyLong_FromLongLong(ints[dim]);
  } catch (const std::exception& error) {  // symbolic sizes, a layout without strides
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
}

PyMethodDef methods[] = {
    {"size_at", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(dim_at<false>)),
     METH_FASTCALL, "size_at(tensor, dim) -> int: tensor.size(dim)"},
    {"stride_at", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(dim_at<true>)),
     METH_FASTCALL, "stride_at(tensor, dim) -> int: tensor.stride(dim)"},
    {"tensor_match", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(tensor_match)),
     METH_FASTCALL, "tensor_match(spec, obj) -> bool"},
    {"tensors_match", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(tensors_match)),
     METH_FASTCALL, "tensors_match(specs, *objs) -> bool: every obj matches its spec"},
    {"storage_groups",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(storage_groups)), METH_FASTCALL,
     "storage_groups((groups, offsets), *tensors) -> bool: they share storage as expected"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "ember.guards._tensor_match",
    "Tensor checks of ember guard sets against torch's C++ tensors (see _accel.py).",
    -1,
    methods,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__tensor_match() {
  return PyModule_Create(&module_def);
}
