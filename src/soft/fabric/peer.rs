//! Whether the process behind a fabric GID still runs
//! (docs/spec/fabric.md §5).

/// True while process `pid` exists and has not exited. `kill(pid, 0)`
/// sends nothing and tells whether the pid exists (`EPERM`: it exists
/// but belongs to someone else); an exited process that its parent has
/// not reaped yet still exists as a zombie, so its state letter in
/// `/proc/<pid>/stat` is checked too (`Z` zombie, `X` dead).
///
/// A pid that a new, unrelated process has taken reads as alive; the
/// requester's acknowledgement timer bounds that case
/// (docs/spec/fabric.md §5).
pub(crate) fn alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: signal 0 delivers nothing; the call only looks the pid up.
    let r = unsafe { libc::kill(pid as i32, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EPERM) {
        return false;
    }
    match std::fs::read(std::format!("/proc/{pid}/stat")) {
        // The state letter follows the last ')' (the command name may
        // itself hold parentheses).
        Ok(b) => match b.iter().rposition(|&c| c == b')') {
            Some(i) => !matches!(b.get(i + 2), Some(b'Z' | b'X')),
            None => true,
        },
        // No /proc (or the process vanished between the two looks).
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::alive;

    #[test]
    fn this_process_is_alive_and_a_reaped_child_is_not() {
        assert!(alive(std::process::id()));
        assert!(!alive(0));
        assert!(!alive(u32::MAX));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not reaped yet: a zombie once it exits.
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!alive(pid), "an exited, unreaped child reads as dead");
        child.wait().unwrap();
        assert!(!alive(pid));
    }
}
