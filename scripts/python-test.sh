#!/usr/bin/env bash
# Builds the Python package (crates/python, with maturin) into a venv under target/ and runs its
# pytest suite (tests/python) against local clusters it starts. Run by test.sh; exits non-zero
# if anything fails. Needs target/<profile>/ringfs (RINGFS_EXECUTABLE) built beforehand.
#   RINGFS_PYTHON_PROFILE  release (default) or debug: which build of ringfs the tests run
#   RINGFS_PYTHON_FULL=0   skip pandas/pyarrow/zarr/dask and PyTorch (their tests then report SKIPPED)
#   RINGFS_PYTHON_TORCH=0  skip only PyTorch (its Linux wheel brings its CUDA libraries: about
#                          5 GB, 1-2 minutes to install; PyTorch runs on the CPU without a GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${RINGFS_PYTHON_PROFILE:-release}"
venv=target/python-venv
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv" || { echo "cannot make a venv: install python3-venv" >&2; exit 1; }
fi
packages=(maturin pytest fsspec numpy)
if [ "${RINGFS_PYTHON_FULL:-1}" != 0 ]; then
    packages+=(pandas pyarrow zarr "dask[dataframe]")
    if [ "${RINGFS_PYTHON_TORCH:-1}" != 0 ]; then
        packages+=(torch)
    fi
fi
# Only what is missing is fetched: a second run costs no download. No copy of the wheels goes to
# pip's cache: PyTorch's come to about 3 GB, and the venv keeps what was installed anyway.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir "${packages[@]}"
release_flag=()
[ "$profile" = release ] && release_flag=(--release)
rm -f target/wheels/ringfs-*.whl
"$venv/bin/maturin" build --quiet "${release_flag[@]}" -m crates/python/Cargo.toml -i "$venv/bin/python"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps target/wheels/ringfs-*.whl
export RINGFS_EXECUTABLE="${RINGFS_EXECUTABLE:-$PWD/target/$profile/ringfs}"
"$venv/bin/python" -m pytest -q tests/python
