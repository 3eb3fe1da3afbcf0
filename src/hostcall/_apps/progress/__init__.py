"""Progress bars: those of compiled loops (``compiled``: ``scan``,
``fori_loop``, ``while_loop``, ``track``, chunked loops of the engine in
``hostcall._apps.loops``), their options (``options``), the listener that
draws them (``bars``), what keeps tqdm safe to draw from the delivery
threads (``tqdm_guard``), and the bars of Python loops (``python_loops``:
``tqdm``, ``trange``)."""
