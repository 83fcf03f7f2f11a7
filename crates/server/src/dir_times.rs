//! Directory times: a directory's mtime and ctime change whenever a name in it is created,
//! removed or renamed (POSIX).
//!
//! The name lives on one server and the directory's inode, usually, on another, so the
//! name's server tells the directory (`TouchDir`, to the directory's name server, which
//! sends it on to the inode). The touches are queued and sent by the `ringfs-dirtimes`
//! thread — never by the request that changed the name: a touch of a directory whose server
//! is cut off must not hold up the reply (it did, and a client retrying its `mkdir` in the
//! root directory, which every server holds, kept timing out). Touches of one directory
//! gathered within [`COALESCE`] go as one message, so a burst of creates costs one message
//! per directory and millisecond. A directory's times thus follow its names within a few
//! milliseconds (docs/CONSISTENCY.md). A touch that cannot be delivered is dropped and
//! logged: an operation that succeeded does not fail for a time stamp. Touches never undo a
//! later change of the directory, so their order does not matter.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use ringfs_proto::path;
use ringfs_proto::{DirTouch, Errno, FileId, Request, Response};

use crate::service::{ServerState, store_errno};

/// Touches of one directory closer together than this are sent together.
const COALESCE: Duration = Duration::from_millis(1);

#[derive(Default)]
pub struct DirTimes {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    /// Touches waiting to be sent: the latest time for each directory.
    pending: HashMap<String, i64>,
}

impl DirTimes {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a touch of `dir` (no allocation and no wake-up for a directory queued
    /// already: the common case of a burst).
    fn note(&self, dir: &str, time_ns: i64) {
        let mut state = self.lock();
        match state.pending.get_mut(dir) {
            Some(latest) => *latest = (*latest).max(time_ns),
            None => {
                let was_empty = state.pending.is_empty();
                state.pending.insert(dir.to_string(), time_ns);
                if was_empty {
                    self.wake.notify_one();
                }
            }
        }
    }

    /// The queued touches, once some are queued (after [`COALESCE`], so that a burst goes
    /// as one); empty after `limit` without any.
    fn take(&self, limit: Duration) -> Vec<(String, i64)> {
        let mut state = self.lock();
        if state.pending.is_empty() {
            state = self.wake.wait_timeout(state, limit).unwrap_or_else(|poisoned| poisoned.into_inner()).0;
            if state.pending.is_empty() {
                return Vec::new();
            }
        }
        drop(state);
        std::thread::sleep(COALESCE);
        self.lock().pending.drain().collect()
    }
}

impl ServerState {
    /// A name in `child`'s parent directory was created, removed or renamed at `time_ns`.
    pub(crate) fn touch_parent(&self, child: &str, time_ns: i64) {
        let Some(parent) = path::parent(child) else { return };
        self.dir_times.note(parent, time_ns);
    }

    fn send_touch(&self, dir: &str, time_ns: i64) {
        let outcome = if dir == "/" {
            // Every server holds the root directory.
            let touch = DirTouch { path: String::new(), file: FileId::ROOT, time_ns };
            self.broadcast(&Request::TouchDir(touch)).into_iter().find_map(Result::err).map_or(Ok(()), Err)
        } else {
            let touch = DirTouch { path: dir.to_string(), file: FileId::default(), time_ns };
            self.ask(&self.owner_of_path(dir), Request::TouchDir(touch)).map(drop)
        };
        if let Err(errno) = outcome {
            log::debug!("the times of {dir} were not updated: {errno}");
        }
    }

    /// Sends queued touches until the server stops.
    pub(crate) fn dir_times_loop(&self) {
        while !self.shutdown.is_requested() {
            for (dir, time_ns) in self.dir_times.take(Duration::from_millis(200)) {
                self.send_touch(&dir, time_ns);
            }
        }
    }

    /// `TouchDir`: by path at the directory's name server (sent on to its inode), or by file
    /// at the inode.
    pub fn touch_dir(&self, touch: DirTouch) -> Result<Response, Errno> {
        if touch.path.is_empty() {
            self.store.touch_dir(touch.file, touch.time_ns).map_err(store_errno)?;
            return Ok(Response::Done);
        }
        let entry = {
            let _pass = self.gate.pass(&[&touch.path], 0)?;
            self.store.lookup(&touch.path, self.anchor_of(&touch.path), false).map_err(store_errno)?.0
        };
        if !entry.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let onward = DirTouch { path: String::new(), file: entry.file, time_ns: touch.time_ns };
        self.ask_home(entry.file, Request::TouchDir(onward)).map(drop)?;
        Ok(Response::Done)
    }
}
