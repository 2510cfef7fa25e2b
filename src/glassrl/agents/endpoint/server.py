"""The HTTP side: an OpenAI-compatible server on 127.0.0.1 (an ephemeral port), FastAPI under uvicorn in a
thread of the rollout's process.

Routes, under ``/e/{episode}/v1`` (each agent is given its own base URL, so a call names its episode):

- ``GET /models``: the one model, ``policy``;
- ``POST /chat/completions``: OpenAI's chat completions (``messages``, ``tools``, ``tool_choice``
  auto/none, ``n``, ``max_tokens``/``max_completion_tokens``, ``stop``, ``logprobs``/``top_logprobs``,
  ``stream``), answered by the rollout session (:mod:`.session`). Streaming sends the completion
  as server-sent events once its turn is sampled (the engine samples a turn for the whole batch:
  a role chunk, the content, the calls, the finish reason, then ``data: [DONE]``).

An episode's name holds a random key (only its agent knows its URL), so the API key is not read:
any ``OPENAI_API_KEY`` will do. A request the endpoint cannot serve is HTTP 400 with OpenAI's
error body naming why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from glassrl.agents.endpoint.render import BadRequest
from glassrl.errors import GlassrlError

MODEL = "policy"


class Handler(Protocol):
    """What answers the routes: the rollout session now running (None between rollouts)."""

    async def complete(self, episode: str, body: dict[str, Any]) -> dict[str, Any]: ...


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}}, status)


def build_app(server: EndpointServer) -> FastAPI:
    app = FastAPI(title="glassrl rollout endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    def refused(request: Request) -> JSONResponse | None:
        handler = server.handler
        if handler is None:
            return _error(503, "no rollout is running", "server_error")
        return None

    @app.get("/e/{episode}/v1/models")
    async def models(episode: str, request: Request):
        if (error := refused(request)) is not None:
            return error
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "glassrl"}]}

    @app.post("/e/{episode}/v1/chat/completions")
    async def chat_completions(episode: str, request: Request):
        if (error := refused(request)) is not None:
            return error
        try:
            body = await request.json()
        except json.JSONDecodeError as err:
            return _error(400, f"the request body is not JSON: {err}")
        if not isinstance(body, dict):
            return _error(400, "the request body is not a JSON object")
        try:
            response = await server.handler.complete(episode, body)
        except BadRequest as err:
            return _error(400, str(err))
        except GlassrlError as err:
            return _error(500, str(err), "server_error")
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(_events(response, include_usage), media_type="text/event-stream")
        return response

    return app


def _events(response: dict[str, Any], include_usage: bool) -> Iterator[str]:
    """A whole completion as OpenAI's stream of ``chat.completion.chunk`` events."""
    head = {k: response[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(index: int, delta: dict, finish: str | None = None, logprobs: Any = None) -> str:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return f"data: {json.dumps(head | {'choices': [choice]}, ensure_ascii=False)}\n\n"

    for choice in response["choices"]:
        i, message = choice["index"], choice["message"]
        yield chunk(i, {"role": "assistant", "content": ""})
        if message.get("content"):
            yield chunk(i, {"content": message["content"]}, logprobs=choice.get("logprobs"))
        for k, call in enumerate(message.get("tool_calls") or ()):
            yield chunk(i, {"tool_calls": [{"index": k, **call}]})
        yield chunk(i, {}, choice["finish_reason"])
    if include_usage:
        yield f"data: {json.dumps(head | {'choices': [], 'usage': response['usage']})}\n\n"
    yield "data: [DONE]\n\n"


class EndpointServer:
    """uvicorn serving :func:`build_app` in a daemon thread on 127.0.0.1 and a port the OS chose."""

    def __init__(self) -> None:
        self.handler: Handler | None = None
        config = uvicorn.Config(build_app(self), host="127.0.0.1", port=0, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="glassrl-endpoint", daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise GlassrlError("the rollout endpoint did not start (uvicorn ended; see the log above)")
            self.thread.join(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)

    def base_url(self, episode: str) -> str:
        return f"http://127.0.0.1:{self.port}/e/{episode}/v1"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


async def wait(future) -> Any:
    """A concurrent.futures.Future awaited from the server's event loop."""
    return await asyncio.wrap_future(future)
