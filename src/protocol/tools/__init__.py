"""Tools: the values (``spec.py``), the offered tools and ``tool_choice`` (``offered.py``), and
hosted tool discovery (``search.py``)."""
