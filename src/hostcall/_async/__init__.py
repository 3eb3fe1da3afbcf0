"""Asynchronous delivery: taps queued on the host, delivered by one thread.

``delivery``: which delivery a tap gets when traced (``set_delivery``);
``queue``: the bounded queue and its consumer thread; ``lowering``: the
emitter of queued taps; ``native``: the C++ queue's build and loading.
"""
