//! One message of every kind, with every field set to something recognisable: the round-trip
//! tests check them, and the protocol fuzzers (`message::fuzz` tests, `tests/fuzz_server.rs`)
//! start their mutations from their encodings.

use super::*;
use crate::attr::FileKind;
use crate::message::Credentials;
use crate::wire::Bytes;

fn file(serial: u64) -> FileId {
    FileId { anchor: 0xA0 + serial as u32, serial }
}

fn sample_attr() -> Attr {
    Attr {
        mode: FileKind::Regular.mode_bits() | 0o644,
        uid: 1000,
        gid: 100,
        chunk_size: 1 << 20,
        len: 4096,
        file_id: file(0xDEADBEEF),
        nlink: 2,
        rdev: 0x0801,
        atime_ns: 1,
        mtime_ns: 2,
        ctime_ns: -3,
        flags: 2,
        backend_len: 1 << 40,
        last_chunk: ChunkIndex(1 << 20),
    }
}

/// One request of every kind (every variant, and both arms of every optional part).
pub fn requests() -> Vec<Request> {
    let chunk = ChunkKey::new(file(9), ChunkIndex(3));
    let template = ChunkTemplate { mode: 0o100644, uid: 1, gid: 2, chunk_size: 65536, backend_len: 3 << 20 };
    let entry = EntryRef::new(file(4), FileKind::Directory);
    let subtree = Subtree { token: RenameToken(77), from: "/a".into(), to: "/b/c".into(), exchange: true };
    vec![
        Request::Hello(Hello {
            version: PROTOCOL_VERSION,
            secret: vec![1, 2, 3],
            client_pid: 42,
            host_id: 7,
            from_server: true,
            memory_probe: Some((0x1000, 0xABCD)),
            client_id: 99,
            timeout_ms: 1500,
            clock_ns: -5,
            credentials: Credentials { uid: 1000, gid: 100, groups: vec![4, 27] },
        }),
        Request::GetMembers,
        Request::Join(Member {
            name: "n0".into(),
            tcp_address: "127.0.0.1:1".into(),
            unix_path: "/tmp/s".into(),
            host_id: 5,
            pid: 77,
            alive: true,
            incarnation: 2,
        }),
        Request::PushMembers(MemberList { epoch: 4, placement: "modular/koyama".into(), members: vec![] }),
        Request::MemberDigest(MemberDigest { epoch: 7, digest: 0x1234_5678_9abc_def0 }),
        Request::Ping,
        Request::Stats,
        Request::Shutdown(Shutdown { everyone: true }),
        Request::Create(Create { link_target: Some("/y".into()), rdev: 5, open_for: 99, access: 6, ..Create::new("/x", 0o100600, 4096) }),
        Request::Lookup(Lookup { path: "/x".into(), open_for: 99, access: 4 }),
        Request::Unlink(Unlink { path: "/f".into(), time_ns: 4 }),
        Request::Rmdir(Rmdir { path: "/d".into(), time_ns: 5 }),
        Request::Rename(Rename { from: "/a".into(), to: "/b".into(), time_ns: 3, flags: RenameFlags::EXCHANGE }),
        Request::Link(Link { from: "/a".into(), to: "/b".into(), time_ns: 3 }),
        Request::LinkFile(LinkFile { file: file(6), to: "/b".into(), time_ns: 3 }),
        Request::MissingFiles(FileList { files: vec![file(1), file(2)] }),
        Request::GetXattr(XattrName { file: file(7), name: "user.a".into(), time_ns: 0 }),
        Request::SetXattr(SetXattr {
            file: file(7),
            name: "user.b".into(),
            value: Bytes(vec![0, 1, 2]),
            flags: XattrFlags::CREATE,
            time_ns: 8,
        }),
        Request::ListXattrs(FileOnly { file: file(7) }),
        Request::RemoveXattr(XattrName { file: file(7), name: "trusted.c".into(), time_ns: 9 }),
        Request::TouchDir(DirTouch { path: "/d".into(), file: file(0), time_ns: 10, defer_for: "server-1".into(), subdirectories: 0 }),
        Request::TouchDir(DirTouch { path: String::new(), file: file(8), time_ns: 11, defer_for: String::new(), subdirectories: -1 }),
        Request::CollectTouches(FileOnly { file: file(8) }),
        Request::SetLock(FileLock { file: file(3), client: 9, owner: 7, kind: LockKind::Write, start: 10, end: u64::MAX, pid: 44 }),
        Request::Reserve(Reservation { file: file(3), offset: 5, end: 1 << 40, chunk_size: 1 << 20, bytes: 1 << 39, release: 0 }),
        Request::Reserve(Reservation { file: file(3), offset: 0, end: 0, chunk_size: 0, bytes: 0, release: 77 }),
        Request::PlaceAppend(AppendPlace { file: file(3), size: 1 << 33, len: 4096 }),
        Request::GmemAlloc(crate::gmem::GmemAlloc {
            job: 5,
            sequence: 1,
            rank: 2,
            ranks: 4,
            host_id: 77,
            len: 1 << 30,
            block_size: 1 << 18,
            distribution: crate::gmem::Distribution::Cyclic(2),
            cache: crate::gmem::CacheMode::Cooperative,
            endpoint: "127.0.0.1:4000".into(),
        }),
        Request::CoGet(crate::gmem::CoGet { array: 9, block: 2, rank: 1, exclusive: true, full_write: false, request: 3 }),
        Request::CoPut(crate::gmem::CoPut { array: 9, block: 2, rank: 1, dirty: true }),
        Request::CoForward(crate::gmem::CoForward {
            array: 9,
            block: 2,
            requester: 3,
            request: 17,
            exclusive: false,
            expected: 3,
            relay: vec![crate::gmem::RelayTarget { rank: 4, request: 2 }],
        }),
        Request::CoInvalidate(crate::gmem::CoInvalidate { array: 9, block: 2, write_back: true, keep_shared: true, expected: 5 }),
        Request::CoFill(crate::gmem::CoFill {
            array: 9,
            block: 2,
            request: 5,
            relay: vec![crate::gmem::RelayTarget { rank: 0, request: 1 }, crate::gmem::RelayTarget { rank: 7, request: 40 }],
        }),
        Request::GmemDefine(gmem_layout()),
        Request::GmemDrop(crate::gmem::ArrayOnly { array: 9 }),
        Request::GmemRead(crate::gmem::BlockRange { array: 9, block: 3, offset: 8, len: 4096 }),
        Request::GmemWrite(crate::gmem::BlockRange { array: 9, block: 4, offset: 0, len: 1 << 18 }),
        Request::GmemLease(crate::gmem::BlockRange { array: 9, block: 5, offset: 4096, len: 1 << 17 }),
        Request::GmemAtomic(crate::gmem::GmemAtomic {
            at: crate::gmem::BlockRange { array: 9, block: 0, offset: 16, len: 8 },
            op: crate::gmem::AtomicOp::CompareSwap(crate::gmem::CompareSwap { expected: 1, new: 2 }),
        }),
        Request::GmemAtomic(crate::gmem::GmemAtomic {
            at: crate::gmem::BlockRange { array: 9, block: 0, offset: 0, len: 8 },
            op: crate::gmem::AtomicOp::FetchAdd(3),
        }),
        Request::GmemBarrier(crate::gmem::GmemBarrier { job: 5, epoch: 7, rank: 1, ranks: 4 }),
        Request::GmemFree(crate::gmem::GmemFree { job: 5, array: 9, rank: 0, ranks: 4 }),
        Request::TestLock(FileLock { file: file(3), client: 9, owner: 8, kind: LockKind::Read, start: 0, end: 5, pid: 45 }),
        Request::ReadDir(ReadDir { path: "/".into(), after: Some("m".into()), limit: 100 }),
        Request::Find(Find {
            root: "/d".into(),
            filter: FindFilter { newer_than_ns: Some(5), size: Some(3901), name: Some("*01*".into()) },
        }),
        Request::Find(Find { root: "/".into(), filter: FindFilter::default() }),
        Request::LookupDir(PathOnly { path: "/d".into() }),
        Request::PrepareRmdir(PathOnly { path: "/d".into() }),
        Request::InstallEntry(InstallEntry {
            path: "/b".into(),
            entry,
            mode: InstallMode::EXCHANGE,
            expect: file(8),
            replace_empty_dir: true,
            token: RenameToken(3),
        }),
        Request::RemoveEntry(RemoveEntry { path: "/b".into(), expect: file(8), token: RenameToken(0) }),
        Request::NameLock(NameLock { path: "/b".into(), token: RenameToken(4), acquire: true }),
        Request::NamespaceLock(NamespaceLock { token: RenameToken(7), acquire: true }),
        Request::Freeze(subtree.clone()),
        Request::MoveSubtree(subtree.clone()),
        Request::PutEntries(PutEntries { token: RenameToken(7), entries: vec![MovedEntry { path: "/b/c/x".into(), entry }] }),
        Request::Thaw(subtree),
        Request::Stat(FileOnly { file: file(1) }),
        Request::Open(OpenFile { file: file(2), client: 99 }),
        Request::Close(Close { client: 99, files: vec![file(1), file(2)] }),
        Request::SetAttr(SetAttr { mode: Some(0o600), gid: Some(5), mtime_ns: Some(-1), times_explicit: true, ..SetAttr::new(file(3), 6) }),
        Request::AsUser(AsUser::new(
            Credentials { uid: 7, gid: 8, groups: vec![9] },
            &Request::Unlink(Unlink { path: "/u".into(), time_ns: 1 }),
        )),
        Request::ForgetDirAttrs(FileOnly { file: file(12) }),
        Request::Truncate(Truncate { file: file(3), size: 1 << 33, time_ns: 1 }),
        Request::MarkExtended(MarkExtended { file: file(1), last_chunk: ChunkIndex(8) }),
        Request::AddLink(NameCount { file: file(1), time_ns: 2, name: Some("/m/b".into()) }),
        Request::ClampChunkTimes(LinkCount { file: file(1), time_ns: 3 }),
        Request::DropLink(NameCount::new(file(1), 2)),
        Request::Fsync(FileOnly { file: file(1) }),
        Request::LastChunk(FileOnly { file: file(2) }),
        Request::RemoveChunks(RemoveChunks { file: file(2), from_index: ChunkIndex(1), cut_at_ns: Some(7) }),
        Request::Write(Write {
            chunk,
            offset: 5,
            source: WriteSource::Remote(RemoteBytes { address: 99, len: 100 }),
            template,
            time_ns: 8,
        }),
        Request::Write(Write { chunk, offset: 0, source: WriteSource::Inline, template, time_ns: 8 }),
        Request::Read(Read { chunk, offset: 1, len: 2, lease: true, release: vec![LeaseId(4), LeaseId(5)], backend_len: 7 }),
        Request::SetChunkLen(SetChunkLen {
            chunk,
            len: 10,
            template,
            backend: Some(BackendFileReply { path: "/f".into(), len: 5 }),
            cut_at_ns: None,
        }),
        Request::Release(Release { leases: vec![LeaseId(1), LeaseId(2), LeaseId(3)] }),
        Request::Sync(Sync { ticket: 0 }),
        Request::Sync(Sync { ticket: 12 }),
        Request::FlushPrepare(FileOnly { file: file(8) }),
        Request::ReadBackendDir(ReadDir { path: "/d".into(), after: None, limit: 7 }),
        Request::LoadChunk(LoadChunk { chunk: ChunkKey::new(file(3), ChunkIndex(2)), backend_len: 9, backend: None, keep: true }),
        Request::BackendOf(FileOnly { file: file(3) }),
        Request::Rebind(Rebind { file: file(3), path: Some("/new".into()), from: Some("/old".into()) }),
        Request::Redirty(FileOnly { file: file(3) }),
        Request::YieldBackendName(BackendName { file: file(3), name: "/taken".into() }),
        Request::MoveBackendFile(BackendMove { file: file(3), from: "/old".into(), to: "/new".into() }),
        Request::SettleBackendName(PathOnly { path: "/new".into() }),
        Request::Changes(ChangesSince { epoch: 5, after: 17, client: 9 }),
        Request::ProbeFor(ProbeFor { name: "server-3".into(), timeout_ms: 2000 }),
    ]
}

/// One response of every kind.
pub fn responses() -> Vec<Response> {
    vec![
        Response::Error(Errno::ENOENT),
        Response::Done,
        Response::Hello(HelloReply { version: 1, server_name: "s".into(), memory_access: true, memory_probe: Some((5, 6)) }),
        Response::Members(MemberList { epoch: 1, placement: String::new(), members: vec![] }),
        Response::Attr(sample_attr()),
        Response::Opened(Opened { attr: sample_attr(), registered: true }),
        Response::Written(77),
        Response::Read(ReadReply { attr: Some(sample_attr()), len: 5, lease: Some(Lease { id: LeaseId(1), address: 2, stored: 3 }) }),
        Response::Read(ReadReply { attr: None, len: 0, lease: None }),
        Response::Count(3),
        Response::DirTouched(file(4)),
        Response::TouchTime(1_700_000_000_000_000_000),
        Response::LockHolder(Some(FileLock { file: file(3), client: 9, owner: 7, kind: LockKind::Unlock, start: 1, end: 2, pid: 3 })),
        Response::LockHolder(None),
        Response::GmemArray(gmem_layout()),
        Response::CoGrant(crate::gmem::CoGrant { state: 2, source: 1 }),
        Response::ChangeList(ChangeList {
            epoch: 5,
            last: 20,
            complete: true,
            files: vec![file(3)],
            names: vec!["/a".into()],
            moves: vec![NameMove { from: "/a".into(), to: "/b".into(), exchange: false }],
        }),
        Response::Tail(TailSummary { last: Some((ChunkIndex(4), 5)), newest_mtime_ns: 6 }),
        Response::Tail(TailSummary::default()),
        Response::Found(FindResult { scanned: 10, matched: 2, undecided: vec!["/a".into()] }),
        Response::DirPage(DirPage {
            entries: vec![
                DirEntry { name: "a".into(), entry: EntryRef::new(file(1), FileKind::Regular), attr: Some(sample_attr()) },
                DirEntry { name: "b".into(), entry: EntryRef::new(file(2), FileKind::Fifo), attr: None },
            ],
            more: true,
            removed: vec!["c".into()],
        }),
        Response::HasEntries(HasEntries { any: false, removed: vec!["c".into(), "d".into()] }),
        Response::SyncProgress(SyncProgress { ticket: 5, remaining: 6 }),
        Response::Replaced(Some(EntryRef::new(file(5), FileKind::Symlink))),
        Response::Replaced(None),
        Response::Stats(ServerStats { name: "s".into(), entries: 1, chunks: 2, bytes: 3, open_unlinked: 4, ..ServerStats::default() }),
        Response::Stats(ServerStats {
            name: "g".into(),
            gmem: Some(GmemStats { dram_bytes: 1, spilled_bytes: 2, ssd_read_bytes: 3, ssd_write_bytes: 4 }),
            peer_transports: vec![PeerTransport { server: "h".into(), transports: "tcp/lo (am, rma)".into() }],
            ..ServerStats::default()
        }),
        Response::Stats(ServerStats {
            name: "s".into(),
            cache: Some(Box::new(CacheStats {
                backend: "/lustre/project".into(),
                mount_path: "/".into(),
                policy: "io-aware".into(),
                dirty_chunks: 1,
                dirty_bytes: 2,
                pending_entries: 3,
                flushed_chunks: 4,
                flushed_bytes: 5,
                loaded_chunks: 6,
                evicted_chunks: 7,
                written_through_bytes: 8,
                flushing: true,
                longest_stop_us: 9,
            })),
            ..ServerStats::default()
        }),
        Response::BackendTarget(Some(BackendPlace { path: "/lustre/project/a".into(), dev: 64769, ino: 1234 })),
        Response::BackendTarget(None),
        Response::BackendFile(Some(BackendFileReply { path: "/a".into(), len: 7 })),
        Response::Files(FileList { files: vec![file(3)] }),
        Response::Value(Bytes(b"v".to_vec())),
        Response::Names(vec!["user.a".into(), "user.b".into()]),
    ]
}

fn gmem_layout() -> crate::gmem::ArrayLayout {
    crate::gmem::ArrayLayout {
        array: 9,
        len: 1 << 30,
        block_size: 1 << 18,
        distribution: crate::gmem::Distribution::Block,
        homes: vec!["server-0".into(), "server-1".into()],
        cache: crate::gmem::CacheMode::HomeServed,
        nodes: vec!["127.0.0.1:4000".into(), "127.0.0.1:4001".into()],
    }
}
