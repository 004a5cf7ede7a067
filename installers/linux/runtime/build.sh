#!/bin/sh
# Build GPUFlex's AppImage runtime (runtime.c):  build.sh OUT
#
# Needs gcc and Debian's libsquashfuse-dev, libfuse3-dev, zlib1g-dev, libzstd-dev,
# liblzma-dev, liblz4-dev. squashfuse and the decompressors are linked statically (their .a
# files), so the AppImage needs only libc and libfuse3 on the host; a library without its .a
# is linked dynamically and named on stderr.
set -eu
HERE=$(dirname "$(readlink -f "$0")")
OUT=${1:?usage: build.sh OUT}
CC=${CC:-gcc}

static="" dynamic=""
for lib in squashfuse_ll zstd z lzma lz4; do
  if case "$($CC -print-file-name=lib$lib.a)" in /*) true ;; *) false ;; esac; then
    static="$static -l$lib"
  else
    dynamic="$dynamic -l$lib"
    echo "note: lib$lib.a not found, linking lib$lib dynamically" >&2
  fi
done

# -s: no symbols (the runtime is copied into every AppImage); the section header table stays,
# and it is what the runtime uses to find where it ends.
# shellcheck disable=SC2086
$CC -std=c11 -O2 -s -Wall -Wextra -o "$OUT" "$HERE/runtime.c" \
  -Wl,-Bstatic $static -Wl,-Bdynamic $dynamic -lfuse3 -lpthread

# The AppImage magic: "AI" and the type (2) at offset 8 of the ELF header (EI_ABIVERSION and
# the padding after it, which loaders ignore), written after linking as the spec says.
printf 'AI\002' | dd of="$OUT" bs=1 seek=8 conv=notrunc status=none
