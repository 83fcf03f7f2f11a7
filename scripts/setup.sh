# Sourced by demo.sh and test.sh: makes sure the tools ringfs needs are installed.
# The Rust toolchain named in rust-toolchain.toml (with rustfmt and clippy) is installed by
# rustup on first use; system packages are installed with apt-get when missing and possible.

need_packages=()
for tool in cc:gcc pkg-config:pkg-config; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || need_packages+=("${tool#*:}")
done
if [ ${#need_packages[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing ${need_packages[*]}"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_packages[@]}" >/dev/null
    else
        echo "missing system packages: ${need_packages[*]} (install them, then rerun)" >&2
        exit 1
    fi
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust from https://rustup.rs" >&2
    exit 1
fi
