/* Batched tf.train.Example parsing (see data/parsing.py). Minimal module; the parser follows. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyMethodDef methods[] = {{NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_examples", NULL, -1, methods};
PyMODINIT_FUNC PyInit__examples(void) { return PyModule_Create(&module); }
