#!/usr/bin/env bash
# ctest tensorboard_readback_test: an event file written by the production
# EventFileWriter (tensorboard_sample_writer), read back by TensorBoard's own
# readers (tools/tensorboard_readback.py) against the values written. Exits
# 77, a skip, when PYTHON cannot import tensorboard.
#
#   tensorboard_readback_test.sh WRITER PYTHON CHECKER
set -euo pipefail
writer=$1 python=$2 checker=$3
dir=$(mktemp -d "${TMPDIR:-/tmp}/tensorboard_readback.XXXXXX")
trap 'rm -rf "$dir"' EXIT
"$writer" --logdir="$dir/tb" --expected="$dir/expected.json"
"$python" "$checker" --logdir="$dir/tb" --expected="$dir/expected.json"
