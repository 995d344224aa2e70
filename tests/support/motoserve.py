"""moto's S3 server on a free loopback port, as a process of its own.

Run by `tests.support.s3server.moto_server`: prints the port on the first line
of stdout, then serves until its stdin closes (the test process ended, however
it ended) or it gets SIGTERM.

Why a process and not a thread of the test process: the node processes under
test renew through this server with deadlines of a second or two, and in a
thread it shares the test process's GIL with the test's own polling (reading
and parsing the nodes' recordings). On a loaded machine that starved it
(requests waited seconds for the GIL: every node self-fenced over and over
and a test failed in CI for it).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any


class OneAtATime:
    """Serve one request at a time.

    moto's S3 checks a PUT's If-Match/If-None-Match and then stores the object
    without a lock: under a threaded server two concurrent creates of one key
    can both succeed (and an overwrite can break a concurrent read). Real S3
    is atomic per key; serialising requests makes moto so too.
    """

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self.lock:
            return list(self.app(environ, start_response))


def main() -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    class Quiet(MotoRequestHandler):  # type: ignore[misc]
        def log_request(self, *args: Any, **kwargs: Any) -> None:
            pass

    app = OneAtATime(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=Quiet)

    def until_stdin_closes() -> None:
        sys.stdin.buffer.read()
        server.shutdown()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    print(server.server_port, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
