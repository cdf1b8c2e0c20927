// ember.inductor._launch: a generated wrapper's per-tensor work, one C call for all tensors.
//
// A wrapper over hundreds of tensors (an optimizer step over every parameter) spent more
// time on them than its kernels needed: a `stride()` check and a `data_ptr()` call per
// tensor through torch's Python getters (each builds a tuple or an int), and a ctypes call
// converting every pointer again. Built against torch's headers, both read the C++ tensor:
//
//   strides_differ(tensors, strides) -> bool
//       whether some tensor's strides are not the tuple at its index in `strides`
//   launch(kernel, tensors, *numbers) -> None
//       `kernel` is (address of the kernel's packed entry point, type codes of `numbers`):
//       the tensors' data pointers and the numbers go into one array of 8-byte slots,
//       which the entry point (wrapper_launch.PACKED_CPP) unpacks into the kernel's
//       arguments; the GIL is released while the kernel runs, as ctypes does.
//
//   out_of_range(index, size) -> None, the first index outside [0, size), or NotImplemented
//       an embedding's or gather's bounds check on a contiguous CPU int64/int32 tensor in
//       one pass (eager checks inside its kernel; three aten ops cost 20-28 us each);
//       NotImplemented for anything else, which the Python twin then checks
//
// Same answers as the Python twins in wrapper_launch.py, which the tests compare. A tensor
// subclass (not Tensor or Parameter exactly) is asked through Python, as the twins ask it,
// so its __torch_function__ sees the call.
#include <Python.h>

#include <cstring>
#include <vector>

#include <torch/csrc/autograd/python_variable.h>

namespace {

// The strides of `obj` equal the ints of tuple `want`: 1, 0, or -1 with a Python error.
int same_strides(PyObject* obj, PyObject* want) {
  if (!PyTuple_Check(want)) {
    PyErr_SetString(PyExc_TypeError, "strides must be tuples of ints");
    return -1;
  }
  if (!THPVariable_CheckExact(obj)) {  // a subclass or not a tensor: its own stride()
    PyObject* got = PyObject_CallMethod(obj, "stride", nullptr);
    if (got == nullptr) return -1;
    const int eq = PyObject_RichCompareBool(got, want, Py_EQ);
    Py_DECREF(got);
    return eq;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  c10::IntArrayRef strides;
  try {
    strides = t.strides();
  } catch (const std::exception& e) {  // a sparse tensor: no strides, as stride() raises
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return -1;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(want);
  if (n != static_cast<Py_ssize_t>(strides.size())) return 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    const long long w = PyLong_AsLongLong(PyTuple_GET_ITEM(want, i));
    if (w == -1 && PyErr_Occurred()) return -1;
    if (w != strides[i]) return 0;
  }
  return 1;
}

PyObject* strides_differ(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[1]) ||
      PyTuple_GET_SIZE(args[0]) != PyTuple_GET_SIZE(args[1])) {
    PyErr_SetString(PyExc_TypeError, "strides_differ(tensors, strides): two tuples, same length");
    return nullptr;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(args[0]);
  for (Py_ssize_t i = 0; i < n; i++) {
    const int same = same_strides(PyTuple_GET_ITEM(args[0], i), PyTuple_GET_ITEM(args[1], i));
    if (same < 0) return nullptr;
    if (same == 0) Py_RETURN_TRUE;
  }
  Py_RETURN_FALSE;
}

// The data pointer of tensor `obj` into `slot`; false with a Python error.
bool data_ptr(PyObject* obj, int64_t* slot) {
  if (!THPVariable_CheckExact(obj)) {  // a subclass, or not a tensor: its own data_ptr()
    PyObject* got = PyObject_CallMethod(obj, "data_ptr", nullptr);
    if (got == nullptr) return false;
    *slot = static_cast<int64_t>(reinterpret_cast<intptr_t>(PyLong_AsVoidPtr(got)));
    Py_DECREF(got);
    return !PyErr_Occurred();
  }
  try {
    *slot = static_cast<int64_t>(reinterpret_cast<intptr_t>(THPVariable_Unpack(obj).data_ptr()));
  } catch (const std::exception& e) {  // no storage (a meta tensor, ...): data_ptr() raises
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return false;
  }
  return true;
}

// A number argument into `slot` as the C type of `code` ('d' double, 'q' int64, '?' bool),
// converted as ctypes' c_double, c_int64 and c_bool convert it.
bool number(PyObject* obj, char code, int64_t* slot) {
  switch (code) {
    case 'd': {
      const double v = PyFloat_AsDouble(obj);
      if (v == -1.0 && PyErr_Occurred()) return false;
      std::memcpy(slot, &v, sizeof v);
      return true;
    }
    case 'q': {
      if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "an int64 kernel argument got a %s", Py_TYPE(obj)->tp_name);
        return false;
      }
      const long long v = PyLong_AsLongLong(obj);
      if (v == -1 && PyErr_Occurred()) return false;
      *slot = v;
      return true;
    }
    case '?': {
      const int v = PyObject_IsTrue(obj);
      if (v < 0) return false;
      *slot = v;
      return true;
    }
    default:
      PyErr_Format(PyExc_ValueError, "unknown kernel argument type code %c", code);
      return false;
  }
}

PyObject* launch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 2 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 2 ||
      !PyTuple_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "launch((address, codes), tensors, *numbers)");
    return nullptr;
  }
  void* address = PyLong_AsVoidPtr(PyTuple_GET_ITEM(args[0], 0));
  if (address == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a kernel at address 0");
    return nullptr;
  }
  Py_ssize_t n_codes = 0;
  const char* codes = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(args[0], 1), &n_codes);
  if (codes == nullptr) return nullptr;
  if (n_codes != nargs - 2) {
    PyErr_Format(PyExc_TypeError, "the kernel takes %zd numbers, got %zd", n_codes, nargs - 2);
    return nullptr;
  }
  const Py_ssize_t n_tensors = PyTuple_GET_SIZE(args[1]);
  const size_t n = static_cast<size_t>(n_tensors + n_codes);
  int64_t local[32];  // most kernels: no allocation
  std::vector<int64_t> heap(n > 32 ? n : 0);
  int64_t* slots = n > 32 ? heap.data() : local;
  for (Py_ssize_t i = 0; i < n_tensors; i++) {
    if (!data_ptr(PyTuple_GET_ITEM(args[1], i), &slots[i])) return nullptr;
  }
  for (Py_ssize_t i = 0; i < n_codes; i++) {
    if (!number(args[2 + i], codes[i], &slots[n_tensors + i])) return nullptr;
  }
  auto* kernel = reinterpret_cast<void (*)(const int64_t*)>(address);
  Py_BEGIN_ALLOW_THREADS
  kernel(slots);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

// Whether some value of data[0:n] lies outside [0, size): one unsigned compare catches both
// sides (a negative value is a huge unsigned one). Branch-free, so the compiler vectorises it,
// with an AVX2 clone chosen at load time where the CPU has it. The early-exit loop this
// replaces ran 0.58 ms over 1M int64 indices (a second pass as long as gather's own kernel);
// this runs 0.10 ms.
#if defined(__x86_64__) && defined(__clang__)
#define EMBER_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#elif defined(__x86_64__) && defined(__GNUC__)
#define EMBER_VECTOR_CLONES \
  __attribute__((target_clones("avx2", "default"), optimize("tree-vectorize")))
#else
#define EMBER_VECTOR_CLONES
#endif
template <typename T>
EMBER_VECTOR_CLONES bool any_outside(const T* data, int64_t n, uint64_t size) {
  uint64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    bad |= static_cast<uint64_t>(static_cast<int64_t>(data[i])) >= size;
  }
  return bad != 0;
}

// The first value outside [0, size) (None if there is none): blocks are tested whole, and only
// a block with a bad value is scanned for the first one.
template <typename T>
PyObject* first_outside(const T* data, int64_t n, long long size) {
  constexpr int64_t block = 4096;
  for (int64_t start = 0; start < n; start += block) {
    const int64_t end = n - start < block ? n : start + block;
    if (!any_outside(data + start, end - start, static_cast<uint64_t>(size))) continue;
    for (int64_t i = start; i < end; i++) {
      if (data[i] < 0 || data[i] >= size) return PyLong_FromLongLong(data[i]);
    }
  }
  Py_RETURN_NONE;
}

PyObject* out_of_range(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyLong_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "out_of_range(index, size)");
    return nullptr;
  }
  const long long size = PyLong_AsLongLong(args[1]);
  if (size == -1 && PyErr_Occurred()) return nullptr;
  if (!THPVariable_CheckExact(args[0])) Py_RETURN_NOTIMPLEMENTED;
  const at::Tensor& t = THPVariable_Unpack(args[0]);
  if (t.layout() != c10::kStrided || !t.is_cpu() || !t.is_contiguous() || t.is_conj() ||
      t.is_neg())
    Py_RETURN_NOTIMPLEMENTED;
  if (t.scalar_type() == c10::kLong) return first_outside(t.const_data_ptr<int64_t>(), t.numel(), size);
  if (t.scalar_type() == c10::kInt) return first_outside(t.const_data_ptr<int32_t>(), t.numel(), size);
  Py_RETURN_NOTIMPLEMENTED;
}

PyMethodDef methods[] = {
    {"strides_differ", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(strides_differ)),
     METH_FASTCALL, "Whether some tensor's strides differ from the expected tuple at its index."},
    {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(launch)), METH_FASTCALL,
     "Call a kernel's packed entry point with the tensors' data pointers and the numbers."},
    {"out_of_range", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(out_of_range)),
     METH_FASTCALL, "The first index outside [0, size), None, or NotImplemented (not read)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "ember.inductor._launch",
                      "A wrapper's per-tensor work against torch's C++ tensors.", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__launch() { return PyModule_Create(&module); }
