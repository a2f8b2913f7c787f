/* Placeholder so setup.py builds; the TFRecord core follows. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef records_module = {PyModuleDef_HEAD_INIT, "_records", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__records(void) { return PyModule_Create(&records_module); }
