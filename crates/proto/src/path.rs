//! Canonical ringfs paths: the strings that name keys.
//!
//! A path is the first half of every chunk key, so two spellings of one file must become one
//! string before they are hashed. Clients canonicalise what users type; servers accept only
//! canonical paths and reject anything else with `EINVAL`, so a malformed request cannot name a
//! key outside the namespace.
//!
//! Canonical form: starts with `/`, components separated by single `/`, no `.` or `..`
//! components, no trailing `/` (except the root `/` itself), no NUL byte, at most
//! [`MAX_PATH_BYTES`] bytes and [`MAX_NAME_BYTES`] per component.
//!
//! Linux bounds the path *one call* names (`PATH_MAX`), not how deep a tree is: a program
//! whose working directory lies deep inside a file system names a file by a relative path of
//! up to 4,095 bytes there, and the file's absolute path is longer. ringfs keys names by their
//! absolute paths, so it accepts paths much longer than one call's ([`MAX_PATH_BYTES`]); the
//! edges that take a path from a program (the kernel for the FUSE mount) bound each call's
//! path by [`MAX_CALL_PATH_BYTES`].

use crate::Errno;

/// Longest canonical path ringfs stores, in bytes: sixteen times what one call may name, so
/// trees reached through deep working directories fit (the `dir` store's journal records a
/// path's length in 16 bits). Requests stay far below the frame limit
/// ([`crate::MAX_BODY_LEN`]).
pub const MAX_PATH_BYTES: usize = 65_535;
/// Longest path one call may name, in bytes (Linux `PATH_MAX` minus the terminating NUL);
/// also the longest symbolic link target.
pub const MAX_CALL_PATH_BYTES: usize = 4095;
/// Longest single component, in bytes (Linux `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;

/// Turns a user-supplied path into canonical form, resolving `.` and `..` lexically.
/// Relative paths are taken relative to the ringfs root. `..` at the root stays at the root.
pub fn canonicalize(input: &str) -> Result<String, Errno> {
    if input.contains('\0') {
        return Err(Errno::EINVAL);
    }
    let mut components: Vec<&str> = Vec::new();
    for component in input.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                components.pop();
            }
            name => {
                if name.len() > MAX_NAME_BYTES {
                    return Err(Errno::ENAMETOOLONG);
                }
                components.push(name);
            }
        }
    }
    let mut path = String::with_capacity(input.len() + 1);
    for component in &components {
        path.push('/');
        path.push_str(component);
    }
    if path.is_empty() {
        path.push('/');
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(path)
}

/// Checks that `path` is already canonical; servers call this on every path they receive.
pub fn validate(path: &str) -> Result<(), Errno> {
    if path == "/" {
        return Ok(());
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(Errno::ENAMETOOLONG);
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(Errno::EINVAL);
    };
    for component in rest.split('/') {
        match component {
            "" | "." | ".." => return Err(Errno::EINVAL),
            name if name.len() > MAX_NAME_BYTES => return Err(Errno::ENAMETOOLONG),
            name if name.contains('\0') => return Err(Errno::EINVAL),
            _ => {}
        }
    }
    Ok(())
}

/// The directory that contains `path`; `None` for the root.
pub fn parent(path: &str) -> Option<&str> {
    if path == "/" {
        return None;
    }
    match path.rfind('/') {
        Some(0) => Some("/"),
        Some(index) => Some(&path[..index]),
        None => None,
    }
}

/// The last component of `path` (empty for the root).
pub fn file_name(path: &str) -> &str {
    match path.rfind('/') {
        Some(index) => &path[index + 1..],
        None => path,
    }
}

/// `dir` + `/` + `name`, for a canonical `dir` and a single component `name`.
pub fn join(dir: &str, name: &str) -> String {
    if dir == "/" { format!("/{name}") } else { format!("{dir}/{name}") }
}

/// True when `path` lies strictly inside directory `dir` (at any depth).
pub fn is_inside(path: &str, dir: &str) -> bool {
    if dir == "/" {
        return path != "/";
    }
    path.len() > dir.len() && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/'
}

/// Shell-style name matching (`fnmatch` without flags): `*` matches any run of characters,
/// `?` one character, `[abc]`, `[a-z]` and `[!abc]` one character of (or not of) a set.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    // Backtracking over the last `*` only: linear for patterns like "*01*".
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, n));
                p += 1;
                continue;
            }
            Some('?') => {
                p += 1;
                n += 1;
                continue;
            }
            Some('[') => {
                if let Some((matched, next)) = match_class(&pattern, p, name[n]) {
                    if matched {
                        p = next;
                        n += 1;
                        continue;
                    }
                } else if name[n] == '[' {
                    p += 1;
                    n += 1;
                    continue;
                }
            }
            Some(literal) if *literal == name[n] => {
                p += 1;
                n += 1;
                continue;
            }
            _ => {}
        }
        match star {
            Some((star_p, star_n)) => {
                p = star_p + 1;
                n = star_n + 1;
                star = Some((star_p, star_n + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

/// Matches `c` against the bracket expression starting at `pattern[start]` (`[`); returns
/// whether it matched and the index after `]`, or `None` if the expression is unterminated.
fn match_class(pattern: &[char], start: usize, c: char) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negated = matches!(pattern.get(i), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    while let Some(&current) = pattern.get(i) {
        if current == ']' && !first {
            return Some((matched != negated, i + 1));
        }
        if pattern.get(i + 1) == Some(&'-') && pattern.get(i + 2).is_some_and(|end| *end != ']') {
            matched |= current <= c && c <= pattern[i + 2];
            i += 3;
        } else {
            matched |= current == c;
            i += 1;
        }
        first = false;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn canonicalize_resolves_dots_and_slashes() {
        assert_eq!(canonicalize("").unwrap(), "/");
        assert_eq!(canonicalize("/").unwrap(), "/");
        assert_eq!(canonicalize("a//b/./c/").unwrap(), "/a/b/c");
        assert_eq!(canonicalize("/a/b/../../..").unwrap(), "/");
        assert_eq!(canonicalize("/a/../b").unwrap(), "/b");
        assert_eq!(canonicalize(&"x".repeat(256)), Err(Errno::ENAMETOOLONG));
        assert_eq!(canonicalize("a\0b"), Err(Errno::EINVAL));
    }

    #[test]
    fn paths_longer_than_one_calls_are_accepted_up_to_the_limit() {
        // 200 components of 255 bytes: 51,200 bytes, far deeper than PATH_MAX.
        let deep: String = (0..200).map(|index| format!("/{}", format!("{index:03}").repeat(85))).collect();
        assert_eq!(canonicalize(&deep).unwrap(), deep);
        assert_eq!(validate(&deep), Ok(()));
        let too_deep: String = (0..257).map(|index| format!("/{}", format!("{index:03}").repeat(85))).collect();
        assert!(too_deep.len() > MAX_PATH_BYTES);
        assert_eq!(canonicalize(&too_deep), Err(Errno::ENAMETOOLONG));
        assert_eq!(validate(&too_deep), Err(Errno::ENAMETOOLONG));
        assert_eq!(validate(&format!("{deep}/{}", "n".repeat(256))), Err(Errno::ENAMETOOLONG));
    }

    #[test]
    fn validate_rejects_non_canonical_paths() {
        for bad in ["", "a", "/a/", "//a", "/a/./b", "/a/../b", "/a\0"] {
            assert!(validate(bad).is_err(), "{bad:?} should be rejected");
        }
        for good in ["/", "/a", "/a/b c/d.txt"] {
            assert_eq!(validate(good), Ok(()));
        }
    }

    #[test]
    fn parent_and_name_split_a_path() {
        assert_eq!(parent("/"), None);
        assert_eq!(parent("/a"), Some("/"));
        assert_eq!(parent("/a/b"), Some("/a"));
        assert_eq!(file_name("/a/b"), "b");
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
        assert!(is_inside("/a/b", "/a"));
        assert!(!is_inside("/ab", "/a"));
        assert!(!is_inside("/a", "/a"));
        assert!(is_inside("/a", "/"));
    }

    #[test]
    fn globs_match_like_fnmatch() {
        assert!(glob_match("*01*", "file.mdtest.0.1001"));
        assert!(glob_match("*01*", "01"));
        assert!(!glob_match("*01*", "file.mdtest.1.1000"));
        assert!(glob_match("file.?", "file.x"));
        assert!(!glob_match("file.?", "file.xy"));
        assert!(glob_match("*.[ch]", "main.c"));
        assert!(!glob_match("*.[!ch]", "main.c"));
        assert!(glob_match("[a-c]*", "beta"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        assert!(glob_match("*", ""));
        assert!(glob_match("[", "["));
    }

    proptest! {
        #[test]
        fn canonical_output_always_validates(input in "[a-c./]{0,40}") {
            let path = canonicalize(&input).unwrap();
            prop_assert_eq!(validate(&path), Ok(()));
            prop_assert_eq!(canonicalize(&path).unwrap(), path.clone());
        }
    }
}
