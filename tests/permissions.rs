//! Owners and permissions (issue 12) through the FUSE mount, as root and as two unprivileged
//! users (uids that need no account: the test runs its shell commands under them).
//!
//! The mount runs as root with `--allow-other`, as a job's mount shared with other users
//! would; the kernel checks modes against the attributes ringfs reports
//! (`default_permissions`), so what ringfs must get right is whom entries belong to.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

use common::{TestCluster, fuse_available, running_as_root};

/// Two users with no account: uid = gid.
const ALICE: u32 = 65534;
const BOB: u32 = 60001;

/// Runs `script` with `sh` as `uid` (and group `uid`, no supplementary groups).
fn as_user(uid: u32, script: &str) -> Output {
    let mut command = Command::new("sh");
    command.arg("-c").arg(script).current_dir("/").env_clear().env("PATH", "/usr/bin:/bin").env("XATTR", XATTR);
    // (std drops the supplementary groups when root sets the uid.)
    command.uid(uid).gid(uid).output().unwrap()
}

/// A mount other users can reach (the cluster directory is private otherwise); `None` where
/// the test cannot run (no FUSE, not root).
fn shared_mount(cluster: &TestCluster) -> Option<common::Mount> {
    if !running_as_root() {
        eprintln!("SKIPPED: these tests switch users and need root");
        return None;
    }
    if !fuse_available() {
        return None;
    }
    std::fs::set_permissions(&cluster.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mount = cluster.mount(&["--allow-other"]);
    Some(mount)
}

/// `python3 -c XATTR 'op path name [value] [flags]'`: one extended-attribute call, printing
/// its result or the errno's name (the same script on the mount and on tmpfs).
const XATTR: &str = r#"
import errno, os, sys
op, path, name = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ''
try:
    if op == 'set':
        value = sys.argv[4].encode() if sys.argv[4] != 'BIG' else b'x' * 70000
        os.setxattr(path, name, value, int(sys.argv[5]), follow_symlinks=False)
        print('ok')
    elif op == 'get':
        print(os.getxattr(path, name, follow_symlinks=False))
    elif op == 'list':
        print(sorted(os.listxattr(path, follow_symlinks=False)))
    elif op == 'remove':
        os.removexattr(path, name, follow_symlinks=False)
        print('ok')
except OSError as error:
    print(errno.errorcode[error.errno])
"#;

/// What a step did: its exit status and its error output (paths made relative).
fn outcome(uid: u32, script: &str, root: &str) -> (bool, String, String) {
    let output = as_user(uid, &script.replace("{root}", root));
    // Lines sorted: directory order differs between file systems.
    let clean = |bytes: &[u8]| {
        let text = String::from_utf8_lossy(bytes).replace(root, "ROOT");
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort();
        lines.join("\n")
    };
    (output.status.success(), clean(&output.stdout), clean(&output.stderr))
}

/// The owner, group and mode bits of everything below `root`, by relative path.
fn ownership(root: &std::path::Path) -> Vec<(String, u32, u32, u32)> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let metadata = std::fs::symlink_metadata(entry.path()).unwrap();
            let name = entry.path().strip_prefix(root).unwrap().display().to_string();
            // (A symbolic link's mode is always 0777.)
            found.push((name, metadata.uid(), metadata.gid(), metadata.mode() & 0o7777));
            if metadata.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    found.sort();
    found
}

/// Steps of two users and root in a shared sticky directory, run on the mount and on tmpfs:
/// every step must succeed or fail alike (same message), and the trees must end with the
/// same owners and modes.
#[test]
fn users_own_what_they_create_and_modes_keep_others_out_as_on_tmpfs() {
    let cluster = TestCluster::start(2);
    let Some(mount) = shared_mount(&cluster) else { return };
    let tmpfs = std::path::PathBuf::from(format!("/dev/shm/ringfs-permissions-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmpfs);
    std::fs::create_dir(&tmpfs).unwrap();
    std::fs::set_permissions(&tmpfs, std::fs::Permissions::from_mode(0o755)).unwrap();
    let steps: &[(u32, &str)] = &[
        (0, "mkdir {root}/shared && chmod 1777 {root}/shared"),
        (
            ALICE,
            "umask 027 && mkdir {root}/shared/a && echo secret > {root}/shared/a/private && chmod 600 {root}/shared/a/private \
             && echo hi > {root}/shared/a/public && chmod 644 {root}/shared/a/public && ln -s public {root}/shared/a/link \
             && mkfifo {root}/shared/a/fifo",
        ),
        // Bob is neither owner nor in Alice's group: "other" bits (none on a/ yet).
        (BOB, "ls {root}/shared/a"),
        (BOB, "cat {root}/shared/a/private"),
        (ALICE, "chmod 755 {root}/shared/a"),
        (BOB, "ls {root}/shared/a"),
        (BOB, "cat {root}/shared/a/private"),
        (BOB, "cat {root}/shared/a/public"),
        (BOB, "touch {root}/shared/a/new"),
        (BOB, "echo x >> {root}/shared/a/public"),
        (BOB, "chmod 777 {root}/shared/a/public"),
        (BOB, "chown 60001 {root}/shared/a/public"),
        (ALICE, "chown 0 {root}/shared/a/public"),
        (ALICE, "chgrp 0 {root}/shared/a/public"),
        // The sticky bit: Bob may create in shared/, not remove or move what Alice owns.
        (BOB, "mkdir {root}/shared/b && echo mine > {root}/shared/b/f"),
        (BOB, "rm -rf {root}/shared/a"),
        (BOB, "mv {root}/shared/a {root}/shared/b/taken"),
        (ALICE, "rmdir {root}/shared/b"),
        (ALICE, "rm -f {root}/shared/b/f"),
        // Root reads anything and gives files away.
        (0, "cat {root}/shared/a/private"),
        (0, "chown 60001:60001 {root}/shared/a/public"),
        (BOB, "echo more >> {root}/shared/a/public && cat {root}/shared/a/public"),
        (ALICE, "cat {root}/shared/a/public"),
        // Setting the group of one's own file to a group one is not in is refused.
        (ALICE, "chgrp 60001 {root}/shared/a/private"),
        // Extended attributes: user.* by permission, trusted.* for root only, Linux's errors.
        (
            ALICE,
            "x() { python3 -c \"$XATTR\" \"$@\"; }; f={root}/shared/a/public; x set $f user.color blue 0; x get $f user.color; \
                 x set $f user.color red 1; x set $f user.size big 2; x set $f user.color red 2; x get $f user.color; x list $f; \
                 x remove $f user.nothing; x get $f user.nothing; x set $f user.big BIG 0; x set $f trusted.t 1 0; \
                 x set $f other.name v 0; x set {root}/shared/a/fifo user.a 1 0; x get {root}/shared/a/fifo user.a; \
                 x set {root}/shared/a user.dir yes 0; x list {root}/shared/a",
        ),
        (
            BOB,
            "x() { python3 -c \"$XATTR\" \"$@\"; }; f={root}/shared/a/public; x get $f user.color; x set $f user.color green 0; \
               x remove $f user.color; x list $f; x get {root}/shared/a/private user.any",
        ),
        (
            0,
            "x() { python3 -c \"$XATTR\" \"$@\"; }; f={root}/shared/a/public; x set $f trusted.t root-only 0; x get $f trusted.t; \
             x list $f; x set $f security.s label 0; x get $f security.s",
        ),
        (
            BOB,
            "x() { python3 -c \"$XATTR\" \"$@\"; }; f={root}/shared/a/public; x list $f; x get $f trusted.t; x get $f security.s; \
               x set $f security.s other 0",
        ),
        (ALICE, "x() { python3 -c \"$XATTR\" \"$@\"; }; x remove {root}/shared/a/public user.color; x list {root}/shared/a/public"),
        // Directories' search permission.
        (ALICE, "chmod 700 {root}/shared/a"),
        (BOB, "cat {root}/shared/a/public"),
        (BOB, "stat -c %s {root}/shared/a/public"),
    ];
    for (number, (uid, script)) in steps.iter().enumerate() {
        let on_mount = outcome(*uid, script, &mount.dir.display().to_string());
        let on_tmpfs = outcome(*uid, script, &tmpfs.display().to_string());
        assert_eq!(on_mount, on_tmpfs, "step {number} as {uid}: {script}\n(left: the mount, right: tmpfs)");
    }
    assert_eq!(ownership(&mount.dir), ownership(&tmpfs), "owners and modes (left: the mount, right: tmpfs)");
    let _ = std::fs::remove_dir_all(&tmpfs);
}

/// Extended attributes through the native client: Linux's semantics and errors, the checks
/// by namespace for another user, the root directory (held by every server), and a restart
/// of every server (`dir` store).
#[test]
fn extended_attributes_keep_linux_semantics_and_survive_a_restart() {
    use ringfs_client::{Errno, XattrFlags};
    let mut cluster = TestCluster::with_options(common::ClusterOptions { dir_store: true, ..common::ClusterOptions::new(2) });
    let client = cluster.client();
    common::write_file(&client, "/f", b"data");
    let binary: Vec<u8> = (0..=255).collect();
    client.set_xattr("/f", "user.a", b"1", 0).unwrap();
    client.set_xattr("/f", "user.binary", &binary, 0).unwrap();
    client.set_xattr("/f", "user.empty", b"", 0).unwrap();
    assert_eq!(client.get_xattr("/f", "user.binary").unwrap(), binary);
    assert_eq!(client.get_xattr("/f", "user.empty").unwrap(), b"");
    assert_eq!(client.list_xattrs("/f").unwrap(), ["user.a", "user.binary", "user.empty"]);
    assert_eq!(client.set_xattr("/f", "user.a", b"2", XattrFlags::CREATE), Err(Errno::EEXIST));
    assert_eq!(client.set_xattr("/f", "user.new", b"2", XattrFlags::REPLACE), Err(Errno::ENODATA));
    client.set_xattr("/f", "user.a", b"2", XattrFlags::REPLACE).unwrap();
    assert_eq!(client.get_xattr("/f", "user.a").unwrap(), b"2");
    assert_eq!(client.get_xattr("/f", "user.missing"), Err(Errno::ENODATA));
    assert_eq!(client.remove_xattr("/f", "user.missing"), Err(Errno::ENODATA));
    assert_eq!(client.set_xattr("/f", "user.big", &vec![0; 65537], 0), Err(Errno::E2BIG));
    assert_eq!(client.set_xattr("/f", &format!("user.{}", "n".repeat(251)), b"", 0), Err(Errno::ERANGE));
    assert_eq!(client.set_xattr("/f", "system.posix_acl_access", b"", 0), Err(Errno::EOPNOTSUPP), "no ACLs (documented)");
    assert_eq!(client.set_xattr("/f", "unknown.name", b"", 0), Err(Errno::EOPNOTSUPP));
    let before = client.stat("/f").unwrap().ctime_ns;
    std::thread::sleep(std::time::Duration::from_millis(2));
    client.remove_xattr("/f", "user.empty").unwrap();
    assert!(client.stat("/f").unwrap().ctime_ns > before, "a change of extended attributes changes ctime");
    // Another (unprivileged) user: trusted.* is root's, user.* needs permissions.
    client.set_xattr("/f", "trusted.t", b"root", 0).unwrap();
    client.chmod("/f", 0o644).unwrap();
    let other = client.as_user(ringfs_client::Credentials { uid: BOB, gid: BOB, groups: Vec::new() });
    assert_eq!(other.list_xattrs("/f").unwrap(), ["user.a", "user.binary"], "trusted.* is hidden");
    assert_eq!(other.get_xattr("/f", "trusted.t"), Err(Errno::EPERM));
    assert_eq!(other.get_xattr("/f", "user.a").unwrap(), b"2");
    assert_eq!(other.set_xattr("/f", "user.a", b"3", 0), Err(Errno::EACCES));
    // The root directory and a directory.
    client.mkdir("/d", 0o755).unwrap();
    client.set_xattr("/", "user.root", b"r", 0).unwrap();
    client.set_xattr("/d", "user.dir", b"d", 0).unwrap();
    client.symlink("/f", "/link").unwrap();
    assert_eq!(client.get_xattr("/link", "user.a").unwrap(), b"2", "followed");
    assert_eq!(client.lset_xattr("/link", "user.a", b"x", 0), Err(Errno::EPERM), "no user.* on a link itself");

    for server in 0..2 {
        cluster.stop(server);
        cluster.restart(server);
    }
    cluster.wait_for_alive(2);
    let client = cluster.client();
    assert_eq!(client.list_xattrs("/f").unwrap(), ["trusted.t", "user.a", "user.binary"]);
    assert_eq!(client.get_xattr("/f", "user.binary").unwrap(), binary);
    assert_eq!(client.get_xattr("/", "user.root").unwrap(), b"r");
    assert_eq!(client.get_xattr("/d", "user.dir").unwrap(), b"d");
    // A removed file takes its attributes along (nothing is left beside its chunk files).
    client.unlink("/f").unwrap();
    client.unlink("/link").unwrap();
    let leftovers = std::process::Command::new("find").arg(&cluster.dir).args(["-name", "*.xattr"]).output().unwrap();
    let leftovers = String::from_utf8_lossy(&leftovers.stdout);
    assert_eq!(leftovers.lines().count(), 3, "only / (on each of the 2 servers) and /d keep attributes: {leftovers}");
}

/// Describes a tree, one line per entry: path, type, mode, owner, group, mtime, size, a
/// digest of the contents and the `user.` extended attributes.
const DESCRIBE: &str = r#"
import hashlib, os, stat, sys
root = sys.argv[1]
for dirpath, dirnames, filenames in os.walk(root):
    for name in sorted(dirnames + filenames):
        path = os.path.join(dirpath, name)
        info = os.lstat(path)
        kind = stat.S_IFMT(info.st_mode)
        digest = hashlib.sha1(open(path, 'rb').read()).hexdigest()[:12] if stat.S_ISREG(info.st_mode) else ''
        if stat.S_ISLNK(info.st_mode):
            digest = os.readlink(path)
        xattrs = sorted((n, os.getxattr(path, n, follow_symlinks=False)) for n in os.listxattr(path, follow_symlinks=False) if n.startswith('user.'))
        mode = '' if stat.S_ISLNK(info.st_mode) else oct(stat.S_IMODE(info.st_mode))
        print(os.path.relpath(path, root), kind, mode, info.st_uid, info.st_gid, info.st_mtime_ns // 10**9, info.st_size if not stat.S_ISDIR(info.st_mode) else '', digest, xattrs)
"#;

fn describe(root: &std::path::Path) -> String {
    let output = Command::new("python3").arg("-c").arg(DESCRIBE).arg(root).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let mut lines: Vec<String> = String::from_utf8_lossy(&output.stdout).lines().map(str::to_string).collect();
    lines.sort();
    lines.join("\n")
}

fn run(script: &str) {
    let output = Command::new("sh").arg("-c").arg(script).output().unwrap();
    assert!(output.status.success(), "{script}: {}", String::from_utf8_lossy(&output.stderr));
}

/// `cp -a`, `rsync -aX` and `tar --xattrs` copy a tree of several owners, modes, times and
/// extended attributes into the mount and back out, keeping all of them.
#[test]
fn cp_rsync_and_tar_keep_modes_owners_times_and_xattrs() {
    let cluster = TestCluster::start(2);
    let Some(mount) = shared_mount(&cluster) else { return };
    let m = mount.dir.display().to_string();
    let shm = format!("/dev/shm/ringfs-roundtrip-{}", std::process::id());
    let _ = std::fs::remove_dir_all(&shm);
    run(&format!(
        "set -e; mkdir -p {shm}/src/sub && cd {shm}/src && echo alice > alice && echo bob > bob && echo x > sub/x \
         && head -c 300000 /dev/urandom > big && ln -s alice link && mkfifo fifo \
         && chown {ALICE}:{ALICE} alice link fifo && chown -h {ALICE}:{ALICE} link && chown {BOB}:{BOB} bob sub \
         && chmod 640 alice && chmod 600 bob && chmod 700 sub && chmod 444 sub/x && chmod 2755 big \
         && python3 -c \"import os; os.setxattr('alice', 'user.tag', b'a'); os.setxattr('sub', 'user.dir', b'd'); os.setxattr('big', 'user.bin', bytes(range(256)))\" \
         && touch -d @1000000000 alice bob sub/x big fifo && touch -h -d @1000000000 link && touch -d @1100000000 sub"
    ));
    let source = describe(std::path::Path::new(&format!("{shm}/src")));
    run(&format!("cp -a {shm}/src {m}/cp"));
    assert_eq!(describe(std::path::Path::new(&format!("{m}/cp"))), source, "cp -a into the mount");
    run(&format!("rsync -aX {shm}/src/ {m}/rsync/"));
    assert_eq!(describe(std::path::Path::new(&format!("{m}/rsync"))), source, "rsync -aX into the mount");
    run(&format!("mkdir {m}/tar && tar --xattrs -C {shm}/src -cf - . | tar --xattrs --xattrs-include='*' -C {m}/tar -xpf -"));
    assert_eq!(describe(std::path::Path::new(&format!("{m}/tar"))), source, "tar --xattrs into the mount");
    run(&format!("cp -a {m}/cp {shm}/back && rsync -aX {m}/rsync/ {shm}/back-rsync/"));
    assert_eq!(describe(std::path::Path::new(&format!("{shm}/back"))), source, "cp -a out of the mount");
    assert_eq!(describe(std::path::Path::new(&format!("{shm}/back-rsync"))), source, "rsync -aX out of the mount");
    let _ = std::fs::remove_dir_all(&shm);
}

/// Which times change (m: mtime, c: ctime) on which operation — the file's, and its
/// directory's on every change of names in it —, `utimensat`, limits and open flags, errno
/// of the common mistakes, `statvfs`, `fallocate` and locks, printed one per line.
const POSIX_RULES: &str = r#"
import errno, os, sys, time
root = sys.argv[1]
def err(f):
    try:
        f(); return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
def times(p):
    s = os.stat(p, follow_symlinks=False)
    return (s.st_mtime_ns, s.st_ctime_ns)
def changed(p, action):
    before = times(p); time.sleep(0.02); action(); time.sleep(0.05); after = times(p)
    return ('m' if after[0] != before[0] else '-') + ('c' if after[1] != before[1] else '-')
d = os.path.join(root, 'rules'); os.mkdir(d)
f = os.path.join(d, 'f')
out = []
out.append(('dir on create', changed(d, lambda: open(f, 'w').close())))
out.append(('file on write', changed(f, lambda: open(f, 'a').write('x'))))
out.append(('file on truncate', changed(f, lambda: os.truncate(f, 0))))
out.append(('file on chmod', changed(f, lambda: os.chmod(f, 0o600))))
out.append(('file on chown', changed(f, lambda: os.chown(f, 0, 0))))
out.append(('file on link', changed(f, lambda: os.link(f, f + '2'))))
out.append(('dir on link', changed(d, lambda: os.link(f, f + '3'))))
out.append(('file on rename', changed(f, lambda: os.rename(f + '3', f + '4'))))
out.append(('dir on rename', changed(d, lambda: os.rename(f + '4', f + '5'))))
out.append(('dir on unlink', changed(d, lambda: os.unlink(f + '5'))))
out.append(('file on unlink of another name', changed(f, lambda: os.unlink(f + '2'))))
out.append(('dir on mkdir', changed(d, lambda: os.mkdir(os.path.join(d, 'sub')))))
out.append(('dir on rmdir', changed(d, lambda: os.rmdir(os.path.join(d, 'sub')))))
out.append(('dir on symlink', changed(d, lambda: os.symlink('f', os.path.join(d, 'l')))))
out.append(('file on utime', changed(f, lambda: os.utime(f, (1, 2)))))
out.append(('utime value', os.stat(f).st_mtime_ns))
out.append(('file on setxattr', changed(f, lambda: os.setxattr(f, 'user.a', b'1'))))
out.append(('name of 255', err(lambda: open(os.path.join(d, 'n' * 255), 'w').close())))
out.append(('name of 256', err(lambda: open(os.path.join(d, 'n' * 256), 'w').close())))
out.append(('mkdir name of 256', err(lambda: os.mkdir(os.path.join(d, 'n' * 256)))))
out.append(('O_EXCL existing', err(lambda: os.open(f, os.O_CREAT | os.O_EXCL | os.O_WRONLY))))
out.append(('O_NOFOLLOW link', err(lambda: os.open(os.path.join(d, 'l'), os.O_RDONLY | os.O_NOFOLLOW))))
out.append(('O_DIRECTORY file', err(lambda: os.open(f, os.O_RDONLY | os.O_DIRECTORY))))
os.symlink('loop2', os.path.join(d, 'loop1')); os.symlink('loop1', os.path.join(d, 'loop2'))
out.append(('ELOOP', err(lambda: open(os.path.join(d, 'loop1')))))
out.append(('open dir for write', err(lambda: os.open(d, os.O_WRONLY))))
out.append(('rmdir non-empty', err(lambda: os.rmdir(d))))
out.append(('unlink dir', err(lambda: os.unlink(d))))
out.append(('mkdir existing', err(lambda: os.mkdir(d))))
out.append(('rename dir into itself', err(lambda: os.rename(d, os.path.join(d, 'x')))))
out.append(('link to dir', err(lambda: os.link(d, os.path.join(root, 'dlink')))))
fd = os.open(f, os.O_WRONLY | os.O_APPEND); os.write(fd, b'abc'); os.lseek(fd, 0, 0); os.write(fd, b'de'); os.close(fd)
out.append(('O_APPEND', open(f, 'rb').read()))
out.append(('O_TRUNC', (os.close(os.open(f, os.O_WRONLY | os.O_TRUNC)), os.stat(f).st_size)[1]))
s = os.statvfs(root)
out.append(('statvfs namemax', s.f_namemax))
out.append(('statvfs has blocks and files', s.f_blocks > 0 and s.f_files > 0))
out.append(('fallocate', err(lambda: os.posix_fallocate(os.open(f, os.O_RDWR), 0, 1 << 20))))
out.append(('size after fallocate', os.stat(f).st_size))
import fcntl
# (Each kind on its own file: through the mount flock shares the space of fcntl locks, as on
# NFS — docs/CONSISTENCY.md, tests/locks.rs.)
fd = os.open(f, os.O_RDWR)
out.append(('flock', err(lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))))
out.append(('flock again', err(lambda: fcntl.flock(os.open(f, os.O_RDONLY), fcntl.LOCK_SH | fcntl.LOCK_NB))))
fd2 = os.open(os.path.join(d, 'locked'), os.O_RDWR | os.O_CREAT)
out.append(('fcntl lock', err(lambda: fcntl.lockf(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB))))
out.append(('fcntl lock again', err(lambda: fcntl.lockf(fd2, fcntl.LOCK_SH | fcntl.LOCK_NB, 10, 5))))
for name, value in out:
    print(name, value)
"#;

/// The same POSIX rules checked on tmpfs and through the mount print the same lines.
#[test]
fn times_limits_flags_and_errors_through_the_mount_match_tmpfs() {
    let cluster = TestCluster::start(2);
    let Some(mount) = shared_mount(&cluster) else { return };
    let rules = |root: &std::path::Path| {
        let output = Command::new("python3").arg("-c").arg(POSIX_RULES).arg(root).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let tmpfs = std::path::PathBuf::from(format!("/dev/shm/ringfs-rules-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmpfs);
    std::fs::create_dir(&tmpfs).unwrap();
    let expected = rules(&tmpfs);
    let _ = std::fs::remove_dir_all(&tmpfs);
    let got = rules(&mount.dir);
    for (line, (got, expected)) in got.lines().zip(expected.lines()).enumerate() {
        assert_eq!(got, expected, "line {line} (left: the mount, right: tmpfs)");
    }
    assert_eq!(got.lines().count(), expected.lines().count());
}

/// Through the native client too: a directory's mtime and ctime move with every change of
/// the names in it, and a `stat` right after the change shows it (rsync relies on that).
#[test]
fn directories_times_follow_their_names_through_the_native_client() {
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    client.mkdir("/d", 0o755).unwrap();
    client.mkdir("/e", 0o755).unwrap();
    let times = |path: &str| {
        let stat = client.stat(path).unwrap();
        (stat.mtime_ns, stat.ctime_ns)
    };
    type Change<'a> = (&'static str, Box<dyn Fn() + 'a>);
    let mut changes: Vec<Change> = vec![
        ("create", Box::new(|| common::write_file(&client, "/d/f", b"x"))),
        ("link", Box::new(|| client.link("/d/f", "/d/g").unwrap())),
        ("rename", Box::new(|| client.rename("/d/g", "/d/h").unwrap())),
        ("unlink", Box::new(|| client.unlink("/d/h").unwrap())),
        ("mkdir", Box::new(|| client.mkdir("/d/sub", 0o700).unwrap())),
        ("directory rename", Box::new(|| client.rename("/d/sub", "/d/sub2").unwrap())),
        ("rmdir", Box::new(|| client.rmdir("/d/sub2").unwrap())),
        ("symlink", Box::new(|| client.symlink("f", "/d/l").unwrap())),
    ];
    for (what, change) in changes.drain(..) {
        let before = times("/d");
        std::thread::sleep(std::time::Duration::from_millis(3));
        change();
        let after = times("/d");
        assert!(after.0 > before.0 && after.1 > before.1, "{what}: {before:?} -> {after:?}");
    }
    // A rename between directories changes both.
    let (d, e) = (times("/d"), times("/e"));
    std::thread::sleep(std::time::Duration::from_millis(3));
    client.rename("/d/f", "/e/f").unwrap();
    assert!(times("/d").0 > d.0 && times("/e").0 > e.0);
    // The root directory (held by every server) too.
    let root = times("/");
    std::thread::sleep(std::time::Duration::from_millis(3));
    client.mkdir("/new", 0o755).unwrap();
    assert!(times("/").0 > root.0);
}

/// Touches of a directory held back by the servers of its names (see
/// `crates/server/src/dir_times.rs`) show in every view of the directory at once: its
/// `stat`, the listing of its parent, and after it is renamed; on 4 servers, so that most
/// names live away from the directory's inode.
#[test]
fn held_back_directory_touches_show_in_stat_listing_and_after_rename() {
    let wall_clock_ns = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
    let cluster = TestCluster::start(4);
    let client = cluster.client();
    client.mkdir("/top", 0o755).unwrap();
    client.mkdir("/top/d", 0o755).unwrap();
    let dir_mtime = |path: &str| client.stat(path).unwrap().mtime_ns;
    let listed_mtime = |name: &str| client.readdir("/top").unwrap().into_iter().find(|entry| entry.name == name).unwrap().stat.mtime_ns;
    for round in 0..20 {
        let mut newest = 0;
        for index in 0..8 {
            // (Names are stamped with the client's clock, which is this clock.)
            newest = wall_clock_ns();
            common::write_file(&client, &format!("/top/d/f{round}.{index}"), b"x");
        }
        let seen = match round % 3 {
            0 => dir_mtime("/top/d"),
            1 => listed_mtime("d"),
            _ => {
                client.rename("/top/d", "/top/e").unwrap();
                let seen = dir_mtime("/top/e");
                client.rename("/top/e", "/top/d").unwrap();
                seen
            }
        };
        assert!(seen >= newest, "round {round}: the directory shows {seen}, its newest name was made after {newest}");
        for index in 0..8 {
            newest = wall_clock_ns();
            client.unlink(&format!("/top/d/f{round}.{index}")).unwrap();
        }
        assert!(dir_mtime("/top/d") >= newest, "round {round}: removals move the time too");
    }
}

/// `fallocate`: the file grows to cover the range (reading zeros), `KEEP_SIZE` leaves the
/// size, a range the servers have no room for fails at once with ENOSPC and changes nothing,
/// other modes are not supported — through the native client and through the mount.
#[test]
fn fallocate_grows_files_and_refuses_what_does_not_fit() {
    use ringfs_client::{Errno, FALLOC_FL_KEEP_SIZE, OpenFlags};
    let options = common::ClusterOptions { capacity: Some("8M".into()), ..common::ClusterOptions::new(2) };
    let cluster = TestCluster::with_options(options);
    let client = cluster.client();
    let fd = client.open("/f", OpenFlags::READ | OpenFlags::WRITE | OpenFlags::CREATE, 0o644).unwrap();
    client.pwrite(fd, b"head", 0).unwrap();
    client.fallocate(fd, 0, 0, 3 << 20).unwrap();
    assert_eq!(client.fstat(fd).unwrap().size, 3 << 20);
    let mut bytes = vec![1u8; 8];
    assert_eq!(client.pread(fd, &mut bytes, 0).unwrap(), 8);
    assert_eq!(&bytes, b"head\0\0\0\0", "existing bytes stay, the rest reads as zeros");
    client.fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 5 << 20).unwrap();
    assert_eq!(client.fstat(fd).unwrap().size, 3 << 20, "KEEP_SIZE");
    assert_eq!(client.fallocate(fd, 0, 0, 64 << 20), Err(Errno::ENOSPC), "16 MiB of room for 64");
    assert_eq!(client.fstat(fd).unwrap().size, 3 << 20, "a refused fallocate changes nothing");
    assert_eq!(client.fallocate(fd, 2 /* PUNCH_HOLE */ | FALLOC_FL_KEEP_SIZE, 0, 4096), Err(Errno::EOPNOTSUPP));
    assert_eq!(client.fallocate(fd, 0, 0, 0), Err(Errno::EINVAL));

    // The room is held: another file filling the servers cannot take it, and writes into
    // the reserved range (5 MiB, with KEEP_SIZE past the end) still succeed.
    let other = client.open("/g", OpenFlags::WRITE | OpenFlags::CREATE, 0o644).unwrap();
    let block = vec![7u8; 256 << 10];
    let mut filled = 0u64;
    while client.pwrite(other, &block, filled).is_ok() {
        filled += block.len() as u64;
        assert!(filled < 16 << 20, "the servers' capacity ends somewhere");
    }
    assert!((4 << 20..11 << 20).contains(&filled), "the other file got the room not reserved ({filled} bytes)");
    let payload = vec![3u8; 5 << 20];
    assert_eq!(client.pwrite(fd, &payload, 0), Ok(payload.len()), "writes into the reserved range find their room");
    client.close(fd).unwrap();
    // Removing the file gives its room back.
    client.unlink("/f").unwrap();
    assert_eq!(client.pwrite(other, &block, filled), Ok(block.len()), "the removed file's room is free again");
    client.close(other).unwrap();
    client.unlink("/g").unwrap();

    if !fuse_available() {
        return;
    }
    let mount = cluster.mount(&[]);
    let m = mount.dir.display().to_string();
    run(&format!("fallocate -l 2M {m}/g && fallocate -n -o 0 -l 3M {m}/g"));
    assert_eq!(std::fs::metadata(mount.path("g")).unwrap().len(), 2 << 20);
    let refused = Command::new("fallocate").args(["-l", "64M"]).arg(mount.path("h")).output().unwrap();
    assert!(String::from_utf8_lossy(&refused.stderr).contains("No space left on device"), "{refused:?}");
    assert_eq!(std::fs::metadata(mount.path("h")).unwrap().len(), 0);
    let punched = Command::new("fallocate").args(["-p", "-o", "0", "-l", "4096"]).arg(mount.path("g")).output().unwrap();
    // (EOPNOTSUPP; util-linux words it after the mode it tried.)
    let said = String::from_utf8_lossy(&punched.stderr);
    assert!(!punched.status.success() && (said.contains("unsupported") || said.contains("not supported")), "{punched:?}");
}

/// Two processes write one SQLite database in rollback-journal mode, each through its own
/// mount of the cluster (as on two nodes): SQLite's locks, kept by the servers, keep them
/// apart, and the database ends whole with every row. In WAL mode (which needs shared
/// memory, so one node only) both write through one mount.
#[test]
fn sqlite_with_two_writers_through_the_mount() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let (mount, other_mount) = (cluster.mount(&[]), cluster.mount(&[]));
    for mode in ["DELETE", "WAL"] {
        let name = format!("db-{mode}.sqlite");
        let second = if mode == "WAL" { mount.path(&name) } else { other_mount.path(&name) };
        let output =
            Command::new("python3").arg("-c").arg(SQLITE_TWO_WRITERS).arg(mount.path(&name)).arg(mode).arg(second).output().unwrap();
        let said = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{mode}: {}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(said.trim(), "(600, 2) ok [0, 0]", "{mode}: rows, writers, integrity, exit codes");
    }
}

/// Two writer processes insert 300 rows each, one transaction per row, the second through
/// the path given third; prints the row count, the number of writers seen, the integrity
/// check and the writers' exit codes.
const SQLITE_TWO_WRITERS: &str = r#"
import sqlite3, sys, os, multiprocessing, time
path, mode, second = sys.argv[1], sys.argv[2], sys.argv[3]
def writer(n):
    db = sqlite3.connect(second if n else path, timeout=30)
    db.execute(f'PRAGMA journal_mode={mode}')
    for i in range(300):
        with db:
            db.execute('INSERT INTO t VALUES (?, ?)', (n, i))
    db.close()
db = sqlite3.connect(path)
db.execute(f'PRAGMA journal_mode={mode}')
db.execute('CREATE TABLE t (writer INTEGER, i INTEGER)')
db.commit(); db.close()
procs = [multiprocessing.Process(target=writer, args=(n,)) for n in range(2)]
for p in procs: p.start()
for p in procs: p.join()
db = sqlite3.connect(path)
print(db.execute('SELECT COUNT(*), COUNT(DISTINCT writer) FROM t').fetchone(), db.execute('PRAGMA integrity_check').fetchone()[0], [p.exitcode for p in procs])
"#;

/// The servers check every call of the native client for the user it acts for (here through
/// `Client::as_user`, which states another user with each request, as the FUSE mount does):
/// search permission along the path, write permission on the parent, the sticky bit, opens
/// for reading and writing, `chmod`/`chown`/`utimensat` rules, set-ID bits dropped, and a
/// set-group-ID directory passing its group on. A change of a directory's mode (or its
/// removal) holds at once on every server, whatever they remembered of it.
#[test]
fn servers_enforce_permissions_for_every_native_call() {
    use ringfs_client::{Credentials, Errno, OpenFlags};
    const TEAM: u32 = 5000;
    let cluster = TestCluster::start(3);
    let root = cluster.client();
    let alice = root.as_user(Credentials { uid: ALICE, gid: ALICE, groups: vec![TEAM] });
    let bob = root.as_user(Credentials { uid: BOB, gid: BOB, groups: Vec::new() });
    root.chmod("/", 0o755).unwrap();

    // Search and write permission on directories.
    root.mkdir("/closed", 0o700).unwrap();
    common::write_file(&root, "/closed/f", b"x");
    assert_eq!(alice.stat("/closed/f").map(drop), Err(Errno::EACCES), "no search permission on /closed");
    assert_eq!(alice.mkdir("/closed/d", 0o755), Err(Errno::EACCES));
    assert_eq!(alice.readdir("/closed").map(drop), Err(Errno::EACCES), "no read permission");
    assert_eq!(alice.mkdir("/mine", 0o755), Err(Errno::EACCES), "/ is root's 0755");
    assert_eq!(alice.unlink("/closed/f"), Err(Errno::EACCES));
    root.mkdir("/shared", 0o777).unwrap();
    root.chmod("/shared", 0o777).unwrap();

    // Opens, truncates, and the owner's rights.
    let fd = alice.open("/shared/a", OpenFlags::WRITE | OpenFlags::CREATE, 0o600).unwrap();
    alice.write(fd, b"alice's").unwrap();
    alice.close(fd).unwrap();
    let stat = root.stat("/shared/a").unwrap();
    assert_eq!((stat.uid, stat.gid, stat.mode & 0o7777), (ALICE, ALICE, 0o600), "owned by its creator");
    assert_eq!(bob.open("/shared/a", OpenFlags::READ, 0).map(drop), Err(Errno::EACCES));
    assert_eq!(bob.open("/shared/a", OpenFlags::WRITE, 0).map(drop), Err(Errno::EACCES));
    assert_eq!(bob.open("/shared/a", OpenFlags::WRITE | OpenFlags::CREATE, 0o666).map(drop), Err(Errno::EACCES), "exists");
    assert_eq!(bob.truncate("/shared/a", 0), Err(Errno::EACCES));
    assert_eq!(bob.chmod("/shared/a", 0o666), Err(Errno::EPERM));
    assert_eq!(bob.chown("/shared/a", Some(BOB), None), Err(Errno::EPERM));
    assert_eq!(alice.chown("/shared/a", Some(BOB), None), Err(Errno::EPERM), "only root gives files away");
    assert_eq!(alice.chown("/shared/a", None, Some(BOB)), Err(Errno::EPERM), "not her group");
    alice.chown("/shared/a", None, Some(TEAM)).unwrap();
    assert_eq!(bob.utimens("/shared/a", Some(1), Some(1)), Err(Errno::EPERM));
    assert_eq!(bob.touch("/shared/a"), Err(Errno::EACCES));
    alice.chmod("/shared/a", 0o666).unwrap();
    bob.touch("/shared/a").expect("write permission is enough to set the times to now");
    assert_eq!(bob.utimens("/shared/a", Some(1), Some(1)), Err(Errno::EPERM), "explicit times: the owner only");
    assert_eq!(common::read_file(&bob, "/shared/a").unwrap(), b"alice's");
    root.chown("/shared/a", Some(BOB), None).unwrap();
    assert_eq!(root.stat("/shared/a").unwrap().uid, BOB);

    // Set-ID bits: dropped by chown, and by a chmod outside the file's group.
    let fd = alice.create("/shared/tool", 0o755).unwrap();
    alice.close(fd).unwrap();
    alice.chmod("/shared/tool", 0o6755).unwrap();
    assert_eq!(root.stat("/shared/tool").unwrap().mode & 0o7777, 0o6755);
    root.chown("/shared/tool", Some(BOB), None).unwrap();
    assert_eq!(root.stat("/shared/tool").unwrap().mode & 0o7777, 0o755, "chown drops set-user-ID and set-group-ID");
    bob.chmod("/shared/tool", 0o2755).unwrap();
    assert_eq!(root.stat("/shared/tool").unwrap().mode & 0o7777, 0o755, "bob is not in group {ALICE}");

    // The sticky bit.
    root.mkdir("/tmp", 0o777).unwrap();
    root.chmod("/tmp", 0o1777).unwrap();
    common::write_file(&alice, "/tmp/hers", b"h");
    assert_eq!(bob.unlink("/tmp/hers"), Err(Errno::EPERM));
    assert_eq!(bob.rename("/tmp/hers", "/tmp/his"), Err(Errno::EPERM));
    common::write_file(&bob, "/tmp/his", b"b");
    assert_eq!(bob.rename("/tmp/his", "/tmp/hers"), Err(Errno::EPERM), "nor replace it");
    alice.unlink("/tmp/hers").unwrap();
    bob.unlink("/shared/a").expect("no sticky bit on /shared");

    // A set-group-ID directory passes its group on.
    root.mkdir("/team", 0o775).unwrap();
    root.chown("/team", None, Some(TEAM)).unwrap();
    root.chmod("/team", 0o2775).unwrap();
    assert_eq!(bob.mkdir("/team/x", 0o755), Err(Errno::EACCES), "bob is not in the team");
    common::write_file(&alice, "/team/f", b"t");
    alice.mkdir("/team/sub", 0o755).unwrap();
    let file = root.stat("/team/f").unwrap();
    let sub = root.stat("/team/sub").unwrap();
    assert_eq!((file.uid, file.gid), (ALICE, TEAM));
    assert_eq!((sub.gid, sub.mode & 0o7777), (TEAM, 0o2755), "a new directory keeps set-group-ID");

    // Moving a directory to another parent needs write permission on it (its `..`).
    root.mkdir("/shared/rootdir", 0o755).unwrap();
    bob.mkdir("/shared/bobs", 0o755).unwrap();
    assert_eq!(bob.rename("/shared/rootdir", "/shared/bobs/rootdir"), Err(Errno::EACCES));

    // A directory's mode and existence as they are now, on every server.
    root.mkdir("/open", 0o755).unwrap();
    let names: Vec<String> = (0..12).map(|index| format!("/open/f{index}")).collect();
    for name in &names {
        common::write_file(&root, name, b"o");
    }
    for name in &names {
        assert_eq!(common::read_file(&bob, name).unwrap(), b"o");
    }
    root.chmod("/open", 0o700).unwrap();
    for name in &names {
        assert_eq!(bob.stat(name).map(drop), Err(Errno::EACCES), "{name}: the chmod of /open holds at once everywhere");
    }
    root.chmod("/open", 0o755).unwrap();
    for name in &names {
        bob.stat(name).unwrap();
        root.unlink(name).unwrap();
    }
    root.rmdir("/open").unwrap();
    root.mkdir("/open", 0o700).unwrap();
    for name in &names {
        assert_eq!(bob.stat(name).map(drop), Err(Errno::EACCES), "{name}: /open was made again, closed");
    }
    // Root is not held back.
    common::write_file(&root, "/closed/g", b"r");
    root.chmod("/shared/tool", 0).unwrap();
    root.open("/shared/tool", OpenFlags::READ | OpenFlags::WRITE, 0).map(|fd| root.close(fd)).unwrap().unwrap();
}
