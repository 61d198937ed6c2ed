# Slim CPU image for `fusefleet api` and `fusefleet scheduler` (no torch: they never touch a model).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

COPY pyproject.toml README.md ./
COPY api ./api
COPY scheduler ./scheduler
COPY gpu_worker ./gpu_worker
COPY shared ./shared
COPY fusefleet ./fusefleet
RUN pip install '.[s3]' && useradd --create-home --uid 10001 fusefleet

USER fusefleet
EXPOSE 8000
CMD ["fusefleet", "api", "--host", "0.0.0.0", "--port", "8000"]
