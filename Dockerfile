# The image GKE runs (built by `gcloud builds submit`, see notebook 03).
# Ray and Python come from the Ray image whose versions equal requirements.lock's (a test
# checks); every Python package comes from requirements.lock, the one list of exact pins.
# Its Python is gke.settings.IMAGE_PYTHON (a test checks the tag against it), one of those the
# lock supports; the check below stops a build from a base image with another.
FROM rayproject/ray:2.60.0-py311

# The Ray image's user `ray` (uid 1000, group users = 100) owns its Python: no root needed.
USER 1000:100
WORKDIR /home/ray/distrl

# LD_LIBRARY_PATH: GKE's device plugin mounts the node's GPU driver (libcuda.so.1) at
# /usr/local/nvidia/lib64 and sets no environment; CUDA base images put that folder on the
# path, the Ray CPU image does not (preflight.NVIDIA_LIB_DIR has the sources; a test reads it
# here). On a CPU pod the folder is absent and the path harmless.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_CPP_MIN_LOG_LEVEL=2 \
    LD_LIBRARY_PATH=/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}

RUN python -c 'import sys; v = "%d.%d" % sys.version_info[:2]; \
    assert v == "3.11", f"the base image runs Python {v}, gke.settings.IMAGE_PYTHON says 3.11"'

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
