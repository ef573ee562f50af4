#!/usr/bin/env bash
# NVIDIA's load generator perf_analyzer (PyPI `perf-analyzer`), runnable on this machine, as DEST/perf_analyzer.
#
#   benchmarks/get_perf_analyzer.sh [DEST]        (default DEST: .tools/perf_analyzer; `make perf-analyzer`)
#
# perf-analyzer's wheels from 2.58 on are tagged manylinux_2_38 (glibc 2.38); the only other version on PyPI,
# 0.1.0, is an empty placeholder. Where the system glibc is older (Debian 12 has 2.36), the binary runs through
# Debian 13's own libc6 / libstdc++6 / libgcc-s1, downloaded with apt-get into DEST (nothing installed system-wide)
# and started through that libc's loader. DEST/perf_analyzer is a launcher that does whichever applies.
set -euo pipefail

DEST=${1:-.tools/perf_analyzer}
VERSION=${PERF_ANALYZER_VERSION:-2.60.0}
PYTHON=${PYTHON:-python3}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)

if [ ! -x "$DEST/wheel/perf_analyzer/bin/perf_analyzer" ]; then
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_38_x86_64 \
        "perf-analyzer==$VERSION" -d "$DEST/download"
    rm -rf "$DEST/wheel"
    "$PYTHON" -m zipfile -e "$DEST"/download/perf_analyzer-"$VERSION"-*.whl "$DEST/wheel"
    chmod +x "$DEST/wheel/perf_analyzer/bin/perf_analyzer"
fi
BIN="$DEST/wheel/perf_analyzer/bin/perf_analyzer"

glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
if [ "$(printf '%s\n2.38\n' "$glibc" | sort -V | head -1)" = "2.38" ]; then
    printf '#!/bin/sh\nexec "%s" "$@"\n' "$BIN" > "$DEST/perf_analyzer"
else
    LIBS="$DEST/trixie/root/usr/lib/x86_64-linux-gnu"
    if [ ! -e "$LIBS/ld-linux-x86-64.so.2" ]; then
        APT="$DEST/trixie"
        mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/debs"
        echo "deb http://deb.debian.org/debian trixie main" > "$APT/sources.list"
        opts=(-o "Dir::Etc::sourcelist=$APT/sources.list" -o "Dir::Etc::sourceparts=-"
              -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache" -o "APT::Get::List-Cleanup=0")
        apt-get "${opts[@]}" update -qq
        (cd "$APT/debs" && apt-get "${opts[@]}" download -qq libc6 libstdc++6 libgcc-s1)
        for deb in "$APT"/debs/*.deb; do dpkg-deb -x "$deb" "$APT/root"; done
    fi
    printf '#!/bin/sh\n# glibc %s here; perf_analyzer needs 2.38: Debian 13 libraries from %s\nexec "%s" --library-path "%s" "%s" "$@"\n' \
        "$glibc" "$LIBS" "$LIBS/ld-linux-x86-64.so.2" "$LIBS" "$BIN" > "$DEST/perf_analyzer"
fi
chmod +x "$DEST/perf_analyzer"
"$DEST/perf_analyzer" --version
echo "perf_analyzer $VERSION: $DEST/perf_analyzer"
