"""The engine: the only place MLX runs. The generation thread and its batch (mlx-lm's
``BatchGenerator``), the port the actors reach it through (``port.py``: the inbound messages,
the outbound facts, the per-sequence slots), the prompt cache, sampling and constraints,
loading, sharding over ranks, and a vision-language model's image side."""
