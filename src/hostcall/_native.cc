// hostcall's native extension, hostcall._native: one shared library built
// when the package is installed (CMakeLists.txt), holding the tap queue
// (_runtime/hostcall_queue.cc), the metrics writers' number formatting
// (_runtime/hostcall_texts.cc) and the steered loops' stop check
// (_apps/control/hostcall_control.cc).
//
// Python never calls into this module: it is an (empty) extension module so
// that the import system finds the library where it was installed, in a
// wheel or in an editable install alike (importlib.util.find_spec(
// "hostcall._native").origin), under a name that holds the Python version
// (the SOABI suffix). _core/libraries.py loads that file with ctypes and
// registers its XLA FFI handlers.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace {

PyModuleDef hostcall_native_module = {
    PyModuleDef_HEAD_INIT,
    "hostcall._native",
    "hostcall's native library (loaded with ctypes by "
    "hostcall._core.libraries; nothing to call from Python).",
    0,
    nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__native(void) {
  return PyModule_Create(&hostcall_native_module);
}
