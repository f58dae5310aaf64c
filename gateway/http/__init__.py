"""The request path: routes (Cohere and the other dialects), the direct ASGI fast path, request context, access control, strict decoding, OpenAPI."""
