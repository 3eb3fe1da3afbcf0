"""Derivatives of host calls.

``rules``: a host function's derivative rules (``HostFunction``), the rules
derived from one another and finite differences, all run on the host;
``linear``: the JVP of a call as a host call of the forward rule, linear in
the tangents, transposing to the reverse rule. Their lifting over ``vmap``
levels is the core's (``hostcall._core.lifting``).
"""
