//! The store's operations on one store: data, names, POSIX errors, capacity, restarts.

use ringfs_proto::{ChunkRef, ChunkTemplate, Create, Errno, FindFilter, TailSummary};

use crate::*;
use proptest::prelude::*;

const REGULAR: u32 = 0o100644;
const DIRECTORY: u32 = 0o040755;

fn memory_store() -> ChunkStore {
    ChunkStore::open(StoreConfig::memory()).unwrap()
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ringfs-store-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn chunk(path: &str, index: u64, file_id: u64) -> ChunkRef {
    ChunkRef { path: path.into(), index, file_id }
}

fn template(chunk_size: u32) -> ChunkTemplate {
    ChunkTemplate { mode: REGULAR, uid: 0, gid: 0, chunk_size, backend_len: 0 }
}

fn read_all(store: &ChunkStore, chunk: &ChunkRef) -> Vec<u8> {
    let mut bytes = Vec::new();
    store.read(chunk, 0, u64::MAX, &mut bytes, 0).unwrap();
    bytes
}

fn create_dir(store: &ChunkStore, path: &str) {
    store.create(&Create::new(path, DIRECTORY, 4096), 1).unwrap();
    let ticket = store.known_dir(path).unwrap_err();
    assert!(store.mark_known_dir(path, ticket));
}

#[test]
fn written_bytes_read_back_and_holes_read_as_zeros() {
    let store = memory_store();
    store.create(&Create::new("/f", REGULAR, 100), 5).unwrap();
    let head = chunk("/f", 0, 5);
    assert_eq!(store.write(&head, 10, &mut &b"abc"[..], template(100), 1).unwrap(), 13);
    assert_eq!(read_all(&store, &head), [&[0u8; 10][..], b"abc"].concat());
    assert_eq!(store.set_chunk_len(&head, 20, template(100), 2).unwrap().len, 20);
    assert_eq!(read_all(&store, &head).len(), 20);
    assert_eq!(store.set_chunk_len(&head, 11, template(100), 3).unwrap().len, 11);
    assert_eq!(read_all(&store, &head), [&[0u8; 10][..], b"a"].concat());
    // Writing past the chunk size is refused.
    assert_eq!(store.write(&head, 99, &mut &b"xy"[..], template(100), 4).unwrap_err().errno(), Errno::EINVAL);
}

#[test]
fn later_chunks_belong_to_one_file_id() {
    let store = memory_store();
    store.write(&chunk("/f", 3, 7), 0, &mut &b"new"[..], template(64), 1).unwrap();
    store.write(&chunk("/f", 3, 8), 0, &mut &b"other"[..], template(64), 1).unwrap();
    assert_eq!(read_all(&store, &chunk("/f", 3, 7)), b"new");
    assert_eq!(read_all(&store, &chunk("/f", 3, 8)), b"other");
    assert_eq!(store.read(&chunk("/f", 4, 7), 0, 10, &mut Vec::new(), 0).unwrap(), (None, 0));
    assert_eq!(store.tail_summary("/f", 7).last, Some((3, 3)));
    assert_eq!(store.remove_chunks("/f", 8, 1), 1);
    assert_eq!(store.tail_summary("/f", 8).last, None);
    assert_eq!(store.tail_summary("/f", 7), TailSummary { last: Some((3, 3)), newest_mtime_ns: 1 });
    assert_eq!(store.stats().chunks, 2, "the root directory and one chunk");
}

#[test]
fn a_stale_file_id_is_refused_on_chunk_zero() {
    let store = memory_store();
    store.create(&Create::new("/f", REGULAR, 64), 5).unwrap();
    let error = store.write(&chunk("/f", 0, 6), 0, &mut &b"x"[..], template(64), 1).unwrap_err();
    assert_eq!(error.errno(), Errno::ESTALE);
    store.unlink("/f", 0).unwrap();
    let error = store.write(&chunk("/f", 0, 5), 0, &mut &b"x"[..], template(64), 1).unwrap_err();
    assert_eq!(error.errno(), Errno::ESTALE);
    assert_eq!(store.stat(&chunk("/f", 0, 0)).unwrap_err().errno(), Errno::ENOENT);
}

#[test]
fn creates_follow_posix_rules() {
    let store = memory_store();
    let entry = Create::new("/d/f", REGULAR, 64);
    assert!(matches!(store.create(&entry, 1), Err(StoreError::ParentUnknown(parent)) if parent == "/d"));
    create_dir(&store, "/d");
    assert!(store.create(&entry, 1).unwrap().created);
    assert_eq!(store.create(&entry, 1).unwrap_err().errno(), Errno::EEXIST);
    let open = Create { exclusive: false, ..entry.clone() };
    assert!(!store.create(&open, 1).unwrap().created);
    let mkdir_over_file = Create::new("/d/f", DIRECTORY, 64);
    assert_eq!(store.create(&mkdir_over_file, 2).unwrap_err().errno(), Errno::EEXIST);
    let open_dir = Create { exclusive: false, ..Create::new("/d", REGULAR, 64) };
    assert_eq!(store.create(&open_dir, 3).unwrap_err().errno(), Errno::EISDIR);
    assert_eq!(store.unlink("/d", 0).unwrap_err().errno(), Errno::EISDIR);
}

#[test]
fn truncating_open_empties_the_file_and_reports_extension() {
    let store = memory_store();
    store.create(&Create::new("/f", REGULAR, 64), 1).unwrap();
    store.write(&chunk("/f", 0, 1), 0, &mut &[1u8; 64][..], template(64), 1).unwrap();
    store.mark_extended("/f", 1).unwrap();
    let reopen = Create { exclusive: false, truncate: true, ..Create::new("/f", REGULAR, 64) };
    let outcome = store.create(&reopen, 2).unwrap();
    assert!(outcome.truncated_extended);
    // The mark stays: open files may have cached it (see `truncate_head`).
    assert_eq!((outcome.attr.len, outcome.attr.file_id, outcome.attr.is_extended()), (0, 1, true));
}

#[test]
fn rmdir_preparation_invalidates_known_directories() {
    let store = memory_store();
    create_dir(&store, "/d");
    assert_eq!(store.known_dir("/d"), Ok(()));
    store.create(&Create::new("/d/f", REGULAR, 64), 1).unwrap();
    assert!(store.prepare_rmdir("/d").0);
    // A lookup that started before the invalidation cannot record a stale answer.
    let stale_ticket = store.known_dir("/d").unwrap_err() - 1;
    assert!(!store.mark_known_dir("/d", stale_ticket));
    assert!(matches!(store.create(&Create::new("/d/g", REGULAR, 64), 2), Err(StoreError::ParentUnknown(_))));
    store.unlink("/d/f", 0).unwrap();
    assert!(!store.prepare_rmdir("/d").0);
    store.begin_rmdir("/d").unwrap();
    assert_eq!(store.lookup_dir("/d").unwrap_err().errno(), Errno::ENOENT);
    store.finish_rmdir("/d", true).unwrap();
    assert_eq!(store.stat(&chunk("/d", 0, 0)).unwrap_err().errno(), Errno::ENOENT);
    assert_eq!(store.stats().entries, 0);
    assert_eq!(store.lookup_dir("/").unwrap().file_id, ROOT_FILE_ID);
}

#[test]
fn read_dir_pages_through_entries_in_name_order() {
    let store = memory_store();
    for i in 0..25 {
        store.create(&Create::new(&format!("/f{i:02}"), REGULAR, 64), i + 1).unwrap();
    }
    let mut names = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.read_dir("/", after.as_deref(), 10);
        names.extend(page.entries.iter().map(|entry| entry.name.clone()));
        after = names.last().cloned();
        if !page.more {
            break;
        }
    }
    assert_eq!(names, (0..25).map(|i| format!("f{i:02}")).collect::<Vec<_>>());
    assert!(store.read_dir("/missing", None, 10).entries.is_empty());
}

#[test]
fn capacity_limit_gives_enospc_and_frees_on_unlink() {
    let store = ChunkStore::open(StoreConfig { capacity_bytes: 10_000, ..StoreConfig::memory() }).unwrap();
    let baseline = store.stats().used_bytes;
    store.create(&Create::new("/f", REGULAR, 1 << 20), 1).unwrap();
    let error = store.write(&chunk("/f", 0, 1), 0, &mut &vec![0u8; 20_000][..], template(1 << 20), 1).unwrap_err();
    assert_eq!(error.errno(), Errno::ENOSPC);
    store.write(&chunk("/f", 0, 1), 0, &mut &vec![0u8; 5_000][..], template(1 << 20), 1).unwrap();
    let used = store.stats().used_bytes;
    assert!(used >= 5_000);
    store.unlink("/f", 0).unwrap();
    assert_eq!(store.stats().used_bytes, baseline);
}

#[test]
fn rename_steps_move_chunks_and_replace_the_target() {
    let store = memory_store();
    store.create(&Create::new("/a", REGULAR, 8), 1).unwrap();
    store.create(&Create::new("/b", REGULAR, 8), 2).unwrap();
    store.write(&chunk("/a", 0, 1), 0, &mut &b"12345678"[..], template(8), 1).unwrap();
    store.write(&chunk("/a", 1, 1), 0, &mut &b"9"[..], template(8), 1).unwrap();
    assert_eq!(store.tail_indices("/a", 1), [1]);
    let moved = store.copy_chunk(&chunk("/a", 1, 1)).unwrap();
    store.put_chunk(&chunk("/b", 1, 1), moved.attr, &moved.bytes).unwrap();
    let head = store.copy_chunk(&chunk("/a", 0, 0)).unwrap();
    let replaced = store.install_entry("/b", head.attr, &head.bytes).unwrap();
    assert_eq!(replaced.map(|attr| attr.file_id), Some(2));
    store.unlink("/a", 1).unwrap();
    assert_eq!(read_all(&store, &chunk("/b", 0, 1)), b"12345678");
    assert_eq!(read_all(&store, &chunk("/b", 1, 1)), b"9");
    assert_eq!(store.stats().entries, 1);
}

#[test]
fn shared_reads_are_not_changed_by_later_writes() {
    let store = memory_store();
    let target = chunk("/s", 1, 3);
    store.write(&target, 0, &mut &b"before"[..], template(64), 1).unwrap();
    store.set_chunk_len(&target, 10, template(64), 1).unwrap();
    let shared = store.read_shared(&target, 2, 100, 0).unwrap();
    assert_eq!(shared.len, 8);
    let (bytes, range) = shared.bytes.unwrap();
    store.write(&target, 0, &mut &b"AFTER!"[..], template(64), 2).unwrap();
    assert_eq!(&bytes[range], b"fore");
    assert_eq!(read_all(&store, &target), b"AFTER!\0\0\0\0");
    assert!(store.read_shared(&chunk("/s", 2, 3), 0, 1, 0).unwrap().attr.is_none());
}

#[test]
fn find_counts_entries_below_a_root_and_defers_spread_files() {
    let store = memory_store();
    create_dir(&store, "/d");
    for (index, time) in [(1, 10), (2, 30), (10, 30)] {
        let entry = Create { time_ns: time, ..Create::new(&format!("/d/f{index:02}"), REGULAR, 64) };
        store.create(&entry, index).unwrap();
        store.write(&chunk(&format!("/d/f{index:02}"), 0, index), 0, &mut &[7u8; 5][..], template(64), time).unwrap();
    }
    store.mark_extended("/d/f10", 10).unwrap();
    store.create(&Create::new("/elsewhere", REGULAR, 64), 99).unwrap();
    let filter = FindFilter { newer_than_ns: Some(20), size: Some(5), name: Some("*0*".into()) };
    let found = store.find("/d", &filter);
    assert_eq!((found.scanned, found.matched), (3, 1), "f02 matches; f01 is too old");
    assert_eq!(found.undecided, ["/d/f10"]);
    assert_eq!(store.find("/", &FindFilter::default()).scanned, 5);
}

#[test]
fn directory_store_survives_reopening() {
    let root = temp_dir("reopen");
    let config = StoreConfig { medium: Medium::Directory(root.clone()), capacity_bytes: 0, cache: None };
    {
        let store = ChunkStore::open(config.clone()).unwrap();
        create_dir(&store, "/d");
        store.create(&Create::new("/d/f", REGULAR, 16), 9).unwrap();
        store.write(&chunk("/d/f", 0, 9), 0, &mut &b"0123456789abcdef"[..], template(16), 1).unwrap();
        store.write(&chunk("/d/f", 2, 9), 4, &mut &b"xyz"[..], template(16), 2).unwrap();
        store.mark_extended("/d/f", 9).unwrap();
        store.create(&Create { link_target: Some("/d/f".into()), ..Create::new("/d/l", 0o120777, 16) }, 3).unwrap();
        store.create(&Create::new("/gone", REGULAR, 16), 4).unwrap();
        store.unlink("/gone", 0).unwrap();
    }
    let store = ChunkStore::open(config).unwrap();
    assert_eq!(read_all(&store, &chunk("/d/f", 0, 9)), b"0123456789abcdef");
    assert_eq!(read_all(&store, &chunk("/d/f", 2, 9)), b"\0\0\0\0xyz");
    assert!(store.stat(&chunk("/d/f", 0, 0)).unwrap().is_extended());
    assert_eq!(read_all(&store, &chunk("/d/l", 0, 0)), b"/d/f");
    let names: Vec<String> = store.read_dir("/d", None, 100).entries.into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["f", "l"]);
    assert_eq!(store.stat(&chunk("/gone", 0, 0)).unwrap_err().errno(), Errno::ENOENT);
    assert_eq!(store.stats().entries, 3);
    assert!(store.stat(&chunk("/", 0, 0)).unwrap().is_dir());
    std::fs::remove_dir_all(root).unwrap();
}

proptest! {
    /// Random writes and length changes on one chunk, checked against a plain vector.
    #[test]
    fn chunk_matches_reference_model(
        operations in proptest::collection::vec((0u64..300, proptest::collection::vec(any::<u8>(), 0..80), any::<bool>()), 1..40),
        use_directory in any::<bool>(),
    ) {
        let root = temp_dir("model");
        let medium = if use_directory { Medium::Directory(root.clone()) } else { Medium::Memory };
        let store = ChunkStore::open(StoreConfig { medium, capacity_bytes: 0, cache: None }).unwrap();
        let target = chunk("/m", 1, 42);
        let mut model: Vec<u8> = Vec::new();
        for (offset, bytes, shrink) in operations {
            if shrink {
                let len = offset.min(model.len() as u64);
                store.set_chunk_len(&target, len, template(400), 1).unwrap();
                model.truncate(len as usize);
            } else {
                store.write(&target, offset, &mut &bytes[..], template(400), 1).unwrap();
                let end = offset as usize + bytes.len();
                if model.len() < end && !bytes.is_empty() {
                    model.resize(end, 0);
                }
                if model.len() < offset as usize {
                    model.resize(offset as usize, 0);
                }
                model[offset as usize..end].copy_from_slice(&bytes);
            }
            prop_assert_eq!(read_all(&store, &target), model.clone());
        }
        let _ = std::fs::remove_dir_all(root);
    }
}
