"""Anthropic's Messages API: the request grammar (``request.py`` over ``messages.py`` and
``values.py``) and the answer (``stream.py``), both as translations of our own objects."""
