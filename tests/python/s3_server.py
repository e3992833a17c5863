"""moto's S3 server on loopback, as the tests run it (started by conftest.S3Server).

    python s3_server.py PORT LOG

Serves moto's application (the one `moto_server` serves) on 127.0.0.1:PORT with two additions:

- every request is logged to LOG as one JSON line: method, path, query, the headers that matter
  here (Range, x-amz-copy-source, If-None-Match), the response status, the bytes of the request
  body, the response's Content-Length (`response_length`: what the server set out to send, e.g.
  the bytes of the Range a GET asked for) and the response body bytes handed to the socket in
  full (`response_bytes`; a transfer the client cut short counts less). Tests measure what crossed the wire from it (copies at commit,
  bytes fetched by a read, conditional creates).
- faults on demand: `POST /_faults?method=PUT&count=N&status=503` makes the next N requests with
  that method (and, with `&path=SUBSTRING`, whose path contains it) answer STATUS with S3's
  error for it (503 SlowDown, 403 AccessDenied, 500 InternalError), without reaching moto; with
  `&delay=SECONDS` they are answered as usual, that much later; with `&hold=SECONDS` they wait
  until `POST /_faults/release` (at most SECONDS; the first hold that runs out releases the
  rest), then are answered as usual. `GET /_faults/held` answers how many requests wait now.
  Faults in the body of a served answer: `&corrupt=1` flips one byte in the middle of the body
  (same length, and without the object's `x-amz-checksum-*` headers: only the reader's own
  checksum sees it); `&truncate=BYTES` sends the headers (the full
  Content-Length) and the first BYTES bytes of the body, then, with `&hold=SECONDS`, waits as a
  hold does, then drops the connection (a transfer cut short: a connection reset mid-body).

`Expect: 100-continue` is answered once. werkzeug's request handler (under moto 5.2.5 and werkzeug
3.1.9) writes `100 Continue` twice for such a request, once from http.server and once from its own
run_wsgi, and the AWS SDK v2 (which always sends the header on PutObject) then reads the second
interim response as the final one and fails the upload with "Status Code: 100". Real S3 sends it
once; so does this server.
"""
import json
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from moto.moto_server.threaded_moto_server import MotoRequestHandler  # noqa: F401 (moto's handler)
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

# the error an injected fault answers, by status: S3's code and message (clients classify errors
# by the code: SlowDown is retried as throttling, AccessDenied is not retried)
ERRORS = {503: ("Slow Down", "SlowDown", "Please reduce your request rate."),
          403: ("Forbidden", "AccessDenied", "Access Denied"),
          500: ("Internal Server Error", "InternalError", "We encountered an internal error.")}


def error_body(status):
    reason, code, message = ERRORS[status]
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error>").encode()
    return f"{status} {reason}", body


@dataclass
class Fault:
    """One `POST /_faults` order: the next `count` requests with `method` whose path contains
    `path` are answered `status`, or, with `delay` or `hold`, served as usual later."""
    method: str
    path: str
    count: int
    status: int
    delay: float
    hold: float
    corrupt: bool = False
    truncate: int = -1
    released: threading.Event = field(default_factory=threading.Event)


class Handler(MotoRequestHandler):
    def handle_expect_100(self):
        # run_wsgi writes the one interim response; http.server's would be a second
        return True


class Recorder:
    """WSGI middleware: the request log and the injected faults."""

    def __init__(self, app, log_path):
        self.app = app
        self.log = open(log_path, "a", buffering=1, encoding="utf-8")
        self.lock = threading.Lock()
        self.faults = []  # Fault
        self.held = 0  # requests waiting in a hold

    def write(self, entry):
        with self.lock:
            self.log.write(json.dumps(entry) + "\n")

    def __call__(self, environ, start_response):
        method = environ["REQUEST_METHOD"]
        path = environ.get("PATH_INFO", "")
        query = environ.get("QUERY_STRING", "")
        if path == "/_faults" and method == "POST":
            q = urllib.parse.parse_qs(query)
            with self.lock:
                self.faults.append(Fault(q["method"][0], q.get("path", [""])[0], int(q["count"][0]),
                                         int(q.get("status", ["503"])[0]), float(q.get("delay", ["0"])[0]),
                                         float(q.get("hold", ["0"])[0]), q.get("corrupt", ["0"])[0] == "1",
                                         int(q.get("truncate", ["-1"])[0])))
            start_response("200 OK", [("Content-Length", "0")])
            return [b""]
        if path == "/_faults/held" and method == "GET":
            with self.lock:
                body = str(self.held).encode()
            start_response("200 OK", [("Content-Length", str(len(body)))])
            return [body]
        if path == "/_faults/release" and method == "POST":
            with self.lock:
                for f in self.faults:
                    f.released.set()
            start_response("200 OK", [("Content-Length", "0")])
            return [b""]
        entry = {
            "method": method,
            "path": path,
            "query": query,
            "range": environ.get("HTTP_RANGE"),
            "copy_source": environ.get("HTTP_X_AMZ_COPY_SOURCE"),
            "if_none_match": environ.get("HTTP_IF_NONE_MATCH"),
            "request_bytes": int(environ.get("CONTENT_LENGTH") or 0),
        }
        with self.lock:
            fault = next((f for f in self.faults if f.method == method and f.path in path and f.count > 0), None)
            if fault is not None:
                fault.count -= 1
        if fault is not None and (fault.corrupt or fault.truncate >= 0):
            return self.damaged(environ, start_response, entry, fault)
        if fault is not None and fault.hold > 0:
            # held until released (a hold that runs out releases the others): then served as usual
            with self.lock:
                self.held += 1
            try:
                if not fault.released.wait(fault.hold):
                    fault.released.set()
            finally:
                with self.lock:
                    self.held -= 1
            fault = None
        if fault is not None and fault.delay > 0:
            time.sleep(fault.delay)  # a slow answer: then served as usual
            fault = None
        if fault is not None:
            # the body is read so that the connection stays usable
            environ["wsgi.input"].read(entry["request_bytes"])
            status_line, body = error_body(fault.status)
            entry.update(status=fault.status, response_bytes=len(body), injected=True)
            self.write(entry)
            start_response(status_line, [("Content-Type", "application/xml"),
                                         ("Content-Length", str(len(body)))])
            return [body]
        status = {}

        def recording_start(s, headers, exc_info=None):
            status["code"] = int(s.split(" ", 1)[0])
            length = next((v for k, v in headers if k.lower() == "content-length"), None)
            status["length"] = int(length) if length is not None else None
            return start_response(s, headers, exc_info)

        return self.recorded(self.app(environ, recording_start), entry, status)

    def damaged(self, environ, start_response, entry, fault):
        """The answer moto gives, its body corrupted or cut short (see the module's doc)."""
        status = {}

        def recording_start(s, headers, exc_info=None):
            status["code"] = int(s.split(" ", 1)[0])
            status["start"] = (s, headers)
            return lambda data: None

        body = b"".join(self.app(environ, recording_start))
        s, headers = status["start"]
        if fault.corrupt:
            # without the object's own checksum headers (an object uploaded without one):
            # botocore would otherwise catch the flipped byte itself
            headers = [(k, v) for k, v in headers if not k.lower().startswith("x-amz-checksum")]
        start_response(s, headers)
        entry.update(status=status["code"], response_length=len(body), injected=True)
        if fault.corrupt:
            mid = len(body) // 2
            body = body[:mid] + bytes([body[mid] ^ 0xFF]) + body[mid + 1:] if body else body
            entry.update(response_bytes=len(body), corrupt=True)
            self.write(entry)
            return [body]
        cut = body[:fault.truncate]
        entry.update(response_bytes=len(cut), truncated=True)
        self.write(entry)

        def send():
            yield cut
            if fault.hold > 0:
                with self.lock:
                    self.held += 1
                try:
                    if not fault.released.wait(fault.hold):
                        fault.released.set()
                finally:
                    with self.lock:
                        self.held -= 1
            raise ConnectionResetError("injected: the transfer is cut short")

        return send()

    def recorded(self, body, entry, status):
        sent = 0
        try:
            for chunk in body:
                sent += len(chunk)
                yield chunk
        finally:
            if hasattr(body, "close"):
                body.close()
            entry.update(status=status.get("code"), response_length=status.get("length"),
                         response_bytes=sent)
            self.write(entry)

def main():
    port, log_path = int(sys.argv[1]), sys.argv[2]
    app = DomainDispatcherApplication(create_backend_app)
    run_simple("127.0.0.1", port, Recorder(app, log_path), threaded=True, request_handler=Handler)


if __name__ == "__main__":
    main()
