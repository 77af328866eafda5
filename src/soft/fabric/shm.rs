//! POSIX shared-memory segments (`/dev/shm/<name>`): the memory two
//! processes of the software fabric share.
//!
//! A [`Segment`] is one `MAP_SHARED` read/write mapping. The creator sizes
//! it; an opener takes the size from `fstat`, treats a size of 0 as not
//! made yet (the creator is between its `shm_open` and its `ftruncate`) and
//! refuses any other size shorter than it needs. Dropping a segment only unmaps it: the name lives until
//! [`Segment::unlink`], and a mapping stays valid after the name is gone.

use std::ffi::CString;

use crate::error::{Error, Result};

/// Longest accepted segment name (bytes, without the leading '/').
const MAX_NAME: usize = 200;

/// One mapping of a shared-memory segment.
#[derive(Debug)]
pub(crate) struct Segment {
    /// Start of the mapping (page-aligned).
    ptr: *mut u8,
    /// Bytes mapped.
    len: usize,
}

// SAFETY: a `Segment` owns a mapping and hands out only its address; it
// never reads or writes the bytes itself. The mapping is valid in every
// thread of the process, and whoever accesses the memory through
// `as_ptr` synchronises (the bytes are shared with another process anyway).
unsafe impl Send for Segment {}
// SAFETY: as above; `&Segment` gives only the address and the length.
unsafe impl Sync for Segment {}

static_assertions::assert_impl_all!(Segment: Send, Sync);

/// `"/<name>"` for shm_open, after checking that `name` is 1..=200 bytes of
/// `[A-Za-z0-9._-]`.
fn shm_path(name: &str) -> Result<CString> {
    let ok = (1..=MAX_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
        && name != "."
        && name != "..";
    if !ok {
        return Err(Error::InvalidAttribute);
    }
    CString::new(std::format!("/{name}")).map_err(|_| Error::InvalidAttribute)
}

/// The last OS error as a crate error.
fn os_error() -> Error {
    match std::io::Error::last_os_error().raw_os_error().unwrap_or(0) {
        libc::EEXIST | libc::EBUSY => Error::ResourceBusy,
        libc::ENOMEM | libc::ENOSPC | libc::EMFILE | libc::ENFILE | libc::EAGAIN => {
            Error::ResourceExhausted
        }
        libc::EINVAL | libc::ENAMETOOLONG | libc::EFBIG => Error::InvalidAttribute,
        libc::ENOENT | libc::ENOSYS | libc::ENODEV => Error::NoDevice,
        _ => Error::ProviderError,
    }
}

/// Maps `len` bytes of `fd` shared read/write.
fn map(fd: libc::c_int, len: usize) -> Result<*mut u8> {
    // SAFETY: a fresh shared mapping chosen by the kernel; `fd` is open.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_error());
    }
    Ok(p.cast())
}

impl Segment {
    /// Creates `/dev/shm/<name>` exclusively (mode 0600), sized `len`
    /// bytes (zero-filled by the kernel) and mapped shared read/write.
    /// An existing name is `Err(ResourceBusy)`; `len == 0` or a bad name is
    /// `Err(InvalidAttribute)`. On any failure after the name was created,
    /// it is unlinked again, so nothing is left behind.
    pub(crate) fn create(name: &str, len: usize) -> Result<Segment> {
        let path = shm_path(name)?;
        if len == 0 || libc::off_t::try_from(len).is_err() {
            return Err(Error::InvalidAttribute);
        }
        // SAFETY: `path` is a NUL-terminated string.
        let fd = unsafe {
            libc::shm_open(
                path.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Err(os_error());
        }
        // SAFETY: `fd` is the segment just created; `len` fits in off_t.
        let r = if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            Err(os_error())
        } else {
            map(fd, len)
        };
        // SAFETY: `fd` is ours; the mapping (if any) does not need it.
        unsafe { libc::close(fd) };
        match r {
            Ok(ptr) => Ok(Segment { ptr, len }),
            Err(e) => {
                // SAFETY: `path` is NUL-terminated; the name is the one we
                // created.
                unsafe { libc::shm_unlink(path.as_ptr()) };
                Err(e)
            }
        }
    }

    /// Opens and maps an existing segment, with the length `fstat`
    /// reports. `Ok(None)` if no segment has that name, or if it has
    /// length 0: [`Segment::create`] names a segment before it sizes it,
    /// so a length of 0 is one whose creator has not got that far yet
    /// (the opener looks again later). Any other length shorter than
    /// `min_len` is `Err(InvalidAttribute)` (not one of ours, or
    /// damaged), as is a bad name.
    pub(crate) fn open(name: &str, min_len: usize) -> Result<Option<Segment>> {
        let path = shm_path(name)?;
        // SAFETY: `path` is a NUL-terminated string.
        let fd = unsafe { libc::shm_open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if fd < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
                return Ok(None);
            }
            return Err(os_error());
        }
        // SAFETY: all-zero bytes are a valid `stat`; fstat fills it in.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: `fd` is open and `st` is writable.
        let r = if unsafe { libc::fstat(fd, &mut st) } != 0 {
            Err(os_error())
        } else {
            match usize::try_from(st.st_size) {
                Ok(0) => Ok(None),
                Ok(len) if len >= min_len.max(1) => {
                    map(fd, len).map(|ptr| Some(Segment { ptr, len }))
                }
                _ => Err(Error::InvalidAttribute),
            }
        };
        // SAFETY: `fd` is ours; the mapping (if any) does not need it.
        unsafe { libc::close(fd) };
        r
    }

    /// Removes the name (existing mappings stay valid). A missing name or
    /// a bad one is not an error: there is nothing to remove.
    pub(crate) fn unlink(name: &str) {
        if let Ok(path) = shm_path(name) {
            // SAFETY: `path` is NUL-terminated. ENOENT is ignored.
            unsafe { libc::shm_unlink(path.as_ptr()) };
        }
    }

    /// Start of the mapping (page-aligned).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Creates the name with `shm_open(O_CREAT)` and does not size it:
    /// what an opener sees while a creator is inside [`Segment::create`].
    #[cfg(test)]
    pub(crate) fn name_unsized(name: &str) {
        let path = shm_path(name).unwrap();
        // SAFETY: `path` is NUL-terminated; the fd is closed at once.
        unsafe {
            let fd = libc::shm_open(
                path.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600,
            );
            assert!(fd >= 0);
            libc::close(fd);
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr + len` is the mapping this segment owns; nothing
        // borrowed from it outlives the segment. Never unlinks.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::String;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A name no other test (or test run) uses.
    pub(crate) fn unique(tag: &str) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        // Relaxed: a counter for uniqueness only.
        let n = N.fetch_add(1, Ordering::Relaxed);
        std::format!("rdd-test-{tag}-{}-{n}", std::process::id())
    }

    /// Unlinks the name when the test ends, passed or not.
    struct Unlink<'a>(&'a str);
    impl Drop for Unlink<'_> {
        fn drop(&mut self) {
            Segment::unlink(self.0);
        }
    }

    #[test]
    fn create_and_open_share_bytes() {
        let name = unique("share");
        let _u = Unlink(&name);
        let a = Segment::create(&name, 8192).unwrap();
        assert_eq!(a.len(), 8192);
        assert_eq!(a.as_ptr() as usize % 4096, 0);
        let b = Segment::open(&name, 4096).unwrap().unwrap();
        assert_eq!(b.len(), 8192);
        // SAFETY: both mappings are 8192 bytes; one thread touches them.
        unsafe {
            assert_eq!(*b.as_ptr().add(100), 0, "zero-filled");
            *a.as_ptr().add(100) = 0x5a;
            *b.as_ptr().add(8191) = 0xa5;
            assert_eq!(*b.as_ptr().add(100), 0x5a);
            assert_eq!(*a.as_ptr().add(8191), 0xa5);
        }
        Segment::unlink(&name);
    }

    #[test]
    fn create_twice_is_busy() {
        let name = unique("twice");
        let _u = Unlink(&name);
        let _a = Segment::create(&name, 4096).unwrap();
        assert_eq!(
            Segment::create(&name, 4096).unwrap_err(),
            Error::ResourceBusy
        );
        Segment::unlink(&name);
    }

    #[test]
    fn open_missing_is_none() {
        assert!(Segment::open(&unique("missing"), 1).unwrap().is_none());
        Segment::unlink(&unique("missing")); // no error
    }

    #[test]
    fn unlink_keeps_mappings() {
        let name = unique("unlink");
        let _u = Unlink(&name);
        let a = Segment::create(&name, 4096).unwrap();
        // SAFETY: 4096 bytes mapped.
        unsafe { *a.as_ptr() = 7 };
        Segment::unlink(&name);
        assert!(Segment::open(&name, 1).unwrap().is_none());
        // SAFETY: the mapping outlives the name.
        assert_eq!(unsafe { *a.as_ptr() }, 7);
        // The name is free again.
        let b = Segment::create(&name, 4096).unwrap();
        // SAFETY: 4096 bytes mapped.
        assert_eq!(unsafe { *b.as_ptr() }, 0, "a new segment");
        Segment::unlink(&name);
    }

    #[test]
    fn bad_names_are_refused() {
        let long = "x".repeat(MAX_NAME + 1);
        for bad in ["", "a/b", "/a", "a b", "ä", ".", "..", long.as_str()] {
            assert_eq!(
                Segment::create(bad, 4096).unwrap_err(),
                Error::InvalidAttribute,
                "{bad:?}"
            );
            assert_eq!(
                Segment::open(bad, 1).unwrap_err(),
                Error::InvalidAttribute,
                "{bad:?}"
            );
        }
        let stem = unique("x");
        let ok = stem.clone() + &"y".repeat(MAX_NAME - stem.len());
        assert_eq!(ok.len(), MAX_NAME);
        let s = Segment::create(&ok, 4096).unwrap();
        Segment::unlink(&ok);
        drop(s);
        assert_eq!(
            Segment::create(&unique("zero"), 0).unwrap_err(),
            Error::InvalidAttribute
        );
    }

    #[test]
    fn a_segment_not_sized_yet_reads_as_absent() {
        let name = unique("unsized");
        let _u = Unlink(&name);
        Segment::name_unsized(&name);
        // Not an error: the creator sizes it next.
        assert!(Segment::open(&name, 4096).unwrap().is_none());
        Segment::unlink(&name);
    }

    #[test]
    fn short_segment_is_refused() {
        let name = unique("short");
        let _u = Unlink(&name);
        let _a = Segment::create(&name, 4096).unwrap();
        assert_eq!(
            Segment::open(&name, 4097).unwrap_err(),
            Error::InvalidAttribute
        );
        assert_eq!(Segment::open(&name, 4096).unwrap().unwrap().len(), 4096);
        Segment::unlink(&name);
    }
}
