# syntax=docker/dockerfile:1
# The edge collector image: `sluice collect` with the `edge` extra only (paho-mqtt, pyarrow,
# msgspec) - no Spark, no Dagster, no JVM - for a small box next to the sensors.
#
# Build from the repository root:  docker build -f docker/collector.Dockerfile -t sluice-collector .
# Run:  docker run -v /etc/sluice/collector.toml:/etc/sluice/collector.toml:ro \
#         -v collector-state:/var/lib/sluice/collector -v edge-streams:/var/lib/sluice/streams \
#         [--cap-add SYS_NICE  for the NIC driver's realtime_priority] sluice-collector
# Pravega Sensor Collector variables (-e PRAVEGA_SENSOR_COLLECTOR_NET1_CLASS=...) work too.
FROM python:3.11-slim-bookworm

ARG UV_VERSION=0.13.9

# tini forwards SIGTERM to the collector (which then drains its buffers) and reaps the NIC
# driver's sampling process.
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/* \
 && pip install --no-cache-dir "uv==${UV_VERSION}" \
 && useradd --system --uid 10001 --user-group --home-dir /opt/sluice --shell /usr/sbin/nologin sluice

WORKDIR /opt/sluice
ENV UV_PROJECT_ENVIRONMENT=/opt/sluice/.venv \
    UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1 \
    PATH=/opt/sluice/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    SLUICE_HOME=/var/lib/sluice/home

# Dependencies first (a layer that changes only with the lock file), then the project. The
# wheel lists every top-level package, so all are copied; only pipeline.streams and
# collectors are imported at run time.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project --extra edge
COPY pipeline ./pipeline
COPY collectors ./collectors
COPY assets ./assets
COPY resources ./resources
# Fail the build if Spark or Dagster crept into the edge install, or `sluice collect` cannot
# start without them.
RUN uv sync --frozen --no-dev --extra edge \
 && ! python -c "import pyspark" 2>/dev/null \
 && ! python -c "import dagster" 2>/dev/null \
 && sluice collect --help >/dev/null

RUN mkdir -p /var/lib/sluice/home /var/lib/sluice/collector /var/lib/sluice/streams /etc/sluice \
 && cp collectors/collector.example.toml /etc/sluice/collector.example.toml \
 && chown -R sluice:sluice /var/lib/sluice
VOLUME ["/var/lib/sluice/collector", "/var/lib/sluice/streams"]

USER sluice
STOPSIGNAL SIGTERM
# Prometheus metrics, when collector.toml sets metrics_port = 9464 (and metrics_address =
# "0.0.0.0": loopback inside a container reaches no one).
EXPOSE 9464
# Healthy while every instance runs, its driver reaches its source (an MQTT broker) and its
# sender the store, each within unhealthy_after_seconds (collector.toml).
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=2 \
  CMD ["sluice", "collect", "--config", "/etc/sluice/collector.toml", "status", "--check"]
# tini is PID 1: it forwards SIGTERM/SIGINT/SIGHUP to the collector (each drains its buffers)
# and reaps the NIC driver's sampling process. Give only arguments when running the image.
ENTRYPOINT ["tini", "--", "sluice", "collect"]
CMD ["--config", "/etc/sluice/collector.toml"]
