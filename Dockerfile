# The gateway, and the engine simulator that ships in the same package.
#
#   docker build -t priority-gateway .
#   docker build --build-arg EXTRAS=[precise] -t priority-gateway .   # precise prefix mode (tokenizers)
#   docker build --build-arg EXTRAS=[otel] -t priority-gateway .      # OpenTelemetry tracing (OTEL_* variables)
#   docker run -p 127.0.0.1:8080:8080 priority-gateway         # embedded default: simulated engines
#   docker run ... priority-gateway serve --config /etc/gateway/gateway.yaml
#   docker run ... --entrypoint python priority-gateway -m priority_gateway.engines.sim --host 0.0.0.0 --port 8000 ...
#
# Pushing it to a registry, and the workflow that publishes it on version tags: deploy/README.md.
#
# Two stages: the wheel is built with the build tools, the runtime image only installs it.

FROM python:3.11-slim AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md LICENSE ./
COPY priority_gateway ./priority_gateway
COPY engines ./engines
ARG EXTRAS=""
RUN pip wheel --wheel-dir /wheels ".${EXTRAS}"

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GATEWAY__DATA_DIR=/var/lib/gateway
# /var/lib/gateway: state the gateway keeps across restarts (store: sqlite's file, keys.admin_file);
# owned by the gateway user, so a volume mounted there starts writable by it.
RUN groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid gateway --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gateway \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/gateway
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["gateway"]
# Listen on all interfaces: inside a container, 127.0.0.1 is unreachable from outside.
CMD ["serve", "--host", "0.0.0.0"]
