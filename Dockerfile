# Certified unlearning service: a small image that serves app.main:app with uvicorn as a non-root user.
# BASE: the official Python image by default; CI builds from a stand-in made of Debian's packages where no registry
# can be reached (docs/operations.md, "Containers": python3 of Debian bookworm in a venv at /usr/local).
ARG BASE=python:3.11-slim
FROM ${BASE}

# NUMBA_CACHE_DIR: the compiled kernels are built into it at build time (olu warm) and owned by the service user:
# numba only uses a cache directory it can write to, and the sources under /srv stay root's, read-only
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OLU_DATA_DIR=/data NUMBA_CACHE_DIR=/srv/numba-cache

WORKDIR /srv
# the pinned dependency versions first (requirements.lock, refreshed by `bash .ci/lock`), in a layer of their own that
# a change of the sources does not rebuild.  PIP_OPTIONS: extra pip options for the build, e.g. an offline install
# from wheels built beforehand (--no-index --find-links /wheels, the wheels mounted with `podman build -v`)
ARG PIP_OPTIONS=""
COPY requirements.lock ./
RUN pip install $PIP_OPTIONS -r requirements.lock

COPY pyproject.toml README.md ./
COPY app ./app
COPY migrations ./migrations
COPY alembic.ini ./
# the project itself, without dependencies (the lock has them, the stream extra's nats-py included, so the same image
# runs the broker worker: docker run IMAGE olu consume ...).  Editable: the one copy of app/ is /srv/app, the one
# uvicorn serves (--app-dir /srv) and `olu` runs, so the kernels `olu warm` caches are those the service loads (numba's
# cache is keyed by the source file's path and modification time).  `olu warm` fails the build unless it says "ok".
RUN pip install $PIP_OPTIONS --no-deps -e . && useradd --system --uid 10001 --home /srv olu \
    && mkdir -p /data "$NUMBA_CACHE_DIR" && olu warm > /tmp/warm.log \
    && cat /tmp/warm.log && grep -q "^kernels: ok" /tmp/warm.log && rm /tmp/warm.log \
    && chown -R olu /data "$NUMBA_CACHE_DIR"

# the bytecode of the sources, compiled once here: PYTHONDONTWRITEBYTECODE is set and /srv is root's, so without it
# every start (and every replica) compiled app/ and migrations/ from source again (~20k lines); a layer of its own
# after the kernels', so the cached warm layer above is reused.  Checked by mtime like numba's cache: same files
RUN python -m compileall -q -j 0 /srv/app /srv/migrations

USER olu
VOLUME ["/data"]
EXPOSE 8000
# liveness: /healthz (the process answers; no I/O).  Readiness is /readyz (database, schema, signing key; 503 until
# they are there): point a load balancer or an orchestrator's readiness probe at it, not at this check
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status == 200 else 1)"
# --app-dir keeps /srv first on sys.path, so migrations/ beside app/ is found.  --no-proxy-headers: the service
# takes the client address from the socket, and a forwarded header only from the proxies listed in
# OLU_TRUSTED_PROXIES (empty: none; e.g. docker run -e OLU_TRUSTED_PROXIES=172.17.0.1 ... behind a proxy on the host).
# --no-access-log: the service writes its own access line per request (app/observability), uvicorn's would double it
CMD ["uvicorn", "app.main:app", "--app-dir", "/srv", "--host", "0.0.0.0", "--port", "8000", "--no-proxy-headers", \
     "--no-access-log"]
