//! Memory registration: [`MemoryRegion`]s a peer may read or write with RMA, the
//! [`RemoteKey`]s that name a peer's region, and the [`RegistrationCache`] that keeps
//! registrations between requests.
//!
//! Registering memory with an RDMA device pins its pages and costs tens of microseconds per
//! megabyte, more than copying it; a transport therefore registers a buffer once and reuses the
//! registration while the buffer stays mapped. The cache learns that a buffer went away from
//! UCX's memory hooks (`libucm` reports every `munmap`, `brk` shrink and `madvise` that drops
//! pages), the way UCX's own registration cache and MPI libraries do.

use std::ffi::c_void;
use std::ptr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::context::Context;
use crate::handle::EndpointShared;
use crate::sys;
use crate::{Error, check};

/// Longest packed remote key accepted from a peer (UCX's keys are tens to a few hundred bytes).
pub const MAX_PACKED_KEY: usize = 1024;

const PAGE: usize = 4096;

/// Memory registered with UCX, so that peers given its packed key can access it by RMA.
pub struct MemoryRegion {
    context: Context,
    handle: sys::ucp_mem_h,
    address: usize,
    length: usize,
    packed_key: Vec<u8>,
}

// SAFETY: a registration belongs to the context (created with mt_workers_shared, so UCX locks
// it); the handle is only passed to UCX, never dereferenced here.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above; nothing in it changes after creation.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Registers `memory`. A peer given [`MemoryRegion::pack_key`] can read and write it until
    /// the region is dropped: give keys only to trusted peers, for memory that outlives their use
    /// of it (on RDMA hardware, dropping the registration revokes the key; on transports that
    /// copy between processes, such as `cma`, the peer's access is checked only by the kernel).
    pub fn register(context: &Context, memory: &[u8]) -> Result<MemoryRegion, Error> {
        Self::register_range(context, memory.as_ptr() as usize, memory.len())
    }

    fn register_range(context: &Context, address: usize, length: usize) -> Result<MemoryRegion, Error> {
        if length == 0 {
            return Err(Error::Invalid("cannot register an empty buffer".into()));
        }
        let functions = context.inner.functions;
        // SAFETY: plain data.
        let mut params: sys::ucp_mem_map_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        params.address = address as *mut c_void;
        params.length = length;
        let mut handle: sys::ucp_mem_h = ptr::null_mut();
        // SAFETY: valid context; UCX registers the mapped range (it fails on unmapped memory).
        check("ucp_mem_map", unsafe { (functions.ucp_mem_map)(context.inner.handle, &params, &mut handle) })?;
        let mut region = MemoryRegion { context: context.clone(), handle, address, length, packed_key: Vec::new() };
        region.packed_key = region.pack()?;
        Ok(region)
    }

    fn pack(&self) -> Result<Vec<u8>, Error> {
        let functions = self.context.inner.functions;
        let mut buffer: *mut c_void = ptr::null_mut();
        let mut size: libc::size_t = 0;
        // SAFETY: valid context and registration; UCX allocates the packed key.
        check("ucp_rkey_pack", unsafe { (functions.ucp_rkey_pack)(self.context.inner.handle, self.handle, &mut buffer, &mut size) })?;
        // SAFETY: UCX wrote `size` bytes at `buffer`, released once after the copy.
        let packed = unsafe { std::slice::from_raw_parts(buffer.cast::<u8>(), size) }.to_vec();
        // SAFETY: the buffer came from ucp_rkey_pack.
        unsafe { (functions.ucp_rkey_buffer_release)(buffer) };
        Ok(packed)
    }

    /// The key a peer needs to access this region ([`Endpoint::unpack_key`](crate::Endpoint::unpack_key)).
    pub fn pack_key(&self) -> &[u8] {
        &self.packed_key
    }

    /// First registered address.
    pub fn address(&self) -> usize {
        self.address
    }

    /// Registered length in bytes.
    pub fn len(&self) -> usize {
        self.length
    }

    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// True if `[address, address + length)` lies inside the region.
    pub fn covers(&self, address: usize, length: usize) -> bool {
        address >= self.address && address.saturating_add(length) <= self.address + self.length
    }

    pub(crate) fn handle(&self) -> sys::ucp_mem_h {
        self.handle
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: a live registration of this context, unmapped once; operations using it hold
        // an Arc of it, so none is in flight.
        let status = unsafe { (self.context.inner.functions.ucp_mem_unmap)(self.context.inner.handle, self.handle) };
        if status != sys::UCS_OK {
            log::warn!("ucp_mem_unmap failed: {}", sys::status_text(status));
        }
    }
}

/// A peer's memory region, usable for RMA on the endpoint it was unpacked on.
#[derive(Clone)]
pub struct RemoteKey {
    shared: Rc<RemoteKeyShared>,
}

struct RemoteKeyShared {
    endpoint: Rc<EndpointShared>,
    handle: sys::ucp_rkey_h,
}

impl RemoteKey {
    /// Unpacks a peer's packed key on `endpoint` (which must be usable).
    pub(crate) fn unpack(endpoint: &Rc<EndpointShared>, packed: &[u8]) -> Result<RemoteKey, Error> {
        let endpoint_handle = endpoint.live_handle()?;
        if packed.is_empty() || packed.len() > MAX_PACKED_KEY {
            return Err(Error::Protocol(format!("a packed remote key of {} bytes (1 to {MAX_PACKED_KEY} allowed)", packed.len())));
        }
        // UCX parses the key without knowing its length: give it a zero-padded copy, so that a
        // malformed key cannot make it read past the bytes the peer sent.
        let mut padded = [0u8; MAX_PACKED_KEY * 2];
        padded[..packed.len()].copy_from_slice(packed);
        let functions = endpoint.worker.functions;
        let mut handle: sys::ucp_rkey_h = ptr::null_mut();
        // SAFETY: a live endpoint and a readable key buffer; UCX writes the handle.
        check("ucp_ep_rkey_unpack", unsafe { (functions.ucp_ep_rkey_unpack)(endpoint_handle, padded.as_ptr().cast(), &mut handle) })?;
        Ok(RemoteKey { shared: Rc::new(RemoteKeyShared { endpoint: endpoint.clone(), handle }) })
    }

    pub(crate) fn handle(&self) -> sys::ucp_rkey_h {
        self.shared.handle
    }

    pub(crate) fn belongs_to(&self, endpoint: &Rc<EndpointShared>) -> bool {
        Rc::ptr_eq(&self.shared.endpoint, endpoint)
    }
}

impl Drop for RemoteKeyShared {
    fn drop(&mut self) {
        // SAFETY: a live key, destroyed once; operations using it hold a clone, so none is in flight.
        unsafe { (self.endpoint.worker.functions.ucp_rkey_destroy)(self.handle) };
    }
}

/// The address range of one cache entry, readable without a lock by the unmap hook.
struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    valid: AtomicBool,
}

struct CacheEntry {
    region: Arc<MemoryRegion>,
    slot: usize,
    last_use: u64,
}

/// Keeps memory registrations for reuse, at most `capacity` of them (least recently used
/// dropped first), forgetting any whose memory is unmapped. Shared by the threads of a process.
pub struct RegistrationCache {
    context: Context,
    entries: Mutex<Vec<CacheEntry>>,
    /// Boxed: its address is the unmap hook's argument.
    slots: Box<[Slot]>,
    /// False when UCX's memory hooks are unavailable: then nothing is cached (a stale
    /// registration would send data to pages the buffer no longer has).
    hooked: bool,
    clock: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// `libucm`'s callback before memory leaves the address space: invalidates overlapping slots.
unsafe extern "C" fn memory_unmapped(_event_type: libc::c_int, event: *mut sys::ucm_vm_unmapped_t, argument: *mut c_void) {
    // SAFETY: the argument is the cache's slot array, alive until the hook is removed; UCX
    // passes a valid event for VM_UNMAPPED.
    let (slots, event) = unsafe { (&*(argument as *const Box<[Slot]>), &*event) };
    let start = event.address as usize;
    let end = start.saturating_add(event.size);
    for slot in slots.iter() {
        if slot.valid.load(Ordering::Acquire) && slot.start.load(Ordering::Relaxed) < end && start < slot.end.load(Ordering::Relaxed) {
            slot.valid.store(false, Ordering::Release);
        }
    }
}

impl RegistrationCache {
    /// A cache of at most `capacity` registrations on `context`.
    pub fn new(context: &Context, capacity: usize) -> Arc<RegistrationCache> {
        let slots: Box<[Slot]> = (0..capacity.max(1))
            .map(|_| Slot { start: AtomicUsize::new(0), end: AtomicUsize::new(0), valid: AtomicBool::new(false) })
            .collect();
        let mut cache = Arc::new(RegistrationCache {
            context: context.clone(),
            entries: Mutex::new(Vec::new()),
            slots,
            hooked: false,
            clock: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        });
        let functions = context.inner.functions;
        let inner = Arc::get_mut(&mut cache).expect("a new Arc has one owner");
        let argument = (&raw const inner.slots).cast_mut().cast();
        // SAFETY: the argument (the slot array's box, at a stable address inside the Arc) lives
        // until Drop removes the hook.
        let status = unsafe { (functions.ucm_set_event_handler)(sys::UCM_EVENT_VM_UNMAPPED, 0, memory_unmapped, argument) };
        inner.hooked = status == sys::UCS_OK;
        if !inner.hooked {
            log::warn!("UCX memory hooks are unavailable ({}): memory registrations are not cached", sys::status_text(status));
        }
        cache
    }

    /// A registration covering `memory`: a cached one, or a new one (of the whole pages
    /// around it) that is cached for next time.
    pub fn register(&self, memory: &[u8]) -> Result<Arc<MemoryRegion>, Error> {
        let address = memory.as_ptr() as usize;
        let length = memory.len();
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let mut entries = self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        entries.retain(|entry| self.slots[entry.slot].valid.load(Ordering::Acquire));
        if let Some(entry) = entries.iter_mut().find(|entry| entry.region.covers(address, length)) {
            entry.last_use = now;
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(entry.region.clone());
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let start = address & !(PAGE - 1);
        let end = (address + length).next_multiple_of(PAGE);
        let region = Arc::new(MemoryRegion::register_range(&self.context, start, end - start)?);
        if !self.hooked {
            return Ok(region);
        }
        if entries.len() == self.slots.len()
            && let Some(oldest) = entries.iter().enumerate().min_by_key(|(_, entry)| entry.last_use).map(|(index, _)| index)
        {
            let evicted = entries.swap_remove(oldest);
            self.slots[evicted.slot].valid.store(false, Ordering::Release);
        }
        let slot =
            (0..self.slots.len()).find(|slot| !entries.iter().any(|entry| entry.slot == *slot)).expect("a slot is free after eviction");
        self.slots[slot].start.store(start, Ordering::Relaxed);
        self.slots[slot].end.store(end, Ordering::Relaxed);
        self.slots[slot].valid.store(true, Ordering::Release);
        entries.push(CacheEntry { region: region.clone(), slot, last_use: now });
        Ok(region)
    }

    /// (hits, misses) so far.
    pub fn statistics(&self) -> (u64, u64) {
        (self.hits.load(Ordering::Relaxed), self.misses.load(Ordering::Relaxed))
    }

    /// True if registrations are cached (UCX's memory hooks work here).
    pub fn is_caching(&self) -> bool {
        self.hooked
    }

    /// The context registrations are made on.
    pub fn context(&self) -> &Context {
        &self.context
    }
}

impl Drop for RegistrationCache {
    fn drop(&mut self) {
        if self.hooked {
            let argument = (&raw const self.slots).cast_mut().cast();
            // SAFETY: removes the hook installed in new() with the same callback and argument.
            unsafe { (self.context.inner.functions.ucm_unset_event_handler)(sys::UCM_EVENT_VM_UNMAPPED, memory_unmapped, argument) };
        }
    }
}
