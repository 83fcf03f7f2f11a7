# Sourced by demo.sh and test.sh: makes sure the tools ringfs needs are installed.
# The Rust toolchain named in rust-toolchain.toml (with rustfmt and clippy) is installed by
# rustup on first use; missing system packages are installed with apt-get (as root).
#   gcc, pkg-config  the C library's example and test program
#   fuse3            fusermount3, for FUSE mounts by users other than root
#   rsync, python3,  tools the FUSE tests run through the mount
#   git
#   iproute2         `ip`, for the fault tests with servers in network namespaces
#   fio              run under the LD_PRELOAD library by tests/preload.rs
#   mpich,           an MPI-IO program (ROMIO) run under the LD_PRELOAD library by
#   libmpich-dev     tests/preload.rs and across Slurm nodes by tests/slurm.rs; looked for as
#                    mpicc.mpich/mpiexec.mpich (another MPI's mpicc does not count)
#   slurmctld,       a real Slurm cluster of network-namespace nodes for tests/slurm.rs
#   slurmd, munge,   (scripts/local-slurm.sh)
#   slurm-client
#   python3-venv     the venv the Python package is built and tested in (scripts/python-test.sh)
#   libucx-dev,      UCX: the library crates/ucx loads at run time, the headers its layout test
#   ucx-utils        compiles against, and ucx_perftest (`ringfs bench ucx`)

need_packages=()
for tool in cc:gcc pkg-config:pkg-config fusermount3:fuse3 rsync:rsync python3:python3 git:git ip:iproute2 fio:fio mpicc.mpich:libmpich-dev mpiexec.mpich:mpich \
    slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge nsenter:util-linux \
    ucx_perftest:ucx-utils; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || need_packages+=("${tool#*:}")
done
[ -e /usr/include/ucp/api/ucp.h ] || need_packages+=(libucx-dev)
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    need_packages+=(python3-venv)
fi
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
