//! [`UverbsAh`]: CREATE_AH and DESTROY_AH for rxe's direct rings
//! (docs/spec/rxe.md §8). The kernel resolves the address vector (GID
//! attribute, network type, IP addresses) itself and answers with an
//! `ah_num`, the index a UD send WQE names it by.

use core::mem::{offset_of, size_of};

use rdma_sys as ibv;

use super::command::{cmd_fd, exec, resp_addr};
use super::Kind;
use crate::attr::AddressVector;
use crate::error::{Error, Result};
use crate::sys::uverbs as k;
use k::ib_uverbs_write_cmds as cmd;

/// CREATE_AH's response: the core part (the handle), then rxe's
/// (`struct rxe_create_ah_resp`).
#[repr(C)]
#[derive(Default)]
struct AhResp {
    core: k::ib_uverbs_create_ah_resp,
    drv: k::rxe_create_ah_resp,
}
static_assertions::const_assert_eq!(offset_of!(AhResp, drv), 4);
static_assertions::const_assert_eq!(size_of::<AhResp>(), 12);
static_assertions::const_assert_eq!(size_of::<k::ib_uverbs_create_ah>(), 56);

/// An address handle created with the kernel's CREATE_AH on the context's
/// command fd. Dropping it destroys the kernel object.
pub struct UverbsAh {
    fd: i32,
    handle: u32,
    ah_num: u32,
    alive: bool,
}

impl UverbsAh {
    /// Creates an address handle on the PD whose kernel handle is
    /// `pd_handle`, for `port_num`, to `dest`. Only rxe has them
    /// (other kinds are [`Error::Unsupported`]); a kernel that answers
    /// `ah_num` 0 (one without the driver response, which expects the
    /// address vector inside every WQE, docs/spec/rxe.md §8) is
    /// [`Error::Unsupported`] too, the handle destroyed again. Other errors
    /// map the errno as every uverbs command does.
    ///
    /// # Safety
    /// `ctx` must point to a live `ibv_context` of a device of `kind`,
    /// open until this handle is dropped.
    pub unsafe fn create(
        ctx: *mut ibv::ibv_context,
        kind: Kind,
        pd_handle: u32,
        port_num: u8,
        dest: &AddressVector,
    ) -> Result<UverbsAh> {
        if kind != Kind::Rxe {
            return Err(Error::Unsupported);
        }
        // SAFETY: the caller's contract.
        let fd = unsafe { cmd_fd(ctx) }?;
        let mut resp = AhResp::default();
        let body = k::ib_uverbs_create_ah {
            response: resp_addr(&mut resp),
            user_handle: 0,
            pd_handle,
            reserved: 0,
            attr: k::ib_uverbs_ah_attr {
                grh: k::ib_uverbs_global_route {
                    dgid: dest.dgid,
                    flow_label: dest.flow_label,
                    sgid_index: dest.sgid_index,
                    hop_limit: dest.hop_limit,
                    traffic_class: dest.traffic_class,
                    reserved: 0,
                },
                dlid: dest.dlid,
                sl: dest.sl,
                src_path_bits: 0,
                static_rate: 0,
                is_global: u8::from(dest.is_global),
                port_num,
                reserved: 0,
            },
            ..Default::default()
        };
        exec(
            fd,
            "uverbs CREATE_AH",
            cmd::IB_USER_VERBS_CMD_CREATE_AH,
            body,
            size_of::<AhResp>(),
        )?;
        let ah = UverbsAh {
            fd,
            handle: resp.core.ah_handle,
            ah_num: resp.drv.ah_num,
            alive: true,
        };
        if ah.ah_num == 0 {
            // Dropped: destroyed again.
            return Err(Error::Unsupported);
        }
        Ok(ah)
    }

    /// The index UD send WQEs name this handle by (never 0).
    pub fn ah_num(&self) -> u32 {
        self.ah_num
    }

    /// Destroys the kernel object, reporting the kernel's error (it is
    /// then freed with the context).
    pub fn destroy(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        if !core::mem::replace(&mut self.alive, false) {
            return Ok(());
        }
        exec(
            self.fd,
            "uverbs DESTROY_AH",
            cmd::IB_USER_VERBS_CMD_DESTROY_AH,
            k::ib_uverbs_destroy_ah {
                ah_handle: self.handle,
            },
            0,
        )
    }
}

impl Drop for UverbsAh {
    fn drop(&mut self) {
        // Recorded for `verbs::last_error`, otherwise ignored.
        let _ = self.teardown();
    }
}
