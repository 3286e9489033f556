"""Pydantic request/response models: the public contract, mirrored in openapi/openapi.json."""
