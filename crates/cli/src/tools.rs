//! Small file tools: put, get, cat, ls, stat, rm, mkdir, rmdir, mv, ln -s.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::{Context, Result};
use ringfs_client::{Client, DirEntry, Errno, OpenFlags, Stat};

/// Buffer size of copies in and out of ringfs.
const COPY_BUFFER: usize = 4 << 20;

/// Makes "path: error" messages for failed operations.
fn failed(path: &str, errno: Errno) -> anyhow::Error {
    anyhow::anyhow!("{path}: {errno}")
}

/// Copies a local file into ringfs.
pub fn put(client: &Client, local: &Path, path: &str) -> Result<u64> {
    let mut input = std::fs::File::open(local).with_context(|| format!("cannot open {}", local.display()))?;
    let mode = input.metadata().map(|metadata| std::os::unix::fs::PermissionsExt::mode(&metadata.permissions()) & 0o7777).unwrap_or(0o644);
    let fd = client.create(path, mode).map_err(|errno| failed(path, errno))?;
    let mut buffer = vec![0u8; COPY_BUFFER];
    let mut total = 0u64;
    let copied = (|| -> Result<()> {
        loop {
            let count = input.read(&mut buffer).with_context(|| format!("cannot read {}", local.display()))?;
            if count == 0 {
                return Ok(());
            }
            client.write(fd, &buffer[..count]).map_err(|errno| failed(path, errno))?;
            total += count as u64;
        }
    })();
    client.close(fd).map_err(|errno| failed(path, errno))?;
    copied.map(|()| total)
}

/// Copies a ringfs file to a local file (`-` writes to standard output).
pub fn get(client: &Client, path: &str, local: &Path) -> Result<u64> {
    let fd = client.open(path, OpenFlags::READ, 0).map_err(|errno| failed(path, errno))?;
    let mut output: Box<dyn Write> = if local == Path::new("-") {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(std::fs::File::create(local).with_context(|| format!("cannot create {}", local.display()))?)
    };
    let mut buffer = vec![0u8; COPY_BUFFER];
    let mut total = 0u64;
    let copied = (|| -> Result<()> {
        loop {
            let count = client.read(fd, &mut buffer).map_err(|errno| failed(path, errno))?;
            if count == 0 {
                return output.flush().context("cannot write the output");
            }
            output.write_all(&buffer[..count]).context("cannot write the output")?;
            total += count as u64;
        }
    })();
    client.close(fd).map_err(|errno| failed(path, errno))?;
    copied.map(|()| total)
}

fn type_char(stat: &Stat) -> char {
    match stat.kind() {
        Some(ringfs_client::FileKind::Directory) => 'd',
        Some(ringfs_client::FileKind::Symlink) => 'l',
        _ => '-',
    }
}

fn permissions(mode: u32) -> String {
    (0..9).map(|bit| if mode & (1 << (8 - bit)) != 0 { ['r', 'w', 'x'][bit % 3] } else { '-' }).collect()
}

fn print_long(name: &str, stat: &Stat) {
    println!("{}{} {:>5} {:>5} {:>12} {}", type_char(stat), permissions(stat.mode), stat.uid, stat.gid, stat.size, name);
}

/// Lists a directory (or shows one file).
pub fn ls(client: &Client, path: &str, long: bool) -> Result<()> {
    let stat = client.lstat(path).map_err(|errno| failed(path, errno))?;
    let entries: Vec<DirEntry> = if stat.is_dir() {
        client.readdir(path).map_err(|errno| failed(path, errno))?
    } else {
        vec![DirEntry { name: path.to_string(), stat }]
    };
    for entry in entries {
        if long {
            print_long(&entry.name, &entry.stat);
        } else {
            println!("{}", entry.name);
        }
    }
    Ok(())
}

pub fn stat(client: &Client, path: &str) -> Result<()> {
    let stat = client.lstat(path).map_err(|errno| failed(path, errno))?;
    let kind = match stat.kind() {
        Some(ringfs_client::FileKind::Directory) => "directory",
        Some(ringfs_client::FileKind::Symlink) => "symbolic link",
        _ => "regular file",
    };
    println!("  File: {path}");
    println!("  Type: {kind}");
    println!("  Size: {}  Chunk size: {}  Id: {:016x}", stat.size, stat.chunk_size, stat.ino);
    println!("Access: {:04o} ({}{})  Uid: {}  Gid: {}", stat.mode & 0o7777, type_char(&stat), permissions(stat.mode), stat.uid, stat.gid);
    println!("Modify: {}.{:09}", stat.mtime_ns.div_euclid(1_000_000_000), stat.mtime_ns.rem_euclid(1_000_000_000));
    if stat.kind() == Some(ringfs_client::FileKind::Symlink) {
        println!("Target: {}", client.readlink(path).map_err(|errno| failed(path, errno))?);
    }
    Ok(())
}

/// Creates a directory, and with `parents` every missing ancestor (no error if it exists).
pub fn mkdir(client: &Client, path: &str, parents: bool) -> Result<()> {
    if !parents {
        return client.mkdir(path, 0o755).map_err(|errno| failed(path, errno));
    }
    let canonical = ringfs_proto::path::canonicalize(path).map_err(|errno| failed(path, errno))?;
    let mut prefix = String::new();
    for component in canonical.split('/').filter(|component| !component.is_empty()) {
        prefix.push('/');
        prefix.push_str(component);
        match client.mkdir(&prefix, 0o755) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(errno) => return Err(failed(&prefix, errno)),
        }
    }
    Ok(())
}

/// Removes a file, or with `recursive` a whole tree.
pub fn rm(client: &Client, path: &str, recursive: bool) -> Result<()> {
    let stat = client.lstat(path).map_err(|errno| failed(path, errno))?;
    if !stat.is_dir() {
        return client.unlink(path).map_err(|errno| failed(path, errno));
    }
    if !recursive {
        return Err(failed(path, Errno::EISDIR));
    }
    client.remove_tree(path).map_err(|errno| failed(path, errno))
}
