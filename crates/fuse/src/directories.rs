//! Open directories of the mount and where each listing stands.
//!
//! Every `READDIRPLUS` (and `READDIR`) is answered with a page the servers give while the
//! kernel waits for it ([`ringfs_client::Client::list_page`]), never with a listing taken
//! earlier: the kernel takes the attributes and names of a reply as at least as new as its
//! request (it ignores a reply's attributes only for inodes it changed while the request was
//! under way, and it holds the directory's lock, so no name in it changes through this mount
//! meanwhile). A listing taken at `opendir` and served later gave the kernel sizes older
//! than writes it had made since (a file written and renamed became empty to it).
//!
//! The kernel continues a listing after the cookie (`offset`) of the last entry it took. A
//! cookie here names that entry: cookie `i + 1` is the `i`-th name given out through the
//! handle, so the next page starts after that name, whatever was created or removed since.

use parking_lot::Mutex;
use std::collections::HashMap;

use ringfs_client::Directory;

/// Entries a handle's first page asks for; later pages ask for as many as the kernel took
/// from the last full reply, or twice as many as last time after a reply that was not full.
const FIRST_PAGE_ENTRIES: usize = 256;
const MOST_PAGE_ENTRIES: usize = 8192;

/// Where the next page of a listing starts.
#[derive(Debug, PartialEq, Eq)]
pub struct Resume {
    /// The dot entries still to give (2: "." and "..", 1: "..", 0: none).
    pub dots: usize,
    /// The page starts after this name (`None`: at the first name).
    pub after: Option<String>,
    /// How many entries to ask the servers for.
    pub wanted: usize,
}

/// One open directory.
struct OpenDirectory {
    directory: Directory,
    /// Inode numbers of "." and "..".
    dots: [u64; 2],
    /// The names given out, by cookie - 1 ("." and ".." first).
    names: Vec<String>,
    wanted: usize,
}

/// The open directories, by handle.
#[derive(Default)]
pub struct OpenDirectories {
    open: Mutex<HashMap<u64, OpenDirectory>>,
    next_handle: std::sync::atomic::AtomicU64,
}

impl OpenDirectories {
    fn open(&self) -> parking_lot::MutexGuard<'_, HashMap<u64, OpenDirectory>> {
        self.open.lock()
    }

    /// Registers an opened directory; its handle. `dots` are the inode numbers of the
    /// directory and of its parent.
    pub fn insert(&self, directory: Directory, dots: [u64; 2]) -> u64 {
        let handle = self.next_handle.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let names = vec![".".to_string(), "..".to_string()];
        self.open().insert(handle, OpenDirectory { directory, dots, names, wanted: FIRST_PAGE_ENTRIES });
        handle
    }

    pub fn remove(&self, handle: u64) {
        self.open().remove(&handle);
    }

    /// The directory of `handle` and where a listing continuing after cookie `offset`
    /// starts; `None` for an unknown handle. A cookie never given out starts nothing.
    pub fn resume(&self, handle: u64, offset: u64) -> Option<(Directory, Option<Resume>)> {
        let open = self.open();
        let listing = open.get(&handle)?;
        let offset = usize::try_from(offset).unwrap_or(usize::MAX);
        let resume = (offset <= listing.names.len()).then(|| Resume {
            dots: 2usize.saturating_sub(offset),
            after: (offset > 2).then(|| listing.names[offset - 1].clone()),
            wanted: listing.wanted,
        });
        Some((listing.directory.clone(), resume))
    }

    /// Gives entries to the kernel through `add` (a name, its cookie, and what it is; `true`
    /// when the reply is full and the entry was not taken): first the dot entries `resume`
    /// asks for, then the `entries` of a page (named by `name_of`). Records the names taken
    /// and sizes the next page by what the reply took. `false` if the handle went meanwhile.
    pub fn give<E>(
        &self,
        handle: u64,
        resume: &Resume,
        entries: &[E],
        name_of: impl Fn(&E) -> &str,
        page_has_more: bool,
        mut add: impl FnMut(&str, u64, Listed<'_, E>) -> bool,
    ) -> bool {
        let mut open = self.open();
        let Some(listing) = open.get_mut(&handle) else { return false };
        for dot in 2 - resume.dots..2 {
            if add(&listing.names[dot], dot as u64 + 1, Listed::Dot(listing.dots[dot])) {
                return true;
            }
        }
        for (taken, entry) in entries.iter().enumerate() {
            let name = name_of(entry);
            if add(name, listing.names.len() as u64 + 1, Listed::Entry(entry)) {
                listing.wanted = taken.max(16);
                return true;
            }
            listing.names.push(name.to_string());
        }
        if page_has_more {
            listing.wanted = (resume.wanted * 2).min(MOST_PAGE_ENTRIES);
        }
        true
    }
}

/// What a listed name is.
pub enum Listed<'a, E> {
    /// "." or "..", with its inode number.
    Dot(u64),
    Entry(&'a E),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn directory() -> Directory {
        Directory { path: "/d".into(), stat: ringfs_client::Stat::default() }
    }

    #[test]
    fn a_listing_continues_after_the_name_of_the_last_cookie_the_kernel_took() {
        let directories = OpenDirectories::default();
        let handle = directories.insert(directory(), [5, 1]);
        let (_, resume) = directories.resume(handle, 0).unwrap();
        let resume = resume.unwrap();
        assert_eq!((resume.dots, resume.after.as_deref(), resume.wanted), (2, None, FIRST_PAGE_ENTRIES));
        // The reply takes ".", "..", "a" and "b"; "c" does not fit.
        let mut given = Vec::new();
        directories.give(
            handle,
            &resume,
            &["a", "b", "c"],
            |name| name,
            true,
            |name, cookie, listed| {
                if name == "c" {
                    return true;
                }
                let ino = match listed {
                    Listed::Dot(ino) => Some(ino),
                    Listed::Entry(_) => None,
                };
                given.push((name.to_string(), cookie, ino));
                false
            },
        );
        let expected = [(".", 1, Some(5)), ("..", 2, Some(1)), ("a", 3, None), ("b", 4, None)];
        assert_eq!(given, expected.map(|(name, cookie, ino)| (name.to_string(), cookie, ino)));
        let (_, resume) = directories.resume(handle, 4).unwrap();
        let resume = resume.unwrap();
        assert_eq!((resume.dots, resume.after.as_deref()), (0, Some("b")));
        assert_eq!(resume.wanted, 16, "the next page asks for what the kernel took, at least 16");
        let (_, resume) = directories.resume(handle, 1).unwrap();
        assert_eq!(resume.map(|resume| (resume.dots, resume.after)), Some((1, None)));
        assert_eq!(directories.resume(handle, 5).unwrap().1, None, "cookie 5 was never given");
        directories.remove(handle);
        assert!(directories.resume(handle, 0).is_none());
    }

    #[test]
    fn a_reply_that_took_the_whole_page_doubles_the_next_page() {
        let directories = OpenDirectories::default();
        let handle = directories.insert(directory(), [5, 1]);
        let resume = directories.resume(handle, 0).unwrap().1.unwrap();
        directories.give(handle, &resume, &["a"], |name| name, true, |_, _, _| false);
        assert_eq!(directories.resume(handle, 3).unwrap().1.unwrap().wanted, 2 * FIRST_PAGE_ENTRIES);
    }
}
