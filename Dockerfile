# sordino's container image: slim, non-root, with a health check.
#   docker build -t sordino .
#   docker run -p 8000:8000 -p 8001:8001 --shm-size 1g sordino
# The image runs `sordino start` (the README's first command's install); without a
# configuration it serves the built-in demo models. Kubernetes: deploy/k8s/,
# KServe: deploy/kserve/ (docs/scale-out.md). For Ray actors, build with
# --build-arg EXTRAS=ray.
FROM python:3.11-slim

ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/sordino
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install ".${EXTRAS:+[$EXTRAS]}" \
    && rm -rf /opt/sordino/src \
    && groupadd --system --gid 10001 sordino \
    && useradd --system --uid 10001 --gid sordino --home-dir /var/lib/sordino --create-home sordino

USER 10001:10001
WORKDIR /var/lib/sordino
EXPOSE 8000 8001

# The process serves HTTP: KServe v2 liveness (readiness is the orchestrator's call).
HEALTHCHECK --interval=15s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/v2/health/live', timeout=2).status != 200)"]

ENTRYPOINT ["sordino"]
CMD ["start", "--host", "0.0.0.0", "--http-port", "8000", "--grpc-port", "8001", "--data-dir", "/var/lib/sordino"]
