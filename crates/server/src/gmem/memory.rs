//! The blocks of the global arrays a server homes: in DRAM up to a budget, the least
//! recently used spilled to a directory on the node-local SSD and read back on access.
//!
//! For arrays whose ranks cache cooperatively ([`HomeReads::Once`]), a block read back from
//! the SSD for a read enters the LRU order at its cold end (LRU insertion, as scan-resistant
//! caches do): it becomes recently used only when it is used again. The home serves such a
//! block once per wave of readers (the others get it from each other), and a plain LRU order
//! would trade a resident block for every block a scan reads back, none of them read again:
//! a scan of twice the DRAM then reads everything back, where cold entry costs one resident
//! block. For other arrays ([`HomeReads::Repeated`]), and for writes, blocks enter at the
//! hot end: there the next rank's read of the same block comes to the home too.
//!
//! A block is *resident* (its bytes in DRAM), *on the SSD*, or *moving* between the two (an
//! I/O is under way, without the table's lock; whoever needs it waits). A block never
//! written is neither: reading it gives zeros, and writing it makes it resident. An access
//! *pins* its block for as long as it touches the bytes, so eviction passes it over.
//! Invariant (checked in debug builds): `dram_used` is the size of the resident and moving
//! blocks, and `lru` holds exactly the resident ones, by their last use.
//!
//! A block's bytes are shared (`Arc<Buffer>`): a read may *lease* them to a client on this
//! host, which copies them straight out of the server's memory; a write to a leased block
//! copies it first (copy-on-write), so a lease never changes under its reader.
//!
//! Spill files (one per array, a block at `block × block_size`) are opened with `O_DIRECT`
//! where the file system allows it, so SSD reads are not secretly page-cache reads; where it
//! does not (tmpfs), pages are dropped after every write (`POSIX_FADV_DONTNEED`). An
//! emulated SSD ([`Throttle`]) can slow the spill I/O down to a chosen bandwidth and latency.

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ringfs_proto::Errno;
use ringfs_rpc::throttle::{self, DeviceModel, Throttle};

/// Ticks of the LRU order above this are uses; below it, blocks that entered cold.
const HOT: u64 = 1 << 62;

/// Alignment of block buffers and spill I/O (`O_DIRECT`).
const ALIGNMENT: usize = 4096;

/// How the reads of an array's blocks come to their home.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HomeReads {
    /// As often as ranks need the block (uncached arrays, caches only homes serve): a
    /// block read back from the SSD is likely read again soon.
    Repeated,
    /// Once per wave of readers (cooperative caches forward the other copies).
    Once,
}

/// How a server keeps global memory.
#[derive(Clone, Debug)]
pub struct GlobalMemoryConfig {
    /// Bytes of blocks kept in DRAM before the least recently used go to the SSD.
    pub dram_bytes: u64,
    /// Where spilled blocks go.
    pub spill_dir: PathBuf,
    /// Slow spill I/O down to this (off by default).
    pub ssd: Option<DeviceModel>,
}

/// A resident block's bytes: shared with leases, replaced when written while leased.
type Block = Arc<Mutex<Arc<Buffer>>>;

/// Where the bytes of a block are.
enum Residence {
    Dram(Block),
    Ssd,
    Moving,
}

struct Slot {
    residence: Residence,
    /// Accesses touching the bytes now.
    pins: u32,
    /// When it was last used (its key in `lru` while resident).
    last_use: u64,
    /// Read back for a read and not used since: the access that loaded it does not count
    /// as a use.
    cold: bool,
    /// The SSD holds the block's current bytes (a resident copy may differ: `dirty`).
    on_ssd: bool,
    dirty: bool,
}

type BlockKey = (u64, u64);

#[derive(Default)]
struct Table {
    /// Block size of each array held here.
    arrays: HashMap<u64, u32>,
    /// The arrays whose blocks read back for a read enter the LRU order cold.
    read_once: HashSet<u64>,
    blocks: HashMap<BlockKey, Slot>,
    lru: BTreeMap<u64, BlockKey>,
    /// Ticks of uses, counting up from [`HOT`]; blocks entering cold take ticks counting
    /// down from it (`cold_entries`).
    clock: u64,
    cold_entries: u64,
    dram_used: u64,
}

/// Counters of a server's global memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub dram_bytes: u64,
    pub spilled_bytes: u64,
    pub ssd_read_bytes: u64,
    pub ssd_write_bytes: u64,
}

/// The global memory blocks of one server.
pub struct GlobalMemory {
    config: GlobalMemoryConfig,
    table: Mutex<Table>,
    /// Woken when a block stops moving.
    moved: Condvar,
    spill_files: Mutex<HashMap<u64, Arc<SpillFile>>>,
    /// Whether this memory made its spill directory (it then removes it when dropped).
    made_spill_dir: AtomicBool,
    ssd: Option<Throttle>,
    ssd_read_bytes: AtomicU64,
    ssd_write_bytes: AtomicU64,
}

/// What an access does with the bytes of a block (pinned, locked).
pub enum Access<'a> {
    Read {
        offset: usize,
        into: &'a mut [u8],
    },
    Write {
        offset: usize,
        from: &'a [u8],
    },
    /// A 64-bit atomic operation on the word at `offset`; the word before goes into `old`.
    Atomic {
        offset: usize,
        op: ringfs_proto::gmem::AtomicOp,
        old: &'a mut u64,
    },
    /// The block's bytes themselves, shared (`None` for a block never written: zeros).
    Lease {
        into: &'a mut Option<Arc<Buffer>>,
    },
}

impl Access<'_> {
    fn changes(&self) -> bool {
        !matches!(self, Access::Read { .. } | Access::Lease { .. })
    }

    /// Applies the access to a resident block's bytes (copying them first if a write finds
    /// them leased).
    fn apply_to(&mut self, block: &Mutex<Arc<Buffer>>) {
        let mut shared = lock_buffer(block);
        if let Access::Lease { into } = self {
            **into = Some(shared.clone());
            return;
        }
        if self.changes() && Arc::get_mut(&mut shared).is_none() {
            let mut copy = Buffer::zeroed(shared.len());
            copy.copy_from_slice(&shared);
            *shared = Arc::new(copy);
        }
        match Arc::get_mut(&mut shared) {
            Some(bytes) => self.apply(bytes),
            // A read of a leased block.
            None => {
                if let Access::Read { offset, into } = self {
                    into.copy_from_slice(&shared[*offset..*offset + into.len()]);
                }
            }
        }
    }

    fn apply(&mut self, bytes: &mut [u8]) {
        match self {
            Access::Lease { .. } => {}
            Access::Read { offset, into } => into.copy_from_slice(&bytes[*offset..*offset + into.len()]),
            Access::Write { offset, from } => bytes[*offset..*offset + from.len()].copy_from_slice(from),
            Access::Atomic { offset, op, old } => {
                let word = &mut bytes[*offset..*offset + 8];
                let value = u64::from_le_bytes(word.try_into().expect("8 bytes"));
                **old = value;
                word.copy_from_slice(&op.apply(value).to_le_bytes());
            }
        }
    }

    /// The bytes of the block it touches: `offset..end`.
    fn span(&self) -> (usize, usize) {
        match self {
            Access::Read { offset, into } => (*offset, *offset + into.len()),
            Access::Write { offset, from } => (*offset, *offset + from.len()),
            Access::Atomic { offset, .. } => (*offset, *offset + 8),
            Access::Lease { .. } => (0, 0),
        }
    }
}

/// What to do next about an access.
enum Step {
    /// The block is pinned and resident: access it.
    Access(Block),
    /// Never written, and only read: zeros.
    Zeros,
    /// Write these blocks to the SSD (they are moving), then look again.
    Evict(Vec<(BlockKey, Block)>),
    /// Read the block from the SSD (it is moving) after writing these, then look again;
    /// `hot`: for a write (it enters the LRU order as used).
    Load { victims: Vec<(BlockKey, Block)>, hot: bool },
    /// Another access moves the block: wait.
    Wait,
}

impl GlobalMemory {
    pub fn new(config: GlobalMemoryConfig) -> GlobalMemory {
        let ssd = config.ssd.map(Throttle::new);
        GlobalMemory {
            config,
            table: Mutex::new(Table::default()),
            moved: Condvar::new(),
            spill_files: Mutex::new(HashMap::new()),
            made_spill_dir: AtomicBool::new(false),
            ssd,
            ssd_read_bytes: AtomicU64::new(0),
            ssd_write_bytes: AtomicU64::new(0),
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock()
    }

    /// An array with blocks of `block_size` bytes is homed (partly) here, its blocks read as
    /// `reads` says. Defining it again changes nothing; with another block size it is
    /// EEXIST (an array's blocks never change size).
    pub fn define(&self, array: u64, block_size: u32, reads: HomeReads) -> Result<(), Errno> {
        let mut table = self.table();
        match table.arrays.get(&array) {
            Some(known) if *known != block_size => Err(Errno::EEXIST),
            Some(_) => Ok(()),
            None => {
                table.arrays.insert(array, block_size);
                if reads == HomeReads::Once {
                    table.read_once.insert(array);
                }
                Ok(())
            }
        }
    }

    /// Whether `array` is held here, with its block size.
    pub fn block_size(&self, array: u64) -> Option<u32> {
        self.table().arrays.get(&array).copied()
    }

    /// An array is freed: its blocks and spill file go.
    pub fn drop_array(&self, array: u64) {
        {
            let mut table = self.table();
            let table = &mut *table;
            let Some(block_size) = table.arrays.remove(&array) else { return };
            table.read_once.remove(&array);
            let keys: Vec<BlockKey> = table.blocks.keys().filter(|(owner, _)| *owner == array).copied().collect();
            for key in keys {
                let Some(slot) = table.blocks.remove(&key) else { continue };
                match slot.residence {
                    Residence::Dram(_) => {
                        table.lru.remove(&slot.last_use);
                        table.dram_used -= u64::from(block_size);
                    }
                    // (The I/O under way finds its block gone and leaves the count alone.)
                    Residence::Moving => table.dram_used -= u64::from(block_size),
                    Residence::Ssd => {}
                }
            }
            Self::debug_check(table);
        }
        if let Some(file) = self.spill_files.lock().remove(&array) {
            let _ = std::fs::remove_file(&file.path);
        }
        self.moved.notify_all();
    }

    /// Counters.
    pub fn stats(&self) -> MemoryStats {
        let table = self.table();
        let spilled_bytes = table
            .blocks
            .iter()
            .filter(|(_, slot)| matches!(slot.residence, Residence::Ssd))
            .map(|(key, _)| u64::from(table.arrays.get(&key.0).copied().unwrap_or(0)))
            .sum();
        MemoryStats {
            dram_bytes: table.dram_used,
            spilled_bytes,
            ssd_read_bytes: self.ssd_read_bytes.load(Ordering::Relaxed),
            ssd_write_bytes: self.ssd_write_bytes.load(Ordering::Relaxed),
        }
    }

    /// Runs `access` on block `block` of `array`. ESTALE if the array is not (or no longer)
    /// held here, EFAULT if the access leaves the block, EIO if the SSD fails.
    pub fn access(&self, array: u64, block: u64, mut access: Access) -> Result<(), Errno> {
        let key = (array, block);
        let block_size = self.block_size(array).ok_or(Errno::ESTALE)? as usize;
        let (start, end) = access.span();
        if start > end || end > block_size {
            return Err(Errno::EFAULT);
        }
        loop {
            match self.next_step(key, block_size, access.changes()) {
                Step::Access(buffer) => {
                    access.apply_to(&buffer);
                    self.unpin(key);
                    return Ok(());
                }
                Step::Zeros => {
                    if !matches!(access, Access::Lease { .. }) {
                        let mut zeros = vec![0u8; block_size];
                        access.apply(&mut zeros);
                    }
                    return Ok(());
                }
                Step::Evict(victims) => self.write_out(victims)?,
                Step::Load { victims, hot } => {
                    self.write_out(victims)?;
                    self.load(key, block_size, hot)?;
                }
                Step::Wait => {
                    let mut table = self.table();
                    if matches!(table.blocks.get(&key).map(|slot| &slot.residence), Some(Residence::Moving)) {
                        self.moved.wait(&mut table);
                    }
                }
            }
        }
    }

    /// Looks at the block under the table's lock and decides.
    fn next_step(&self, key: BlockKey, block_size: usize, changes: bool) -> Step {
        let mut table = self.table();
        Self::debug_check(&table);
        if !table.arrays.contains_key(&key.0) {
            // Dropped meanwhile: the access finds zeros (its caller's array is gone).
            return Step::Zeros;
        }
        table.clock += 1;
        let now = HOT + table.clock;
        let table = &mut *table;
        match table.blocks.get_mut(&key) {
            Some(slot) => match &slot.residence {
                Residence::Dram(buffer) => {
                    let buffer = buffer.clone();
                    if slot.cold && !changes {
                        // The access that read it back.
                        slot.cold = false;
                    } else {
                        slot.cold = false;
                        table.lru.remove(&slot.last_use);
                        table.lru.insert(now, key);
                        slot.last_use = now;
                    }
                    slot.pins += 1;
                    slot.dirty |= changes;
                    Step::Access(buffer)
                }
                Residence::Moving => Step::Wait,
                Residence::Ssd => {
                    let victims = self.make_room(table, block_size as u64);
                    let slot = table.blocks.get_mut(&key).expect("the block is still here");
                    slot.residence = Residence::Moving;
                    table.dram_used += block_size as u64;
                    Step::Load { victims, hot: changes || !table.read_once.contains(&key.0) }
                }
            },
            None if !changes => Step::Zeros,
            None => {
                let victims = self.make_room(table, block_size as u64);
                if !victims.is_empty() {
                    return Step::Evict(victims);
                }
                let buffer = Arc::new(Mutex::new(Arc::new(Buffer::zeroed(block_size))));
                table.blocks.insert(
                    key,
                    Slot { residence: Residence::Dram(buffer.clone()), pins: 1, last_use: now, cold: false, on_ssd: false, dirty: true },
                );
                table.lru.insert(now, key);
                table.dram_used += block_size as u64;
                Step::Access(buffer)
            }
        }
    }

    /// Picks resident, unpinned blocks, least recently used first, until `needed` more bytes
    /// fit in the budget: clean copies (the SSD has them) are dropped at once, the others
    /// marked moving and returned, to be written out. Pinned blocks are passed over (the
    /// budget may be exceeded while they are in use).
    fn make_room(&self, table: &mut Table, needed: u64) -> Vec<(BlockKey, Block)> {
        let mut victims = Vec::new();
        let mut freeing = 0;
        let candidates: Vec<(u64, BlockKey)> = table.lru.iter().map(|(tick, key)| (*tick, *key)).collect();
        for (tick, key) in candidates {
            if table.dram_used - freeing + needed <= self.config.dram_bytes {
                break;
            }
            let Some(slot) = table.blocks.get_mut(&key) else { continue };
            if slot.pins > 0 {
                continue;
            }
            let Residence::Dram(buffer) = std::mem::replace(&mut slot.residence, Residence::Moving) else { continue };
            table.lru.remove(&tick);
            let len = buffer_len(&buffer);
            if slot.on_ssd && !slot.dirty {
                slot.residence = Residence::Ssd;
                table.dram_used -= len;
                continue;
            }
            freeing += len;
            victims.push((key, buffer));
        }
        victims
    }

    /// Writes evicted blocks to the SSD and marks them spilled (their DRAM goes).
    fn write_out(&self, victims: Vec<(BlockKey, Block)>) -> Result<(), Errno> {
        let mut outcome = Ok(());
        for (key, buffer) in victims {
            let len = buffer_len(&buffer);
            let written = self.spill_file(key.0).and_then(|file| {
                throttle::pass(self.ssd.as_ref(), len);
                let bytes = lock_buffer(&buffer);
                file.write_block(key.1 * len, &bytes)
            });
            let mut table = self.table();
            let table = &mut *table;
            if let Some(slot) = table.blocks.get_mut(&key) {
                match &written {
                    Ok(()) => {
                        self.ssd_write_bytes.fetch_add(len, Ordering::Relaxed);
                        slot.residence = Residence::Ssd;
                        slot.on_ssd = true;
                        slot.dirty = false;
                        table.dram_used -= len;
                    }
                    Err(_) => {
                        // Kept in DRAM (over the budget) rather than lost.
                        table.clock += 1;
                        slot.residence = Residence::Dram(buffer.clone());
                        slot.last_use = HOT + table.clock;
                        table.lru.insert(slot.last_use, key);
                    }
                }
            }
            self.moved.notify_all();
            if let Err(errno) = written {
                log::error!("global memory: writing block {} of array {:x} to the SSD failed: {errno}", key.1, key.0);
                outcome = Err(Errno::EIO);
            }
        }
        outcome
    }

    /// Reads a spilled block (marked moving, its DRAM counted) back into DRAM, at the hot
    /// end of the LRU order (`hot`: for a write) or at its cold end.
    fn load(&self, key: BlockKey, block_size: usize, hot: bool) -> Result<(), Errno> {
        let mut buffer = Buffer::zeroed(block_size);
        let read = self.spill_file(key.0).and_then(|file| {
            throttle::pass(self.ssd.as_ref(), block_size as u64);
            file.read_block(key.1 * block_size as u64, &mut buffer)
        });
        let mut table = self.table();
        let table = &mut *table;
        table.clock += 1;
        if let Some(slot) = table.blocks.get_mut(&key) {
            match read {
                Ok(()) => {
                    self.ssd_read_bytes.fetch_add(block_size as u64, Ordering::Relaxed);
                    slot.residence = Residence::Dram(Arc::new(Mutex::new(Arc::new(buffer))));
                    slot.dirty = false;
                    slot.cold = !hot;
                    slot.last_use = if hot {
                        HOT + table.clock
                    } else {
                        table.cold_entries += 1;
                        HOT - table.cold_entries
                    };
                    table.lru.insert(slot.last_use, key);
                }
                Err(_) => {
                    slot.residence = Residence::Ssd;
                    table.dram_used -= block_size as u64;
                }
            }
        }
        self.moved.notify_all();
        read.map_err(|errno| {
            log::error!("global memory: reading block {} of array {:x} from the SSD failed: {errno}", key.1, key.0);
            Errno::EIO
        })
    }

    /// The table's invariant (see the module doc), checked in debug builds.
    fn debug_check(table: &Table) {
        if cfg!(debug_assertions) {
            let mut counted = 0;
            let mut resident = 0;
            for (key, slot) in &table.blocks {
                let size = u64::from(table.arrays.get(&key.0).copied().unwrap_or(0));
                match slot.residence {
                    Residence::Dram(_) => {
                        counted += size;
                        resident += 1;
                        debug_assert_eq!(table.lru.get(&slot.last_use), Some(key), "a resident block is in the LRU order");
                    }
                    Residence::Moving => counted += size,
                    Residence::Ssd => {}
                }
            }
            debug_assert_eq!(table.dram_used, counted, "dram_used counts the resident and moving blocks");
            debug_assert_eq!(table.lru.len(), resident, "the LRU order holds the resident blocks only");
        }
    }

    fn unpin(&self, key: BlockKey) {
        if let Some(slot) = self.table().blocks.get_mut(&key) {
            slot.pins -= 1;
        }
    }

    /// Removes every spill file, and the spill directory where this memory made it (the
    /// default is under `/tmp`): arrays do not outlive their server. Called when the server
    /// stops and when the memory is dropped; an access still under way keeps reading and
    /// writing its file's open descriptor.
    pub fn remove_spill_files(&self) {
        for file in self.spill_files.lock().values() {
            let _ = std::fs::remove_file(&file.path);
        }
        if self.made_spill_dir.load(Ordering::Relaxed) {
            let _ = std::fs::remove_dir(&self.config.spill_dir);
        }
    }

    /// The spill file of `array`, made on first use.
    fn spill_file(&self, array: u64) -> Result<Arc<SpillFile>, Errno> {
        let mut files = self.spill_files.lock();
        if let Some(file) = files.get(&array) {
            return Ok(file.clone());
        }
        if !self.config.spill_dir.is_dir() {
            std::fs::create_dir_all(&self.config.spill_dir).map_err(Errno::from)?;
            self.made_spill_dir.store(true, Ordering::Relaxed);
        }
        let path = self.config.spill_dir.join(format!("array-{array:016x}"));
        let file = Arc::new(SpillFile::open(path)?);
        files.insert(array, file.clone());
        Ok(file)
    }
}

impl Drop for GlobalMemory {
    fn drop(&mut self) {
        self.remove_spill_files();
    }
}

fn buffer_len(buffer: &Block) -> u64 {
    lock_buffer(buffer).len() as u64
}

fn lock_buffer(buffer: &Mutex<Arc<Buffer>>) -> MutexGuard<'_, Arc<Buffer>> {
    buffer.lock()
}

/// A block's bytes in DRAM, aligned for direct I/O.
pub struct Buffer {
    pointer: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: a Buffer owns its allocation; shared, it is only read (writers copy it first, see
// `Access::apply_to`).
unsafe impl Send for Buffer {}
// SAFETY: as above: `&Buffer` gives read access only.
unsafe impl Sync for Buffer {}

impl Buffer {
    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len.max(1), ALIGNMENT).expect("block sizes are small powers of two")
    }

    pub fn zeroed(len: usize) -> Buffer {
        // SAFETY: the layout has a non-zero size.
        let pointer = unsafe { std::alloc::alloc_zeroed(Buffer::layout(len)) };
        let pointer = std::ptr::NonNull::new(pointer).unwrap_or_else(|| std::alloc::handle_alloc_error(Buffer::layout(len)));
        Buffer { pointer, len }
    }
}

impl std::ops::Deref for Buffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialized bytes (zeroed at allocation) owned by this buffer.
        unsafe { std::slice::from_raw_parts(self.pointer.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.pointer.as_ptr(), self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.pointer.as_ptr(), Buffer::layout(self.len)) };
    }
}

/// The spill file of one array.
struct SpillFile {
    path: PathBuf,
    file: File,
    /// Opened with `O_DIRECT` (otherwise pages are dropped after each write).
    direct: bool,
}

impl SpillFile {
    fn open(path: PathBuf) -> Result<SpillFile, Errno> {
        let mut options = std::fs::OpenOptions::new();
        options.read(true).write(true).create(true).truncate(true);
        if let Ok(file) = options.clone().custom_flags(libc::O_DIRECT).open(&path) {
            return Ok(SpillFile { path, file, direct: true });
        }
        let file = options.open(&path).map_err(Errno::from)?;
        Ok(SpillFile { path, file, direct: false })
    }

    fn write_block(&self, offset: u64, bytes: &[u8]) -> Result<(), Errno> {
        self.file.write_all_at(bytes, offset).map_err(Errno::from)?;
        if !self.direct {
            // The page cache must not keep the block (an "SSD read" would be a DRAM read):
            // write it back, then drop it.
            let fd = std::os::fd::AsRawFd::as_raw_fd(&self.file);
            // SAFETY: plain system calls on an open descriptor.
            unsafe {
                libc::sync_file_range(
                    fd,
                    offset as i64,
                    bytes.len() as i64,
                    libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                );
                libc::posix_fadvise(fd, offset as i64, bytes.len() as i64, libc::POSIX_FADV_DONTNEED);
            }
        }
        Ok(())
    }

    fn read_block(&self, offset: u64, into: &mut [u8]) -> Result<(), Errno> {
        self.file.read_exact_at(into, offset).map_err(Errno::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringfs_proto::gmem::{AtomicOp, CompareSwap};

    fn memory(dram_blocks: u64, name: &str) -> GlobalMemory {
        let spill_dir = std::env::temp_dir().join(format!("ringfs-gmem-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&spill_dir);
        GlobalMemory::new(GlobalMemoryConfig { dram_bytes: dram_blocks * 4096, spill_dir, ssd: None })
    }

    fn read(memory: &GlobalMemory, block: u64, offset: usize, len: usize) -> Vec<u8> {
        let mut bytes = vec![0xEE; len];
        memory.access(1, block, Access::Read { offset, into: &mut bytes }).unwrap();
        bytes
    }

    #[test]
    fn a_dropped_memory_leaves_no_spill_file_and_removes_only_a_directory_it_made() {
        let memory = memory(1, "dropped");
        let spill_dir = memory.config.spill_dir.clone();
        memory.define(1, 4096, HomeReads::Repeated).unwrap();
        for block in 0..3u64 {
            memory.access(1, block, Access::Write { offset: 0, from: &[1; 4096] }).unwrap();
        }
        assert_eq!(std::fs::read_dir(&spill_dir).unwrap().count(), 1, "one spill file");
        drop(memory);
        assert!(!spill_dir.exists(), "the directory the memory made is gone");

        // A directory that was there (a node's SSD, `--gmem-spill`) stays, emptied.
        std::fs::create_dir_all(&spill_dir).unwrap();
        let memory = GlobalMemory::new(GlobalMemoryConfig { dram_bytes: 4096, spill_dir: spill_dir.clone(), ssd: None });
        memory.define(1, 4096, HomeReads::Repeated).unwrap();
        for block in 0..3u64 {
            memory.access(1, block, Access::Write { offset: 0, from: &[1; 4096] }).unwrap();
        }
        drop(memory);
        assert_eq!(std::fs::read_dir(&spill_dir).unwrap().count(), 0, "no spill file left");
        std::fs::remove_dir(&spill_dir).unwrap();
    }

    #[test]
    fn blocks_spill_past_the_budget_and_read_back_exact() {
        let memory = memory(2, "spill");
        memory.define(1, 4096, HomeReads::Repeated).unwrap();
        assert_eq!(read(&memory, 7, 0, 16), vec![0; 16], "never written: zeros, nothing stored");
        assert_eq!(memory.stats().dram_bytes, 0);
        for block in 0..10u64 {
            let bytes = vec![block as u8 + 1; 4096];
            memory.access(1, block, Access::Write { offset: 0, from: &bytes }).unwrap();
            assert!(memory.stats().dram_bytes <= 2 * 4096, "the budget holds");
        }
        assert_eq!(memory.stats().spilled_bytes, 8 * 4096);
        for block in 0..10u64 {
            assert_eq!(read(&memory, block, 100, 3), vec![block as u8 + 1; 3], "block {block}");
        }
        assert!(memory.stats().ssd_read_bytes >= 8 * 4096);
        let mut old = 0;
        memory.access(1, 3, Access::Atomic { offset: 8, op: AtomicOp::FetchAdd(5), old: &mut old }).unwrap();
        assert_eq!(old, u64::from_le_bytes([4; 8]));
        memory
            .access(1, 3, Access::Atomic { offset: 8, op: AtomicOp::CompareSwap(CompareSwap { expected: 1, new: 9 }), old: &mut old })
            .unwrap();
        assert_eq!(old, u64::from_le_bytes([4; 8]) + 5, "a failed compare-and-swap reports the word");
        assert_eq!(memory.access(1, 3, Access::Read { offset: 4090, into: &mut [0; 8] }), Err(Errno::EFAULT));
        memory.drop_array(1);
        assert_eq!(memory.stats().dram_bytes, 0);
        assert_eq!(memory.access(1, 3, Access::Read { offset: 0, into: &mut [0; 8] }), Err(Errno::ESTALE));
    }

    #[test]
    fn a_scan_of_twice_the_dram_keeps_most_resident_blocks_and_a_block_used_again_stays() {
        let memory = memory(4, "scan");
        memory.define(1, 4096, HomeReads::Once).unwrap();
        for block in 0..8u64 {
            memory.access(1, block, Access::Write { offset: 0, from: &[block as u8 + 1; 4096] }).unwrap();
        }
        // Blocks 4-7 are resident, 0-3 on the SSD. A scan reads all eight twice.
        let before = memory.stats().ssd_read_bytes;
        for _ in 0..2 {
            for block in 0..8u64 {
                assert_eq!(read(&memory, block, 0, 2), vec![block as u8 + 1; 2], "block {block}");
            }
        }
        // Each pass reads 0-3 back (each in turn the coldest block) and costs one resident
        // block (LRU order: every block, every pass).
        let read_back = (memory.stats().ssd_read_bytes - before) / 4096;
        assert!(read_back <= 10, "{read_back} blocks read back, an LRU order reads 16");
        // A block read back and read again is used: the next scan does not push it out.
        read(&memory, 0, 0, 1);
        read(&memory, 0, 0, 1);
        let before = memory.stats().ssd_read_bytes;
        for block in 1..4u64 {
            read(&memory, block, 0, 1);
        }
        read(&memory, 0, 0, 1);
        assert_eq!((memory.stats().ssd_read_bytes - before) / 4096, 3, "block 0 stayed");
    }

    #[test]
    fn a_leased_block_keeps_its_bytes_while_writes_go_to_a_copy() {
        let memory = memory(4, "lease");
        memory.define(1, 4096, HomeReads::Repeated).unwrap();
        let mut lease = None;
        memory.access(1, 0, Access::Lease { into: &mut lease }).unwrap();
        assert!(lease.is_none(), "a block never written is not lent (zeros)");
        memory.access(1, 0, Access::Write { offset: 0, from: &[1; 4096] }).unwrap();
        memory.access(1, 0, Access::Lease { into: &mut lease }).unwrap();
        let lent = lease.take().unwrap();
        memory.access(1, 0, Access::Write { offset: 0, from: &[2; 100] }).unwrap();
        assert_eq!(lent[0], 1, "the lease still shows the bytes it lent");
        assert_eq!(read(&memory, 0, 0, 2), [2, 2], "the write went to a copy");
        assert_eq!(read(&memory, 0, 100, 2), [1, 1], "that kept the rest of the block");
    }

    /// Threads add to words of 32 blocks through a budget of 3 blocks (evictions and loads
    /// all the time, blocks pinned while others move): no addition is lost.
    #[test]
    fn concurrent_accesses_through_constant_eviction_lose_nothing() {
        let memory = memory(3, "storm");
        memory.define(1, 4096, HomeReads::Repeated).unwrap();
        std::thread::scope(|scope| {
            for thread in 0..4u64 {
                let memory = &memory;
                scope.spawn(move || {
                    let mut state = thread + 1;
                    for _ in 0..2_000 {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        let block = state % 32;
                        let mut old = 0;
                        memory.access(1, block, Access::Atomic { offset: 0, op: AtomicOp::FetchAdd(1), old: &mut old }).unwrap();
                    }
                });
            }
        });
        let total: u64 = (0..32).map(|block| u64::from_le_bytes(read(&memory, block, 0, 8).try_into().unwrap())).sum();
        assert_eq!(total, 8_000);
        assert!(memory.stats().dram_bytes <= 3 * 4096 + 4 * 4096, "over the budget only by pinned blocks");
    }
}
