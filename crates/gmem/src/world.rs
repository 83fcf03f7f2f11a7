//! A job's ranks together: collective allocation and free of arrays, barriers, and the
//! completion of implicit non-blocking operations (`fence`, `quiet`).

use ringfs_sync::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use ringfs_client::Client;
use ringfs_proto::gmem::{CacheMode, GmemBarrier};
use ringfs_proto::{Errno, Request, Response};
use ringfs_rpc::Connection;

use crate::Result;
use crate::cache::{BlockCache, CacheConfig, CacheStats};
use crate::pending::{Implicit, Pool};
use crate::ranks::{RankIdentity, identity_from_env};

/// Worker threads for non-blocking operations.
const WORKERS: usize = 4;

/// A rank's view of its job. Cheap to clone; thread-safe. When the application drops its
/// last handle (of the world or of an array), that thread waits for the rank's background
/// work (non-blocking operations, reads ahead) to finish, then the world is torn down there:
/// writes back its cache, stops its cache's server and waits for that server's threads.
#[derive(Clone)]
pub struct World {
    /// In the application's handles, not in those of background jobs. (Declared first: it
    /// is dropped before `inner`, which it needs.)
    _finisher: Option<Arc<Finisher>>,
    pub(crate) inner: Arc<WorldInner>,
}

/// Finishes the world's background work when the application's last handle goes. Before,
/// a job still running then held the world, so the world was torn down by a worker thread
/// while the application's thread went on — a rank returned from its work and exited, and a
/// worker still inside UCX while `exit` ran the libraries' destructors corrupted the heap
/// (`malloc_consolidate(): invalid chunk size`, SIGSEGV in `free`), rarely.
struct Finisher(Weak<WorldInner>);

impl Drop for Finisher {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.pool.finish();
        }
    }
}

pub(crate) struct WorldInner {
    pub client: Client,
    pub identity: RankIdentity,
    /// The server the job's collective steps meet at.
    pub coordinator: String,
    /// Collective allocations made so far (each rank counts the same).
    pub allocations: AtomicU64,
    /// Barriers passed so far.
    barriers: AtomicU64,
    pub pool: Pool,
    pub implicit: Arc<Implicit>,
    connections: Mutex<HashMap<String, Arc<Connection>>>,
    /// This rank's block cache (arrays are cached when it exists).
    pub cache: Option<BlockCache>,
}

impl World {
    /// Joins the job this process is a rank of: the servers from `RINGFS_SERVER` and
    /// `RINGFS_SECRET`, the rank from the launcher (see [`crate::identity_from_env`]).
    pub fn init() -> Result<World> {
        let client = Client::from_env().map_err(|error| {
            log::error!("global memory: {error}");
            Errno::EIO
        })?;
        World::with_client(client, identity_from_env()?)
    }

    /// A world over an existing client, as rank `identity.rank` of `identity.ranks`, caching
    /// as the environment says ([`CacheConfig::from_env`]).
    pub fn with_client(client: Client, identity: RankIdentity) -> Result<World> {
        World::with_cache(client, identity, CacheConfig::from_env()?)
    }

    /// A world caching blocks as `cache` says (every rank of a job must say the same).
    pub fn with_cache(client: Client, identity: RankIdentity, cache: CacheConfig) -> Result<World> {
        if identity.ranks == 0 || identity.rank >= identity.ranks {
            return Err(Errno::EINVAL);
        }
        let coordinator = client.server_for_key(&format!("/.ringfs-gmem/{:016x}", identity.job));
        let cache = if cache.mode() == CacheMode::Uncached {
            None
        } else {
            let members = client.members();
            let address = members.members.iter().find(|member| member.name == coordinator).map(|member| member.tcp_address.clone());
            Some(BlockCache::start(cache, identity.rank, client.connection_config(), &address.unwrap_or_default())?)
        };
        let inner = Arc::new(WorldInner {
            client,
            identity,
            coordinator,
            allocations: AtomicU64::new(0),
            barriers: AtomicU64::new(0),
            pool: Pool::new(WORKERS),
            implicit: Arc::default(),
            connections: Mutex::new(HashMap::new()),
            cache,
        });
        Ok(World { _finisher: Some(Arc::new(Finisher(Arc::downgrade(&inner)))), inner })
    }

    /// A handle for a background job: it does not keep the application's side open (see
    /// [`Finisher`]).
    pub(crate) fn for_background(&self) -> World {
        World { _finisher: None, inner: self.inner.clone() }
    }

    pub fn rank(&self) -> u32 {
        self.inner.identity.rank
    }

    pub fn ranks(&self) -> u32 {
        self.inner.identity.ranks
    }

    /// The client underneath (its files and the global memory share connections).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Waits until every rank has called it (after completing this rank's implicit
    /// operations, as `shmem_barrier_all` does).
    pub fn barrier(&self) -> Result<()> {
        self.quiet()?;
        let identity = self.inner.identity;
        let epoch = self.inner.barriers.fetch_add(1, Ordering::Relaxed);
        let request = Request::GmemBarrier(GmemBarrier { job: identity.job, epoch, rank: identity.rank, ranks: identity.ranks });
        self.inner.until_everyone(&request).map(drop)
    }

    /// Writes this rank's dirty cached blocks back to their homes and empties its cache
    /// (after completing its implicit operations). Nothing else needs it: other ranks see
    /// cached writes anyway; it makes a measurement start cold, or the homes hold every
    /// byte before a rank leaves.
    pub fn flush_cache(&self) -> Result<()> {
        self.quiet()?;
        if let Some(cache) = &self.inner.cache {
            let inner = &self.inner;
            cache.flush(&|home: &str, request: &Request, data: &[u8]| inner.call(home, request, data));
        }
        Ok(())
    }

    /// What this rank's block cache did, if it has one.
    pub fn cache_stats(&self) -> Option<CacheStats> {
        self.inner.cache.as_ref().map(BlockCache::stats)
    }

    /// Waits until every implicit (`_nbi`) operation of this rank is complete; the first
    /// error among them, if any.
    pub fn quiet(&self) -> Result<()> {
        self.inner.implicit.quiet()
    }

    /// Orders this rank's implicit puts: those issued before complete before those issued
    /// after. (Implemented as [`World::quiet`].)
    pub fn fence(&self) -> Result<()> {
        self.quiet()
    }
}

impl Drop for WorldInner {
    /// A rank leaving writes its dirty blocks back, so that ranks still running find them.
    fn drop(&mut self) {
        if let Some(cache) = &self.cache {
            cache.flush(&|home: &str, request: &Request, data: &[u8]| self.call(home, request, data));
        }
    }
}

impl WorldInner {
    /// A connection to server `name`, kept for later calls.
    pub fn connection(&self, name: &str) -> Result<Arc<Connection>> {
        let mut connections = self.connections.lock();
        if let Some(connection) = connections.get(name)
            && !connection.is_broken()
        {
            return Ok(connection.clone());
        }
        let connection = self.client.connection_to(name)?;
        connections.insert(name.to_string(), connection.clone());
        Ok(connection)
    }

    /// One request to server `name`, and its answer.
    pub fn call(&self, name: &str, request: &Request, data: &[u8]) -> Result<ringfs_rpc::Reply> {
        let connection = self.connection(name)?;
        let call = connection.start(request, data, None);
        self.client.finish_call(&connection, call)
    }

    /// Asks the coordinator until every rank has (it answers EAGAIN until then, after
    /// waiting a little for them).
    pub(crate) fn until_everyone(&self, request: &Request) -> Result<Response> {
        loop {
            match self.call(&self.coordinator, request, &[]) {
                Err(Errno::EAGAIN) => continue,
                outcome => return outcome.map(|reply| reply.response),
            }
        }
    }
}
