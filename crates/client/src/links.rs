//! Where symbolic links lead. A link's target is a string; the process resolving it decides
//! what it means. Through this client (the C library, Python) ringfs is the whole tree: an
//! absolute target is a ringfs path. A client told where its process sees ringfs
//! ([`crate::ClientConfig::mounted_at`], as the LD_PRELOAD library is) resolves targets as a
//! mount there would: an absolute target under that prefix is ringfs's, any other absolute
//! target — or a relative one leaving through `..` — is the kernel's, and a call that follows
//! such a link fails with [`LEADS_OUT`] for the caller to redo outside ringfs
//! ([`Client::resolve_links`] says where).

use ringfs_proto::path;

use crate::{Client, Errno, Result};

/// Most symbolic links followed while resolving one path (Linux's `MAXSYMLINKS`).
pub(crate) const MAX_SYMLINK_HOPS: usize = 40;

/// What a call that follows a symbolic link leading out of ringfs fails with (only with
/// [`crate::ClientConfig::mounted_at`]): the caller asks [`Client::resolve_links`] where it
/// leads.
pub const LEADS_OUT: Errno = Errno::EXDEV;

/// Where a path leads once its symbolic links are followed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkDestination {
    /// A ringfs path (canonical).
    Ringfs(String),
    /// A path outside ringfs, as the process sees it (canonical, absolute).
    Outside(String),
}

/// Where the symbolic link at ringfs path `link` with `target` leads, for a process that
/// sees ringfs at `mounted_at` (`None`: ringfs is the whole tree).
pub fn link_destination(mounted_at: Option<&str>, link: &str, target: &str) -> Result<LinkDestination> {
    let Some(mount) = mounted_at else {
        let parent = path::parent(link).unwrap_or("/");
        let destination = if target.starts_with('/') { target.to_string() } else { path::join(parent, target) };
        return path::canonicalize(&destination).map(LinkDestination::Ringfs);
    };
    let seen = if target.starts_with('/') {
        target.to_string()
    } else {
        let parent = path::parent(link).unwrap_or("/");
        format!("{mount}{}/{target}", if parent == "/" { "" } else { parent })
    };
    let seen = path::canonicalize(&seen)?;
    Ok(match seen.strip_prefix(mount) {
        Some("") => LinkDestination::Ringfs("/".to_string()),
        Some(rest) if rest.starts_with('/') => LinkDestination::Ringfs(rest.to_string()),
        _ => LinkDestination::Outside(seen),
    })
}

impl Client {
    /// The canonical ringfs path the symbolic link at `path` points to; [`LEADS_OUT`] when it
    /// leads out of ringfs.
    pub(crate) fn follow_link(&self, path: &str) -> Result<String> {
        let target = self.readlink(path)?;
        match link_destination(self.inner.mounted_at.as_deref(), path, &target)? {
            LinkDestination::Ringfs(destination) => Ok(destination),
            LinkDestination::Outside(_) => Err(LEADS_OUT),
        }
    }

    /// Where `path` leads once the symbolic links of its last component are followed: a
    /// ringfs path that is not a link (or does not exist), or a path outside ringfs. ELOOP
    /// after [`MAX_SYMLINK_HOPS`] links.
    pub fn resolve_links(&self, path: &str) -> Result<LinkDestination> {
        let mut path = path::canonicalize(path)?;
        for _ in 0..MAX_SYMLINK_HOPS {
            match self.lookup_attr(&path) {
                Ok(attr) if attr.is_symlink() => {}
                Ok(_) | Err(Errno::ENOENT) => return Ok(LinkDestination::Ringfs(path)),
                Err(errno) => return Err(errno),
            }
            let target = self.readlink(&path)?;
            match link_destination(self.inner.mounted_at.as_deref(), &path, &target)? {
                LinkDestination::Ringfs(next) => path = next,
                outside => return Ok(outside),
            }
        }
        Err(Errno::ELOOP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ringfs(path: &str) -> Result<LinkDestination> {
        Ok(LinkDestination::Ringfs(path.to_string()))
    }

    fn outside(path: &str) -> Result<LinkDestination> {
        Ok(LinkDestination::Outside(path.to_string()))
    }

    #[test]
    fn without_a_mount_every_target_is_a_ringfs_path() {
        assert_eq!(link_destination(None, "/venv/bin/python3", "/usr/bin/python3"), ringfs("/usr/bin/python3"));
        assert_eq!(link_destination(None, "/venv/bin/python3", "python"), ringfs("/venv/bin/python"));
        assert_eq!(link_destination(None, "/a/link", "../../../x"), ringfs("/x"), "`..` stops at the root");
    }

    #[test]
    fn seen_from_a_mount_absolute_targets_outside_it_are_the_kernels() {
        let mount = Some("/ringfs");
        assert_eq!(link_destination(mount, "/venv/bin/python3", "/usr/bin/python3"), outside("/usr/bin/python3"));
        assert_eq!(link_destination(mount, "/venv/bin/python3", "/ringfs/venv/bin/python"), ringfs("/venv/bin/python"));
        assert_eq!(link_destination(mount, "/venv/bin/python3", "/ringfs"), ringfs("/"));
        assert_eq!(link_destination(mount, "/venv/bin/python3", "/ringfsx/y"), outside("/ringfsx/y"));
        assert_eq!(link_destination(mount, "/venv/bin/python3", "python"), ringfs("/venv/bin/python"));
        assert_eq!(link_destination(mount, "/link", "d/e"), ringfs("/d/e"));
        assert_eq!(link_destination(mount, "/a/link", "../../etc/passwd"), outside("/etc/passwd"), "`..` leaves the mount");
        assert_eq!(link_destination(mount, "/a/link", "../b"), ringfs("/b"));
    }
}
