"""A response's events: the event machine (``machine.py`` over ``inputs.py``, ``table.py`` and
``open_item.py``), the SSE codec (``sse.py``) and the stored replay tape (``replay.py``)."""
