"""What people build on host callbacks, built on hostcall's own core:
progress bars (``bars``, ``progress``), metric logging (``metrics``,
``writers``) and plots of logged runs (``plot``)."""
