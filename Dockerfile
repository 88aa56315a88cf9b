# The training image: teacher_server, student_trainer and e3_launch built
# from this repository for NVIDIA GPUs (Hopper by default), run as a non-root
# user. Build from the repository root:
#
#   docker build -t REGISTRY/e3train:TAG .
#   docker build --build-arg CUDA_ARCHS=80 ...        # A100
#
# The base is NVIDIA's CUDA devel image on Ubuntu 24.04, the layout the GPU
# builds of this project are made and tested on (shared/device/README.md):
# the apt packages of tools/install_deps.sh (same names on Ubuntu), LibTorch
# with CUDA and NCCL from the PyTorch wheel (Debian's libtorch-dev is
# CPU-only), a Release build. docs/guides/cluster.md says what has and has not been
# run of this file.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_VERSION=2.7.1
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG CUDA_ARCHS=90
ENV DEBIAN_FRONTEND=noninteractive

COPY tools/install_deps.sh /tmp/install_deps.sh
RUN apt-get update -qq \
 && apt-get install -y --no-install-recommends python3-venv python3-pip ca-certificates \
 && E3_DEPLOY_TOOLS=0 /tmp/install_deps.sh \
 && rm -rf /var/lib/apt/lists/*

# LibTorch with CUDA (and its NCCL) from the wheel, in a venv off the system
# Python; the chat templates keep rendering with the system's python3-jinja2.
RUN python3 -m venv /opt/torch \
 && /opt/torch/bin/pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"

COPY . /src
RUN set -eux; \
    py=/opt/torch/bin/python; \
    torch_prefix=$($py -c 'import torch; print(torch.utils.cmake_prefix_path)'); \
    nccl=$($py -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])'); \
    cmake -S /src -B /tmp/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$torch_prefix" -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS}" \
      -DNCCL_INCLUDE_DIR="$nccl/include" -DNCCL_LIBRARY="$nccl/lib/libnccl.so.2" \
      -DE3_BUILD_TESTS=OFF -DE3_BUILD_BENCH=OFF; \
    cmake --build /tmp/build --target teacher_server student_trainer e3_launch; \
    mkdir -p /opt/e3/bin; \
    cp /tmp/build/teacher_server/teacher_server /tmp/build/student_trainer/student_trainer \
       /tmp/build/launcher/e3_launch /src/deploy/k8s/teacher-entrypoint.sh \
       /src/deploy/k8s/student-entrypoint.sh /opt/e3/bin/; \
    rm -rf /tmp/build /src

# The wheel's libraries (LibTorch, NCCL, cuDNN) for the binaries.
RUN py=/opt/torch/bin/python; \
    torch_lib=$($py -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))'); \
    nccl=$($py -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])'); \
    printf '%s\n' "$torch_lib" "$nccl/lib" > /etc/ld.so.conf.d/e3-torch.conf && ldconfig \
 && groupadd --gid 10001 e3 && useradd --uid 10001 --gid e3 --create-home --shell /usr/sbin/nologin e3

ENV PATH=/opt/e3/bin:${PATH}
USER 10001:10001
WORKDIR /home/e3
# The manifests in deploy/k8s pick the command (the entrypoint scripts).
CMD ["teacher_server", "--help"]
