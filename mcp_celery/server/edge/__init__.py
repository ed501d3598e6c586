"""The HTTP edge: who calls (tokens, auth), how much they may ask (limits), what is refused before MCP."""
