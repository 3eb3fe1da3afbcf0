"""JAX's callback flavours, drop-in, on hostcall's core, without their walls.

``pure``: ``pure_callback``; ``io``: ``io_callback``; ``debug``:
``debug_callback`` / ``debug_print``; ``derivatives``: host derivative rules
and finite differences shared by the pure and io flavours.
"""
