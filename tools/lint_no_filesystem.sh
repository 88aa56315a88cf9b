#!/usr/bin/env sh
# Fails when code that can run in a LibTorch process uses std::filesystem
# (see common/base/file_util.h for why). Comment lines are ignored.
cd "$(dirname "$0")/.." || exit 2
hits=$(grep -rnE 'std::filesystem|#include <filesystem>' common kernels teacher_server student_trainer proto bench \
         tests/teacher_server tests/student_trainer tests/e2e | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//')
if [ -n "$hits" ]; then
  echo "std::filesystem in LibTorch-process code (use common/base/file_util.h):"
  echo "$hits"
  exit 1
fi
echo "no std::filesystem in LibTorch-process code"
