//! Cutting a byte range of a file into per-chunk pieces.

use ringfs_proto::ChunkIndex;

/// The part of one chunk that a read or write touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub index: ChunkIndex,
    /// Offset inside the chunk.
    pub offset_in_chunk: u64,
    pub len: usize,
    /// Offset of this piece inside the caller's buffer.
    pub buffer_offset: usize,
}

/// The pieces of `len` bytes starting at file offset `offset`, in file order.
pub fn pieces(offset: u64, len: usize, chunk_size: u64) -> impl Iterator<Item = Piece> {
    debug_assert!(chunk_size > 0);
    let mut buffer_offset = 0usize;
    std::iter::from_fn(move || {
        if buffer_offset >= len {
            return None;
        }
        let position = offset + buffer_offset as u64;
        let offset_in_chunk = position % chunk_size;
        let piece_len = ((chunk_size - offset_in_chunk) as usize).min(len - buffer_offset);
        let piece = Piece { index: ChunkIndex::of_offset(position, chunk_size), offset_in_chunk, len: piece_len, buffer_offset };
        buffer_offset += piece_len;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_range_across_three_chunks() {
        let all: Vec<Piece> = pieces(90, 120, 100).collect();
        assert_eq!(
            all,
            [
                Piece { index: ChunkIndex(0), offset_in_chunk: 90, len: 10, buffer_offset: 0 },
                Piece { index: ChunkIndex(1), offset_in_chunk: 0, len: 100, buffer_offset: 10 },
                Piece { index: ChunkIndex(2), offset_in_chunk: 0, len: 10, buffer_offset: 110 },
            ]
        );
        assert_eq!(pieces(5, 0, 100).count(), 0);
    }

    proptest! {
        #[test]
        fn pieces_tile_the_range_inside_single_chunks(offset in 0u64..1_000_000, len in 0usize..100_000, chunk_size in 1u64..70_000) {
            let mut expected_buffer_offset = 0;
            for piece in pieces(offset, len, chunk_size) {
                prop_assert_eq!(piece.buffer_offset, expected_buffer_offset);
                prop_assert!(piece.len > 0);
                prop_assert!(piece.offset_in_chunk + piece.len as u64 <= chunk_size);
                prop_assert_eq!(piece.index.first_byte(chunk_size) + piece.offset_in_chunk, offset + piece.buffer_offset as u64);
                expected_buffer_offset += piece.len;
            }
            prop_assert_eq!(expected_buffer_offset, len);
        }
    }
}
