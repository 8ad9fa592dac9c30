/*
 * _fastcall.c - the hit path of a prepared call on CPU torch tensors, in C
 * (libsdpa/__init__.py: _prepared). Python's own path spends ~11 us on a
 * one-token call, most of it interpreting: 15 torch attribute reads, a
 * 17-item key, four ctypes struct writes and ctypes' call. Here the same
 * reads are C calls, the struct writes are stores, and the library is
 * called through the pointer ctypes resolved (so no second libsdpa is ever
 * loaded: the extension does not link it). Limited API (abi3), Python 3.9+.
 *
 * call(cplans, threads, q, k, v, layout, is_causal, scale, enable_gqa,
 * return_lse, backend, quant, component) -> result, or an int status (the call
 * failed: the caller raises with sdpa_last_error() on this thread), or
 * None (not a prepared signature, or torch's thread count is no longer
 * `threads`, the count the context was made for; None: no such check):
 * the caller takes the Python path.
 * cplans maps the signature (the key _prepared builds) to a tuple
 * (fn, handle, tq, tk, tv, to, params, lse_shape or None) of addresses.
 */
#define Py_LIMITED_API 0x03090000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef int (*forward_fn)(void *, void *, void *, void *, void *, void *, void *);

static PyObject *tensor_type, *grad_enabled, *empty_like, *empty, *float32, *num_threads;
static PyObject *s_dtype, *s_shape, *s_stride, *s_data_ptr, *s_is_cpu, *s_requires_grad;

/* setup(torch.Tensor, torch.is_grad_enabled, torch.empty_like, torch.empty, torch.float32,
 *       torch.get_num_threads) */
static PyObject *setup(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *t, *g, *el, *e, *f, *n;
    if (!PyArg_UnpackTuple(args, "setup", 6, 6, &t, &g, &el, &e, &f, &n))
        return NULL;
    PyObject **slot[6] = {&tensor_type, &grad_enabled, &empty_like, &empty, &float32, &num_threads};
    PyObject *given[6] = {t, g, el, e, f, n};
    for (int i = 0; i < 6; i++) { /* Py_XSETREF is not in the limited API */
        PyObject *old = *slot[i];
        Py_INCREF(given[i]);
        *slot[i] = given[i];
        Py_XDECREF(old);
    }
    Py_RETURN_NONE;
}

/* A bool attribute of x: 1, 0, or -1 with an exception set. */
static int bool_attr(PyObject *x, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(x, name);
    if (!v)
        return -1;
    const int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* x.data_ptr() as a pointer, or NULL with an exception set. */
static void *data_ptr(PyObject *x)
{
    PyObject *v = PyObject_CallMethodObjArgs(x, s_data_ptr, NULL);
    if (!v)
        return NULL;
    void *p = PyLong_AsVoidPtr(v);
    Py_DECREF(v);
    return p;
}

static void *addr(PyObject *plan, Py_ssize_t i) { return PyLong_AsVoidPtr(PyTuple_GetItem(plan, i)); }

/* A keyword value of the documented types (as _prepared checks them):
 * is_causal bool or str, enable_gqa bool or None, scale float, int or None,
 * return_lse bool, names str or None. */
static int flags_ok(PyObject *const *f)
{
    PyTypeObject *c = Py_TYPE(f[1]), *g = Py_TYPE(f[3]), *s = Py_TYPE(f[2]);
    if (c != &PyBool_Type && c != &PyUnicode_Type)
        return 0;
    if (g != &PyBool_Type && f[3] != Py_None)
        return 0;
    if (s != &PyFloat_Type && s != &PyLong_Type && f[2] != Py_None)
        return 0;
    if (f[4] != Py_True && f[4] != Py_False)
        return 0;
    for (int i = 5; i < 8; i++)
        if (f[i] != Py_None && Py_TYPE(f[i]) != &PyUnicode_Type)
            return 0;
    return 1;
}

static PyObject *call(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cplans, *threads, *x[3], *f[8]; /* layout, is_causal, scale, enable_gqa,
                                               * return_lse, backend, quant, component */
    if (!PyArg_UnpackTuple(args, "call", 13, 13, &cplans, &threads, &x[0], &x[1], &x[2], &f[0],
                           &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7]))
        return NULL;
    if (!tensor_type || !flags_ok(f))
        Py_RETURN_NONE;
    if (threads != Py_None) { /* the context follows torch's thread count: still the same? */
        PyObject *n = PyObject_CallObject(num_threads, NULL);
        if (!n)
            return NULL;
        long want = PyLong_AsLong(n);
        Py_DECREF(n);
        if (want < 1)
            want = 1;
        if (want != PyLong_AsLong(threads))
            Py_RETURN_NONE; /* the Python path makes the new context */
    }
    for (int i = 0; i < 3; i++) {
        if ((PyObject *)Py_TYPE(x[i]) != tensor_type)
            Py_RETURN_NONE;
        const int cpu = bool_attr(x[i], s_is_cpu);
        if (cpu <= 0)
            return cpu < 0 ? NULL : (Py_INCREF(Py_None), Py_None);
    }
    PyObject *g = PyObject_CallObject(grad_enabled, NULL);
    if (!g)
        return NULL;
    const int grad = PyObject_IsTrue(g);
    Py_DECREF(g);
    for (int i = 0; grad > 0 && i < 3; i++) {
        const int rg = bool_attr(x[i], s_requires_grad);
        if (rg != 0)
            return rg < 0 ? NULL : (Py_INCREF(Py_None), Py_None); /* refused by the Python path */
    }
    /* the key, as _prepared builds it: dtypes, shapes and strides, then the flags */
    const Py_ssize_t nf = 8;
    PyObject *key = PyTuple_New(9 + nf);
    if (!key)
        return NULL;
    for (int i = 0; i < 3; i++) {
        PyObject *d = PyObject_GetAttr(x[i], s_dtype);
        PyObject *sh = PyObject_GetAttr(x[i], s_shape);
        PyObject *st = PyObject_CallMethodObjArgs(x[i], s_stride, NULL);
        if (!d || !sh || !st) {
            Py_XDECREF(d), Py_XDECREF(sh), Py_XDECREF(st), Py_DECREF(key);
            return NULL;
        }
        PyTuple_SetItem(key, i, d); /* steals */
        PyTuple_SetItem(key, 3 + 2 * i, sh);
        PyTuple_SetItem(key, 4 + 2 * i, st);
    }
    for (Py_ssize_t i = 0; i < nf; i++) {
        Py_INCREF(f[i]);
        PyTuple_SetItem(key, 9 + i, f[i]);
    }
    PyObject *plan = PyDict_GetItemWithError(cplans, key); /* borrowed */
    Py_DECREF(key);
    if (!plan)
        return PyErr_Occurred() ? NULL : (Py_INCREF(Py_None), Py_None);
    Py_INCREF(plan); /* another thread may clear the table while this call runs */
    PyObject *out = NULL, *lse = NULL, *result = NULL;
    void *lse_ptr = NULL;
    void *tq = addr(plan, 2), *tk = addr(plan, 3), *tv = addr(plan, 4), *to = addr(plan, 5);
    void *pq = data_ptr(x[0]), *pk = pq ? data_ptr(x[1]) : NULL, *pv = pk ? data_ptr(x[2]) : NULL;
    if (!pv)
        goto done;
    out = PyObject_CallFunctionObjArgs(empty_like, x[0], NULL);
    void *po = out ? data_ptr(out) : NULL;
    if (!po)
        goto done;
    PyObject *lse_shape = PyTuple_GetItem(plan, 7);
    if (lse_shape != Py_None) {
        PyObject *a = PyTuple_Pack(1, lse_shape), *kw = Py_BuildValue("{sO}", "dtype", float32);
        lse = a && kw ? PyObject_Call(empty, a, kw) : NULL;
        Py_XDECREF(a), Py_XDECREF(kw);
        if (!lse || !(lse_ptr = data_ptr(lse)))
            goto done;
    }
    /* sdpa_tensor's first field is its data pointer (sdpa.h) */
    *(void **)tq = pq, *(void **)tk = pk, *(void **)tv = pv, *(void **)to = po;
    forward_fn fn = (forward_fn)addr(plan, 0);
    void *handle = addr(plan, 1), *params = addr(plan, 6);
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = fn(handle, tq, tk, tv, to, lse_ptr, params);
    Py_END_ALLOW_THREADS
    if (status != 0)
        result = PyLong_FromLong(status);
    else if (lse)
        result = PyTuple_Pack(2, out, lse);
    else
        result = (Py_INCREF(out), out);
done:
    Py_XDECREF(out), Py_XDECREF(lse);
    Py_DECREF(plan);
    return result;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, "setup(Tensor, is_grad_enabled, empty_like, empty, float32)"},
    {"call", call, METH_VARARGS, "call(cplans, q, k, v, 8 keywords): a prepared call, or None"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastcall", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastcall(void)
{
    s_dtype = PyUnicode_InternFromString("dtype");
    s_shape = PyUnicode_InternFromString("shape");
    s_stride = PyUnicode_InternFromString("stride");
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_is_cpu = PyUnicode_InternFromString("is_cpu");
    s_requires_grad = PyUnicode_InternFromString("requires_grad");
    return PyModule_Create(&module);
}
