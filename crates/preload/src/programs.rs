//! `exec` of a ringfs path. The kernel cannot load a program from ringfs, so the library
//! does what the kernel would do through a mount where it can: a symbolic link leading out of
//! ringfs runs the program it leads to (a Python virtual environment's `bin/python3`), and a
//! script (`#!`) runs its interpreter with the script's path, which the interpreter then
//! reads through the library (the environment's `bin/pip`). A program whose bytes are in
//! ringfs cannot run: EACCES, as on a `noexec` mount.

use std::ffi::{CStr, CString, c_char};

use ringfs_client::{Errno, LinkDestination, OpenFlags};

use crate::state::fresh_client;

/// Most interpreters one `exec` goes through (the kernel's `BINPRM_MAX_RECURSION`).
pub(crate) const MAX_INTERPRETERS: usize = 4;
/// Longest `#!` line read, in bytes (the kernel's `BINPRM_BUF_SIZE`).
const SHEBANG_BYTES: usize = 256;

/// What the kernel runs for a ringfs path.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Program {
    /// A program outside ringfs, which a symbolic link leads to.
    Kernel(CString),
    /// A script: its interpreter, run with the optional argument of its `#!` line and the
    /// script's path.
    Script { interpreter: CString, argument: Option<CString> },
}

/// What executing ringfs path `path` runs: ENOENT if nothing is there, EACCES for a directory,
/// a file without execute permission or a program whose bytes are in ringfs. Asked with a
/// client of its own (see `state::fresh_client`).
pub(crate) fn program_at(path: &str) -> Result<Program, Errno> {
    let client = fresh_client()?;
    let file = match client.resolve_links(path)? {
        LinkDestination::Outside(program) => return CString::new(program).map(Program::Kernel).map_err(|_| Errno::EINVAL),
        LinkDestination::Ringfs(file) => file,
    };
    if client.stat(&file)?.mode & libc::S_IFMT != libc::S_IFREG {
        return Err(Errno::EACCES);
    }
    client.access(&file, libc::X_OK as u32)?;
    let fd = client.open(&file, OpenFlags::READ, 0)?;
    let mut head = vec![0u8; SHEBANG_BYTES];
    let read = client.pread(fd, &mut head, 0);
    client.close(fd)?;
    let (interpreter, argument) = parse_shebang(&head[..read?]).ok_or(Errno::EACCES)?;
    Ok(Program::Script { interpreter, argument })
}

/// The interpreter and optional argument of a `#!` line, as Linux reads it: up to the end
/// of the line, the interpreter ends at the first blank, the rest (trimmed) is one argument.
fn parse_shebang(head: &[u8]) -> Option<(CString, Option<CString>)> {
    let line = head.strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|byte| *byte == b'\n')?];
    let blank = |byte: &u8| *byte == b' ' || *byte == b'\t';
    let start = line.iter().position(|byte| !blank(byte))?;
    let line = &line[start..];
    let end = line.iter().position(blank).unwrap_or(line.len());
    let argument = line[end..].trim_ascii();
    let interpreter = CString::new(&line[..end]).ok()?;
    let argument = if argument.is_empty() { None } else { Some(CString::new(argument).ok()?) };
    Some((interpreter, argument))
}

/// The arguments a script's interpreter gets: itself, the `#!` line's argument, the script
/// as the caller named it, then the caller's arguments after the first.
///
/// # Safety
/// `argv` must be NULL or a NULL-terminated array of NUL-terminated strings.
pub(crate) unsafe fn script_arguments(
    interpreter: &CStr,
    argument: Option<&CStr>,
    script: *const c_char,
    argv: *const *const c_char,
) -> Vec<*const c_char> {
    let mut arguments = vec![interpreter.as_ptr()];
    arguments.extend(argument.map(CStr::as_ptr));
    arguments.push(script);
    if !argv.is_null() {
        // SAFETY: NULL-terminated by contract; the first entry is the program's own name.
        unsafe {
            if !(*argv).is_null() {
                let mut at = argv.add(1);
                while !(*at).is_null() {
                    arguments.push(*at);
                    at = at.add(1);
                }
            }
        }
    }
    arguments.push(std::ptr::null());
    arguments
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shebang(head: &str) -> Option<(String, Option<String>)> {
        parse_shebang(head.as_bytes())
            .map(|(interpreter, argument)| (interpreter.into_string().unwrap(), argument.map(|argument| argument.into_string().unwrap())))
    }

    #[test]
    fn shebang_lines_read_as_linux_reads_them() {
        assert_eq!(shebang("#!/ringfs/venv/bin/python3\nimport sys\n"), Some(("/ringfs/venv/bin/python3".into(), None)));
        assert_eq!(shebang("#! /bin/sh -eu \n"), Some(("/bin/sh".into(), Some("-eu".into()))));
        assert_eq!(shebang("#!/usr/bin/env python3 -I\n"), Some(("/usr/bin/env".into(), Some("python3 -I".into()))));
        assert_eq!(shebang("\x7fELF\x02\x01"), None);
        assert_eq!(shebang("#!\n"), None);
        assert_eq!(shebang("#!/bin/sh"), None, "no end of line within the first bytes");
    }

    #[test]
    fn a_scripts_interpreter_gets_the_script_and_the_callers_arguments() {
        let argv = [c"pip".as_ptr(), c"--version".as_ptr(), std::ptr::null()];
        // SAFETY: a NULL-terminated array of NUL-terminated strings.
        let arguments = unsafe { script_arguments(c"/bin/python3", Some(c"-I"), c"/ringfs/pip".as_ptr(), argv.as_ptr()) };
        let texts: Vec<&str> =
            arguments[..arguments.len() - 1].iter().map(|argument| unsafe { CStr::from_ptr(*argument) }.to_str().unwrap()).collect();
        assert_eq!(texts, ["/bin/python3", "-I", "/ringfs/pip", "--version"]);
        assert!(arguments.last().unwrap().is_null());
    }
}
