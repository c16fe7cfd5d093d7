"""The text side: where prompts are made. Items become chat messages (``chat.py``), the chat
template renders them and the tokenizer counts them (``prompt_maker.PromptMaker``, the face the
actors use), within the context window (``prompt_bounds.py``), incrementally for a WebSocket
continuation (``incremental_render.py``). No MLX arrays: it runs on worker threads."""
