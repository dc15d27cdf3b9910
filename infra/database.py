"""The stack's one database option: a PostgreSQL URL, turned into what each server needs.

`dssm stack up --database postgresql://USER[:PW]@HOST:PORT/NAME` keeps MLflow's tracking store and
model registry in database NAME_mlflow and Prefect's in NAME_prefect, on that server. Two databases,
not one: both servers create their schema with alembic, and both keep alembic's bookkeeping in a
table named `alembic_version`, so in one database each would take the other's migration state for
its own. Each server also gets its own driver: MLflow's SQLAlchemy store the synchronous psycopg 3
(`postgresql+psycopg://`), the Prefect server asyncpg (`postgresql+asyncpg://`).

`prepare` checks that the server answers and creates a missing database (the role needs CREATEDB;
where it has not, an administrator creates the two, see infra/README.md).
"""

from __future__ import annotations

from typing import Any

from core.errors import DssmError

SCHEMES = ("postgresql", "postgres")
DRIVERS = {"mlflow": "psycopg", "prefect": "asyncpg"}
DEFAULT_NAME = "dssm"
MAINTENANCE_DB = "postgres"  # where CREATE DATABASE is sent from (every PostgreSQL server has it)
CONNECT_TIMEOUT = 5  # seconds


def parse(url: str):
    """The SQLAlchemy URL of a user's `postgresql://…` (a driver suffix such as +psycopg2 is dropped:
    each server gets its own)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise DssmError(
            f"--database: {url!r} is not a database URL; e.g. postgresql://postgres@127.0.0.1:5432/dssm"
        ) from None
    if parsed.get_backend_name() not in SCHEMES:
        raise DssmError(
            f"--database: {parsed.get_backend_name()!r} is not supported; give a postgresql://USER@HOST:PORT/NAME URL "
            "(no --database: sqlite files under --dir)"
        )
    return parsed.set(drivername="postgresql", database=parsed.database or DEFAULT_NAME)


def databases(url: str) -> dict[str, str]:
    """Service -> the database name it keeps its tables in (NAME_mlflow, NAME_prefect)."""
    name = parse(url).database
    return {service: f"{name}_{service}" for service in DRIVERS}


def service_urls(url: str) -> dict[str, str]:
    """Service -> its SQLAlchemy URL (own database, own driver), the password included. The URL's
    query (libpq parameters such as sslmode) goes to MLflow's psycopg only: asyncpg takes none of
    them, and Prefect's TLS is set by its PREFECT_SERVER_DATABASE_SQLALCHEMY_CONNECT_ARGS_TLS_* settings."""
    base, names = parse(url), databases(url)
    urls = {}
    for service, driver in DRIVERS.items():
        own = base.set(drivername=f"postgresql+{driver}", database=names[service])
        own = own if driver == "psycopg" else own.set(query={})
        urls[service] = own.render_as_string(hide_password=False)
    return urls


def shown(url: str) -> str:
    """The URL as printed and recorded for people: without its password."""
    return parse(url).render_as_string(hide_password=True)


def _psycopg():
    try:
        import psycopg
        import psycopg.sql
    except ImportError:
        raise DssmError(
            "--database needs the PostgreSQL driver psycopg, which is not installed: pip install -r requirements.lock"
        ) from None
    return psycopg


def connect(url, dbname: str):
    """An autocommit psycopg connection to database `dbname` on the server of SQLAlchemy URL `url`."""
    psycopg = _psycopg()
    params: dict[str, Any] = {k: v for k, v in url.query.items() if isinstance(v, str)}
    params |= {"host": url.host, "port": url.port, "user": url.username, "password": url.password}
    params = {k: v for k, v in params.items() if v is not None}
    return psycopg.connect(dbname=dbname, connect_timeout=CONNECT_TIMEOUT, autocommit=True, **params)


def check_drivers() -> None:
    """Both servers' drivers importable, else the error that says what to install."""
    _psycopg()
    try:
        import asyncpg  # noqa: F401  (the Prefect server's driver)
    except ImportError:
        raise DssmError(
            "--database needs the PostgreSQL driver asyncpg (Prefect's), which is not installed: "
            "pip install -r requirements.lock"
        ) from None


def _why(check) -> str | None:
    try:
        check()
    except DssmError as e:
        return str(e)
    except Exception as e:  # psycopg.Error, socket errors: the reason is the message
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return None


def answers(url: str) -> str | None:
    """None when the server answers and both of the stack's databases exist, else why not (`dssm stack status`)."""

    def check() -> None:
        parsed = parse(url)
        for name in databases(url).values():
            connect(parsed, name).close()

    return _why(check)


def answers_at(url: str) -> str | None:
    """None when the database a postgresql:// URL names answers, else why not."""
    from sqlalchemy.engine import make_url

    return _why(lambda: connect(make_url(url), make_url(url).database or MAINTENANCE_DB).close())


def prepare(url: str, progress=print) -> dict[str, str]:
    """Check the drivers and that the server answers; create NAME_mlflow and NAME_prefect where missing.
    Returns service -> database name."""
    check_drivers()
    psycopg = _psycopg()
    parsed, names = parse(url), databases(url)
    where = f"{parsed.host or 'localhost'}:{parsed.port or 5432}"
    for name in names.values():
        try:
            connect(parsed, name).close()
            continue
        except psycopg.OperationalError as e:
            if getattr(e, "sqlstate", None) != "3D000" and "does not exist" not in str(e):  # 3D000: no such database
                raise DssmError(f"--database: PostgreSQL at {where} does not answer as {shown(url)}: {e}") from None
        try:
            with connect(parsed, MAINTENANCE_DB) as conn:
                conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
        except psycopg.errors.DuplicateDatabase:
            pass  # another `stack up` made it meanwhile
        except psycopg.Error as e:
            raise DssmError(
                f"--database: database {name} does not exist on {where} and could not be created ({e}); "
                f"create it with: createdb -h {parsed.host or 'localhost'} -p {parsed.port or 5432} "
                f"-U {parsed.username or 'postgres'} {name}"
            ) from None
        progress(f"created database {name} on {where}")
    return names
