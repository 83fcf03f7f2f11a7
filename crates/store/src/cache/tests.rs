//! Cache mode on one store: read-through, flushing under racing writes, removals and cuts,
//! eviction and write-through, restarts.

use std::fs;
use std::path::PathBuf;

use ringfs_proto::{ChunkIndex, ChunkKey, ChunkTemplate, Create, EntryFlags, Errno, FileId};

use super::*;
use crate::ChunkStore;
use crate::backend::{self, RemovalKind};
use crate::{Medium, StoreConfig};

const CHUNK: u32 = 1 << 16;

struct Setup {
    root: PathBuf,
}

impl Setup {
    fn new(tag: &str) -> Setup {
        let root = std::env::temp_dir().join(format!("ringfs-cache-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("backend")).unwrap();
        Setup { root }
    }

    fn backend(&self) -> PathBuf {
        self.root.join("backend")
    }

    fn config(&self, capacity_bytes: u64, on_disk: bool) -> StoreConfig {
        StoreConfig {
            medium: if on_disk { Medium::Directory(self.root.join("store")) } else { Medium::Memory },
            capacity_bytes,
            cache: Some(CacheConfig { backend: self.backend(), mount_path: "/".into(), chunk_size: CHUNK }),
        }
    }

    fn store(&self) -> ChunkStore {
        ChunkStore::open(self.config(0, false)).unwrap()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn template(backend_len: u64) -> ChunkTemplate {
    ChunkTemplate { mode: 0o100644, uid: 0, gid: 0, chunk_size: CHUNK, backend_len }
}

/// Flushes everything queued, preparing inodes locally (one server).
fn flush_all(store: &ChunkStore) -> Vec<FlushOutcome> {
    let prepare = |file: FileId| store.prepare(file).map_err(|error| error.errno());
    let mut outcomes = Vec::new();
    let mut deferred = Vec::new();
    while let Some(queued) = store.next_work(u64::MAX) {
        let outcome = store.flush(&queued.item, &prepare, FlushPace::Complete).unwrap();
        if outcome == FlushOutcome::Deferred {
            deferred.push(queued);
        }
        outcomes.push(outcome);
    }
    // Back in the queue, as the flusher does, for the next round.
    for queued in deferred {
        store.requeue(queued);
    }
    outcomes
}

/// The anchor every test file gets (one store: every anchor is local).
const ANCHOR: u32 = 3;

/// The file a path names.
fn file_of(store: &ChunkStore, path: &str) -> FileId {
    store.lookup(path, ANCHOR, false).unwrap().0.file
}

fn read_file(store: &ChunkStore, path: &str, size: u64) -> Vec<u8> {
    let file = file_of(store, path);
    let backend = store.backend_file(file).unwrap();
    let mut bytes = Vec::new();
    for index in ChunkIndex::FIRST.through(ChunkIndex::last_of(size, CHUNK as u64)) {
        let mut piece = Vec::new();
        store.read(ChunkKey::new(file, index), 0, CHUNK as u64, &mut piece, backend.as_ref()).unwrap();
        piece.resize(CHUNK as usize, 0);
        bytes.extend(piece);
    }
    bytes.truncate(size as usize);
    bytes
}

/// Ends the truncation of `file` under way, to `len` (what the server does once the later
/// chunks are cut).
fn end_cut(store: &ChunkStore, file: FileId, len: u64) {
    let cut = store.cut_under_way(file).expect("a cut under way");
    assert_eq!(cut.len, len);
    store.finish_cut(file, cut).unwrap();
}

/// Creates (or truncates) `path` with `bytes`; its file id.
fn new_file(store: &ChunkStore, path: &str, bytes: &[u8]) -> FileId {
    let entry = Create { exclusive: false, truncate: true, ..Create::new(path, 0o100644, CHUNK) };
    let outcome = store.create(&entry, FileId { anchor: ANCHOR, serial: xxhash_rust::xxh3::xxh3_64(path.as_bytes()) | 1 }).unwrap();
    let file = outcome.entry.file;
    if outcome.truncated {
        end_cut(store, file, 0);
    }
    let backend = store.backend_file(file).unwrap();
    for (index, piece) in bytes.chunks(CHUNK as usize).enumerate() {
        store.write(ChunkKey::new(file, ChunkIndex(index as u64)), 0, &mut &piece[..], template(0), 5, backend.as_ref()).unwrap();
    }
    file
}

/// Removes the name `path` and the file's last link.
fn remove(store: &ChunkStore, path: &str) {
    let entry = store.unlink(path, ANCHOR, None).unwrap();
    store.drop_link(entry.file, 9).unwrap();
}

#[test]
fn backend_files_are_read_through_once_per_chunk() {
    let setup = Setup::new("read");
    let data = pattern(3 * CHUNK as usize + 100, 1);
    fs::create_dir(setup.backend().join("in")).unwrap();
    fs::write(setup.backend().join("in/data"), &data).unwrap();
    let store = setup.store();
    let head = store.stat(file_of(&store, "/in/data")).unwrap();
    assert!(head.is_extended() && head.has(EntryFlags::BACKED | EntryFlags::BACKEND_DATA | EntryFlags::IN_BACKEND));
    assert_eq!(head.backend_len, data.len() as u64);
    assert_eq!(read_file(&store, "/in/data", data.len() as u64), data);
    assert_eq!(read_file(&store, "/in/data", data.len() as u64), data);
    assert_eq!(store.cache_stats().unwrap().loaded_chunks, 4, "each chunk came from the backend once");
    assert!(store.lookup_dir("/in", ANCHOR).unwrap().is_dir());
    assert!(!store.has_work(), "reading dirties nothing");
    let page = store.backend_page("/in", None, 10, &|_| ANCHOR).unwrap();
    assert_eq!(page.entries.len(), 1);
    assert_eq!(page.entries[0].entry.file, head.file_id, "the same backend file gets the same id");
}

#[test]
fn written_files_reach_the_backend_and_writes_racing_a_flush_are_kept() {
    let setup = Setup::new("write");
    let store = setup.store();
    let data = pattern(CHUNK as usize + 5000, 2);
    new_file(&store, "/out", &data);
    let outcomes = flush_all(&store);
    assert!(outcomes.iter().all(|outcome| matches!(outcome, FlushOutcome::Flushed { clean: true, .. })), "{outcomes:?}");
    assert_eq!(fs::read(setup.backend().join("out")).unwrap(), data);

    // A write lands while a chunk is being flushed (between its pieces): the flush must
    // not mark it clean.
    const LARGE: u32 = 1 << 20;
    let entry = Create { exclusive: false, truncate: true, ..Create::new("/large", 0o100644, LARGE) };
    let file_id = store.create(&entry, FileId { anchor: ANCHOR, serial: 78 }).unwrap().entry.file;
    flush_all(&store);
    let reference = ChunkKey::inode(file_id);
    let big = pattern(LARGE as usize, 3);
    let large_template = ChunkTemplate { chunk_size: LARGE, ..template(0) };
    store.write(reference, 0, &mut &big[..], large_template, 6, None).unwrap();
    let queued = store.next_work(u64::MAX).unwrap();
    let prepare = |file: FileId| store.prepare(file).map_err(|error| error.errno());
    let racing = pattern(10, 4);
    let wrote = std::cell::Cell::new(false);
    let keep_going = || {
        if !wrote.replace(true) {
            store.write(reference, 100, &mut &racing[..], large_template, 7, None).unwrap();
        }
        true
    };
    let outcome = store.flush(&queued.item, &prepare, FlushPace::Yielding(&keep_going)).unwrap();
    assert_eq!(outcome, FlushOutcome::Flushed { bytes: backend::FLUSH_PIECE_BYTES as u64, clean: false }, "stops at the change");
    assert!(store.stat(file_id).unwrap().has(EntryFlags::DIRTY), "the racing write keeps the chunk dirty");
    assert_ne!(&fs::read(setup.backend().join("large")).unwrap()[100..110], &racing[..], "the flush wrote the older bytes");
    // The racing write queued the chunk again, behind a sync begun before it; putting the
    // interrupted work back keeps the chunk in that sync.
    assert_eq!(store.work_left(queued.since), 0);
    store.requeue(queued.clone());
    assert_eq!(store.work_left(queued.since), 1, "the chunk keeps its place in a sync begun before the write");
    assert_eq!(store.queued_work().len(), 1, "and is queued once");
    flush_all(&store);
    let mut expected = big.clone();
    expected[100..110].copy_from_slice(&racing);
    assert_eq!(fs::read(setup.backend().join("large")).unwrap(), expected);
    assert!(!store.stat(file_id).unwrap().has(EntryFlags::DIRTY));
}

#[test]
fn a_complete_flush_ends_clean_under_continuous_writes() {
    let setup = Setup::new("complete");
    let store = setup.store();
    const LARGE: u32 = 1 << 20;
    let entry = Create { exclusive: false, truncate: true, ..Create::new("/hot", 0o100644, LARGE) };
    let file_id = store.create(&entry, FileId { anchor: ANCHOR, serial: 78 }).unwrap().entry.file;
    let reference = ChunkKey::inode(file_id);
    let large_template = ChunkTemplate { chunk_size: LARGE, ..template(0) };
    store.write(reference, 0, &mut &pattern(LARGE as usize, 1)[..], large_template, 6, None).unwrap();
    flush_all(&store);
    let done = std::sync::atomic::AtomicBool::new(false);
    let prepare = |file: FileId| store.prepare(file).map_err(|error| error.errno());
    std::thread::scope(|scope| {
        scope.spawn(|| {
            // Rewrites the whole chunk, with other bytes each time, until the flushes are done.
            let versions: Vec<Vec<u8>> = (0..4).map(|seed| pattern(LARGE as usize, seed)).collect();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            for round in 0..1_000_000 {
                if done.load(std::sync::atomic::Ordering::Relaxed) || std::time::Instant::now() > deadline {
                    break;
                }
                store.write(reference, 0, &mut &versions[round % 4][..], large_template, 7, None).unwrap();
            }
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut flushes = 0;
        while flushes < 20 && std::time::Instant::now() < deadline {
            let Some(queued) = store.next_work(u64::MAX) else {
                std::thread::yield_now();
                continue;
            };
            // (Skipped: a write queued the chunk again while an earlier flush was taking
            // its bytes, and that flush wrote them.)
            match store.flush(&queued.item, &prepare, FlushPace::Complete).unwrap() {
                FlushOutcome::Flushed { clean: true, .. } => flushes += 1,
                FlushOutcome::Skipped => {}
                outcome => panic!("a complete flush ended {outcome:?}"),
            }
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(flushes, 20, "the writer kept the chunk dirty");
    });
    // The last flush wrote one whole version of the chunk.
    let flushed = fs::read(setup.backend().join("hot")).unwrap();
    assert!((0..4).any(|seed| flushed == pattern(LARGE as usize, seed)), "the backend holds a mix of versions");
}

#[test]
fn removals_and_truncations_reach_the_backend_when_flushed() {
    let setup = Setup::new("namespace");
    fs::write(setup.backend().join("old"), pattern(5000, 5)).unwrap();
    fs::write(setup.backend().join("cut"), pattern(3 * CHUNK as usize, 6)).unwrap();
    let store = setup.store();
    remove(&store, "/old");
    assert!(setup.backend().join("old").exists(), "removal waits for the flush");
    assert_eq!(store.lookup("/old", ANCHOR, false).unwrap_err().errno(), Errno::ENOENT);
    assert_eq!(store.read_dir("/", None, 10).removed, ["old"]);
    let cut = store.stat(file_of(&store, "/cut")).unwrap();
    store.truncate_head(cut.file_id, 1000, 1000, 9).unwrap();
    end_cut(&store, cut.file_id, 1000);
    assert_eq!(store.stat(cut.file_id).unwrap().backend_len, 1000);
    flush_all(&store);
    assert!(!setup.backend().join("old").exists());
    assert_eq!(fs::read(setup.backend().join("cut")).unwrap(), pattern(3 * CHUNK as usize, 6)[..1000]);
    assert!(store.read_dir("/", None, 10).removed.is_empty());

    // A write past the cut that lands while the cut is under way (after the chunks past it
    // were removed, before the cut is recorded) is not flushed until the cut is recorded,
    // so the cut cannot take it away in the backend.
    let cut = store.stat(file_of(&store, "/cut")).unwrap();
    store.truncate_head(cut.file_id, 500, 500, 10).unwrap();
    let late = ChunkKey::new(cut.file_id, ChunkIndex(1));
    let late_bytes = pattern(100, 11);
    let backend = store.backend_file(cut.file_id).unwrap();
    store.write(late, 0, &mut &late_bytes[..], template(0), 11, backend.as_ref()).unwrap();
    let outcomes = flush_all(&store);
    assert!(outcomes.contains(&FlushOutcome::Deferred), "{outcomes:?}");
    end_cut(&store, cut.file_id, 500);
    flush_all(&store);
    let mut expected = pattern(3 * CHUNK as usize, 6)[..500].to_vec();
    expected.resize(CHUNK as usize, 0);
    expected.extend_from_slice(&late_bytes);
    assert_eq!(fs::read(setup.backend().join("cut")).unwrap(), expected);

    // A new file over a removed one replaces it, even before the removal is flushed.
    fs::write(setup.backend().join("again"), b"old contents").unwrap();
    remove(&store, "/again");
    new_file(&store, "/again", b"new");
    flush_all(&store);
    assert_eq!(fs::read(setup.backend().join("again")).unwrap(), b"new");
}

#[test]
fn a_full_store_evicts_clean_chunks_then_writes_through() {
    let setup = Setup::new("full");
    let data = pattern(6 * CHUNK as usize, 7);
    fs::write(setup.backend().join("big"), &data).unwrap();
    let store = ChunkStore::open(setup.config(3 * CHUNK as u64 + 4096, false)).unwrap();
    assert_eq!(read_file(&store, "/big", data.len() as u64), data);
    assert!(store.cache_stats().unwrap().evicted_chunks >= 3, "clean chunks made room");
    assert_eq!(read_file(&store, "/big", data.len() as u64), data, "evicted chunks are loaded again");

    // Dirty data cannot be evicted: a writer that runs out of room writes through.
    let file_id = new_file(&store, "/w0", &pattern(CHUNK as usize, 8));
    new_file(&store, "/w1", &pattern(CHUNK as usize, 9));
    let chunk_of_w0 = |index| ChunkKey::new(file_id, ChunkIndex(index));
    let backend = store.backend_file(file_id).unwrap();
    let second = pattern(CHUNK as usize, 10);
    store.write(chunk_of_w0(1), 0, &mut &second[..], template(0), 3, backend.as_ref()).unwrap();
    let third = pattern(CHUNK as usize, 12);
    let full = store.write(chunk_of_w0(2), 0, &mut &third[..], template(0), 3, backend.as_ref()).unwrap_err();
    assert_eq!(full.errno(), Errno::ENOSPC, "only dirty chunks are left");
    let prepare = |file: FileId| store.prepare(file).map_err(|error| error.errno());
    let through = store.write_through(chunk_of_w0(2), 0, &mut &third[..], template(0), 3, backend.as_ref(), &prepare);
    assert_eq!(through.unwrap(), CHUNK as u64);
    assert_eq!(store.cache_stats().unwrap().written_through_bytes, CHUNK as u64);
    let expected = [pattern(CHUNK as usize, 8), second, third].concat();
    let read = read_file(&store, "/w0", 3 * CHUNK as u64);
    let mismatch = read.iter().zip(&expected).position(|(a, b)| a != b);
    assert!(
        mismatch.is_none() && read.len() == expected.len(),
        "written-through bytes read from the backend: first difference at {mismatch:?}"
    );
    flush_all(&store);
    assert_eq!(fs::read(setup.backend().join("w0")).unwrap(), expected);
}

#[test]
fn dirty_state_and_removals_survive_a_restart() {
    let setup = Setup::new("restart");
    fs::write(setup.backend().join("gone"), b"x").unwrap();
    {
        let store = ChunkStore::open(setup.config(0, true)).unwrap();
        new_file(&store, "/kept", &pattern(2 * CHUNK as usize, 11));
        remove(&store, "/gone");
        assert!(store.has_work());
    }
    let store = ChunkStore::open(setup.config(0, true)).unwrap();
    assert_eq!(store.queued_work().len(), 3, "two chunks and one removal are queued again");
    flush_all(&store);
    assert_eq!(fs::read(setup.backend().join("kept")).unwrap(), pattern(2 * CHUNK as usize, 11));
    assert!(!setup.backend().join("gone").exists());

    // A crash after a new entry replaced a removed one, before the removal record was
    // forgotten: the restart must not apply the removal after the new entry's creation.
    fs::write(setup.backend().join("again"), b"old").unwrap();
    drop(store);
    {
        let store = ChunkStore::open(setup.config(0, true)).unwrap();
        remove(&store, "/again");
        new_file(&store, "/again", b"new");
        let directory = store.space.directory.as_ref().unwrap();
        directory.record_removal("/again", RemovalKind::File).unwrap();
    }
    let store = ChunkStore::open(setup.config(0, true)).unwrap();
    flush_all(&store);
    assert_eq!(fs::read(setup.backend().join("again")).unwrap(), b"new");
    assert!(store.read_dir("/", None, 10).removed.is_empty());
}

#[test]
fn a_flush_that_learnt_a_place_before_a_rename_leaves_the_chunk_dirty() {
    let setup = Setup::new("moved-under-flush");
    let store = setup.store();
    let bytes = pattern(2 * CHUNK as usize, 7);
    let file = new_file(&store, "/work", &bytes);
    // Chunk 1's flush asks the inode where the file lives and learns "/work"; the file is
    // renamed right then (the rename binds it to "/result" and marks its chunks dirty).
    let renamed = std::cell::Cell::new(false);
    let prepare = |asked: FileId| {
        let place = store.prepare(asked).map_err(|error| error.errno());
        if !renamed.replace(true) {
            store.rebind(file, Some("/result"), Some("/work")).unwrap();
        }
        place
    };
    let outcome = store.flush(&WorkItem::Chunk(ChunkKey::new(file, ChunkIndex(1))), &prepare, FlushPace::Complete).unwrap();
    assert_eq!(outcome, FlushOutcome::Flushed { bytes: 0, clean: false }, "the old place is not written, the chunk stays dirty");
    flush_all(&store);
    let backend = fs::read(setup.backend().join("result")).unwrap();
    assert_eq!(backend.len(), bytes.len(), "every chunk reached the new place");
    assert!(backend == bytes);
}

#[test]
fn a_chunk_flushed_between_a_names_removal_and_its_last_link_makes_no_file() {
    let setup = Setup::new("unlink-race");
    let store = setup.store();
    let file = new_file(&store, "/p", &pattern(2 * CHUNK as usize, 3));
    flush_all(&store);
    assert!(setup.backend().join("p").exists());
    // The name goes (its removal is queued); the inode has not heard yet, and a write lands.
    store.unlink("/p", ANCHOR, None).unwrap();
    let backend = store.backend_file(file).unwrap();
    store.write(ChunkKey::new(file, ChunkIndex(1)), 0, &mut &b"late"[..], template(0), 7, backend.as_ref()).unwrap();
    let outcomes = flush_all(&store);
    assert!(!setup.backend().join("p").exists(), "no file is made again at a removed name: {outcomes:?}");
    assert!(outcomes.contains(&FlushOutcome::Deferred), "the chunk waits for the inode: {outcomes:?}");
    store.drop_link(file, 9).unwrap();
    flush_all(&store);
    assert!(!setup.backend().join("p").exists());
}

#[test]
fn a_file_renamed_over_a_file_whose_chunk_is_being_flushed_is_not_mixed_with_it() {
    // The replaced file's chunk flush learns its place ("/f"); right then a smaller file is
    // renamed over "/f": it is bound to "/f" and made there, the name moves to it and the
    // replaced file loses its name. The flush under way must not write the replaced file's
    // bytes into the new file's backend file.
    let setup = Setup::new("replaced-under-flush");
    let store = setup.store();
    let replaced = new_file(&store, "/f", &pattern(3 * CHUNK as usize, 1));
    let small = pattern(CHUNK as usize / 2, 2);
    let renamed_file = new_file(&store, "/new", &small);
    flush_all(&store);
    // The replaced file changes again: its last chunk is dirty.
    let backend_place = store.backend_file(replaced).unwrap();
    let changed = pattern(CHUNK as usize, 9);
    store
        .write(ChunkKey::new(replaced, ChunkIndex(2)), 0, &mut &changed[..], template(3 * CHUNK as u64), 6, backend_place.as_ref())
        .unwrap();
    // Someone has it open, so its chunks stay while it has no name (on other servers they
    // stay until its removal reaches them, whether it is open or not).
    store.open_file(replaced).unwrap();
    let renamed = std::cell::Cell::new(false);
    let prepare = |asked: FileId| {
        let place = store.prepare(asked).map_err(|error| error.errno());
        if !renamed.replace(true) {
            store.rebind(renamed_file, Some("/f"), Some("/new")).unwrap();
            store.prepare(renamed_file).unwrap();
            let entry = ringfs_proto::EntryRef::new(renamed_file, ringfs_proto::FileKind::Regular);
            store.install_entry("/f", entry, ringfs_proto::InstallMode::REPLACE, FileId::default(), false).unwrap();
            store.remove_entry("/new", renamed_file).unwrap();
            store.drop_link_named(replaced, 7, Some("/f")).unwrap();
        }
        place
    };
    let outcome = store.flush(&WorkItem::Chunk(ChunkKey::new(replaced, ChunkIndex(2))), &prepare, FlushPace::Complete).unwrap();
    assert!(renamed.get(), "the flush asked where the replaced file lives ({outcome:?})");
    flush_all(&store);
    let backend = fs::read(setup.backend().join("f")).unwrap();
    assert_eq!(backend.len(), small.len(), "the backend file is the renamed file's, without the replaced file's tail");
    assert!(backend == small);
}

#[test]
fn a_link_waits_while_a_directory_rename_holds_its_path() {
    // Found by the soak (cache-mode hard links, seed 59410): a link not yet in the backend,
    // made between the backend's move of its directory and the inode learning the new path,
    // made the old directory again (its parents are made as needed) and linked there; the
    // rename's removal of the old name then took that directory away, link and all.
    let setup = Setup::new("link-under-move");
    fs::create_dir(setup.backend().join("d")).unwrap();
    let store = setup.store();
    let bytes = pattern(CHUNK as usize, 4);
    let file = new_file(&store, "/p", &bytes);
    flush_all(&store);
    store.add_link_named(file, 8, Some("/d/x")).unwrap();
    store.hold_backend(ringfs_proto::RenameToken(77), &["/d", "/e"], std::time::Duration::from_secs(30)).unwrap();
    store.move_in_backend("/d", "/e", false).unwrap();
    // The link's flush comes now, before this server's step of the rename.
    assert_eq!(store.prepare(file).map_err(|error| error.errno()), Err(Errno::EBUSY), "the link waits for the rename");
    assert!(!setup.backend().join("d").exists(), "the old directory is not made again");
    store.rebase_backend_paths("/d", "/e", false).unwrap();
    store.release_backend(ringfs_proto::RenameToken(77));
    flush_all(&store);
    use std::os::unix::fs::MetadataExt;
    let inode = |path: &str| fs::metadata(setup.backend().join(path)).unwrap().ino();
    assert_eq!(inode("e/x"), inode("p"), "the link is made at the new path");
    assert!(!setup.backend().join("d").exists());
}

#[test]
fn a_file_renamed_over_a_new_file_is_not_replaced_by_that_files_late_creation() {
    // Found by the soak (cache-mode hard links, seed 71052): a file created at "/n" and not
    // yet flushed (its backend creation pending) had another file renamed over it. The
    // renamed file was bound to "/n", made there and flushed; then the replaced file's
    // flush applied its pending creation at "/n" — a new empty file over the renamed one's —
    // and wrote its own bytes into it. The rename now has the replaced file give up its
    // pending creation there first (`yield_backend_name`).
    let setup = Setup::new("late-creation");
    let store = setup.store();
    let renamed_bytes = pattern(CHUNK as usize / 2, 2);
    let renamed_file = new_file(&store, "/m", &renamed_bytes);
    flush_all(&store);
    let replaced = new_file(&store, "/n", &pattern(CHUNK as usize, 1));
    assert_eq!(store.yield_backend_name(replaced, "/n").unwrap(), (true, false), "its creation was pending");
    store.rebind(renamed_file, Some("/n"), Some("/m")).unwrap();
    store.prepare(renamed_file).unwrap();
    flush_all(&store);
    // The replaced file's flush comes late, before its inode has heard that it lost the name.
    let late = store.flush(
        &WorkItem::Chunk(ChunkKey::inode(replaced)),
        &|file| store.prepare(file).map_err(|error| error.errno()),
        FlushPace::Complete,
    );
    assert!(late.is_ok(), "{late:?}");
    let entry = ringfs_proto::EntryRef::new(renamed_file, ringfs_proto::FileKind::Regular);
    store.install_entry("/n", entry, ringfs_proto::InstallMode::REPLACE, FileId::default(), false).unwrap();
    store.remove_entry("/m", renamed_file).unwrap();
    store.drop_link_named(replaced, 7, Some("/n")).unwrap();
    flush_all(&store);
    assert_eq!(fs::read(setup.backend().join("n")).unwrap(), renamed_bytes, "the backend file is the renamed file's");
    // Nothing was pending at "/n" any more: a second rename over it gives nothing up.
    assert_eq!(store.yield_backend_name(renamed_file, "/n").unwrap(), (false, false));
}

#[test]
fn a_flush_that_learnt_a_place_before_a_cut_leaves_the_chunk_dirty() {
    let setup = Setup::new("cut-under-flush");
    let store = setup.store();
    let mut expected = pattern(2 * CHUNK as usize, 7);
    let file = new_file(&store, "/f", &expected);
    flush_all(&store);
    let backend = store.backend_file(file).unwrap();
    let second = ChunkKey::new(file, ChunkIndex(1));
    store.write(second, 0, &mut &pattern(10, 8)[..], template(0), 6, backend.as_ref()).unwrap();
    expected[CHUNK as usize..CHUNK as usize + 10].copy_from_slice(&pattern(10, 8));
    // Chunk 1's flush asks the inode where the file lives; right then the file is cut
    // inside chunk 1 (the inode's length, chunk 1's, then the cut recorded for the
    // backend) and written past the cut again.
    let cut = CHUNK as u64 + 100;
    let again = pattern(1900, 9);
    let changed = std::cell::Cell::new(false);
    let prepare = |asked: FileId| {
        let place = store.prepare(asked).map_err(|error| error.errno());
        if !changed.replace(true) {
            store.truncate_head(file, CHUNK as u64, cut, 7).unwrap();
            store.set_chunk_len(second, 100, template(0), 7, backend.as_ref(), None).unwrap();
            end_cut(&store, file, cut);
            store.write(second, 100, &mut &again[..], template(0), 8, backend.as_ref()).unwrap();
        }
        place
    };
    let outcome = store.flush(&WorkItem::Chunk(second), &prepare, FlushPace::Complete).unwrap();
    // Written now, its bytes past the cut would be cut off when the cut reaches the backend.
    assert_eq!(outcome, FlushOutcome::Flushed { bytes: 0, clean: false }, "nothing written before the cut, the chunk stays dirty");
    flush_all(&store);
    expected.truncate(cut as usize);
    expected.extend_from_slice(&again);
    let written = fs::read(setup.backend().join("f")).unwrap();
    assert_eq!(written.len(), expected.len(), "the bytes written after the cut are in the backend");
    assert!(written == expected);
}

/// A rename loads a file's chunks with `keep`: they stay (dirty) whatever the store evicts
/// before the rename marks them for the file's new place, so removing the old backend file
/// loses nothing.
#[test]
fn chunks_kept_for_a_rename_are_not_evicted() {
    let setup = Setup::new("keep");
    let store = ChunkStore::open(setup.config(3 * CHUNK as u64 + 4096, false)).unwrap();
    let data = pattern(2 * CHUNK as usize, 5);
    let file = new_file(&store, "/f", &data);
    flush_all(&store);
    let backend = store.backend_file(file).unwrap();
    for index in 0..2 {
        assert_eq!(store.load_chunk(ChunkKey::new(file, ChunkIndex(index)), backend.as_ref(), true).unwrap(), 0, "held whole");
    }
    // Reading a larger backend file needs every clean chunk's room.
    let big = pattern(4 * CHUNK as usize, 6);
    fs::write(setup.backend().join("big"), &big).unwrap();
    assert_eq!(read_file(&store, "/big", big.len() as u64), big);
    fs::remove_file(setup.backend().join("f")).unwrap();
    assert_eq!(read_file(&store, "/f", data.len() as u64), data, "the kept chunks were not evicted");
}

/// A flusher that takes work the moment it is queued (the `immediate` policy) while files
/// are created and written: every file reaches the backend. (A new file's inode was queued
/// before the index knew it: a flusher taking it at once found no chunk and dropped the
/// work, and the chunk, marked queued, was never queued again — its data never flushed.)
#[test]
fn files_created_while_a_flusher_takes_work_at_once_all_reach_the_backend() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let setup = Setup::new("eager");
    let store = ChunkStore::open(setup.config(0, false)).unwrap();
    let done = AtomicBool::new(false);
    let files = 2000;
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let prepare = |file: FileId| store.prepare(file).map_err(|error| error.errno());
            while !done.load(Ordering::Acquire) {
                let Some(queued) = store.next_work(u64::MAX) else { continue };
                match store.flush(&queued.item, &prepare, FlushPace::Complete).unwrap() {
                    FlushOutcome::Flushed { clean: true, .. } | FlushOutcome::Skipped => {}
                    _ => store.requeue(queued),
                }
            }
        });
        // Each create pauses where a flusher could take the new inode's work too early.
        crate::testing::PAUSE_BEFORE_INDEXING.set(std::time::Duration::from_micros(200));
        for index in 0..files {
            new_file(&store, &format!("/f{index}"), &pattern(index % 3 * 50, index as u8));
        }
        done.store(true, Ordering::Release);
    });
    flush_all(&store);
    let missing: Vec<usize> = (0..files)
        .filter(|index| fs::read(setup.backend().join(format!("f{index}"))).ok() != Some(pattern(index % 3 * 50, *index as u8)))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {files} files did not reach the backend whole: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
}

/// The value of the extended attribute `name` of `location`, if it has one.
fn backend_xattr(location: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    let path = std::ffi::CString::new(location.as_os_str().as_encoded_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    let mut value = vec![0u8; 256];
    // SAFETY: valid path and name; the buffer's length is passed.
    let count = unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
    (count >= 0).then(|| value[..count as usize].to_vec())
}

#[test]
fn an_inodes_flush_sets_mode_and_attributes_on_the_file_it_opened_not_on_one_moved_to_its_path() {
    // A flush wrote a file's mode and extended attributes by path after opening the file
    // for its data: another file renamed over the path in between (a rename's backend move
    // exchanges the two) got them instead.
    use std::os::unix::fs::PermissionsExt;
    let setup = Setup::new("meta-by-fd");
    let store = setup.store();
    let first = new_file(&store, "/a", &pattern(100, 1));
    new_file(&store, "/c", &pattern(200, 2));
    flush_all(&store);
    let backend = setup.backend();
    let mode = |name: &str| fs::symlink_metadata(backend.join(name)).unwrap().permissions().mode() & 0o7777;
    assert_eq!((mode("a"), mode("c")), (0o644, 0o644));
    store.set_attr(&ringfs_proto::SetAttr { mode: Some(0o600), ..ringfs_proto::SetAttr::new(first, 7) }).unwrap();
    store.set_xattr(first, "user.owner", b"first", 0, 8).unwrap();
    let moved = backend.clone();
    crate::testing::set(&crate::testing::AFTER_FLUSH_OPEN, move || {
        fs::rename(moved.join("a"), moved.join("a.old")).unwrap();
        fs::rename(moved.join("c"), moved.join("a")).unwrap();
    });
    flush_all(&store);
    assert!(crate::testing::ran(&crate::testing::AFTER_FLUSH_OPEN), "the flush ran the hook");
    assert_eq!(mode("a.old"), 0o600, "the flushed file has its new mode");
    assert_eq!(mode("a"), 0o644, "the file moved to its path keeps its own");
    let xattrs_kept = backend_xattr(&backend.join("a.old"), "user.owner");
    // (A backend without user attributes keeps none: then only the modes say something.)
    if xattrs_kept.is_some() {
        assert_eq!(xattrs_kept.as_deref(), Some(&b"first"[..]));
        assert_eq!(backend_xattr(&backend.join("a"), "user.owner"), None, "nor the other file's attributes");
    }
}

/// Moves the backend file of `file` from `from` to `to` in a store that dies at `death`
/// (the move fails); then reopens the store, as the restarted server would.
fn move_and_restart(setup: &Setup, store: ChunkStore, file: FileId, from: &str, to: &str, death: crate::testing::Death) -> ChunkStore {
    use crate::testing::{DEATH, Death};
    DEATH.set(death);
    let died = store.move_backend_file(file, from, to);
    DEATH.set(Death::Never);
    assert!(died.is_err(), "the move stopped at {death:?}: {died:?}");
    drop(store);
    ChunkStore::open(setup.config(0, true)).unwrap()
}

/// Writes `bytes` at the start of `file`, flushes, and checks that the backend file at
/// `path` got them over its `old` bytes.
fn update_reaches(setup: &Setup, store: &ChunkStore, file: FileId, path: &str, old: &[u8]) {
    let place = store.backend_file(file).unwrap().expect("a backend place");
    assert_eq!(place.path, path, "the restart finds the file where the backend has it");
    let update = pattern(100, 9);
    store.write(ChunkKey::new(file, ChunkIndex(0)), 0, &mut &update[..], template(0), 5, Some(&place)).unwrap();
    flush_all(store);
    let mut expected = old.to_vec();
    expected[..update.len()].copy_from_slice(&update);
    assert_eq!(fs::read(setup.backend().join(&path[1..])).unwrap(), expected, "new bytes reach the file at {path}");
}

#[test]
fn a_server_that_died_during_a_backend_move_finds_the_file_after_its_restart() {
    // A `dir` store that died between the backend's `rename` and writing the new place into
    // the inode's header came back with the old path: the file replaced by the rename (moved
    // there by the exchange) was then taken for the file's own, and got its bytes.
    use crate::testing::Death;
    let setup = Setup::new("move-restart");
    let first = pattern(CHUNK as usize + 10, 3);
    let store = ChunkStore::open(setup.config(0, true)).unwrap();
    let file = new_file(&store, "/a", &first);
    new_file(&store, "/b", b"replaced");
    flush_all(&store);
    let store = move_and_restart(&setup, store, file, "/a", "/b", Death::AfterRename);
    update_reaches(&setup, &store, file, "/b", &first);
    assert_eq!(fs::read(setup.backend().join("a")).unwrap(), b"replaced", "and not the file exchanged to the old name");

    // Died before the backend's rename: the file is still at its old name.
    let other = new_file(&store, "/c", &first);
    new_file(&store, "/d", b"stays");
    flush_all(&store);
    let store = move_and_restart(&setup, store, other, "/c", "/d", Death::BeforeRename);
    update_reaches(&setup, &store, other, "/c", &first);
    assert_eq!(fs::read(setup.backend().join("d")).unwrap(), b"stays");
}

#[test]
fn a_link_is_made_to_the_files_own_backend_file_when_another_is_put_at_its_path_meanwhile() {
    // Found by the kill test of hard links (seed 443): a file's link was made from its
    // backend path after the check that the path held the file's own backend file, and in
    // between another server's flush put another file there (the file renamed over this
    // one, whose link at the path was made before this inode heard that it lost the name):
    // the link went to the other file, and the two shared bytes in the backend.
    use std::os::unix::fs::MetadataExt;
    let setup = Setup::new("link-toctou");
    let store = setup.store();
    let first = new_file(&store, "/a", &pattern(100, 1));
    store.add_link_named(first, 8, Some("/a2")).unwrap();
    new_file(&store, "/c", &pattern(200, 2));
    flush_all(&store);
    let inode = |name: &str| fs::symlink_metadata(setup.backend().join(name)).unwrap().ino();
    let own = inode("a2");
    assert_eq!(inode("a"), own, "the first link is made");
    store.add_link_named(first, 9, Some("/l")).unwrap();
    let backend = setup.backend();
    crate::testing::set(&crate::testing::BEFORE_LINK, move || fs::rename(backend.join("c"), backend.join("a")).unwrap());
    flush_all(&store);
    assert!(crate::testing::ran(&crate::testing::BEFORE_LINK), "the link was made after the hook");
    assert_eq!(inode("l"), own, "the link is the file's own backend file");
    assert_eq!(fs::read(setup.backend().join("l")).unwrap(), pattern(100, 1));
}

/// Changes the bytes of the flushed file "/f" (holding `old`) with `change`, in a store that
/// dies right after the bytes change; then reopens the store and flushes: the backend must
/// hold what the restarted store shows.
fn change_cut_short_by_a_crash(tag: &str, old: &[u8], change: impl FnOnce(&ChunkStore, FileId) -> Result<(), StoreError>) -> Vec<u8> {
    let setup = Setup::new(tag);
    let store = ChunkStore::open(setup.config(0, true)).unwrap();
    let file = new_file(&store, "/f", old);
    flush_all(&store);
    crate::testing::DIE_AFTER_CHANGE.set(true);
    let died = change(&store, file);
    crate::testing::DIE_AFTER_CHANGE.set(false);
    assert!(died.is_err(), "the change stopped after the bytes changed");
    drop(store);
    let store = ChunkStore::open(setup.config(0, true)).unwrap();
    flush_all(&store);
    let size = store.stat(file).unwrap().len;
    let shown = read_file(&store, "/f", size);
    assert!(fs::read(setup.backend().join("f")).unwrap() == shown, "the backend has the bytes ringfs shows after a flush");
    shown
}

#[test]
fn a_write_cut_short_by_a_crash_is_flushed_after_the_restart() {
    // A `dir` store that died between changing a clean chunk's bytes and recording it
    // dirty came back with new bytes recorded clean: never flushed, ringfs and the backend
    // differed for good (found by `cache.rs: files_written_while_a_server_is_killed_…`).
    let new = pattern(100, 7);
    let shown = change_cut_short_by_a_crash("write-crash", &pattern(1000, 1), |store, file| {
        let place = store.backend_file(file).unwrap();
        store.write(ChunkKey::new(file, ChunkIndex(0)), 0, &mut &new[..], template(0), 9, place.as_ref()).map(drop)
    });
    assert!(shown[..new.len()] == new[..], "the restarted store shows the new bytes");
}
