"""The OpenAPI document: generated from the wire types, valid, covering every route of the app."""

from types import SimpleNamespace

import msgspec
import schemathesis

from runtime.config import Config, override
from runtime.openapi import document
from runtime.protocol import UNSUPPORTED, ChatRequest, CompletionRequest, WsGenerate
from runtime.server import build_app

MODEL = "served-model"


def app(max_tokens_limit: int = 4096):
    config = override(Config(), "admission", max_tokens_limit=max_tokens_limit)
    return build_app(SimpleNamespace(info=SimpleNamespace(model_id=MODEL, context_length=64), failure=None), config)


def test_the_document_is_valid_openapi_and_covers_every_route():
    web_app = app()
    doc = document(web_app)
    schema = schemathesis.openapi.from_dict(doc)  # refuses a document that is not valid OpenAPI 3.1
    labels = {op.ok().label for op in schema.get_all_operations()}
    for route in web_app.router.routes():
        if route.method != "HEAD":
            assert f"{route.method} {route.resource.canonical}" in labels
    msgspec.json.encode(doc)  # plain JSON


def test_request_fields_and_websocket_messages_are_all_documented():
    schemas = document(app())["components"]["schemas"]
    for cls in (ChatRequest, CompletionRequest, WsGenerate):
        assert set(cls.__struct_fields__) - {"type"} <= set(schemas[cls.__name__]["properties"])
    assert schemas["ChatRequest"]["additionalProperties"] is False  # unknown fields are refused
    assert {"WsClientMessage", "WsServerMessage", "WsTokens", "WsDone", "WsError"} <= set(schemas)
    ws = document(app())["paths"]["/v1/ws"]["get"]["x-websocket"]
    assert ws["client"]["$ref"].endswith("WsClientMessage") and ws["server"]["$ref"].endswith("WsServerMessage")


def test_unsupported_fields_list_only_their_neutral_values_and_limits_come_from_the_config():
    props = document(app(max_tokens_limit=8))["components"]["schemas"]["ChatRequest"]["properties"]
    store = next(u for u in UNSUPPORTED if u.field == "store")
    assert props["store"]["enum"] == list(store.neutral) and store.reason in props["store"]["description"]
    assert props["max_tokens"]["anyOf"][0]["maximum"] == 8
    assert MODEL in props["model"]["enum"]
    completion = document(app())["components"]["schemas"]["CompletionRequest"]["properties"]
    assert completion["best_of"]["enum"] == [None, 1]


def test_with_an_api_key_the_document_is_valid_and_names_the_bearer_scheme():
    config = override(Config(), "server", api_key="k")
    web_app = build_app(SimpleNamespace(info=SimpleNamespace(model_id=MODEL, context_length=64), failure=None), config)
    doc = document(web_app)
    schemathesis.openapi.from_dict(doc)
    assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    assert "k" not in msgspec.json.encode(doc).decode().split('"')  # the key itself is never in it
