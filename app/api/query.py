"""Unknown query parameters are refused (422 validation-error), as unknown body fields are.

The OpenAPI document lists every query parameter of an operation; a parameter it does not list used to be ignored
silently, so a misspelt one (``?limt=10``) changed nothing without a word, and a schema-driven client (schemathesis,
ST201) saw a request that violates the document accepted.  One dependency on every router compares the query's
names with those the matched route declares (its own and its dependencies', by alias), once per route.
"""
from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError

_DECLARED: dict[int, frozenset[str]] = {}


def _declared(route) -> frozenset[str]:
    names = _DECLARED.get(id(route))
    if names is None:
        found: set[str] = set()
        todo = [getattr(route, "dependant", None)]
        while todo:  # the route's own parameters and those of its dependencies, at any depth
            dependant = todo.pop()
            if dependant is not None:
                found.update(p.alias for p in dependant.query_params)
                todo.extend(dependant.dependencies)
        names = _DECLARED[id(route)] = frozenset(found)
    return names


async def known_query_parameters(request: Request) -> None:
    """Refuse a query parameter the matched operation does not declare (loc ``["query", name]``)."""
    if not request.url.query:
        return
    route = request.scope.get("route")
    if route is None:
        return
    declared = _declared(route)
    unknown = sorted({name for name, _ in request.query_params.multi_items()} - declared)
    if unknown:
        raise RequestValidationError([
            {"loc": ("query", name), "msg": "Extra inputs are not permitted"
             + (f" (this operation takes: {', '.join(sorted(declared))})" if declared else
                " (this operation takes no query parameters)"),
             "type": "extra_forbidden"} for name in unknown])
