"""AWS Bedrock's ``bedrock-agent-runtime`` ``Rerank`` for tests, as strict as the service is.

A real HTTP/1.1 server on 127.0.0.1 and a free port (``POST /rerank``) that

- checks the SigV4 signature of every call: it recomputes it with botocore's own signer from the
  secret key it knows, the signed headers and the body (a wrong key id is AWS's 403
  ``UnrecognizedClientException``, a wrong signature its 403 ``InvalidSignatureException``);
- validates the body against the operation's shape (one ``TEXT`` query, 1-1000 ``INLINE`` ``TEXT``
  sources of 1-32,000 characters, ``numberOfResults`` 1-1000 and at most the sources, a model ARN;
  any unknown field is a ``ValidationException``);
- answers ``{"results": [{"index", "relevanceScore"}]}``, best first, or the scripted errors in
  AWS's JSON protocol (status + ``x-amzn-ErrorType`` + ``{"message"}``), slowly if asked.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.fake_http import Answer, FakeUpstream
from tests.fake_providers import fake_score

_AUTH = re.compile(
    r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
    r"SignedHeaders=([^,]+), Signature=([0-9a-f]{64})$"
)
_ARN = re.compile(r"^arn:aws:bedrock:[a-z0-9-]+::foundation-model/[a-z0-9.:-]+$")


@dataclass
class BedrockFault:
    status: int
    code: str  # AWS's error type, e.g. ThrottlingException
    message: str = "scripted"
    delay_s: float = 0.0


class Invalid(Exception):
    pass


def _exact(value: Any, keys: set[str], where: str) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) - keys or not keys <= set(value):
        raise Invalid(f"{where} must have exactly the fields {sorted(keys)}")
    return value


def _text(value: Any, where: str) -> str:
    text = _exact(value, {"text"}, where)["text"]
    if not isinstance(text, str) or not 1 <= len(text) <= 32000:
        raise Invalid(f"{where}.text must be 1 to 32000 characters")
    return text


def validate(body: Any) -> tuple[str, list[str], int, str]:
    """(query, texts, numberOfResults, modelArn) of a valid Rerank body; Invalid otherwise."""
    body = _exact(body, {"queries", "sources", "rerankingConfiguration"}, "the body")
    queries = body["queries"]
    if not isinstance(queries, list) or len(queries) != 1:
        raise Invalid("queries must hold exactly 1 item")
    query = _exact(queries[0], {"type", "textQuery"}, "queries[0]")
    if query["type"] != "TEXT":
        raise Invalid("queries[0].type must be TEXT")
    sources = body["sources"]
    if not isinstance(sources, list) or not 1 <= len(sources) <= 1000:
        raise Invalid("sources must hold 1 to 1000 items")
    texts = []
    for i, source in enumerate(sources):
        source = _exact(source, {"type", "inlineDocumentSource"}, f"sources[{i}]")
        inline = _exact(source["inlineDocumentSource"], {"type", "textDocument"}, f"sources[{i}].inlineDocumentSource")
        if source["type"] != "INLINE" or inline["type"] != "TEXT":
            raise Invalid(f"sources[{i}] must be an INLINE TEXT document")
        texts.append(_text(inline["textDocument"], f"sources[{i}].inlineDocumentSource.textDocument"))
    config = _exact(body["rerankingConfiguration"], {"type", "bedrockRerankingConfiguration"}, "rerankingConfiguration")
    if config["type"] != "BEDROCK_RERANKING_MODEL":
        raise Invalid("rerankingConfiguration.type must be BEDROCK_RERANKING_MODEL")
    bedrock = _exact(
        config["bedrockRerankingConfiguration"],
        {"numberOfResults", "modelConfiguration"},
        "bedrockRerankingConfiguration",
    )
    count = bedrock["numberOfResults"]
    if not isinstance(count, int) or not 1 <= count <= min(1000, len(texts)):
        raise Invalid("numberOfResults must be 1 to 1000 and at most the number of sources")
    arn = _exact(bedrock["modelConfiguration"], {"modelArn"}, "modelConfiguration")["modelArn"]
    if not isinstance(arn, str) or not _ARN.match(arn):
        raise Invalid("modelArn is not a Bedrock model ARN")
    return _text(query["textQuery"], "queries[0].textQuery"), texts, count, arn


class FakeBedrock(FakeUpstream[BedrockFault]):
    """``with FakeBedrock(key_id, secret, region) as fake: fake.url`` -- served while the block runs."""

    def __init__(self, key_id: str, secret: str, region: str) -> None:
        self.key_id, self.secret, self.region = key_id, secret, region
        self.calls: list[dict[str, Any]] = []  # the valid, signed bodies received
        super().__init__(self.calls)

    def fail_next(self, *faults: BedrockFault) -> None:
        self._script("", faults)

    def _signature_error(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[str, str] | None:
        match = _AUTH.match(headers.get("authorization", ""))
        if match is None or "x-amz-date" not in headers:
            return "MissingAuthenticationTokenException", "Missing Authentication Token"
        key_id, _, region, service, signed, signature = match.groups()
        if key_id != self.key_id:
            return "UnrecognizedClientException", "The security token included in the request is invalid."
        if region != self.region or service != "bedrock":
            return "InvalidSignatureException", "Credential should be scoped to a valid region and service"
        names = signed.split(";")
        if "host" not in names or "x-amz-date" not in names or any(n not in headers for n in names):
            return "InvalidSignatureException", "Signed headers are missing"
        request = AWSRequest(method="POST", url=f"{self.url}{path}", data=raw, headers={n: headers[n] for n in names})
        request.context["timestamp"] = headers["x-amz-date"]
        signer = SigV4Auth(Credentials(self.key_id, self.secret), "bedrock", self.region)
        expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
        if expected != signature:
            return "InvalidSignatureException", "The request signature we calculated does not match"
        return None

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> Answer:
        def error(status: int, code: str, message: str) -> Answer:
            return (
                status,
                {"x-amzn-ErrorType": f"{code}:http://internal.amazon.com/"},
                json.dumps({"message": message}).encode(),
            )

        if path != "/rerank":
            return error(404, "UnknownOperationException", "unknown operation")
        refused = self._signature_error(path, headers, raw)
        if refused is not None:
            return error(403, *refused)
        try:
            query, texts, count, _ = validate(json.loads(raw))
        except (ValueError, Invalid) as exc:
            return error(400, "ValidationException", str(exc))
        fault = self._arrived(json.loads(raw))
        if fault is not None:
            if self._held(fault.delay_s):
                return 503, {}, b""
            return error(fault.status, fault.code, fault.message)
        ranked = sorted(range(len(texts)), key=lambda i: -fake_score(query, texts[i]))[:count]
        results = [{"index": i, "relevanceScore": fake_score(query, texts[i])} for i in ranked]
        return 200, {}, json.dumps({"results": results}).encode()
