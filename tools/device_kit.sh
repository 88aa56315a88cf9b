#!/usr/bin/env bash
# Fills .device/ (git-ignored) with what the GPU machine lacks, for
# `source .device/env.sh && tools/device_build.sh BUILD [targets]` there:
# shared/device/fetch-debs.sh's packages plus the ones this tree needs
# beyond them (Oniguruma for tokenizer regexes, yaml-cpp for run configs,
# ISA-L for CRC-32C),
# then repacks them small enough to travel (tools/trim_device_debs.sh).
#
#   tools/device_kit.sh [path/to/shared/device/fetch-debs.sh]
set -euo pipefail
cd "$(dirname "$0")/.."
FETCH=${1:-../shared/device/fetch-debs.sh}
"$FETCH" libonig-dev libonig5 libyaml-cpp-dev libyaml-cpp0.7 libisal-dev libisal2
tools/trim_device_debs.sh
