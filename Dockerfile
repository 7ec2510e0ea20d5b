# The gateway (and the simulator, for the demo fleet) in one image.
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY pyproject.toml README.md alembic.ini ./
COPY gateway ./gateway
COPY simulator ./simulator
COPY policies ./policies
RUN pip install --no-cache-dir .
EXPOSE 8080
CMD ["gateway", "serve", "--host", "0.0.0.0", "--port", "8080"]
