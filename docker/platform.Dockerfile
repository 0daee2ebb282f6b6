# syntax=docker/dockerfile:1
# The Sluice platform image: Dagster (webserver, daemon, code location) and Spark (master,
# workers) from one Python environment. One image on purpose: Spark executors run Sluice's
# Python data source, so a worker must import the same `pipeline` from the same interpreter
# path (PYSPARK_PYTHON) as the driver in the code location.
#
# Build from the repository root:  docker build -f docker/platform.Dockerfile .
FROM python:3.11-slim-bookworm

ARG UV_VERSION=0.13.9

# Java 17 for Spark; tini reaps the JVM's and Dagster's children; procps for Spark's scripts.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps tini \
 && rm -rf /var/lib/apt/lists/* \
 && pip install --no-cache-dir "uv==${UV_VERSION}" \
 && useradd --system --uid 10001 --user-group --home-dir /opt/sluice --shell /usr/sbin/nologin sluice

WORKDIR /opt/sluice
ENV UV_PROJECT_ENVIRONMENT=/opt/sluice/.venv \
    UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1 \
    PATH=/opt/sluice/.venv/bin:$PATH \
    SLUICE_HOME=/var/lib/sluice/home \
    XDG_CACHE_HOME=/var/lib/sluice/cache \
    DAGSTER_HOME=/opt/dagster

# Dependencies first (a layer that changes only with the lock file), then the project.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project --extra platform --extra deploy
COPY pipeline ./pipeline
COPY collectors ./collectors
COPY assets ./assets
COPY resources ./resources
RUN uv sync --frozen --no-dev --extra platform --extra deploy \
 && .venv/bin/python -m pipeline.spark.zip_bytecode

COPY docker/entrypoint.sh /usr/local/bin/sluice-entrypoint
RUN mkdir -p /var/lib/sluice/home /opt/dagster \
 && chown -R sluice:sluice /var/lib/sluice

USER sluice
ENTRYPOINT ["tini", "--", "sluice-entrypoint"]
CMD ["sluice", "--help"]
