"""``GET /openapi.json`` describes exactly the ``/v1`` routes the server mounts, with the SDK's
types for 200 bodies, and every ``$ref`` in it resolves."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx2 as httpx
import trio

from mlx_responses.server import ServerHandle

DEADLINE = 60


def refs(value: Any) -> set[str]:
    return set(re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', json.dumps(value)))


async def test_openapi_lists_every_route_and_resolves(server: ServerHandle) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        with trio.fail_after(DEADLINE):
            reply = await http.get("/openapi.json")
            again = await http.get("/openapi.json")
            # Every operation it lists exists: a request to it is not 404/405 "Unknown route".
            document = reply.json()
            for path, operations in document["paths"].items():
                concrete = re.sub(r"\{[^}]+\}", "x", path)
                for method in operations:
                    probe = await http.request(method.upper(), concrete)
                    unknown = probe.status_code in (404, 405) and "Unknown route" in probe.text
                    assert not unknown, (method, path)
    assert reply.status_code == 200
    assert again.json() == document
    assert document["openapi"].startswith("3.1")
    paths = document["paths"]
    assert set(paths["/v1/responses"]) == {"post"}
    assert set(paths["/v1/responses/{response_id}"]) == {"get", "delete"}
    assert "/v1/files/{file_id}/content" in paths
    assert "/responses" not in paths  # the unprefixed aliases are the same operations
    create = paths["/v1/responses"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CreateResponseBody"
    }
    assert "text/event-stream" in create["responses"]["200"]["content"]
    assert create["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Response"
    }
    schemas = document["components"]["schemas"]
    assert refs(document) <= set(schemas), refs(document) - set(schemas)
    assert "first_id" in schemas["ConversationItemList"]["properties"]
