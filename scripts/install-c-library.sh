#!/usr/bin/env bash
# Installs libringfs, ringfs.h and ringfs.pc under PREFIX (default /usr/local), or, with
# --in-place DIR, writes only a ringfs.pc into DIR that points at this checkout's build.
#   scripts/install-c-library.sh [PREFIX]
#   scripts/install-c-library.sh --in-place DIR [PROFILE]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version="$(grep -m1 '^version' "$root/Cargo.toml" | cut -d'"' -f2)"

write_pc() { # prefix libdir includedir destination
    sed -e "s|@PREFIX@|$1|" -e "s|@LIBDIR@|$2|" -e "s|@INCLUDEDIR@|$3|" -e "s|@VERSION@|$version|" \
        "$root/crates/ffi/ringfs.pc.in" > "$4/ringfs.pc"
}

if [ "${1:-}" = "--in-place" ]; then
    dir="$2"; profile="${3:-release}"
    mkdir -p "$dir"
    write_pc "$root" "$root/target/$profile" "$root/include" "$dir"
    exit 0
fi

prefix="${1:-/usr/local}"
(cd "$root" && cargo build --release -p ringfs-ffi)
install -d "$prefix/lib" "$prefix/include" "$prefix/lib/pkgconfig"
install -m 644 "$root/target/release/libringfs.so" "$root/target/release/libringfs.a" "$prefix/lib/"
install -m 644 "$root/include/ringfs.h" "$root/include/ringfs_gmem.h" "$prefix/include/"
write_pc "$prefix" "$prefix/lib" "$prefix/include" "$prefix/lib/pkgconfig"
echo "installed libringfs $version under $prefix"
