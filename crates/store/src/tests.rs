//! The store's operations on one store: data, names, links, open files, POSIX errors,
//! capacity, restarts.

use ringfs_proto::{ChunkIndex, ChunkKey, ChunkTemplate, Create, EntryRef, Errno, FileId, FileKind, FindFilter, InstallMode, TailSummary};

use crate::*;

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

fn file(serial: u64) -> FileId {
    FileId { anchor: 7, serial }
}

fn chunk(serial: u64, index: u64) -> ChunkKey {
    ChunkKey::new(file(serial), ChunkIndex(index))
}

fn template(chunk_size: u32) -> ChunkTemplate {
    ChunkTemplate { mode: REGULAR, uid: 0, gid: 0, chunk_size, backend_len: 0 }
}

fn read_all(store: &ChunkStore, key: ChunkKey) -> Vec<u8> {
    let mut bytes = Vec::new();
    store.read(key, 0, u64::MAX, &mut bytes, None).unwrap();
    bytes
}

fn create(store: &ChunkStore, path: &str, mode: u32, serial: u64) -> EntryRef {
    store.create(&Create::new(path, mode, 4096), file(serial)).unwrap().entry
}

fn create_dir(store: &ChunkStore, path: &str, serial: u64) {
    create(store, path, DIRECTORY, serial);
    let ticket = store.known_dir(path).unwrap_err();
    assert!(store.mark_known_dir(path, ticket));
}

#[test]
fn written_bytes_read_back_and_holes_read_as_zeros() {
    let store = memory_store();
    store.create(&Create::new("/f", REGULAR, 100), file(5)).unwrap();
    let head = chunk(5, 0);
    assert_eq!(store.write(head, 10, &mut &b"abc"[..], template(100), 1, None).unwrap(), 13);
    assert_eq!(read_all(&store, head), [&[0u8; 10][..], b"abc"].concat());
    assert_eq!(store.set_chunk_len(head, 20, template(100), 2, None, None).unwrap().len, 20);
    assert_eq!(read_all(&store, head).len(), 20);
    assert_eq!(store.set_chunk_len(head, 11, template(100), 3, None, None).unwrap().len, 11);
    assert_eq!(read_all(&store, head), [&[0u8; 10][..], b"a"].concat());
    // Writing past the chunk size is refused.
    assert_eq!(store.write(head, 99, &mut &b"xy"[..], template(100), 4, None).unwrap_err().errno(), Errno::EINVAL);
}

#[test]
fn later_chunks_belong_to_their_file() {
    let store = memory_store();
    store.write(chunk(7, 3), 0, &mut &b"new"[..], template(64), 1, None).unwrap();
    store.write(chunk(8, 3), 0, &mut &b"other"[..], template(64), 1, None).unwrap();
    assert_eq!(read_all(&store, chunk(7, 3)), b"new");
    assert_eq!(read_all(&store, chunk(8, 3)), b"other");
    assert_eq!(store.read(chunk(7, 4), 0, 10, &mut Vec::new(), None).unwrap(), (None, 0));
    assert_eq!(store.tail_summary(file(7)).last, Some((ChunkIndex(3), 3)));
    assert_eq!(store.remove_chunks(file(8), ChunkIndex(1), None), 1);
    assert_eq!(store.tail_summary(file(8)).last, None);
    assert_eq!(store.tail_summary(file(7)), TailSummary { last: Some((ChunkIndex(3), 3)), newest_mtime_ns: 1 });
    assert_eq!(store.stats().chunks, 2, "the root directory and one chunk");
}

#[test]
fn a_file_gone_is_stale_for_holders_of_its_id() {
    let store = memory_store();
    create(&store, "/f", REGULAR, 5);
    let gone = store.unlink("/f", 0, None).unwrap();
    assert_eq!(gone.file, file(5));
    assert!(store.drop_link(file(5), 1).unwrap().is_some(), "no name, no open: the file goes");
    let error = store.write(chunk(5, 0), 0, &mut &b"x"[..], template(64), 1, None).unwrap_err();
    assert_eq!(error.errno(), Errno::ESTALE);
    assert_eq!(store.stat(file(5)).unwrap_err().errno(), Errno::ESTALE);
    assert_eq!(store.lookup("/f", 0, false).unwrap_err().errno(), Errno::ENOENT);
}

#[test]
fn creates_follow_posix_rules() {
    let store = memory_store();
    let entry = Create::new("/d/f", REGULAR, 64);
    assert!(matches!(store.create(&entry, file(1)), Err(StoreError::ParentUnknown(parent)) if parent == "/d"));
    create_dir(&store, "/d", 2);
    assert!(store.create(&entry, file(1)).unwrap().created);
    assert_eq!(store.create(&entry, file(3)).unwrap_err().errno(), Errno::EEXIST);
    let open = Create { exclusive: false, ..entry.clone() };
    let opened = store.create(&open, file(4)).unwrap();
    assert!(!opened.created);
    assert_eq!(opened.entry.file, file(1), "an open finds the existing file");
    assert_eq!(store.create(&Create::new("/d/f", DIRECTORY, 64), file(5)).unwrap_err().errno(), Errno::EEXIST);
    let open_dir = Create { exclusive: false, ..Create::new("/d", REGULAR, 64) };
    assert_eq!(store.create(&open_dir, file(6)).unwrap_err().errno(), Errno::EISDIR);
    assert_eq!(store.unlink("/d", 0, None).unwrap_err().errno(), Errno::EISDIR);
    // Special files are names with an inode and no bytes.
    let fifo = store.create(&Create::new("/fifo", FileKind::Fifo.mode_bits() | 0o600, 64), file(7)).unwrap();
    assert_eq!(fifo.entry.kind(), Some(FileKind::Fifo));
    let device = Create { rdev: 0x0803, ..Create::new("/sda3", FileKind::BlockDevice.mode_bits() | 0o600, 64) };
    assert_eq!(store.create(&device, file(8)).unwrap().attr.unwrap().rdev, 0x0803);
    assert_eq!(store.write(chunk(7, 0), 0, &mut &b"x"[..], template(64), 1, None).unwrap_err().errno(), Errno::EINVAL);
}

#[test]
fn truncating_open_empties_the_file_and_keeps_the_extension_mark() {
    let store = memory_store();
    store.create(&Create::new("/f", REGULAR, 64), file(1)).unwrap();
    store.write(chunk(1, 0), 0, &mut &[1u8; 64][..], template(64), 1, None).unwrap();
    store.mark_extended(file(1), ChunkIndex(4)).unwrap();
    let reopen = Create { exclusive: false, truncate: true, ..Create::new("/f", REGULAR, 64) };
    let outcome = store.create(&reopen, file(2)).unwrap();
    assert!(outcome.truncated);
    // The mark stays: open files may have cached it (see `truncate_head`).
    let attr = outcome.attr.unwrap();
    assert_eq!((attr.len, attr.file_id, attr.last_chunk), (0, file(1), ChunkIndex(4)));
}

#[test]
fn the_bound_on_a_files_chunks_only_rises() {
    let store = memory_store();
    store.create(&Create::new("/f", REGULAR, 64), file(1)).unwrap();
    assert_eq!(store.stat(file(1)).unwrap().last_chunk, ChunkIndex::FIRST, "a new file is chunk 0 alone");
    assert_eq!(store.mark_extended(file(1), ChunkIndex(8)).unwrap(), ChunkIndex(8));
    assert_eq!(store.mark_extended(file(1), ChunkIndex(2)).unwrap(), ChunkIndex(8), "a lower bound leaves it");
    // A truncate past the bound raises it to the new last chunk; a cut leaves it.
    store.truncate_head(file(1), 64, 64 * 20 + 1, 5).unwrap();
    assert_eq!(store.stat(file(1)).unwrap().last_chunk, ChunkIndex(20));
    store.truncate_head(file(1), 10, 10, 6).unwrap();
    assert_eq!(store.stat(file(1)).unwrap().last_chunk, ChunkIndex(20));
    // Never past the chunk of the largest file's last byte.
    let largest = ChunkIndex::last_of(ringfs_proto::MAX_FILE_SIZE, 64);
    assert_eq!(store.mark_extended(file(1), ChunkIndex(u64::MAX)).unwrap(), largest);
    // Only regular files have later chunks.
    create_dir(&store, "/d", 2);
    assert_eq!(store.mark_extended(file(2), ChunkIndex(1)).unwrap_err().errno(), Errno::EINVAL);
    // A file that goes says which chunks its other servers may hold.
    store.unlink("/f", 0, None).unwrap();
    assert_eq!(store.drop_link(file(1), 7).unwrap(), Some(Deleted { file: file(1), last_chunk: largest }));
}

#[test]
fn rmdir_preparation_invalidates_known_directories() {
    let store = memory_store();
    create_dir(&store, "/d", 1);
    assert_eq!(store.known_dir("/d"), Ok(()));
    create(&store, "/d/f", REGULAR, 2);
    assert!(store.prepare_rmdir("/d").0);
    // A lookup that started before the invalidation cannot record a stale answer.
    let stale_ticket = store.known_dir("/d").unwrap_err() - 1;
    assert!(!store.mark_known_dir("/d", stale_ticket));
    assert!(matches!(store.create(&Create::new("/d/g", REGULAR, 64), file(3)), Err(StoreError::ParentUnknown(_))));
    store.unlink("/d/f", 0, None).unwrap();
    assert!(!store.prepare_rmdir("/d").0);
    store.begin_rmdir("/d", 0).unwrap();
    assert_eq!(store.lookup_dir("/d", 0).unwrap_err().errno(), Errno::ENOENT);
    store.finish_rmdir("/d", true).unwrap();
    assert_eq!(store.lookup("/d", 0, false).unwrap_err().errno(), Errno::ENOENT);
    assert_eq!(store.stats().entries, 0);
    assert_eq!(store.lookup_dir("/", 0).unwrap().file, FileId::ROOT);
}

#[test]
fn read_dir_pages_through_entries_in_name_order_with_local_attributes() {
    let store = memory_store();
    for i in 0..25 {
        create(&store, &format!("/f{i:02}"), REGULAR, i + 1);
    }
    // A name whose file lives elsewhere comes without attributes.
    store
        .install_entry(
            "/remote",
            EntryRef::new(FileId { anchor: 99, serial: 99 }, FileKind::Regular),
            InstallMode::REPLACE,
            FileId::default(),
            false,
        )
        .unwrap();
    let mut names = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.read_dir("/", after.as_deref(), 10);
        for entry in &page.entries {
            assert_eq!(entry.attr.is_some(), entry.name != "remote", "{}", entry.name);
        }
        names.extend(page.entries.iter().map(|entry| entry.name.clone()));
        after = names.last().cloned();
        if !page.more {
            break;
        }
    }
    let mut expected: Vec<String> = (0..25).map(|i| format!("f{i:02}")).collect();
    expected.push("remote".into());
    assert_eq!(names, expected);
    assert!(store.read_dir("/missing", None, 10).entries.is_empty());
}

#[test]
fn capacity_limit_gives_enospc_and_frees_on_removal() {
    let store = ChunkStore::open(StoreConfig { capacity_bytes: 10_000, ..StoreConfig::memory() }).unwrap();
    let baseline = store.stats().used_bytes;
    store.create(&Create::new("/f", REGULAR, 1 << 20), file(1)).unwrap();
    let error = store.write(chunk(1, 0), 0, &mut &vec![0u8; 20_000][..], template(1 << 20), 1, None).unwrap_err();
    assert_eq!(error.errno(), Errno::ENOSPC);
    store.write(chunk(1, 0), 0, &mut &vec![0u8; 5_000][..], template(1 << 20), 1, None).unwrap();
    assert!(store.stats().used_bytes >= 5_000);
    store.unlink("/f", 0, None).unwrap();
    store.drop_link(file(1), 2).unwrap();
    assert_eq!(store.stats().used_bytes, baseline);
}

/// A reservation (`fallocate`) is charged at once, used by the file's growth instead of new
/// charges, refused whole when it does not fit, and given back by a release or the file's
/// removal.
#[test]
fn reservations_hold_room_for_their_file_until_used_or_released() {
    let store = ChunkStore::open(StoreConfig { capacity_bytes: 20_000, ..StoreConfig::memory() }).unwrap();
    let baseline = store.stats().used_bytes;
    store.create(&Create::new("/f", REGULAR, 1 << 20), file(1)).unwrap();
    store.create(&Create::new("/g", REGULAR, 1 << 20), file(2)).unwrap();
    let with_files = store.stats().used_bytes;
    assert_eq!(store.reserve(file(1), 50_000), Err(Errno::ENOSPC), "too big: nothing reserved");
    assert_eq!(store.stats().used_bytes, with_files);
    store.reserve(file(1), 8_000).unwrap();
    assert_eq!(store.stats().used_bytes, with_files + 8_000);
    let room_left = 20_000 - (with_files + 8_000);
    let error = store.write(chunk(2, 0), 0, &mut &vec![0u8; room_left as usize + 1][..], template(1 << 20), 1, None).unwrap_err();
    assert_eq!(error.errno(), Errno::ENOSPC, "another file cannot take the reserved room");
    store.write(chunk(1, 0), 0, &mut &vec![0u8; 6_000][..], template(1 << 20), 1, None).unwrap();
    assert_eq!(store.stats().used_bytes, with_files + 8_000, "the write used its reservation");
    store.unreserve(file(1), 1_000);
    assert_eq!(store.stats().used_bytes, with_files + 7_000);
    store.unlink("/f", 0, None).unwrap();
    store.drop_link(file(1), 2).unwrap();
    store.unlink("/g", 0, None).unwrap();
    store.drop_link(file(2), 2).unwrap();
    assert_eq!(store.stats().used_bytes, baseline, "the removal ended the rest of the reservation");
}

/// Reservations as large as a forged request may ask (the request fuzzer's seed 4242 sent
/// such): a store without a capacity limit refuses what the node cannot hold, and no sum of
/// reservations overflows — ENOSPC, as Linux's `fallocate` answers, never a panic or a wrapped
/// count.
#[test]
fn huge_reservations_are_refused_with_enospc_and_never_overflow_the_account() {
    for capacity_bytes in [0, 1 << 40] {
        let store = ChunkStore::open(StoreConfig { capacity_bytes, ..StoreConfig::memory() }).unwrap();
        store.create(&Create::new("/f", REGULAR, 1 << 20), file(1)).unwrap();
        let before = store.stats().used_bytes;
        for _ in 0..3 {
            assert_eq!(store.reserve(file(1), i64::MAX as u64), Err(Errno::ENOSPC), "capacity {capacity_bytes}");
            assert_eq!(store.reserve(file(1), u64::MAX), Err(Errno::ENOSPC), "capacity {capacity_bytes}");
        }
        assert_eq!(store.stats().used_bytes, before, "nothing was charged (capacity {capacity_bytes})");
        store.reserve(file(1), 1 << 20).unwrap();
        assert_eq!(store.stats().used_bytes, before + (1 << 20));
    }
}

#[test]
fn hard_links_count_names_and_the_file_lives_until_the_last_goes() {
    let store = memory_store();
    create(&store, "/a", REGULAR, 1);
    store.write(chunk(1, 0), 0, &mut &b"shared"[..], template(4096), 1, None).unwrap();
    let entry = store.lookup("/a", 0, false).unwrap().0;
    assert_eq!(store.add_link(entry.file, 2).unwrap().nlink, 2);
    assert_eq!(store.install_entry("/b", entry, InstallMode::NO_REPLACE, FileId::default(), false).unwrap(), None);
    assert_eq!(store.install_entry("/b", entry, InstallMode::NO_REPLACE, FileId::default(), false).unwrap_err().errno(), Errno::EEXIST);
    store.unlink("/a", 0, None).unwrap();
    assert_eq!(store.drop_link(entry.file, 3).unwrap(), None, "one name is left");
    let (target, attr) = store.lookup("/b", 0, false).unwrap();
    assert_eq!((target.file, attr.unwrap().nlink), (entry.file, 1));
    assert_eq!(read_all(&store, chunk(1, 0)), b"shared");
    // Directories cannot be linked.
    create_dir(&store, "/d", 2);
    assert_eq!(store.add_link(file(2), 4).unwrap_err().errno(), Errno::EPERM);
}

#[test]
fn an_open_file_outlives_its_last_name_until_the_last_close() {
    let store = memory_store();
    let created = store.create(&Create { open_for: 1, ..Create::new("/tmp", REGULAR, 4096) }, file(1)).unwrap();
    assert!(created.created);
    store.write(chunk(1, 0), 0, &mut &b"scratch"[..], template(4096), 1, None).unwrap();
    store.open_file(file(1)).unwrap();
    store.unlink("/tmp", 0, None).unwrap();
    assert_eq!(store.drop_link(file(1), 2).unwrap(), None, "still open twice");
    assert_eq!(store.stats().open_unlinked, 1);
    assert_eq!(store.lookup("/tmp", 0, false).unwrap_err().errno(), Errno::ENOENT);
    assert_eq!(read_all(&store, chunk(1, 0)), b"scratch", "readable through the open");
    store.write(chunk(1, 0), 7, &mut &b"!"[..], template(4096), 3, None).unwrap();
    assert_eq!(store.stat(file(1)).unwrap().nlink, 0);
    assert_eq!(store.close_file(file(1)), None);
    assert_eq!(store.close_file(file(1)), Some(Deleted { file: file(1), last_chunk: ChunkIndex::FIRST }));
    assert_eq!(store.stat(file(1)).unwrap_err().errno(), Errno::ESTALE);
    assert_eq!(store.stats().open_unlinked, 0);
}

#[test]
fn renames_install_and_remove_names_without_touching_files() {
    let store = memory_store();
    create(&store, "/a", REGULAR, 1);
    create(&store, "/b", REGULAR, 2);
    store.write(chunk(1, 0), 0, &mut &b"12345678"[..], template(8), 1, None).unwrap();
    let a = store.lookup("/a", 0, false).unwrap().0;
    let replaced = store.install_entry("/b", a, InstallMode::REPLACE, FileId::default(), false).unwrap();
    assert_eq!(replaced.map(|entry| entry.file), Some(file(2)));
    assert!(store.remove_entry("/a", a.file).unwrap());
    assert!(!store.remove_entry("/a", a.file).unwrap(), "removed once");
    assert_eq!(read_all(&store, chunk(1, 0)), b"12345678");
    assert_eq!(store.lookup("/b", 0, false).unwrap().0.file, file(1));
    // Exchange: the target must hold the expected file.
    create(&store, "/c", REGULAR, 3);
    assert_eq!(store.install_entry("/c", a, InstallMode::EXCHANGE, file(9), false).unwrap_err().errno(), Errno::ESTALE);
    assert_eq!(store.install_entry("/c", a, InstallMode::EXCHANGE, file(3), false).unwrap().map(|entry| entry.file), Some(file(3)));
    // Type rules of rename targets.
    create_dir(&store, "/d", 4);
    assert_eq!(store.install_entry("/d", a, InstallMode::REPLACE, FileId::default(), false).unwrap_err().errno(), Errno::EISDIR);
    let dir = store.lookup("/d", 0, false).unwrap().0;
    assert_eq!(store.install_entry("/c", dir, InstallMode::REPLACE, FileId::default(), false).unwrap_err().errno(), Errno::ENOTDIR);
    create_dir(&store, "/e", 5);
    assert_eq!(store.install_entry("/e", dir, InstallMode::REPLACE, FileId::default(), false).unwrap_err().errno(), Errno::ENOTEMPTY);
    assert!(store.install_entry("/e", dir, InstallMode::REPLACE, FileId::default(), true).is_ok());
}

#[test]
fn a_subtree_moves_its_names_to_their_new_paths() {
    let store = memory_store();
    create_dir(&store, "/from", 1);
    create_dir(&store, "/from/sub", 2);
    create(&store, "/from/sub/f", REGULAR, 3);
    create(&store, "/from/g", REGULAR, 4);
    create(&store, "/fromage", REGULAR, 5);
    let mut moved = store.take_subtree("/from", "/to/x").unwrap();
    moved.sort_by(|a, b| a.path.cmp(&b.path));
    let paths: Vec<&str> = moved.iter().map(|entry| entry.path.as_str()).collect();
    assert_eq!(paths, ["/to/x/g", "/to/x/sub", "/to/x/sub/f"], "the directory itself and /fromage stay");
    assert!(store.lookup("/from/g", 0, false).is_err());
    assert!(store.lookup("/fromage", 0, false).is_ok());
    assert!(store.known_dir("/from/sub").is_err(), "known directories below are forgotten");
    store.put_entries(&moved).unwrap();
    assert_eq!(store.lookup("/to/x/sub/f", 0, false).unwrap().0.file, file(3));
    let names: Vec<String> = store.read_dir("/to/x", None, 10).entries.into_iter().map(|entry| entry.name).collect();
    assert_eq!(names, ["g", "sub"]);
}

#[test]
fn shared_reads_are_not_changed_by_later_writes() {
    let store = memory_store();
    let target = chunk(3, 1);
    store.write(target, 0, &mut &b"before"[..], template(64), 1, None).unwrap();
    store.set_chunk_len(target, 10, template(64), 1, None, None).unwrap();
    let shared = store.read_shared(target, 2, 100, None).unwrap();
    assert_eq!(shared.len, 8);
    let (bytes, range) = shared.bytes.unwrap();
    store.write(target, 0, &mut &b"AFTER!"[..], template(64), 2, None).unwrap();
    assert_eq!(&bytes[range], b"fore");
    assert_eq!(read_all(&store, target), b"AFTER!\0\0\0\0");
    assert!(store.read_shared(chunk(3, 2), 0, 1, None).unwrap().attr.is_none());
}

#[test]
fn find_counts_entries_below_a_root_and_defers_spread_files() {
    let store = memory_store();
    create_dir(&store, "/d", 1);
    for (index, time) in [(1, 10), (2, 30), (10, 30)] {
        let path = format!("/d/f{index:02}");
        let entry = Create { time_ns: time, ..Create::new(&path, REGULAR, 64) };
        store.create(&entry, file(100 + index)).unwrap();
        store.write(chunk(100 + index, 0), 0, &mut &[7u8; 5][..], template(64), time, None).unwrap();
    }
    store.mark_extended(file(110), ChunkIndex(1)).unwrap();
    create(&store, "/elsewhere", REGULAR, 99);
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
        create_dir(&store, "/d", 1);
        store.create(&Create::new("/d/f", REGULAR, 16), file(9)).unwrap();
        store.write(chunk(9, 0), 0, &mut &b"0123456789abcdef"[..], template(16), 1, None).unwrap();
        store.write(chunk(9, 2), 4, &mut &b"xyz"[..], template(16), 2, None).unwrap();
        store.mark_extended(file(9), ChunkIndex(2)).unwrap();
        store.create(&Create { link_target: Some("/d/f".into()), ..Create::new("/d/l", 0o120777, 16) }, file(3)).unwrap();
        create(&store, "/gone", REGULAR, 4);
        store.unlink("/gone", 0, None).unwrap();
        store.drop_link(file(4), 1).unwrap();
        // Open when the server stopped, no name: nobody has it open after a restart.
        store.create(&Create { open_for: 1, ..Create::new("/orphan", REGULAR, 16) }, file(5)).unwrap();
        store.unlink("/orphan", 0, None).unwrap();
        store.drop_link(file(5), 1).unwrap();
        assert_eq!(store.stats().open_unlinked, 1);
        // A renamed file's name moved.
        let f = store.lookup("/d/f", 0, false).unwrap().0;
        store.install_entry("/d/renamed", f, InstallMode::REPLACE, FileId::default(), false).unwrap();
        store.remove_entry("/d/f", f.file).unwrap();
    }
    let store = ChunkStore::open(config).unwrap();
    assert_eq!(read_all(&store, chunk(9, 0)), b"0123456789abcdef");
    assert_eq!(read_all(&store, chunk(9, 2)), b"\0\0\0\0xyz");
    assert_eq!(store.stat(file(9)).unwrap().last_chunk, ChunkIndex(2));
    assert_eq!(store.lookup("/d/renamed", 0, false).unwrap().0.file, file(9));
    assert_eq!(read_all(&store, chunk(3, 0)), b"/d/f");
    let names: Vec<String> = store.read_dir("/d", None, 100).entries.into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["l", "renamed"]);
    assert_eq!(store.lookup("/gone", 0, false).unwrap_err().errno(), Errno::ENOENT);
    assert_eq!(store.stat(file(5)).unwrap_err().errno(), Errno::ESTALE, "the orphan went at the restart");
    assert_eq!(store.stats().entries, 3);
    assert!(store.stat(FileId::ROOT).unwrap().is_dir());
    std::fs::remove_dir_all(root).unwrap();
}

proptest::proptest! {
    /// Random writes and length changes on one chunk, checked against a plain vector.
    #[test]
    fn chunk_matches_reference_model(
        operations in proptest::collection::vec((0u64..300, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80), proptest::prelude::any::<bool>()), 1..40),
        use_directory in proptest::prelude::any::<bool>(),
    ) {
        let root = temp_dir("model");
        let medium = if use_directory { Medium::Directory(root.clone()) } else { Medium::Memory };
        let store = ChunkStore::open(StoreConfig { medium, capacity_bytes: 0, cache: None }).unwrap();
        let target = chunk(42, 1);
        let mut model: Vec<u8> = Vec::new();
        for (offset, bytes, shrink) in operations {
            if shrink {
                let len = offset.min(model.len() as u64);
                store.set_chunk_len(target, len, template(400), 1, None, None).unwrap();
                model.truncate(len as usize);
            } else {
                store.write(target, offset, &mut &bytes[..], template(400), 1, None).unwrap();
                let end = offset as usize + bytes.len();
                if model.len() < end && !bytes.is_empty() {
                    model.resize(end, 0);
                }
                if model.len() < offset as usize {
                    model.resize(offset as usize, 0);
                }
                model[offset as usize..end].copy_from_slice(&bytes);
            }
            proptest::prop_assert_eq!(read_all(&store, target), model.clone());
        }
        let _ = std::fs::remove_dir_all(root);
    }
}

/// Touches of a directory come late and in any order (servers hold them back): they only
/// move times forward, a later chmod does not stop them, and a later explicit mtime wins.
#[test]
fn late_directory_touches_move_times_forward_but_never_undo_an_explicit_mtime() {
    let store = memory_store();
    create_dir(&store, "/d", 5);
    let times = |store: &ChunkStore| {
        let attr = store.stat(file(5)).unwrap();
        (attr.mtime_ns, attr.ctime_ns)
    };
    store.touch_dir(file(5), 2_000, 0).unwrap();
    store.touch_dir(file(5), 1_500, 0).unwrap();
    assert_eq!(times(&store), (2_000, 2_000), "an older touch arriving later changes nothing");
    // A chmod at 3000, then a touch of a change made at 2500 arrives.
    store.set_attr(&ringfs_proto::SetAttr { mode: Some(0o700), ..ringfs_proto::SetAttr::new(file(5), 3_000) }).unwrap();
    store.touch_dir(file(5), 2_500, 0).unwrap();
    assert_eq!(times(&store), (2_500, 3_000), "the mtime follows the change even after a later chmod");
    // utimensat at 4000 sets the mtime to 10; a change made at 3500 must not undo it.
    store
        .set_attr(&ringfs_proto::SetAttr { mtime_ns: Some(10), times_explicit: true, ..ringfs_proto::SetAttr::new(file(5), 4_000) })
        .unwrap();
    store.touch_dir(file(5), 3_500, 0).unwrap();
    assert_eq!(times(&store), (10, 4_000), "a late touch leaves an explicit mtime");
    // A change after the utimensat moves it again, even backwards from a future mtime.
    store
        .set_attr(&ringfs_proto::SetAttr { mtime_ns: Some(9_999_999), times_explicit: true, ..ringfs_proto::SetAttr::new(file(5), 5_000) })
        .unwrap();
    store.touch_dir(file(5), 6_000, 0).unwrap();
    assert_eq!(times(&store), (6_000, 6_000));
    store.touch_dir(file(5), 7_000, 0).unwrap();
    assert_eq!(times(&store), (7_000, 7_000));
}

#[test]
fn a_directory_counts_its_subdirectories_in_its_link_count() {
    let store = memory_store();
    create_dir(&store, "/d", 5);
    let links = |store: &ChunkStore| store.stat(file(5)).unwrap().nlink;
    assert_eq!(links(&store), 2);
    store.touch_dir(file(5), 1_000, 1).unwrap();
    store.touch_dir(file(5), 1_000, 2).unwrap();
    assert_eq!(links(&store), 5);
    store.touch_dir(file(5), 2_000, -1).unwrap();
    assert_eq!(links(&store), 4, "a change at an older time still counts");
    store.touch_dir(file(5), 3_000, -5).unwrap();
    assert_eq!(links(&store), 2, "never below 2");
    store.drop_link(file(5), 4_000).unwrap();
    assert!(store.stat(file(5)).is_err() || links(&store) == 0, "a removed directory does not count again");
}

#[test]
fn a_files_attributes_say_whether_it_has_extended_attributes() {
    let store = memory_store();
    create(&store, "/f", REGULAR, 6);
    let flagged = |store: &ChunkStore| store.stat(file(6)).unwrap().has(ringfs_proto::EntryFlags::XATTRS);
    assert!(!flagged(&store));
    assert!(store.set_xattr(file(6), "user.a", b"1", 0, 10).unwrap().has(ringfs_proto::EntryFlags::XATTRS));
    store.set_xattr(file(6), "user.b", b"2", 0, 20).unwrap();
    store.remove_xattr(file(6), "user.a", 30).unwrap();
    assert!(flagged(&store), "one is left");
    assert!(!store.remove_xattr(file(6), "user.b", 40).unwrap().has(ringfs_proto::EntryFlags::XATTRS));
    assert!(!flagged(&store));
}

/// A truncation is recorded as under way at the inode until the caller ends it, in the
/// chunk's header: a server that dies before the file's later chunks are cut finds it after
/// its restart and finishes it. A cut finished late removes only chunks not changed since.
#[test]
fn a_truncation_under_way_survives_a_restart_and_a_late_cut_keeps_newer_chunks() {
    let root = temp_dir("cut");
    let config = StoreConfig { medium: Medium::Directory(root.clone()), capacity_bytes: 0, cache: None };
    {
        let store = ChunkStore::open(config.clone()).unwrap();
        store.create(&Create::new("/f", REGULAR, 16), file(9)).unwrap();
        store.write(chunk(9, 0), 0, &mut &b"0123456789abcdef"[..], template(16), 1, None).unwrap();
        store.mark_extended(file(9), ChunkIndex(3)).unwrap();
        store.truncate_head(file(9), 5, 5, 10).unwrap();
        assert_eq!(store.unfinished_cuts(), [(file(9), Cut { len: 5, time_ns: 10 })]);
    }
    let store = ChunkStore::open(config.clone()).unwrap();
    assert_eq!(store.unfinished_cuts(), [(file(9), Cut { len: 5, time_ns: 10 })], "the cut is still under way after a restart");
    assert_eq!(store.cut_under_way(file(9)), Some(Cut { len: 5, time_ns: 10 }));
    // A later truncation under way is not ended by the earlier one's end.
    store.truncate_head(file(9), 7, 7, 11).unwrap();
    store.finish_cut(file(9), Cut { len: 5, time_ns: 10 }).unwrap();
    assert_eq!(store.cut_under_way(file(9)), Some(Cut { len: 7, time_ns: 11 }));
    store.finish_cut(file(9), Cut { len: 7, time_ns: 11 }).unwrap();
    assert_eq!(store.unfinished_cuts(), []);
    drop(store);
    let store = ChunkStore::open(config).unwrap();
    assert_eq!(store.unfinished_cuts(), [], "an ended cut stays ended");

    // Chunks 1 and 2 were there before a cut at time 20; chunk 3 was written after it.
    for (index, time) in [(1, 5), (2, 19), (3, 21)] {
        store.write(chunk(9, index), 0, &mut &b"old"[..], template(16), time, None).unwrap();
    }
    assert_eq!(store.set_chunk_len(chunk(9, 3), 1, template(16), 0, None, Some(20)).unwrap().len, 3, "changed after the cut: kept");
    assert_eq!(store.set_chunk_len(chunk(9, 2), 1, template(16), 0, None, Some(20)).unwrap().len, 1);
    assert_eq!(store.remove_chunks(file(9), ChunkIndex(1), Some(20)), 2);
    assert_eq!(read_all(&store, chunk(9, 3)), b"old", "the chunk written after the cut stays");
    assert_eq!(store.read(chunk(9, 1), 0, 10, &mut Vec::new(), None).unwrap(), (None, 0));
    assert_eq!(store.remove_chunks(file(9), ChunkIndex(1), None), 1);
    std::fs::remove_dir_all(root).unwrap();
}

/// A `dir` store holding `/f` (file 9) with `bytes`, in which `change` runs and dies — as
/// its server would — with `hook` set; the store reopened after it, and its directory.
fn died_in_the_middle(
    tag: &str,
    bytes: &[u8],
    hook: &'static std::thread::LocalKey<std::cell::Cell<bool>>,
    change: impl FnOnce(&ChunkStore) -> Result<(), StoreError>,
) -> (ChunkStore, std::path::PathBuf) {
    let root = temp_dir(tag);
    let config = StoreConfig { medium: Medium::Directory(root.clone()), capacity_bytes: 0, cache: None };
    {
        let store = ChunkStore::open(config.clone()).unwrap();
        store.create(&Create::new("/f", REGULAR, 4096), file(9)).unwrap();
        store.write(chunk(9, 0), 0, &mut &bytes[..], template(4096), 1, None).unwrap();
        hook.set(true);
        let died = change(&store);
        hook.set(false);
        assert!(died.is_err(), "the change stopped where the server died");
    }
    (ChunkStore::open(config).unwrap(), root)
}

/// A write that grew a chunk and was cut short by a crash after storing its bytes, before
/// recording the chunk's new length: after the restart the bytes past the recorded length
/// are gone, so growing the file reads zeros there (found by `cache.rs:
/// files_written_while_a_server_is_killed_…` once it truncated again: the grown file showed
/// the dead write's bytes, which the backend never got).
#[test]
fn bytes_a_crashed_write_stored_past_the_chunks_length_do_not_come_back() {
    let (store, root) = died_in_the_middle("crashed-write", b"kept", &crate::testing::DIE_AFTER_CHANGE, |store| {
        store.write(chunk(9, 0), 100, &mut &b"dead write"[..], template(4096), 2, None).map(drop)
    });
    assert_eq!(read_all(&store, chunk(9, 0)), b"kept");
    store.truncate_head(file(9), 200, 200, 3).unwrap();
    let mut grown = b"kept".to_vec();
    grown.resize(200, 0);
    assert_eq!(read_all(&store, chunk(9, 0)), grown, "the grown file reads zeros past its old end");
    std::fs::remove_dir_all(root).unwrap();
}

/// A truncation whose server died after recording the chunk's new length and before
/// cutting its bytes: after the restart the chunk reads as cut (its bytes past the length
/// dropped) and the cut is still under way, for the server to finish.
#[test]
fn a_cut_recorded_before_its_bytes_were_cut_reads_as_cut_after_a_restart() {
    let (store, root) = died_in_the_middle("cut-crash", b"0123456789", &crate::testing::DIE_BEFORE_CUTTING_BYTES, |store| {
        store.truncate_head(file(9), 4, 4, 2).map(drop)
    });
    assert_eq!(read_all(&store, chunk(9, 0)), b"0123");
    assert_eq!(store.unfinished_cuts(), [(file(9), Cut { len: 4, time_ns: 2 })]);
    store.truncate_head(file(9), 8, 8, 3).unwrap();
    assert_eq!(read_all(&store, chunk(9, 0)), b"0123\0\0\0\0");
    std::fs::remove_dir_all(root).unwrap();
}
