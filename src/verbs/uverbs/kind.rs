//! [`Kind`]: rxe or siw, recognised by the vendor ID the kernel reports.

use rdma_sys as ibv;

// ---------------------------------------------------------------------------
// Device kind.

/// `ibv_device_attr.vendor_id` of rxe (`RXE_VENDOR_ID`, 0xFFFFFF since
/// Linux 5.x).
const RXE_VENDOR_ID: u32 = 0x00ff_ffff;
/// `ibv_device_attr.vendor_id` of siw (`SIW_VENDOR_ID`, ASCII "bmt").
const SIW_VENDOR_ID: u32 = 0x0062_6d74;

/// Which kernel driver serves the context: it decides the driver
/// responses and the ring layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Soft-RoCE (`rdma_rxe`): rings with a 384-byte index header
    /// (docs/spec/rxe.md).
    Rxe,
    /// Soft-iWARP (`siw`): rings of elements with a valid flag each
    /// (docs/spec/siw.md).
    Siw,
}

impl Kind {
    /// Recognises rxe and siw by the vendor ID the kernel reports for
    /// them (rxe 0xFFFFFF, siw 0x626d74); `None` for any other device, or
    /// if the query fails.
    ///
    /// # Safety
    /// `ctx` must point to a live, open `ibv_context`.
    pub unsafe fn detect(ctx: *mut ibv::ibv_context) -> Option<Kind> {
        // SAFETY: all-zero is a valid ibv_device_attr.
        let mut attr: ibv::ibv_device_attr = unsafe { core::mem::zeroed() };
        // SAFETY: live context (the caller's contract); valid out-pointer.
        if unsafe { ibv::ibv_query_device(ctx, &mut attr) } != 0 {
            return None;
        }
        match attr.vendor_id {
            RXE_VENDOR_ID => Some(Kind::Rxe),
            SIW_VENDOR_ID => Some(Kind::Siw),
            _ => None,
        }
    }
}
