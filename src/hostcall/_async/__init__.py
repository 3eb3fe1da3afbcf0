"""Asynchronous delivery: taps queued on the host, delivered by one thread.

``delivery``: which delivery a tap gets when traced (``set_delivery``);
``queue``: the bounded queue, its consumer thread and the call sites;
``queues``: the native queue and the Python fallback it reads; ``lowering``:
the emitter of queued taps; ``native``: the queue's native library
(``hostcall_queue.cc``), built and loaded by ``_core/libraries.py``.
"""
