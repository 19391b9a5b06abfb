FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends util-linux procps \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml celeryconfig.py README.md ./
COPY tasks ./tasks
COPY models ./models
COPY examples ./examples
RUN pip install --no-cache-dir ".[flower]"
ENV PLAYRUN_SANDBOX_ROOT=/var/lib/playrun/sandboxes
