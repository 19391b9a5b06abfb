FROM python:3.11-slim
# bubblewrap: strict sandbox isolation; util-linux (unshare, prlimit) and procps.
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap util-linux procps \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml constraints.txt celeryconfig.py README.md ./
COPY tasks ./tasks
COPY models ./models
COPY examples ./examples
RUN pip install --no-cache-dir -c constraints.txt ".[flower]"
# Workers run unprivileged: strict sandboxes need only unprivileged user namespaces.
RUN useradd --system --uid 10001 --home-dir /var/lib/playrun --create-home playrun \
    && mkdir -p /var/lib/playrun/sandboxes /var/lib/playrun/gateway \
    && chown -R playrun:playrun /var/lib/playrun
ENV PLAYRUN_SANDBOX_ROOT=/var/lib/playrun/sandboxes \
    PLAYRUN_GATEWAY_SOCKET=/var/lib/playrun/gateway/gateway.sock
USER playrun
