//! Renames (`rename`, `renameat2`), coordinated by the server of the old name.
//!
//! A file's rename changes names only: both names are locked (in path order, at their
//! servers); the new name is made to refer to the file, replacing what it named (whose file
//! loses a name), then the old name goes. From the moment the new name is installed it shows
//! the whole file: no data moves. A directory (or an exchange of any two names) takes the
//! directory-rename path (`directory_rename`).

use std::sync::Arc;

use ringfs_proto::path;
use ringfs_proto::{Errno, FileId, InstallMode, NameCount, Rename, RenameFlags, RenameToken, Request, Response};

use crate::deadline::past_point_of_no_return;
use crate::dir_times::DirTimes;
use crate::directory_rename::DirectoryRenames;
use crate::files::Files;
use crate::name_locks::new_token;
use crate::names::{LockedRename, Names};
use crate::node::{Node, store_errno};
use crate::outbound::retry_uncertain;

/// The coordinator of renames.
pub struct Renames {
    node: Arc<Node>,
    names: Arc<Names>,
    trees: Arc<DirectoryRenames>,
    files: Arc<Files>,
    dir_times: Arc<DirTimes>,
}

impl Renames {
    pub fn new(node: Arc<Node>, names: Arc<Names>, trees: Arc<DirectoryRenames>, files: Arc<Files>, dir_times: Arc<DirTimes>) -> Renames {
        Renames { node, names, trees, files, dir_times }
    }

    pub fn rename(&self, rename: Rename) -> Result<Response, Errno> {
        let Rename { from, to, time_ns, flags } = rename;
        if flags & !(RenameFlags::NOREPLACE | RenameFlags::EXCHANGE) != 0 || flags == RenameFlags::NOREPLACE | RenameFlags::EXCHANGE {
            return Err(Errno::EINVAL);
        }
        if from == "/" || to == "/" {
            return Err(Errno::EBUSY);
        }
        if path::is_inside(&to, &from) || (flags & RenameFlags::EXCHANGE != 0 && path::is_inside(&from, &to)) {
            return Err(Errno::EINVAL);
        }
        let source = {
            let _pass = self.names.gate.pass(&[&from], RenameToken::NONE)?;
            self.entry_now(&from)?
        };
        if from == to {
            return Ok(Response::Done);
        }
        if source.is_dir() || flags & RenameFlags::EXCHANGE != 0 {
            return self.trees.rename_tree(&from, &to, time_ns, flags);
        }
        let token = new_token();
        log::trace!("rename {from} -> {to} is {token:x}");
        let entries = self.names.lock_names(&[&from, &to], token)?;
        if entries[0].is_some_and(|entry| entry.is_dir()) {
            // Replaced by a directory since the look above: rename it as one.
            self.names.unlock_names(&[&from, &to], token);
            return self.trees.rename_tree(&from, &to, time_ns, flags);
        }
        let outcome =
            self.rename_file(LockedRename { from: &from, to: &to, source: entries[0], target: entries[1], time_ns, flags, token });
        self.names.unlock_names(&[&from, &to], token);
        if outcome.is_ok() {
            self.dir_times.touch_parent(&from, time_ns);
            self.dir_times.touch_parent(&to, time_ns);
        }
        outcome
    }

    /// What `path` (held here) names now. A look that finds the name's file gone — another
    /// rename replaced it between reading the name and reaching the file: ESTALE from the
    /// store — reads the name again (a rename of the name to itself beside renames over it
    /// failed with ESTALE: `core.rs: a_rename_to_itself_beside_renames_over_the_name_never_fails_stale`).
    fn entry_now(&self, path: &str) -> Result<ringfs_proto::EntryRef, Errno> {
        const ATTEMPTS: usize = 100;
        let anchor = self.node.anchor_of(path);
        for _ in 0..ATTEMPTS {
            match self.node.store.lookup(path, anchor, false).map_err(store_errno) {
                Err(Errno::ESTALE) => continue,
                found => return found.map(|(entry, _)| entry),
            }
        }
        Err(Errno::ESTALE)
    }

    /// Renames a file (or link, or special file) whose names are locked.
    fn rename_file(&self, rename: LockedRename<'_>) -> Result<Response, Errno> {
        let LockedRename { from, to, source, target, time_ns, flags, token } = rename;
        let source = source.ok_or(Errno::ENOENT)?;
        match target {
            Some(_) if flags & RenameFlags::NOREPLACE != 0 => return Err(Errno::EEXIST),
            Some(target) if target.is_dir() => return Err(Errno::EISDIR),
            // Two names of the same file: POSIX says do nothing.
            Some(target) if target.file == source.file => return Ok(Response::Done),
            _ => {}
        }
        if self.node.in_cached_tree(to)
            && let Some(parent) = path::parent(to)
            && parent != "/"
        {
            // The new name's directory must exist before anything changes in the backend: a
            // rename that then failed for want of it left the file bound to a path under it,
            // and its next flush made the directory in the backend, from where it appeared
            // in ringfs (`cache.rs: a_failed_rename_changes_nothing_in_the_backend`). (A
            // directory removed between this check and the new name's installation still
            // fails the rename late.)
            self.names.resolve_parent(parent)?;
        }
        // The new name is counted before it appears, and the count given back once the old
        // name is gone: at every moment the file has at least as many links as names, so no
        // failure half-way can leave a name whose file was freed under it (removing the other
        // name would take the last link). A step whose answer was lost (EIO) may have
        // happened: it is repeated (installing the same file again replaces it with itself;
        // removing checks the file), and if it still fails the extra link stays — at worst
        // the file keeps a link too many. Without the file's server nothing changes (EIO).
        match self.node.ask_home(source.file, Request::AddLink(NameCount::new(source.file, time_ns)))? {
            Response::Attr(_) => {}
            _ => return Err(Errno::EPROTO),
        }
        // Cache mode: the replaced file gave up a backend creation still pending at `to`
        // (made again there if the rename fails).
        let mut yielded = None;
        // Whether the file's backend file moved with the name (moved back if the rename fails).
        let mut moved = false;
        if self.node.in_cached_tree(from) || self.node.in_cached_tree(to) {
            // The replaced file's backend bytes are loaded before the renamed file is bound
            // to its backend path, whose flushed creation replaces them; and the replaced
            // file gives up making its own backend file there first — applied after the
            // renamed file's, its creation would replace it (soak seed 71052). Then the
            // renamed file's backend file moves with its name, or, where it cannot, the file
            // takes its bytes along and is made anew at the new name.
            let prepared = (|| {
                if let Some(target) = target
                    && self.node.in_cached_tree(to)
                {
                    self.files.keep_backend_bytes_if_still_needed(target.file)?;
                    if self.files.yield_backend_name(target.file, to)? {
                        yielded = Some(target.file);
                    }
                }
                moved = self.files.move_with_name(source.file, from, to)?;
                if moved {
                    return Ok(());
                }
                self.files.move_in_backend(source.file, from, to)
            })();
            if let Err(errno) = prepared {
                self.take_backend_name_back(yielded, to);
                self.give_back_link(source.file, from, time_ns);
                return Err(errno);
            }
        }
        let installed = past_point_of_no_return(|| {
            retry_uncertain(|| self.names.install_at(to, source, InstallMode::REPLACE, FileId::default(), false, token))
        });
        let replaced = match installed {
            Ok(replaced) => replaced,
            Err(errno) => {
                if matches!(errno, Errno::EIO | Errno::ETIMEDOUT) {
                    log::warn!("rename {from} -> {to} stopped half-way ({errno}): the file may have both names, and keeps a link for each");
                } else {
                    // Other errors (the new name's parent is gone…) say the step did not happen.
                    if moved {
                        self.move_backend_file_back(source.file, from, to);
                    }
                    self.take_backend_name_back(yielded, to);
                    self.give_back_link(source.file, from, time_ns);
                }
                return Err(errno);
            }
        };
        let removed = past_point_of_no_return(|| retry_uncertain(|| self.names.remove_at(from, source.file, token)));
        match removed {
            Ok(true) => {}
            // Removed by an unlink, which gave back its link.
            Ok(false) => log::warn!("rename {from} -> {to}: the old name vanished while locked"),
            Err(errno) => {
                log::warn!("rename {from} -> {to} stopped half-way ({errno}): the file may have both names, and keeps a link for each")
            }
        }
        if let Some(replaced) = replaced
            && replaced.file != source.file
        {
            self.files.drop_link(replaced.file, time_ns, Some(to))?;
        }
        removed?;
        // Giving back the second link also sets the file's change time (a rename changes it).
        self.give_back_link(source.file, from, time_ns);
        Ok(Response::Done)
    }

    /// A rename whose file's backend file moved with the name did not happen: the file moves
    /// back (exchanged again with the replaced file's backend file, if there was one).
    fn move_backend_file_back(&self, file: FileId, from: &str, to: &str) {
        match self.files.move_with_name(file, to, from) {
            Ok(true) => {}
            Ok(false) => log::warn!("rename {from} -> {to} failed, and the backend file could not be moved back"),
            Err(errno) => log::warn!("rename {from} -> {to} failed, and the backend file could not be moved back ({errno})"),
        }
    }

    /// A rename over `file` (which gave up its pending backend creation at `to`) did not
    /// happen: the file, still named `to`, is made there again (all its bytes are in ringfs:
    /// a pending creation means its backend file was not made yet).
    fn take_backend_name_back(&self, yielded: Option<FileId>, to: &str) {
        let Some(file) = yielded else { return };
        if let Err(errno) = self.files.bind_into_cached_tree(file, to) {
            log::warn!("rename over {to} failed, and the replaced file could not be bound to its name in the backend again ({errno})");
        }
    }

    /// Gives back the link a rename counted for its new name (logged if that fails: the file
    /// then keeps a link too many, which is safe).
    fn give_back_link(&self, file: FileId, from: &str, time_ns: i64) {
        if let Err(errno) = self.files.drop_link(file, time_ns, None) {
            log::warn!("rename of {from}: the file's extra link could not be given back ({errno}); it keeps a link too many");
        }
    }
}
