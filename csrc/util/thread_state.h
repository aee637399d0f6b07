// State that is per thread on free-threaded CPython and process-wide under the GIL.
//
// Some state belongs to whatever walk is running: the scratch pools (scratch.h), the key entries
// kept past the caches and the walk depth (registry/registry_state.h), the user-code epoch, the
// aux reports waiting for an entry point's end (diagnostics/aux_state.h), the per-leaf memo slots
// (registry/registry.h). Under the GIL one walk runs at a time, or hands over only where Python
// code runs and then finds the state as the other thread left it, so one copy per process is
// right. Without the GIL (a build defining Py_GIL_DISABLED, docs/threads.md) walks run at once
// and each thread needs its own copy: two threads popping one pool slot own one vector twice.
//
// FASTREE_PER_THREAD is `thread_local` on free-threaded builds and nothing on GIL builds. Not
// thread_local everywhere because a thread_local in a shared library is reached through
// __tls_get_addr (the general-dynamic TLS model every dlopen'ed module gets), plus an
// initialisation check for one defined in another file: a call on paths that run per leaf or per
// entry point, for nothing, while the GIL serialises the walks anyway. GIL builds keep plain
// statics and globals, as before.
//
// Use it on the declaration and the definition alike (`extern FASTREE_PER_THREAD T x;` in the
// header, `FASTREE_PER_THREAD T x;` in the .cpp): a variable declared thread_local in one place
// and not in another is ill-formed. Per-thread storage that owns Python references must be empty
// whenever its thread is outside a walk (nothing releases it when the thread ends), and the
// module state's Traverse and Clear see the calling thread's copy only.
#pragma once

#include <Python.h>  // Py_GIL_DISABLED comes from the interpreter's pyconfig.h

#ifdef Py_GIL_DISABLED
#define FASTREE_PER_THREAD thread_local
#else
#define FASTREE_PER_THREAD
#endif
