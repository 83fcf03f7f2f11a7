//! Where an array's blocks live: each block's home, by the array's distribution. Every rank
//! computes it alike, as the file client computes chunks' servers; no directory is asked.

use ringfs_proto::gmem::{ArrayLayout, Distribution};

/// What an array's blocks are placed by (kept with the array).
pub(crate) fn home_index(layout: &ArrayLayout, block: u64) -> usize {
    let homes = layout.homes.len().max(1) as u64;
    let index = match layout.distribution {
        Distribution::Block => {
            let blocks = layout.len.div_ceil(u64::from(layout.block_size)).max(1);
            block / blocks.div_ceil(homes)
        }
        Distribution::Cyclic(run) => (block / u64::from(run.max(1))) % homes,
        Distribution::Hashed => {
            let mut key = [0u8; 16];
            key[..8].copy_from_slice(&layout.array.to_le_bytes());
            key[8..].copy_from_slice(&block.to_le_bytes());
            xxhash_rust::xxh3::xxh3_64(&key) % homes
        }
    };
    index.min(homes - 1) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringfs_proto::gmem::CacheMode;

    fn layout(len: u64, distribution: Distribution, homes: usize) -> ArrayLayout {
        ArrayLayout {
            array: 7,
            len,
            block_size: 4096,
            distribution,
            homes: (0..homes).map(|home| format!("s{home}")).collect(),
            cache: CacheMode::Uncached,
            nodes: Vec::new(),
        }
    }

    #[test]
    fn blocks_go_to_their_homes_by_distribution() {
        // 10 blocks over 4 ranks: parts of 3, 3, 3 and 1 blocks.
        let block = layout(10 * 4096, Distribution::Block, 4);
        let homes: Vec<usize> = (0..10).map(|index| home_index(&block, index)).collect();
        assert_eq!(homes, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]);
        let cyclic = layout(10 * 4096, Distribution::Cyclic(2), 3);
        let homes: Vec<usize> = (0..10).map(|index| home_index(&cyclic, index)).collect();
        assert_eq!(homes, [0, 0, 1, 1, 2, 2, 0, 0, 1, 1]);
        let hashed = layout(1000 * 4096, Distribution::Hashed, 4);
        let mut counts = [0; 4];
        for index in 0..1000 {
            counts[home_index(&hashed, index)] += 1;
        }
        assert!(counts.iter().all(|count| *count > 150), "{counts:?}");
    }
}
