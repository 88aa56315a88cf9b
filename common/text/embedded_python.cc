// Python.h first: it sets feature macros the C library headers read.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "common/text/embedded_python.h"

#include <sys/stat.h>

#include <cstdlib>
#include <map>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

// Under AddressSanitizer, what the interpreter allocates is not checked for
// leaks: it is never finalized, and the libraries its modules load (OpenSSL
// for hashlib) have no frame pointers, so LeakSanitizer's fast unwinder
// stops in them and cannot tell their allocations from ours by stack.
#if defined(__SANITIZE_ADDRESS__)
#define E3_LSAN_IGNORES_PYTHON 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define E3_LSAN_IGNORES_PYTHON 1
#endif
#endif
#ifdef E3_LSAN_IGNORES_PYTHON
#include <sanitizer/lsan_interface.h>
#endif

namespace e3 {
namespace {

struct Interpreter {
  std::string error;                       // why it did not start; empty when running
  std::map<std::string, PyObject*> modules;  // loaded by CallPython, under the GIL
};

bool IsFile(const std::string& path) {
  struct stat st;
  return !path.empty() && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The python3 whose environment (a venv's pyvenv.cfg beside it) the
// interpreter takes; empty for the linked libpython's own.
std::string ProgramName() {
  if (const char* p = std::getenv("E3_PYTHON"); p != nullptr && *p != '\0') return p;
  if (const char* venv = std::getenv("VIRTUAL_ENV"); venv != nullptr && *venv != '\0') {
    const std::string python = absl::StrCat(venv, "/bin/python3");
    if (IsFile(python)) return python;
  }
  return "";
}

Interpreter* Start() {
  auto* in = new Interpreter;
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.install_signal_handlers = 0;  // the services own SIGINT and SIGTERM
  config.parse_argv = 0;
  const std::string program = ProgramName();
  PyStatus status = program.empty() ? PyStatus_Ok()
                                    : PyConfig_SetBytesString(&config, &config.program_name, program.c_str());
  if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(status)) {
    in->error = absl::StrCat("the embedded Python ", PY_VERSION, " did not start",
                             program.empty() ? "" : absl::StrCat(" from ", program), ": ",
                             status.err_msg != nullptr ? status.err_msg : "unknown error");
    return in;
  }
  PyEval_SaveThread();  // hand the GIL back; each call takes it
  return in;
}

Interpreter& Get() {
  static Interpreter* const in = Start();
  return *in;
}

std::string Utf8(PyObject* object) {
  PyObject* text = PyObject_Str(object);
  if (text == nullptr) {
    PyErr_Clear();
    return "<unprintable>";
  }
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(text, &size);
  std::string out = data != nullptr ? std::string(data, static_cast<size_t>(size)) : "<unprintable>";
  if (data == nullptr) PyErr_Clear();
  Py_DECREF(text);
  return out;
}

// The pending Python exception as "Type: message (line N)", cleared.
std::string TakeError() {
  PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  std::string out = type != nullptr ? reinterpret_cast<PyTypeObject*>(type)->tp_name : "error";
  if (value != nullptr) {
    absl::StrAppend(&out, ": ", Utf8(value));
    PyObject* line = PyObject_HasAttrString(value, "lineno") ? PyObject_GetAttrString(value, "lineno") : nullptr;
    if (line != nullptr && PyLong_Check(line)) absl::StrAppend(&out, " (template line ", PyLong_AsLong(line), ")");
    Py_XDECREF(line);
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  PyErr_Clear();
  return out;
}

absl::StatusOr<PyObject*> LoadModule(Interpreter& in, const std::string& module, std::string_view source) {
  if (auto it = in.modules.find(module); it != in.modules.end()) return it->second;
  PyObject* code = Py_CompileString(std::string(source).c_str(), (module + ".py").c_str(), Py_file_input);
  PyObject* loaded = code != nullptr ? PyImport_ExecCodeModule(module.c_str(), code) : nullptr;
  Py_XDECREF(code);
  if (loaded == nullptr) {
    const bool missing = PyErr_ExceptionMatches(PyExc_ImportError) != 0;
    const std::string why = TakeError();
    if (!missing) return absl::InternalError(absl::StrCat("embedded Python module ", module, ": ", why));
    return absl::FailedPreconditionError(absl::StrCat(
        "the embedded Python ", PY_VERSION, " cannot load ", module, " (", why,
        "): install Debian's python3-jinja2, or set E3_PYTHON to a python3 ", PY_MAJOR_VERSION, ".",
        PY_MINOR_VERSION, " whose environment has Jinja2 >= 3.1"));
  }
  in.modules[module] = loaded;
  return loaded;
}

absl::StatusOr<std::string> CallLocked(Interpreter& in, const std::string& module, std::string_view source,
                                       const std::string& function, const std::vector<std::string>& args) {
  auto loaded = LoadModule(in, module, source);
  if (!loaded.ok()) return loaded.status();
  PyObject* callable = PyObject_GetAttrString(*loaded, function.c_str());
  if (callable == nullptr) return absl::InternalError(absl::StrCat(module, ".", function, ": ", TakeError()));
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
  for (size_t i = 0; i < args.size(); ++i) {
    PyObject* arg = PyUnicode_DecodeUTF8(args[i].data(), static_cast<Py_ssize_t>(args[i].size()), "strict");
    if (arg == nullptr) {
      Py_DECREF(tuple);
      Py_DECREF(callable);
      return absl::InvalidArgumentError(absl::StrCat("argument ", i, " of ", module, ".", function,
                                                     " is not valid UTF-8: ", TakeError()));
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), arg);  // steals arg
  }
  PyObject* result = PyObject_CallObject(callable, tuple);
  Py_DECREF(tuple);
  Py_DECREF(callable);
  if (result == nullptr) return absl::InvalidArgumentError(TakeError());
  Py_ssize_t size = 0;
  const char* data = PyUnicode_Check(result) ? PyUnicode_AsUTF8AndSize(result, &size) : nullptr;
  absl::StatusOr<std::string> out =
      data != nullptr ? absl::StatusOr<std::string>(std::string(data, static_cast<size_t>(size)))
                      : absl::InternalError(absl::StrCat(module, ".", function, " did not return a str"));
  if (data == nullptr) PyErr_Clear();
  Py_DECREF(result);
  return out;
}

}  // namespace

absl::StatusOr<std::string> CallPython(const std::string& module, std::string_view source,
                                       const std::string& function, const std::vector<std::string>& args) {
#ifdef E3_LSAN_IGNORES_PYTHON
  __lsan::ScopedDisabler python_allocations_are_not_leaks;
#endif
  Interpreter& in = Get();
  if (!in.error.empty()) return absl::FailedPreconditionError(in.error);
  // One call at a time, whole: the GIL alone is not enough, since the
  // interpreter hands it to another waiting thread every few milliseconds,
  // in the middle of a call whose module state (a render in progress)
  // the next call would then see.
  static std::mutex* const one_at_a_time = new std::mutex;
  std::lock_guard<std::mutex> lock(*one_at_a_time);
  const PyGILState_STATE gil = PyGILState_Ensure();
  absl::StatusOr<std::string> out = CallLocked(in, module, source, function, args);
  PyGILState_Release(gil);
  return out;
}

}  // namespace e3
