"""Hosted tools the server runs itself (I/O): web search backends (``web_search``,
``local_index``, ``searxng``) and the MCP client (``egress``, ``mcp_client``)."""
