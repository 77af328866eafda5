//! The boundary macros every export uses: the panic boundary and the
//! early-return checks. Written for this crate; the shape follows the
//! pattern of rustls-ffi's panic boundary and hyper's `non_null!`.

#[cfg(feature = "std")]
use crate::ffi::status::rdd_status;

/// What an export returns when its body panicked (under `std`).
#[cfg(feature = "std")]
pub(crate) trait PanicValue {
    /// The value reported to C after a caught panic.
    fn panic_value() -> Self;
}

#[cfg(feature = "std")]
impl PanicValue for rdd_status {
    #[inline]
    fn panic_value() -> Self {
        rdd_status::Panic
    }
}

/// A fast path run inside its own boundary (`rdd_mlx5_sq_post_ring`)
/// reports a panic as the export's status, and is then done (`Some`).
#[cfg(feature = "std")]
impl PanicValue for Option<rdd_status> {
    #[inline]
    fn panic_value() -> Self {
        Some(rdd_status::Panic)
    }
}

/// Exports that return a count or a negative status (`rdd_cq_poll_n`)
/// report a panic as `-RDD_STATUS_PANIC`.
#[cfg(feature = "std")]
impl PanicValue for i32 {
    #[inline]
    fn panic_value() -> Self {
        -(rdd_status::Panic as u32 as i32)
    }
}

/// Exports that return a static name (`rdd_status_name`, ...) report a
/// panic as the name of an unknown value.
#[cfg(feature = "std")]
impl PanicValue for *const core::ffi::c_char {
    #[inline]
    fn panic_value() -> Self {
        c"unknown".as_ptr()
    }
}

/// Runs an export's body as a closure. With `std` a panic is caught and
/// turned into the return type's [`PanicValue`]; without `std` the body
/// just runs (a panic reaches the panic handler). `return` inside the body
/// returns from the closure in both builds, so the semantics are the same.
macro_rules! ffi_boundary {
    ($body:block) => {{
        #[cfg(feature = "std")]
        {
            match ::std::panic::catch_unwind(::core::panic::AssertUnwindSafe(|| $body)) {
                ::core::result::Result::Ok(value) => value,
                ::core::result::Result::Err(_) => {
                    <_ as $crate::ffi::macros::PanicValue>::panic_value()
                }
            }
        }
        #[cfg(not(feature = "std"))]
        {
            (|| $body)()
        }
    }};
}

/// Returns `RDD_STATUS_NULL_PARAMETER` from the enclosing body if any of
/// the given pointers is NULL.
macro_rules! non_null {
    ($($ptr:expr),+ $(,)?) => {
        $(
            if $ptr.is_null() {
                return $crate::ffi::status::rdd_status::NullParameter;
            }
        )+
    };
}

/// Unwraps a `Result<T, rdd_status>`, returning the status from the
/// enclosing body on error (`?` for bodies that return a bare status).
macro_rules! try_status {
    ($e:expr) => {
        match $e {
            ::core::result::Result::Ok(v) => v,
            ::core::result::Result::Err(status) => return status,
        }
    };
}
