"""A front end: inside a coding harness -- its hooks, `setup`, the git guard and the stdio MCP server."""
