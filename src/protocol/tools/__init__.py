"""Tools: the values (``spec.py``), the offered tools and ``tool_choice`` (``offered.py``), the
server's own ``web_search`` and ``mcp`` tools (``hosted.py``), the ``tools`` array parsed by type
(``parse.py``), and hosted tool discovery (``search.py``)."""
