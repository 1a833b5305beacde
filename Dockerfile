# localdet's image: the daemon on NVIDIA's TensorFlow container (the GPU image, by default),
# or on a Debian base with TensorFlow's CPU build (the CPU variant, which scripts/cpu-image
# builds with podman and the test suite runs). Both come from the steps below, so they cannot
# drift apart; only the base and the build arguments differ.
#
# 25.02 is the newest tag with TensorFlow 2 and Horovod, and the last one: its release notes
# say NVIDIA releases no TensorFlow containers after 25.02. It has TensorFlow 2.17.0+nv25.2,
# Keras 3.3.2 and tf_keras 2.17.0 (Keras 2), Horovod 0.28.1+nv25.2 built for that TensorFlow,
# Python 3.12, CUDA 12.8 and Ubuntu 24.04. Its entrypoint, which sets up CUDA, is kept.
ARG BASE=nvcr.io/nvidia/tensorflow:25.02-tf2-py3
FROM ${BASE}

# What the base lacks: NVIDIA's container has TensorFlow and Horovod; the CPU variant passes
# TENSORFLOW (pip requirements) and HOROVOD=absent.
ARG TENSORFLOW=""
ARG HOROVOD=required

# The state (localdet.db, queue/, store/, experiments/) lives in $LOCALDET_HOME.
# PYTHONUNBUFFERED: the daemon's slot table reaches `docker logs` at once.
ENV LOCALDET_HOME=/localdet \
    PYTHONUNBUFFERED=1

WORKDIR /opt/localdet

# The dependencies come first, in layers of their own, before any of localdet's source: a
# rebuild after a code change reuses them. pip's cache is a build cache mount, kept by the
# engine between builds and never part of the image (BuildKit, Docker's builder since 23.0,
# and podman read `RUN --mount`).
RUN --mount=type=cache,target=/root/.cache/pip \
    if [ -n "$TENSORFLOW" ]; then pip install $TENSORFLOW; fi \
 && python -c "import importlib.metadata as m; print(*sorted(f'{d}=={m.version(d)}' for d in m.packages_distributions()['tensorflow']))" \
        > /opt/tensorflow-of-the-base

# The rest of pyproject's dependencies (most are already in NVIDIA's container), with
# scikit-learn for the examples. TensorFlow, Keras, tf_keras, TensorBoard and TensorFlow's
# ml-dtypes are the base's.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install "h5py>=3.10" "sqlite-utils>=4.0,<4.3" "watchdog>=4.0" \
        "click>=8.1" "pyyaml>=6.0" "jsonschema>=4.20" "rich>=13.0,<15.1" "numpy>=1.26" \
        "starlette>=0.37" "uvicorn>=0.29" "httptools>=0.6" "plotly>=5.20" "matplotlib>=3.8" \
        "optuna>=4.0" "pyfastcdc>=0.3.1,<0.4" "psutil>=5.9" "nvidia-ml-py>=12" \
        "scikit-learn>=1.3"

# localdet itself as its wheel, built from the sources and installed as a package index's
# would be (tests/test_installed_wheel.py tests one built the same way), never the source
# tree: the sources are removed after the build, so nothing of them lies in the WORKDIR to
# be imported in the installed package's place. (COPY, not a bind mount: podman's layer cache
# would not see a change to a bind mount's files.) --no-deps: the base's TensorFlow, tf_keras
# and TensorBoard meet pyproject's pins; resolving those pins again could let pip change
# packages under NVIDIA's TensorFlow build.
COPY pyproject.toml setup.py README.md LICENSE /tmp/localdet-source/
COPY localdet/ /tmp/localdet-source/localdet/
COPY harness/ /tmp/localdet-source/harness/
COPY state/ /tmp/localdet-source/state/
RUN --mount=type=cache,target=/root/.cache/pip \
    pip wheel --no-deps --wheel-dir /tmp/localdet-wheel /tmp/localdet-source \
 && pip install --no-deps /tmp/localdet-wheel/localdet-*.whl \
 && rm -rf /tmp/localdet-wheel /tmp/localdet-source

# Make the build fail, instead of the first multi-GPU trial, if pip replaced the base's
# TensorFlow or Horovod is missing. Nothing here imports TensorFlow, so no GPU is needed.
RUN python -c "import importlib.metadata as m; v = ' '.join(sorted(f'{d}=={m.version(d)}' for d in m.packages_distributions()['tensorflow'])); b = open('/opt/tensorflow-of-the-base').read().split(); assert v.split() == b, f'pip replaced TensorFlow {b} by {v}'" \
 && if [ "$HOROVOD" = required ]; then python -c "from localdet.config.engines import horovod_installed; assert horovod_installed(), 'horovod.tensorflow is missing'"; fi \
 && localdet --help > /dev/null \
 && cd / && python -c "import localdet, sys; assert localdet.__file__.startswith(sys.prefix), localdet.__file__"

COPY examples/ examples/

VOLUME /localdet

# The daemon also serves the dashboard; bound to 0.0.0.0 inside the container it prints an
# address with a token (`docker logs`), and refuses requests without it. It finds the GPUs
# given by `docker run --gpus` with nvidia-smi; with no GPU, it uses `--slots N` CPU slots.
EXPOSE 8090
CMD ["localdet", "daemon", "--web", "--host", "0.0.0.0", "--port", "8090"]
