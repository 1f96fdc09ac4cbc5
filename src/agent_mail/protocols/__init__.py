"""What crosses a wire: the HTTP API's names and its standard-library client, JSON Schemas, the MCP tool table."""
