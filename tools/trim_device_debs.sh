#!/usr/bin/env bash
# Shrinks the GPU build kit's carried Debian packages (.device/debs, filled
# by ../shared/device/fetch-debs.sh) by repacking them without their static
# libraries and documentation: the device build links the shared objects,
# and the device tool refuses a working tree plus carry above 64 MiB. A
# static library that the package's own CMake targets name (GoogleTest's,
# Google Benchmark's) stays: CMake checks that it exists.
# Idempotent; run once after fetch-debs.sh.
set -euo pipefail
DEBS=${1:-$(cd "$(dirname "$0")/.." && pwd)/.device/debs}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
before=$(du -sk "$DEBS" | cut -f1)
for deb in "$DEBS"/*.deb; do
  listing=$(dpkg-deb -c "$deb")
  grep -qE '\.a$|/usr/share/doc/.' <<<"$listing" || continue
  rm -rf "$work/pkg" && dpkg-deb -R "$deb" "$work/pkg"
  named=$(find "$work/pkg" -name '*.cmake' -exec cat {} + 2>/dev/null || true)
  while IFS= read -r lib; do
    grep -qF "$(basename "$lib")\"" <<<"$named" || rm -f "$lib"
  done < <(find "$work/pkg" -name '*.a')
  rm -rf "$work/pkg/usr/share/doc" "$work/pkg/DEBIAN/md5sums"
  dpkg-deb -Zxz -b "$work/pkg" "$deb" >/dev/null
done
echo "$DEBS: ${before} KiB -> $(du -sk "$DEBS" | cut -f1) KiB"
