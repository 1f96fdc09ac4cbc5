"""A scripted stand-in for the model behind a harness: an HTTP server on 127.0.0.1 that answers the
Anthropic Messages API (`POST /v1/messages`, streamed as server-sent events, or whole), the OpenAI
Responses API (Codex), the Gemini API, and the OpenAI Chat Completions API (`POST /v1/chat/completions`
or `/chat/completions`, streamed as `data:` chunks ending `data: [DONE]`, or whole; `GET /v1/models` or
`/models` lists MODEL) for OpenCode, Qwen Code and Copilot CLI, and records every request it was sent.
The harness under test is real; only the model is ours, so what it records is exactly what a model
would be shown.

    with FakeModel(script) as model:   # script(request) -> list of blocks, or None for "ok"
        env["ANTHROPIC_BASE_URL"] = model.url        # or f"{model.url}/v1" as an OpenAI base URL
    model.requests                     # every model request's body, as sent, in order
    model.api(request)                 # which API it came by: "anthropic", "responses", "gemini", "chat"

A block is {"type": "text", "text": ...} or {"type": "tool_use", "name": ..., "input": {...}}; in a chat
completion the text blocks are the assistant's content and the tool_use blocks its tool_calls (arguments
JSON-encoded), finish_reason "tool_calls" when there is one, else "stop".
"""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_ids = itertools.count(1)

MODEL = "scripted"  # the one model GET /v1/models lists to an OpenAI-style client


def text(request: dict) -> str:
    """Everything the model was shown in a request (system, messages, tool results) as one string."""
    return json.dumps(request, ensure_ascii=False)


def last_user_text(request: dict) -> str:
    """The text of the newest user turn (its text blocks and tool results; in a chat completion, the tool
    messages after the last assistant message, or else the newest user message)."""
    messages = request.get("messages", [])
    tools = []
    for message in reversed(messages):
        if message.get("role") == "tool":
            tools.append(message.get("content"))
        else:
            break
    if tools:
        return json.dumps(tools[::-1], ensure_ascii=False)
    for message in reversed(messages):
        if message.get("role") == "user":
            return json.dumps(message.get("content"), ensure_ascii=False)
    return ""


class FakeModel:
    def __init__(self, script=None):
        self.script = script or (lambda request: None)
        self.requests: list[dict] = []
        self._apis: dict[int, str] = {}  # id(body) -> the API it came by (bodies are kept as sent)
        self.lock = threading.Lock()
        self.seen = threading.Condition(self.lock)
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self):
                path = self.path.split("?")[0].rstrip("/")
                if path in ("/v1/models", "/models") and not self.headers.get("anthropic-version"):
                    return self._json({"object": "list", "data": [{"id": MODEL, "object": "model",
                                                                   "created": 0, "owned_by": "scripted"}]})
                self._json({})

            def _record(self, body, api: str) -> None:
                with model.lock:
                    model.requests.append(body)
                    model._apis[id(body)] = api
                    model.seen.notify_all()

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                path = self.path.split("?")[0]
                if path.endswith("/chat/completions"):  # the OpenAI Chat Completions API
                    self._record(body, "chat")
                    blocks = model.script(body)
                    if not blocks:  # a side question that asks for JSON gets JSON
                        wants_json = (body.get("response_format") or {}).get("type") in ("json_object",
                                                                                         "json_schema")
                        blocks = [{"type": "text", "text": "{}" if wants_json else "ok"}]
                    return self._chat(body, blocks)
                if path.endswith("/count_tokens"):
                    return self._json({"input_tokens": 10})
                if path.endswith("/responses"):  # the OpenAI Responses API, as Codex speaks it
                    self._record(body, "responses")
                    return self._responses(body, model.script(body) or [{"type": "text", "text": "ok"}])
                if ":streamGenerateContent" in path or ":generateContent" in path:  # the Gemini API
                    self._record(body, "gemini")
                    blocks = model.script(body)
                    if not blocks:  # the harness's own side questions want JSON (routing, next speaker)
                        wants_json = (body.get("generationConfig") or {}).get("responseMimeType") == "application/json"
                        blocks = [{"type": "text", "text": "{}" if wants_json else "ok"}]
                    return self._gemini(blocks, stream=":streamGenerateContent" in path)
                if ":countTokens" in path:
                    return self._json({"totalTokens": 10})
                if not path.endswith("/v1/messages"):
                    return self._json({})
                self._record(body, "anthropic")
                blocks = model.script(body) or [{"type": "text", "text": "ok"}]
                if body.get("stream"):
                    self._stream(body, blocks)
                else:
                    self._json(_message(body, blocks))

            def _json(self, document):
                data = json.dumps(document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _events(self, events: list[tuple[str | None, dict]]) -> None:
                """Answer with server-sent events: (name, data) pairs, a None name for data-only events."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for name, data in events:
                    self.wfile.write((f"event: {name}\n" if name else "").encode()
                                     + f"data: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

            def _chat(self, body, blocks):
                """A chat completion: the text blocks as the assistant's content, the tool_use blocks as its
                tool_calls; streamed as data-only events and a closing `data: [DONE]` when asked."""
                completion_id = f"chatcmpl-{next(_ids):06d}"
                model_name = body.get("model") or MODEL
                text = "".join(b["text"] for b in blocks if b["type"] == "text")
                calls = [{"id": f"call_{next(_ids):06d}", "type": "function",
                          "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
                         for b in blocks if b["type"] == "tool_use"]
                finish = "tool_calls" if calls else "stop"
                usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
                if not body.get("stream"):
                    message = {"role": "assistant", "content": text or None}
                    if calls:
                        message["tool_calls"] = calls
                    return self._json({"id": completion_id, "object": "chat.completion", "created": 0,
                                       "model": model_name, "choices": [{"index": 0, "message": message,
                                                                         "logprobs": None,
                                                                         "finish_reason": finish}],
                                       "usage": usage})

                def chunk(delta, finish_reason=None, **extra):
                    return {"id": completion_id, "object": "chat.completion.chunk", "created": 0,
                            "model": model_name, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                              "finish_reason": finish_reason}], **extra}

                chunks = [chunk({"role": "assistant", "content": ""})]
                if text:
                    chunks.append(chunk({"content": text}))
                for index, call in enumerate(calls):
                    chunks.append(chunk({"tool_calls": [{"index": index, **call}]}))
                chunks.append(chunk({}, finish))
                if (body.get("stream_options") or {}).get("include_usage"):
                    chunks.append({"id": completion_id, "object": "chat.completion.chunk", "created": 0,
                                   "model": model_name, "choices": [], "usage": usage})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for data in chunks:
                    self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

            def _gemini(self, blocks, stream: bool):
                parts = [{"functionCall": {"name": b["name"], "args": b["input"]}} if b["type"] == "tool_use"
                         else {"text": b["text"]} for b in blocks]
                document = {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP",
                                            "index": 0}],
                            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5,
                                              "totalTokenCount": 15}, "modelVersion": "gemini-test"}
                if not stream:
                    return self._json(document)
                self._events([(None, document)])

            def _responses(self, body, blocks):
                response_id = f"resp_{next(_ids):06d}"
                events = [("response.created", {"type": "response.created",
                                                 "response": {"id": response_id, "status": "in_progress"}})]
                for index, block in enumerate(blocks):
                    if block["type"] == "tool_use":
                        item = {"type": "function_call", "id": f"fc_{next(_ids):06d}", "status": "completed",
                                "call_id": f"call_{next(_ids):06d}", "name": block["name"],
                                "arguments": json.dumps(block["input"])}
                        if block.get("namespace"):  # a tool inside a namespace (Codex lists MCP servers so)
                            item["namespace"] = block["namespace"]
                    else:
                        item = {"type": "message", "id": f"msg_{next(_ids):06d}", "role": "assistant",
                                "status": "completed",
                                "content": [{"type": "output_text", "text": block["text"], "annotations": []}]}
                        events.append(("response.output_item.added", {
                            "type": "response.output_item.added", "output_index": index,
                            "item": {**item, "status": "in_progress", "content": []}}))
                        events.append(("response.output_text.delta", {"type": "response.output_text.delta",
                                                                      "item_id": item["id"], "output_index": index,
                                                                      "content_index": 0, "delta": block["text"]}))
                    events.append(("response.output_item.done", {"type": "response.output_item.done",
                                                                 "output_index": index, "item": item}))
                events.append(("response.completed", {"type": "response.completed", "response": {
                    "id": response_id, "status": "completed",
                    "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
                              "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}}}))
                self._events(events)

            def _stream(self, body, blocks):
                message = _message(body, [])
                message["stop_reason"] = None
                events = [("message_start", {"type": "message_start", "message": message})]
                stop = "end_turn"
                for index, block in enumerate(blocks):
                    if block["type"] == "tool_use":
                        stop = "tool_use"
                        start = {"type": "tool_use", "id": f"toolu_{next(_ids):06d}", "name": block["name"],
                                 "input": {}}
                        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                    else:
                        start = {"type": "text", "text": ""}
                        delta = {"type": "text_delta", "text": block["text"]}
                    events += [
                        ("content_block_start", {"type": "content_block_start", "index": index,
                                                 "content_block": start}),
                        ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
                        ("content_block_stop", {"type": "content_block_stop", "index": index}),
                    ]
                events += [("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop,
                                                                                 "stop_sequence": None},
                                              "usage": {"output_tokens": 5}}),
                           ("message_stop", {"type": "message_stop"})]
                self._events(events)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeModel:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def api(self, request: dict) -> str | None:
        """Which API a recorded request came by: "anthropic", "responses", "gemini" or "chat"."""
        with self.lock:
            return self._apis.get(id(request))

    def wait_for(self, predicate, timeout: float) -> dict | None:
        """The first recorded request for which predicate(request) holds, waiting up to timeout seconds."""
        import time

        deadline = time.monotonic() + timeout
        with self.seen:
            while True:
                for request in self.requests:
                    if predicate(request):
                        return request
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.seen.wait(left)


def _message(body: dict, blocks: list[dict]) -> dict:
    content = []
    for block in blocks:
        if block["type"] == "tool_use":
            content.append({"type": "tool_use", "id": f"toolu_{next(_ids):06d}", "name": block["name"],
                            "input": block["input"]})
        else:
            content.append({"type": "text", "text": block["text"]})
    stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    return {"id": f"msg_{next(_ids):06d}", "type": "message", "role": "assistant",
            "model": body.get("model", "claude-sonnet-4-5"), "content": content, "stop_reason": stop,
            "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 5}}
