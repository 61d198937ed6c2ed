# CUDA PyTorch image for `fusefleet worker`: one container per GPU, the model cached in a volume.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    FUSEFLEET_MODEL_CACHE_DIR=/models HF_HOME=/models/huggingface
WORKDIR /app

COPY pyproject.toml README.md ./
COPY api ./api
COPY scheduler ./scheduler
COPY gpu_worker ./gpu_worker
COPY demo_models ./demo_models
COPY shared ./shared
COPY fusefleet ./fusefleet
# torch comes with the base image; the worker extra adds diffusers, transformers, peft, ...; s3 adds boto3
RUN pip install '.[worker,s3]' && useradd --create-home --uid 10001 fusefleet && mkdir -p /models \
    && chown fusefleet /models

USER fusefleet
# exec form: SIGTERM reaches Celery, which finishes the running batch (warm shutdown)
CMD ["fusefleet", "worker"]
