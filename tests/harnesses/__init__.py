"""What the harnesses meet: the real harness CLIs (Claude Code, Codex, Gemini CLI, Qwen Code, Copilot CLI,
OpenCode) against a scripted model, `agent-mail run`, the waker, the hooks, the MCP server over stdio and the
git guard."""
