//! The bytes IO500 phases write, and their verification on read.
//!
//! Every writer uses one of 64 fixed 4 KiB templates (chosen by its id). The byte at file
//! offset `o` is the template's byte `o % 4096`, except the first 8 bytes of every 4 KiB page,
//! which hold `o ^ seed(writer)` (little-endian). Generating a buffer is a copy plus a stamp
//! per page, so the benchmark spends its time on I/O, yet every byte of a read is checked: a
//! byte from the wrong place, the wrong writer or a stale file does not match.

use std::sync::OnceLock;

const PAGE: u64 = 4096;
const TEMPLATES: usize = 64;

fn seed_of(writer: u64) -> u64 {
    writer.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03
}

/// The 64 templates, drawn once per process.
fn templates() -> &'static [[u8; PAGE as usize]] {
    static TEMPLATE_PAGES: OnceLock<Vec<[u8; PAGE as usize]>> = OnceLock::new();
    TEMPLATE_PAGES.get_or_init(|| {
        (0..TEMPLATES as u64)
            .map(|number| {
                let mut state = seed_of(number) | 1;
                let mut template = [0u8; PAGE as usize];
                for word in template.chunks_mut(8) {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    word.copy_from_slice(&state.to_le_bytes());
                }
                template
            })
            .collect()
    })
}

thread_local! {
    static EXPECTED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Fills `buffer` with what `writer` writes at file offset `offset`.
pub fn fill(buffer: &mut [u8], writer: u64, offset: u64) {
    let seed = seed_of(writer);
    let template = &templates()[(seed >> 58) as usize % TEMPLATES];
    let end = offset + buffer.len() as u64;
    let mut page_start = offset - offset % PAGE;
    while page_start < end {
        let from = page_start.max(offset);
        let to = (page_start + PAGE).min(end);
        buffer[(from - offset) as usize..(to - offset) as usize]
            .copy_from_slice(&template[(from - page_start) as usize..(to - page_start) as usize]);
        let stamp = (page_start ^ seed).to_le_bytes();
        for (position, byte) in (page_start..page_start + 8).zip(stamp) {
            if position >= from && position < to {
                buffer[(position - offset) as usize] = byte;
            }
        }
        page_start += PAGE;
    }
}

/// Checks that `buffer` holds what `writer` wrote at `offset`; the error names the first
/// wrong byte.
pub fn verify(buffer: &[u8], writer: u64, offset: u64) -> Result<(), String> {
    EXPECTED.with(|expected| {
        let mut expected = expected.borrow_mut();
        expected.resize(buffer.len(), 0);
        fill(&mut expected, writer, offset);
        if *expected == buffer {
            return Ok(());
        }
        let wrong = buffer.iter().zip(expected.iter()).position(|(got, want)| got != want).unwrap_or(0);
        Err(format!("data mismatch at file offset {} (writer {writer})", offset + wrong as u64))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_split_of_a_range_fills_the_same_bytes() {
        let mut whole = vec![0u8; 20_000];
        fill(&mut whole, 7, 1_000);
        let mut parts = vec![0u8; 20_000];
        let (first, second) = parts.split_at_mut(4_567);
        fill(first, 7, 1_000);
        fill(second, 7, 1_000 + 4_567);
        assert_eq!(whole, parts);
        verify(&whole, 7, 1_000).unwrap();
    }

    #[test]
    fn wrong_writer_offset_or_byte_is_detected() {
        let mut block = vec![0u8; 47_008];
        fill(&mut block, 3, 47_008 * 5);
        assert!(verify(&block, 3, 47_008 * 5).is_ok());
        assert!(verify(&block, 4, 47_008 * 5).is_err());
        assert!(verify(&block, 3, 47_008 * 6).is_err());
        block[30_000] ^= 1;
        let error = verify(&block, 3, 47_008 * 5).unwrap_err();
        assert!(error.contains(&format!("{}", 47_008 * 5 + 30_000)), "{error}");
    }
}
