//! The global memory in C (`include/ringfs_gmem.h`): each `ringfs_gmem_*` function wraps
//! one call of [`ringfs_gmem`], returning -1 (or NULL) with `errno` set on failure. One
//! world per process, made by [`ringfs_gmem_init`]; arrays are small integers naming an
//! entry of a table; non-blocking operations return a handle to wait for.

use parking_lot::RwLock;
use std::ffi::{c_int, c_void};

use ringfs_client::Errno;
use ringfs_gmem::{Distribution, GetHandle, GlobalArray, PutHandle, Tile, World};

use crate::guard;

static WORLD: RwLock<Option<World>> = RwLock::new(None);
static ARRAYS: RwLock<Vec<Option<GlobalArray>>> = RwLock::new(Vec::new());

fn world() -> Result<World, Errno> {
    WORLD.read().clone().ok_or(Errno::EINVAL)
}

fn array(handle: i64) -> Result<GlobalArray, Errno> {
    let arrays = ARRAYS.read();
    usize::try_from(handle).ok().and_then(|index| arrays.get(index)).and_then(Option::clone).ok_or(Errno::EBADF)
}

/// # Safety
/// `pointer` must be NULL with `len` 0, or point to `len` bytes valid for the access.
unsafe fn bytes_mut<'a>(pointer: *mut c_void, len: usize) -> Result<&'a mut [u8], Errno> {
    if len == 0 {
        return Ok(&mut []);
    }
    if pointer.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(pointer.cast(), len) })
}

/// # Safety
/// As [`bytes_mut`], for reading.
unsafe fn bytes<'a>(pointer: *const c_void, len: usize) -> Result<&'a [u8], Errno> {
    if len == 0 {
        return Ok(&[]);
    }
    if pointer.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(pointer.cast(), len) })
}

/// Joins the job: servers from RINGFS_SERVER and RINGFS_SECRET, rank from `ringfs run
/// --ranks` or the launcher.
#[unsafe(no_mangle)]
pub extern "C" fn ringfs_gmem_init() -> c_int {
    guard(-1, || {
        let mut slot = WORLD.write();
        if slot.is_none() {
            *slot = Some(World::init()?);
        }
        Ok(0)
    })
}

/// Completes this rank's implicit operations and leaves the job (arrays stay until freed
/// by every rank).
#[unsafe(no_mangle)]
pub extern "C" fn ringfs_gmem_finalize() -> c_int {
    guard(-1, || {
        let world = WORLD.write().take();
        ARRAYS.write().clear();
        world.map_or(Ok(0), |world| world.quiet().map(|()| 0))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ringfs_gmem_rank() -> c_int {
    guard(-1, || Ok(world()?.rank() as c_int))
}

#[unsafe(no_mangle)]
pub extern "C" fn ringfs_gmem_ranks() -> c_int {
    guard(-1, || Ok(world()?.ranks() as c_int))
}

/// Collective allocation; the array's handle (>= 0).
#[unsafe(no_mangle)]
pub extern "C" fn ringfs_gmem_alloc(bytes: u64, distribution: c_int, cyclic_blocks: u32, block_size: u32) -> i64 {
    guard(-1, || {
        let distribution = match distribution {
            0 => Distribution::Block,
            1 => Distribution::Cyclic(cyclic_blocks),
            2 => Distribution::Hashed,
            _ => return Err(Errno::EINVAL),
        };
        let array = world()?.alloc(bytes, distribution, block_size)?;
        let mut arrays = ARRAYS.write();
        arrays.push(Some(array));
        Ok(arrays.len() as i64 - 1)
    })
}

/// Collective free.
#[unsafe(no_mangle)]
pub extern "C" fn ringfs_gmem_free(handle: i64) -> c_int {
    guard(-1, || {
        let freed = array(handle)?;
        world()?.free(&freed)?;
        if let Some(slot) = ARRAYS.write().get_mut(handle as usize) {
            *slot = None;
        }
        Ok(0)
    })
}

/// # Safety
/// `destination` must point to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_gmem_get(destination: *mut c_void, handle: i64, offset: u64, len: usize) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let into = unsafe { bytes_mut(destination, len) }?;
        array(handle)?.get(offset, into).map(|()| 0)
    })
}

/// # Safety
/// `source` must point to `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_gmem_put(handle: i64, offset: u64, source: *const c_void, len: usize) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let from = unsafe { bytes(source, len) }?;
        array(handle)?.put(offset, from).map(|()| 0)
    })
}

/// A non-blocking operation under way (what a `ringfs_gmem_handle_t` points to).
pub enum Pending {
    Get { handle: GetHandle, destination: *mut u8, len: usize },
    Put(PutHandle),
}

/// # Safety
/// `destination` must point to `len` writable bytes, valid until the handle is waited for.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_gmem_get_nb(destination: *mut c_void, handle: i64, offset: u64, len: usize) -> *mut Pending {
    guard(std::ptr::null_mut(), || {
        if destination.is_null() && len > 0 {
            return Err(Errno::EFAULT);
        }
        let pending = Pending::Get { handle: array(handle)?.get_nb(offset, len), destination: destination.cast(), len };
        Ok(Box::into_raw(Box::new(pending)))
    })
}

/// The source is copied at once: it may be reused as soon as this returns.
///
/// # Safety
/// `source` must point to `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_gmem_put_nb(handle: i64, offset: u64, source: *const c_void, len: usize) -> *mut Pending {
    guard(std::ptr::null_mut(), || {
        // SAFETY: forwarded contract.
        let from = unsafe { bytes(source, len) }?.to_vec();
        Ok(Box::into_raw(Box::new(Pending::Put(array(handle)?.put_nb(offset, from)))))
    })
}

/// Waits for a non-blocking operation and frees its handle.
///
/// # Safety
/// `pending` must come from `ringfs_gmem_get_nb` or `ringfs_gmem_put_nb`, not waited for yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_gmem_wait(pending: *mut Pending) -> c_int {
    guard(-1, || {
        if pending.is_null() {
            return Err(Errno::EINVAL);
        }
        // SAFETY: made by Box::into_raw above, and not freed yet (the caller's contract).
        match *unsafe { Box::from_raw(pending) } {
            Pending::Get { handle, destination, len } => {
                let got = handle.wait()?;
                // SAFETY: the caller promised `len` writable bytes at `destination`.
                unsafe { std::ptr::copy_nonoverlapping(got.as_ptr(), destination, len.min(got.len())) };
                Ok(0)
            }
            Pending::Put(handle) => handle.wait().map(|_| 0),
        }
    })
}

/// 1 if the operation completed (`ringfs_gmem_wait` then returns at once), 0 if not.
///
/// # Safety
/// As [`ringfs_gmem_wait`]; the handle stays valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_gmem_test(pending: *mut Pending) -> c_int {
    guard(-1, || {
        // SAFETY: a live handle (the caller's contract).
        let pending = unsafe { pending.as_mut() }.ok_or(Errno::EINVAL)?;
        let done = match pending {
            Pending::Get { handle, .. } => handle.test(),
            Pending::Put(handle) => handle.test(),
        };
        Ok(c_int::from(done))
    })
}

/// Completed by `ringfs_gmem_quiet` (or a barrier).
///
/// # Safety
/// `destination` must point to `len` writable bytes, untouched until then.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_gmem_get_nbi(destination: *mut c_void, handle: i64, offset: u64, len: usize) -> c_int {
    guard(-1, || {
        if destination.is_null() && len > 0 {
            return Err(Errno::EFAULT);
        }
        // SAFETY: forwarded contract.
        unsafe { array(handle)?.get_nbi_raw(offset, destination.cast(), len) };
        Ok(0)
    })
}

/// Completed by `ringfs_gmem_quiet` (or a barrier).
///
/// # Safety
/// `source` must point to `len` readable bytes, unchanged until then.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_gmem_put_nbi(handle: i64, offset: u64, source: *const c_void, len: usize) -> c_int {
    guard(-1, || {
        if source.is_null() && len > 0 {
            return Err(Errno::EFAULT);
        }
        // SAFETY: forwarded contract.
        unsafe { array(handle)?.put_nbi_raw(offset, source.cast(), len) };
        Ok(0)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ringfs_gmem_quiet() -> c_int {
    guard(-1, || world()?.quiet().map(|()| 0))
}

#[unsafe(no_mangle)]
pub extern "C" fn ringfs_gmem_fence() -> c_int {
    guard(-1, || world()?.fence().map(|()| 0))
}

#[unsafe(no_mangle)]
pub extern "C" fn ringfs_gmem_barrier() -> c_int {
    guard(-1, || world()?.barrier().map(|()| 0))
}

/// Reads `rows` rows of `row_bytes` bytes, `pitch` bytes apart in the array from `offset`,
/// into `destination` (rows `destination_pitch` bytes apart).
///
/// # Safety
/// `destination` must hold `(rows - 1) * destination_pitch + row_bytes` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_gmem_get_2d(
    destination: *mut c_void,
    destination_pitch: usize,
    handle: i64,
    offset: u64,
    pitch: u64,
    rows: u64,
    row_bytes: u64,
) -> c_int {
    guard(-1, || {
        let len = tile_len(rows, destination_pitch, row_bytes)?;
        // SAFETY: forwarded contract.
        let into = unsafe { bytes_mut(destination, len) }?;
        array(handle)?.get_2d(Tile { offset, pitch, rows, row_bytes }, into, destination_pitch).map(|()| 0)
    })
}

/// Writes a tile (the layout of `ringfs_gmem_get_2d`) from `source`.
///
/// # Safety
/// `source` must hold `(rows - 1) * source_pitch + row_bytes` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_gmem_put_2d(
    handle: i64,
    offset: u64,
    pitch: u64,
    rows: u64,
    row_bytes: u64,
    source: *const c_void,
    source_pitch: usize,
) -> c_int {
    guard(-1, || {
        let len = tile_len(rows, source_pitch, row_bytes)?;
        // SAFETY: forwarded contract.
        let from = unsafe { bytes(source, len) }?;
        array(handle)?.put_2d(Tile { offset, pitch, rows, row_bytes }, from, source_pitch).map(|()| 0)
    })
}

/// The bytes a local tile buffer spans.
fn tile_len(rows: u64, pitch: usize, row_bytes: u64) -> Result<usize, Errno> {
    if rows == 0 {
        return Ok(0);
    }
    let rows = usize::try_from(rows).map_err(|_| Errno::EINVAL)?;
    let row_bytes = usize::try_from(row_bytes).map_err(|_| Errno::EINVAL)?;
    pitch.checked_mul(rows - 1).and_then(|start| start.checked_add(row_bytes)).ok_or(Errno::EINVAL)
}

/// Atomic fetch-and-add of the 64-bit word at `offset`; the word before in `old` (may be
/// NULL).
///
/// # Safety
/// `old` must be NULL or point to a writable `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_gmem_fetch_add(handle: i64, offset: u64, value: u64, old: *mut u64) -> c_int {
    guard(-1, || {
        let before = array(handle)?.fetch_add(offset, value)?;
        // SAFETY: NULL or writable, by contract.
        if let Some(old) = unsafe { old.as_mut() } {
            *old = before;
        }
        Ok(0)
    })
}

/// Atomic compare-and-swap of the 64-bit word at `offset`: set to `desired` if it equals
/// `expected`; the word before in `old` (may be NULL).
///
/// # Safety
/// `old` must be NULL or point to a writable `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_gmem_compare_swap(handle: i64, offset: u64, expected: u64, desired: u64, old: *mut u64) -> c_int {
    guard(-1, || {
        let before = array(handle)?.compare_swap(offset, expected, desired)?;
        // SAFETY: NULL or writable, by contract.
        if let Some(old) = unsafe { old.as_mut() } {
            *old = before;
        }
        Ok(0)
    })
}
