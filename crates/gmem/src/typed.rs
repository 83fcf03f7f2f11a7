//! A typed view of a global array: elements of a plain-data type, addressed by index.

use std::marker::PhantomData;

use ringfs_proto::Errno;
use ringfs_proto::gmem::Distribution;

use crate::Result;
use crate::array::{GlobalArray, Tile};
use crate::world::World;

/// Types whose values are plain bytes: no padding, no pointers, every bit pattern a valid
/// value, so they can be copied to and from global memory byte for byte.
///
/// # Safety
/// Implement it only for types with those properties (`#[repr(C)]` structs of such fields
/// without padding qualify).
pub unsafe trait Plain: Copy + Send + Sync + 'static {}

macro_rules! plain {
    ($($type:ty),*) => {$(
        // SAFETY: primitive numbers: no padding, every bit pattern valid.
        unsafe impl Plain for $type {}
    )*};
}

plain!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128, f32, f64);

/// Global memory as an array of `T` (see [`GlobalArray`] for the bytes underneath).
#[derive(Clone)]
pub struct GlobalArrayOf<T: Plain> {
    bytes: GlobalArray,
    _element: PhantomData<T>,
}

fn as_bytes<T: Plain>(values: &[T]) -> &[u8] {
    // SAFETY: `T: Plain` has no padding; the bytes of a slice of it are initialized.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
}

fn as_bytes_mut<T: Plain>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: `T: Plain`: any bytes written make valid values.
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast(), std::mem::size_of_val(values)) }
}

impl<T: Plain> GlobalArrayOf<T> {
    const SIZE: u64 = std::mem::size_of::<T>() as u64;

    /// Allocates `len` elements collectively (see [`World::alloc`]).
    pub fn alloc(world: &World, len: u64, distribution: Distribution, block_size: u32) -> Result<GlobalArrayOf<T>> {
        let bytes = len.checked_mul(Self::SIZE).ok_or(Errno::EINVAL)?;
        Ok(GlobalArrayOf { bytes: world.alloc(bytes, distribution, block_size)?, _element: PhantomData })
    }

    /// The bytes underneath.
    pub fn bytes(&self) -> &GlobalArray {
        &self.bytes
    }

    pub fn len(&self) -> u64 {
        self.bytes.len() / Self::SIZE
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads `into.len()` elements from index `first`.
    pub fn get(&self, first: u64, into: &mut [T]) -> Result<()> {
        self.bytes.get(first.checked_mul(Self::SIZE).ok_or(Errno::EFAULT)?, as_bytes_mut(into))
    }

    /// Writes `from` at index `first`.
    pub fn put(&self, first: u64, from: &[T]) -> Result<()> {
        self.bytes.put(first.checked_mul(Self::SIZE).ok_or(Errno::EFAULT)?, as_bytes(from))
    }

    /// Reads the tile of `rows` × `columns` elements at (`row`, `column`) of the array seen
    /// as rows of `row_len` elements, into `into` (rows `columns` apart).
    pub fn get_tile(&self, row_len: u64, (row, column): (u64, u64), (rows, columns): (u64, u64), into: &mut [T]) -> Result<()> {
        let tile = self.tile(row_len, row, column, rows, columns)?;
        self.bytes.get_2d(tile, as_bytes_mut(into), (columns * Self::SIZE) as usize)
    }

    /// Writes a tile (the layout of [`GlobalArrayOf::get_tile`]) from `from`.
    pub fn put_tile(&self, row_len: u64, (row, column): (u64, u64), (rows, columns): (u64, u64), from: &[T]) -> Result<()> {
        let tile = self.tile(row_len, row, column, rows, columns)?;
        self.bytes.put_2d(tile, as_bytes(from), (columns * Self::SIZE) as usize)
    }

    fn tile(&self, row_len: u64, row: u64, column: u64, rows: u64, columns: u64) -> Result<Tile> {
        if column.checked_add(columns).is_none_or(|end| end > row_len) {
            return Err(Errno::EFAULT);
        }
        let first = row.checked_mul(row_len).and_then(|at| at.checked_add(column)).ok_or(Errno::EFAULT)?;
        Ok(Tile { offset: first * Self::SIZE, pitch: row_len * Self::SIZE, rows, row_bytes: columns * Self::SIZE })
    }
}
