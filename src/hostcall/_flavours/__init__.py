"""JAX's callback flavours, drop-in, on hostcall's core, without their walls.

``pure``: ``pure_callback``; ``io``: ``io_callback``; ``debug``:
``debug_callback`` / ``debug_print``; ``grad``: ``grad_callback`` /
``grad_print``, their counterparts in the backward pass; ``_stage``: checking, building the
target and binding; ``_target``: ``CallbackTarget``, their host side. Host
derivative rules are in ``hostcall._derivatives``.
"""
