"""The chunked-loop engine that progress bars and steered loops share: the
host's registry of every loop invocation and the listeners it tells
(``invocations``), a loop's events and their targets (``events``), the
device side of one invocation (``chunked``), a loop run as chunks of steps
(``chunks``), the buffering of their taps (``buffering``, which is also
``hostcall.scan``'s), the operand that waits for a chunk's values
(``waiting_operand``) and what steers its loops (``steerer``, which the
``control`` package provides). It imports no application: a bar and a
steered loop's host side are listeners of its invocations."""
