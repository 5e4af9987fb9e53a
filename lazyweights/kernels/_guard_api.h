/*
 * The SIGBUS guard's interface, shared by lazyweights' C extensions. `_ccasts.c` owns the guard (one SIGBUS
 * handler and one per-thread jump target) and exports it as the capsule `lazyweights.kernels._ccasts._guard_api`;
 * `_cquant.c` and `_clora.c` import it. A process must have one handler whichever extension's kernel is running:
 * two, each installed over the other, would call each other forever on a stray SIGBUS.
 *
 * Include after <Python.h> and <errno.h>.
 */
#ifndef LW_GUARD_API_H
#define LW_GUARD_API_H

typedef struct {
    int version;
    int (*ensure_handler)(void);                      /* call with the GIL held; 0 or -1 with errno set */
    int (*run)(void (*call)(void *), void *context);  /* 0, or -1 when a read raised SIGBUS */
} GuardApi;

/* OSError(EFAULT) saying that a page of `what` ("the source") could not be read. */
static inline void lw_raise_sigbus(const char *what) {
    PyObject *err = PyUnicode_FromFormat("a page of %s could not be read (SIGBUS): a memory-mapped file was "
                                         "truncated while it was being read", what);
    PyObject *args = err != NULL ? Py_BuildValue("(iO)", EFAULT, err) : NULL;
    if (args != NULL)
        PyErr_SetObject(PyExc_OSError, args);
    Py_XDECREF(args);
    Py_XDECREF(err);
}

/* _ccasts' guard, or NULL (the kernels then run unguarded) where _ccasts cannot be imported. Call from a
 * module's init: PyCapsule_Import finds the capsule by attribute lookup from the top package, so _ccasts is
 * imported first. */
static inline const GuardApi *lw_import_guard(void) {
    PyObject *ccasts = PyImport_ImportModule("lazyweights.kernels._ccasts");
    const GuardApi *api = ccasts ? PyCapsule_Import("lazyweights.kernels._ccasts._guard_api", 0) : NULL;
    Py_XDECREF(ccasts);
    if (api == NULL)
        PyErr_Clear();
    return api != NULL && api->version == 1 ? api : NULL;
}

/* call(context) with the GIL released, under `guard` when there is one. Call with the GIL held. 0 when it
 * finished; -1 with OSError set when the handler could not be installed or a read of `what` raised SIGBUS. */
static inline int lw_run_released(const GuardApi *guard, void (*call)(void *), void *context, const char *what) {
    int faulted = 0;
    if (guard != NULL && guard->ensure_handler() != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    Py_BEGIN_ALLOW_THREADS
    if (guard != NULL)
        faulted = guard->run(call, context);
    else
        call(context);
    Py_END_ALLOW_THREADS
    if (faulted) {
        lw_raise_sigbus(what);
        return -1;
    }
    return 0;
}

#endif
