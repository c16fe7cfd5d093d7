"""Tools the server runs itself: web search backends, MCP servers, and the egress rules."""
