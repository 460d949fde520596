# The image GKE runs (built by `gcloud builds submit`, see notebook 03).
# Ray and Python come from the Ray image whose versions equal requirements.lock's (a test
# checks); every Python package comes from requirements.lock, the one list of exact pins.
FROM rayproject/ray:2.60.0-py311

# The Ray image's user `ray` (uid 1000, group users = 100) owns its Python: no root needed.
USER 1000:100
WORKDIR /home/ray/distrl

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_CPP_MIN_LOG_LEVEL=2

COPY --chown=1000:100 requirements.lock ./
# The "# gpu:" lines of the lock pin TensorFlow's CUDA wheels: TensorFlow finds them and uses
# the GPU when the pod has one (GKE mounts the node's driver); on CPU pods they stay unused.
RUN pip install --no-cache-dir -r requirements.lock \
    && sed -n 's/^# gpu: //p' requirements.lock > /tmp/gpu.txt \
    && pip install --no-cache-dir --no-deps -r /tmp/gpu.txt \
    && rm /tmp/gpu.txt

COPY --chown=1000:100 pyproject.toml README.md ./
COPY --chown=1000:100 helpers ./helpers
RUN pip install --no-cache-dir --no-deps ./
