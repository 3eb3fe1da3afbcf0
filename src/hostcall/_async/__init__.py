"""Asynchronous delivery: taps queued on the host, delivered by one thread.

``delivery``: which delivery a tap gets when traced (``set_delivery``);
``queue``: the bounded queue and its consumer thread; ``call_sites``: the
call sites and the decoding of what they queued; ``deferred``: the replay
of ``hostcall.jit``'s outputs;
``queues``: the native queue and the Python fallback it reads; ``lowering``:
the emitter of queued taps; ``native``: the queue's part of the native
extension (``hostcall_queue.cc``, built when the package is installed),
loaded by ``_core/libraries.py``.
"""
