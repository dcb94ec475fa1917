"""What a request to the Cloud Storage APIs names: its bucket, the objects it reads and the objects it creates.

The test proxy (tests/gcs_server/proxy.py) uses it to refuse names GCS would treat as other objects than the code meant
('a//b', '/a') and to match injected failures. It understands the URL forms TensorFlow and google-cloud-storage use:
- JSON API, object in the path, percent-encoded ('a%2Fb'): /storage/v1/b/B/o/NAME, /download/storage/v1/b/B/o/NAME,
  .../o/SOURCE/rewriteTo/b/B2/o/TARGET (also copyTo), .../o/TARGET/compose;
- JSON API uploads, object in the query or the body: /upload/storage/v1/b/B/o?uploadType=media|resumable&name=NAME,
  uploadType=multipart (name in the JSON part of the body) and resumable sessions started with a JSON body;
- XML API, host storage.googleapis.com (TensorFlow's reads): /B/NAME, NAME percent-encoded or not.
Pure functions of the request: no server needed to test them.
"""

import dataclasses
import json
import re
import urllib.parse

XML_HOST = "storage.googleapis.com"
_JSON_OBJECT = re.compile(r"^/(?:download/)?storage/v1/b/(?P<bucket>[^/]+)/o/(?P<name>[^/]+)(?P<rest>/.*)?$")
_JSON_UPLOAD = re.compile(r"^/upload/storage/v1/b/(?P<bucket>[^/]+)/o/?$")
_JSON_BUCKET = re.compile(r"^/(?:upload/|download/)?storage/v1/b/(?P<bucket>[^/]+)")
_REWRITE = re.compile(r"^/(?:rewriteTo|copyTo)/b/(?P<bucket>[^/]+)/o/(?P<name>[^/]+)$")


@dataclasses.dataclass(frozen=True)
class NamedObjects:
    bucket: str | None
    reads: tuple[str, ...] = ()  # Objects read, changed or deleted (they must exist).
    creates: tuple[str, ...] = ()  # Objects written (created or replaced).


def unsafe_name(name: str) -> bool:
    """A name the code under test should never form: an empty path segment ('a//b') or a leading '/'."""
    return "//" in name or name.startswith("/")


def named_objects(method: str, target: str, host: str, body: bytes = b"", content_type: str = "") -> NamedObjects:
    """The objects the request `method target` (target: path and query, as sent) to `host` names."""
    parts = urllib.parse.urlsplit(target)
    query = urllib.parse.parse_qs(parts.query)
    if host.split(":")[0] == XML_HOST:
        bucket, _, name = parts.path.lstrip("/").partition("/")
        name = urllib.parse.unquote(name)
        if not name:
            return NamedObjects(bucket or None)
        return NamedObjects(bucket, creates=(name,)) if method in ("PUT", "POST") else NamedObjects(bucket, (name,))
    upload = _JSON_UPLOAD.match(parts.path)
    if upload:
        names = query.get("name") or [_body_name(body, content_type)]
        return NamedObjects(upload["bucket"], creates=tuple(name for name in names if name is not None))
    found = _JSON_OBJECT.match(parts.path)
    if not found:
        bucket = _JSON_BUCKET.match(parts.path)
        return NamedObjects(bucket and bucket["bucket"])
    name, rest = urllib.parse.unquote(found["name"]), found["rest"] or ""
    rewrite = _REWRITE.match(rest)
    if rewrite:
        return NamedObjects(found["bucket"], (name,), (urllib.parse.unquote(rewrite["name"]),))
    if rest == "/compose":
        sources = tuple(source.get("name", "") for source in (_json(body) or {}).get("sourceObjects", []))
        return NamedObjects(found["bucket"], sources, (name,))
    return NamedObjects(found["bucket"], (name,))


def _body_name(body: bytes, content_type: str) -> str | None:
    """The object name in an upload's metadata: the JSON body, or the JSON part of a multipart/related body."""
    boundary = re.search(r'boundary="?([^";]+)"?', content_type)
    if boundary:
        for part in body.split(b"--" + boundary.group(1).encode()):
            headers, _, content = part.partition(b"\r\n\r\n")
            if b"application/json" in headers.lower():
                return (_json(content) or {}).get("name")
        return None
    return (_json(body) or {}).get("name")


def _json(data: bytes) -> dict | None:
    try:
        value = json.loads(data.strip() or b"null")
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None
