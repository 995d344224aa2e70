# The shardlease image: one image for `shardlease operator` (the cluster
# operator) and `shardlease agent` (the per-pod sidecar the operator injects).
#
#   docker build -t shardlease:0.1.0 .                      # runtime (the default)
#   docker build --target example -t shardlease:dev .      # + the example app
#
# The builder makes a wheel from the project and installs it, with its
# pinned dependencies, into a virtualenv; a second one adds the example
# application. The final stages are a clean base with only a virtualenv: no
# source tree, no build tools, no pip. `runtime` (the last stage, so the
# default target) carries only what runs in production; `example` is the
# same plus the example application (shardlease-examples), which the
# end-to-end scenarios (tests/pods, e2e/kind.sh) run beside the agent.

ARG PYTHON_IMAGE=python:3.11-slim
# The final stages' base: the same Python without what only builds a
# virtualenv, where one is at hand (e2e/cluster passes such a base).
ARG RUNTIME_BASE=${PYTHON_IMAGE}

FROM ${PYTHON_IMAGE} AS builder
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# botocore carries the API models of every AWS service (27 MB); the S3 store
# needs S3's, and its credential providers STS's, SSO's and the sign-in
# service's. (tests/pods/test_node.py makes those clients in the image.)
ENV PRUNE_BOTOCORE="import botocore, pathlib, shutil; \
keep = {'s3', 'sts', 'sso', 'sso-oidc', 'signin'}; \
data = pathlib.Path(botocore.__file__).parent / 'data'; \
[shutil.rmtree(p) for p in data.iterdir() if p.is_dir() and p.name not in keep]"
# Only what building the packages needs (see .dockerignore).
COPY pyproject.toml README.md ./
COPY requirements/image.txt requirements/image.txt
COPY operator/ operator/
COPY examples/pyproject.toml examples/README.md examples/
COPY examples/shardlease_examples/ examples/shardlease_examples/
# The dependencies exactly as pinned, each checked against its hash
# (requirements/image.txt, made by pip-compile --generate-hashes from
# pyproject.toml), then the package itself without resolving anything.
RUN python -m venv /opt/shardlease \
 && /opt/shardlease/bin/pip install --require-hashes --no-deps -r requirements/image.txt \
 && pip wheel --no-deps --wheel-dir /wheels . ./examples \
 && /opt/shardlease/bin/pip install --no-deps /wheels/shardlease-*.whl \
 && /opt/shardlease/bin/pip check \
 && /opt/shardlease/bin/python -c "$PRUNE_BOTOCORE"

# The example application, installed next to shardlease but not inside it
# (it needs nothing shardlease does not already depend on).
FROM builder AS example-venv
RUN /opt/shardlease/bin/pip install --no-deps /wheels/shardlease_examples-*.whl \
 && /opt/shardlease/bin/pip check \
 && /opt/shardlease/bin/pip uninstall --yes pip setuptools \
 && /opt/shardlease/bin/python -m shardlease_examples.shardapp --help > /dev/null

# pip and setuptools leave the runtime venv once `pip check` agreed.
FROM builder AS runtime-venv
RUN /opt/shardlease/bin/pip uninstall --yes pip setuptools \
 && /opt/shardlease/bin/shardlease --help > /dev/null

FROM ${RUNTIME_BASE} AS base
# Set by whoever builds: e2e/cluster passes the git revision.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=""
LABEL org.opencontainers.image.title="shardlease" \
      org.opencontainers.image.description="Places the shards of a StatefulSet's application across its pods with leases" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
# HOME: an arbitrary uid has no passwd entry, so nothing may look one up to
# find a home directory.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    PATH=/opt/shardlease/bin:$PATH
# 65532: the conventional "nonroot" uid/gid; the chart runs as it too.
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["shardlease"]
CMD ["--help"]

FROM base AS example
# The same path as in the builder: the venv's scripts point at it.
COPY --from=example-venv /opt/shardlease /opt/shardlease

FROM base AS runtime
COPY --from=runtime-venv /opt/shardlease /opt/shardlease
