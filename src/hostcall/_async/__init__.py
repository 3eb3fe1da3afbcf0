"""Asynchronous delivery: taps queued on the host, delivered by one thread.

``delivery``: which delivery a tap gets when traced (``set_delivery``);
``queue``: the bounded queue, its consumer thread and the call sites;
``queues``: the native queue and the Python fallback it reads; ``lowering``:
the emitter of queued taps; ``native``: hostcall's native library (the queue,
``hostcall_queue.cc``, and the steered loops' check, ``hostcall_control.cc``),
built and loaded.
"""
