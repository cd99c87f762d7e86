"""A Confluent schema registry's read side, served from files: ``GET /schemas/ids/{id}``.

No registry server installs from the registries this project can reach, so the end-to-end tests
(AvroConfluent in ``tests/e2e/test_input_formats.py``) and the ClickPipes-like benchmark workload
(``benchmarks.workload``) serve the one call ClickHouse's AvroConfluent format makes, in a thread of
their own process: ``{dir}/{id}.avsc`` holds the Avro schema of id ``id``, returned as ``{"schema": "<the schema as a JSON string>"}``; any other path is a 404.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_SCHEMA_BY_ID = re.compile(r"^/schemas/ids/(\d+)$")


@contextmanager
def schema_registry(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on a free local port; yield the registry's URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            match = _SCHEMA_BY_ID.match(self.path)
            path = directory / f"{match.group(1)}.avsc" if match else None
            if path is None or not path.is_file():
                self.send_error(404, "no such schema id")
                return
            body = json.dumps({"schema": path.read_text()}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="schema-registry", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
