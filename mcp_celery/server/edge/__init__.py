"""The server's edge: who calls, how much they may ask, and what is refused before MCP.

auth.py       bearer-token verifiers for Streamable HTTP, and the principal that owns a task
tokens.py     static bearer tokens: the token file's format, `mcp-celery token new` and `token revoke`
sessions.py   signed-in sessions in Redis, ended with the credential that opened them
hosts.py      the Host and Origin check (DNS rebinding) in front of the whole HTTP app
limits.py     request limits, the per-principal quota, error text without secrets
refusals.py   the SDK's bare HTTP refusals, reworded so each says what to do
handshake.py  what an initialize-era client declared, carried in its session id across stateless requests
"""
