#!/usr/bin/env bash
# Installs the build and test dependencies from Debian 12's registry.
# Idempotent: when everything is present it returns without touching apt.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build ccache pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libtorch-dev prometheus-cpp-dev libcpp-httplib-dev nlohmann-json3-dev libgloo-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # PyTorch for Python (CPU): the golden generators and the independent
  # acceptance cross-check (tools/acceptance_crosscheck.py) that CI runs.
  python3-torch
  # Chat templates render in embedded CPython with Jinja2, as transformers
  # renders them; .jsonl.gz datasets read through zlib.
  libpython3-dev python3-jinja2 zlib1g-dev
  # Any Split regex of a tokenizer.json, on the engine HF tokenizers uses.
  libonig-dev
  # CRC-32C of TensorBoard event files and checkpoints (Intel ISA-L).
  libisal-dev
  # The run config (YAML), and the plot of a run's curves (tools/plot_run.py).
  libyaml-cpp-dev python3-matplotlib
  # The sanitizer builds: clang with libFuzzer and the TSan/ASan runtimes.
  clang-14 libclang-rt-14-dev
  # The Slurm test (tests/deploy/slurm): a one-machine cluster of Debian's
  # slurmctld and slurmd with munge (tools/slurm_local_cluster.sh).
  slurm-wlm munge
  # The BLAS LibTorch runs on: BLIS (OpenMP). Never OpenBLAS's threaded
  # builds: they break civetweb threads, and the reference BLAS is 30x slower.
  libblis4-openmp
  # PyYAML: the deploy/ manifest checks and tools/make_prometheus_rule.py.
  python3-yaml
)
# The deploy/ tests' tools (E3_DEPLOY_TOOLS=0 leaves them out, as the
# Dockerfile does): a real Prometheus server and promtool, and `kubectl
# kustomize` from Debian's kubernetes-client, unless a kubectl from elsewhere
# is installed (both own /usr/bin/kubectl).
if [[ "${E3_DEPLOY_TOOLS:-1}" != 0 ]]; then
  PKGS+=(prometheus)
  command -v kubectl >/dev/null || PKGS+=(kubernetes-client)
fi
missing=()
for p in "${PKGS[@]}"; do
  [[ "$p" == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
