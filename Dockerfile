# Certified unlearning service: a small image that serves app.main:app with uvicorn as a non-root user.
FROM python:3.11-slim

# NUMBA_CACHE_DIR: the compiled kernels are built into it at build time (olu warm) and owned by the service user:
# numba only uses a cache directory it can write to, and the sources in site-packages stay root's, read-only
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    OLU_DATA_DIR=/data NUMBA_CACHE_DIR=/srv/numba-cache

WORKDIR /srv
COPY pyproject.toml README.md ./
COPY app ./app
COPY migrations ./migrations
COPY alembic.ini ./
# the stream extra (nats-py) lets the same image run the broker worker: docker run IMAGE olu consume ...; the fast
# extra (numba) is the compiled sampler the work budget's estimates assume (docs/operations.md §8): without it
# every discrete Gaussian coordinate takes the pure path, ~150x slower
RUN pip install '.[stream,fast]' && useradd --system --uid 10001 --home /srv olu \
    && mkdir -p /data "$NUMBA_CACHE_DIR" && olu warm && chown -R olu /data "$NUMBA_CACHE_DIR"

USER olu
VOLUME ["/data"]
EXPOSE 8000
# liveness: /healthz (the process answers; no I/O).  Readiness is /readyz (database, schema, signing key; 503 until
# they are there): point a load balancer or an orchestrator's readiness probe at it, not at this check
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status == 200 else 1)"
# --app-dir keeps /srv first on sys.path, so migrations/ beside app/ is found.  --no-proxy-headers: the service
# takes the client address from the socket, and a forwarded header only from the proxies listed in
# OLU_TRUSTED_PROXIES (empty: none; e.g. docker run -e OLU_TRUSTED_PROXIES=172.17.0.1 ... behind a proxy on the host)
CMD ["uvicorn", "app.main:app", "--app-dir", "/srv", "--host", "0.0.0.0", "--port", "8000", "--no-proxy-headers"]
