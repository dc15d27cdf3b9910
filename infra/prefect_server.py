"""The stack's Prefect server: Prefect's own app, as `prefect server start` runs it, behind a Host-header
allow-list.

Prefect 3 answers any Host header, so a web page whose DNS name is rebound to 127.0.0.1 could read
and drive the API from the user's browser (no CORS check sees it: the page and the API then share
an origin). Starlette's TrustedHostMiddleware refuses every other Host with 400 before Prefect sees
the request; the lifespan (Prefect's services: scheduler, late runs) passes through untouched.

    python -m infra.prefect_server --host 127.0.0.1 --port 4200 --allowed-hosts 127.0.0.1,localhost
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m infra.prefect_server", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=4200)
    p.add_argument("--allowed-hosts", required=True, help="comma-separated Host names (without ports) to answer")
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)

    import uvicorn
    from prefect.server.api.server import create_app
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    hosts = [h.strip() for h in args.allowed_hosts.split(",") if h.strip()]
    app = TrustedHostMiddleware(create_app(final=True), allowed_hosts=hosts)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
