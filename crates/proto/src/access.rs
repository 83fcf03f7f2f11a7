//! Who a request acts for, and the permission rules of Linux that servers enforce for them.
//!
//! A client states its [`Credentials`] in its `Hello`; a client acting for several users (the
//! FUSE mount) wraps a request in `Request::AsUser` to state another's. The rules here are
//! pure functions of the credentials and the attributes involved, shared by the servers (which
//! enforce them) and the client (whose `access` reports them).

use crate::attr::{Attr, FileKind};
use crate::errno::Errno;
use crate::message::{Credentials, SetAttr};

/// Read, write and execute (search, for a directory) permission, as in `access(2)`.
pub const MAY_READ: u32 = 4;
pub const MAY_WRITE: u32 = 2;
pub const MAY_EXECUTE: u32 = 1;

const SET_UID: u32 = 0o4000;
const SET_GID: u32 = 0o2000;
const STICKY: u32 = 0o1000;
const GROUP_EXECUTE: u32 = 0o010;

impl Credentials {
    /// Root: what servers act as for their own steps.
    pub fn root() -> Credentials {
        Credentials::default()
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether the user is in group `gid` (primary or supplementary).
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// The `MAY_*` bits this user has on an object with `mode`, owner `uid` and group `gid`:
    /// the owner's, the group's or the others' class, and for root everything except
    /// executing a non-directory that nobody may execute.
    pub fn granted(&self, mode: u32, uid: u32, gid: u32) -> u32 {
        if self.is_root() {
            let executable = mode & 0o111 != 0 || FileKind::from_mode(mode) == Some(FileKind::Directory);
            return MAY_READ | MAY_WRITE | if executable { MAY_EXECUTE } else { 0 };
        }
        let class = if self.uid == uid {
            mode >> 6
        } else if self.in_group(gid) {
            mode >> 3
        } else {
            mode
        };
        class & 7
    }

    /// EACCES unless every bit of `wanted` is granted on `attr`.
    pub fn check(&self, attr: &Attr, wanted: u32) -> Result<(), Errno> {
        if wanted & !self.granted(attr.mode, attr.uid, attr.gid) != 0 { Err(Errno::EACCES) } else { Ok(()) }
    }

    /// Whether this user may remove or rename `victim` out of directory `dir`: the sticky
    /// bit restricts that to the owners of the entry and of the directory (and root).
    pub fn may_remove_from(&self, dir: &Attr, victim: &Attr) -> bool {
        dir.mode & STICKY == 0 || self.is_root() || self.uid == dir.uid || self.uid == victim.uid
    }

    /// Checks a change of attributes of `attr` as `chmod`, `chown` and `utimensat` do, and
    /// returns the change to apply: a `chmod` by someone outside the file's group drops the
    /// set-group-ID bit, and a `chown` of a non-directory (by anyone, root too) drops
    /// set-user-ID, and set-group-ID when the group may execute.
    pub fn authorize_set_attr(&self, attr: &Attr, set: &SetAttr) -> Result<SetAttr, Errno> {
        let root = self.is_root();
        let owner = root || self.uid == attr.uid;
        let mut change = set.clone();
        if let Some(uid) = set.uid
            && !(root || (self.uid == attr.uid && uid == attr.uid))
        {
            return Err(Errno::EPERM);
        }
        if let Some(gid) = set.gid
            && !(root || (self.uid == attr.uid && (gid == attr.gid || self.in_group(gid))))
        {
            return Err(Errno::EPERM);
        }
        if let Some(mode) = set.mode {
            if !owner {
                return Err(Errno::EPERM);
            }
            let group = set.gid.unwrap_or(attr.gid);
            if !root && !self.in_group(group) {
                change.mode = Some(mode & !SET_GID);
            }
        }
        if set.times_explicit {
            if !owner {
                return Err(Errno::EPERM);
            }
        } else if (set.atime_ns.is_some() || set.mtime_ns.is_some()) && !owner {
            self.check(attr, MAY_WRITE)?;
        }
        // As Linux since 2.2.13, for root as for others.
        if (set.uid.is_some() || set.gid.is_some()) && change.mode.is_none() && !attr.is_dir() {
            let mut mode = attr.mode & 0o7777 & !SET_UID;
            if attr.mode & GROUP_EXECUTE != 0 {
                mode &= !SET_GID;
            }
            if mode != attr.mode & 0o7777 {
                change.mode = Some(mode);
            }
        }
        Ok(change)
    }

    /// The owner, group and mode of an entry this user creates with `mode` in directory
    /// `parent`: in a set-group-ID directory it takes the directory's group (a new directory
    /// also the set-group-ID bit); a set-group-ID bit the user could not set (not in the
    /// group) is dropped.
    pub fn new_entry_owner(&self, parent: &Attr, mode: u32) -> (u32, u32, u32) {
        if parent.mode & SET_GID != 0 {
            let directory = FileKind::from_mode(mode) == Some(FileKind::Directory);
            let mut mode = if directory { mode | SET_GID } else { mode };
            if !directory && !self.is_root() && !self.in_group(parent.gid) {
                mode &= !SET_GID;
            }
            return (self.uid, parent.gid, mode);
        }
        let mode = if !self.is_root() && !self.in_group(self.gid) { mode & !SET_GID } else { mode };
        (self.uid, self.gid, mode)
    }

    /// Whether this user may read (`write` false) or change extended attribute `name` of
    /// `attr`, as Linux decides:
    /// - `user.`: only regular files and directories (others: EPERM to change, ENODATA to
    ///   read); read permission to read, write permission to change (EACCES), and on a
    ///   sticky directory ownership (EPERM);
    /// - `trusted.`: root only (EPERM);
    /// - `security.`: anyone reads, root changes;
    /// - `system.` (POSIX ACLs among them) and any other prefix: EOPNOTSUPP.
    pub fn check_xattr(&self, attr: &Attr, name: &str, write: bool) -> Result<(), Errno> {
        let root = self.is_root();
        if name.starts_with("user.") {
            if !(attr.is_dir() || attr.is_regular()) {
                return Err(if write { Errno::EPERM } else { Errno::ENODATA });
            }
            if write && attr.is_dir() && attr.mode & STICKY != 0 && !root && self.uid != attr.uid {
                return Err(Errno::EPERM);
            }
            return self.check(attr, if write { MAY_WRITE } else { MAY_READ });
        }
        if name.starts_with("trusted.") {
            return if root { Ok(()) } else { Err(Errno::EPERM) };
        }
        if name.starts_with("security.") {
            return if root || !write { Ok(()) } else { Err(Errno::EPERM) };
        }
        Err(Errno::EOPNOTSUPP)
    }

    /// Whether this user sees extended attribute `name` in a list (`trusted.` is root's).
    pub fn lists_xattr(&self, name: &str) -> bool {
        self.is_root() || !name.starts_with("trusted.")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FileId;

    fn attr(mode: u32, uid: u32, gid: u32) -> Attr {
        Attr { mode, uid, gid, file_id: FileId { anchor: 1, serial: 2 }, nlink: 1, ..Attr::default() }
    }

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Credentials {
        Credentials { uid, gid, groups: groups.to_vec() }
    }

    #[test]
    fn classes_and_root() {
        let file = attr(0o100640, 10, 20);
        assert_eq!(user(10, 99, &[]).granted(file.mode, 10, 20), MAY_READ | MAY_WRITE);
        assert_eq!(user(11, 99, &[20]).granted(file.mode, 10, 20), MAY_READ);
        assert_eq!(user(11, 99, &[]).granted(file.mode, 10, 20), 0);
        // The owner's class applies even when it grants less than the group's.
        assert_eq!(user(10, 20, &[]).granted(0o100070, 10, 20), 0);
        assert_eq!(Credentials::root().granted(0o100000, 10, 20), MAY_READ | MAY_WRITE);
        assert_eq!(Credentials::root().granted(0o100001, 10, 20), 7);
        assert_eq!(Credentials::root().granted(0o040000, 10, 20), 7);
        assert_eq!(user(11, 99, &[]).check(&file, MAY_READ), Err(Errno::EACCES));
    }

    #[test]
    fn sticky_directories_protect_others_entries() {
        let tmp = attr(0o041777, 0, 0);
        let theirs = attr(0o100644, 10, 10);
        assert!(user(10, 10, &[]).may_remove_from(&tmp, &theirs));
        assert!(!user(11, 11, &[]).may_remove_from(&tmp, &theirs));
        assert!(Credentials::root().may_remove_from(&tmp, &theirs));
        assert!(user(11, 11, &[]).may_remove_from(&attr(0o040777, 0, 0), &theirs));
    }

    #[test]
    fn set_attr_rules() {
        let file = attr(0o106755, 10, 20);
        let set = |change: fn(&mut SetAttr)| {
            let mut set = SetAttr::new(file.file_id, 1);
            change(&mut set);
            set
        };
        let owner = user(10, 20, &[]);
        let other = user(11, 11, &[]);
        assert_eq!(other.authorize_set_attr(&file, &set(|s| s.mode = Some(0o777))), Err(Errno::EPERM));
        assert_eq!(owner.authorize_set_attr(&file, &set(|s| s.uid = Some(11))), Err(Errno::EPERM));
        assert!(owner.authorize_set_attr(&file, &set(|s| s.uid = Some(10))).is_ok());
        assert_eq!(owner.authorize_set_attr(&file, &set(|s| s.gid = Some(30))), Err(Errno::EPERM));
        // chgrp to a group of one's own drops set-user-ID and (group-executable) set-group-ID.
        let changed = user(10, 20, &[30]).authorize_set_attr(&file, &set(|s| s.gid = Some(30))).unwrap();
        assert_eq!(changed.mode, Some(0o755));
        // chmod outside the file's group drops set-group-ID.
        let changed = user(10, 99, &[]).authorize_set_attr(&file, &set(|s| s.mode = Some(0o2755))).unwrap();
        assert_eq!(changed.mode, Some(0o755));
        // Explicit times: the owner only; "now": write permission is enough.
        let writable = attr(0o100666, 10, 20);
        let mut now = SetAttr::new(file.file_id, 1);
        now.mtime_ns = Some(1);
        assert!(other.authorize_set_attr(&writable, &now).is_ok());
        now.times_explicit = true;
        assert_eq!(other.authorize_set_attr(&writable, &now), Err(Errno::EPERM));
        now.times_explicit = false;
        assert_eq!(other.authorize_set_attr(&attr(0o100644, 10, 20), &now), Err(Errno::EACCES));
    }

    #[test]
    fn set_group_id_directories_pass_their_group_on() {
        let shared = attr(0o042775, 0, 50);
        let member = user(10, 10, &[50]);
        assert_eq!(member.new_entry_owner(&shared, 0o100644), (10, 50, 0o100644));
        assert_eq!(member.new_entry_owner(&shared, 0o040755), (10, 50, 0o042755));
        assert_eq!(user(11, 11, &[]).new_entry_owner(&shared, 0o102755), (11, 50, 0o100755));
        assert_eq!(member.new_entry_owner(&attr(0o040755, 0, 0), 0o100644), (10, 10, 0o100644));
    }

    #[test]
    fn xattr_namespaces() {
        let file = attr(0o100644, 10, 20);
        assert!(user(11, 11, &[]).check_xattr(&file, "user.a", false).is_ok());
        assert_eq!(user(11, 11, &[]).check_xattr(&file, "user.a", true), Err(Errno::EACCES));
        assert_eq!(user(10, 10, &[]).check_xattr(&file, "trusted.a", false), Err(Errno::EPERM));
        assert_eq!(user(10, 10, &[]).check_xattr(&file, "system.posix_acl_access", false), Err(Errno::EOPNOTSUPP));
        assert!(!user(10, 10, &[]).lists_xattr("trusted.a"));
    }
}
